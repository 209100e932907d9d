//! `flashpool serve --config FILE`: every setting of `flashpool serve` in a TOML file, keyed by
//! the flag's long name (`listen = "0.0.0.0:10809"`, `busy-poll-us = 50`, `drive = [...]`).
//! Flags given on the command line override the file (a list flag such as `--drive` replaces
//! the file's list; a switch such as `--sparse` can only turn a setting on). Unknown keys and
//! bad values are errors naming the file and the line. Relative paths in the file are taken
//! from the file's directory (`sim-drives` too when it names a file, not a preset).

use crate::serve::ServeArgs;
use anyhow::{Context, Result};
use serde::{Deserialize, Deserializer};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The file's settings; every one optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub data: Option<PathBuf>,
    pub listen: Option<String>,
    pub nvme_tcp: Option<String>,
    pub nvme_nqn: Option<String>,
    pub nvme_allow_host: Option<Vec<String>>,
    pub nvme_dhchap_secret: Option<PathBuf>,
    pub nvme_dhchap_dhgroup: Option<String>,
    #[serde(default, deserialize_with = "nvme_tls")]
    pub nvme_tls: Option<String>,
    pub nvme_tls_psk: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    pub stdio: Option<bool>,
    #[serde(default, deserialize_with = "drives")]
    pub drives: Option<usize>,
    pub drive: Option<Vec<PathBuf>>,
    #[serde(default, deserialize_with = "search")]
    pub search: Option<Vec<String>>,
    pub force: Option<bool>,
    pub sparse: Option<bool>,
    #[serde(default, deserialize_with = "ec")]
    pub ec: Option<(usize, usize)>,
    #[serde(default, deserialize_with = "drive_size")]
    pub drive_size: Option<u64>,
    #[serde(default, deserialize_with = "volume_size")]
    pub volume_size: Option<u64>,
    pub memory: Option<bool>,
    pub sim_drives: Option<String>,
    #[serde(default, deserialize_with = "sim_timing")]
    pub sim_timing: Option<String>,
    pub rebuild_delay: Option<u64>,
    #[serde(default, deserialize_with = "busy_poll_us")]
    pub busy_poll_us: Option<u64>,
    #[serde(default, deserialize_with = "read_poll_us")]
    pub read_poll_us: Option<u64>,
    #[serde(default, deserialize_with = "nbd_reactors")]
    pub nbd_reactors: Option<u64>,
    #[serde(default, deserialize_with = "rebuild_reserve")]
    pub rebuild_reserve: Option<String>,
    #[serde(default, deserialize_with = "stripe_writers")]
    pub stripe_writers: Option<u64>,
    #[serde(default, deserialize_with = "scrub_interval_hours")]
    pub scrub_interval_hours: Option<u64>,
    #[serde(default, deserialize_with = "scrub_rate_mib")]
    pub scrub_rate_mib: Option<u64>,
    pub handshake_timeout: Option<u64>,
    #[serde(default, deserialize_with = "max_handshakes_per_peer")]
    pub max_handshakes_per_peer: Option<u64>,
    #[serde(default, deserialize_with = "tls")]
    pub tls: Option<String>,
    pub tls_certificates: Option<PathBuf>,
    pub tls_psk: Option<PathBuf>,
    pub tls_verify_peer: Option<bool>,
    #[serde(default, deserialize_with = "listen_addr")]
    pub metrics: Option<String>,
    #[serde(default, deserialize_with = "listen_addr")]
    pub api: Option<String>,
    pub api_token_file: Option<PathBuf>,
    pub api_allow_remote: Option<bool>,
}

fn custom<T, E: serde::de::Error>(r: Result<T>) -> Result<Option<T>, E> {
    r.map(Some).map_err(|e| E::custom(format!("{e:#}")))
}

/// A size: a number of bytes or a string with a suffix ("64M", "1GiB"); anything else (a
/// negative number, a float, a table) is named with the key and the forms accepted, where
/// serde's untagged enum would say only "data did not match any variant".
/// Returns the bytes and the value as written.
fn size<'de, D: Deserializer<'de>>(d: D, key: &str) -> Result<(u64, String), D::Error> {
    let bad = |what: String| {
        serde::de::Error::custom(format!(
            "{key} = {what}: expected a number of bytes (4096) or a string with a suffix \
             (\"64M\", \"1G\")"
        ))
    };
    match toml::Value::deserialize(d)? {
        toml::Value::Integer(n) => u64::try_from(n)
            .map(|b| (b, n.to_string()))
            .map_err(|_| bad(n.to_string())),
        toml::Value::String(t) => crate::size::parse_size(&t)
            .map(|b| (b, format!("{t:?}")))
            .map_err(|e| serde::de::Error::custom(format!("{key}: {e:#}"))),
        other => Err(bad(other.to_string())),
    }
}

fn drive_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let (n, given) = size(d, "drive-size")?;
    custom(crate::size::check_drive_size(&given, n))
}

/// A size `--volume-size` takes (its parser refuses 0).
fn volume_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let (n, _) = size(d, "volume-size")?;
    flag_accepts("volume_size", &n.to_string()).map_err(serde::de::Error::custom)?;
    Ok(Some(n))
}

fn ec<'de, D: Deserializer<'de>>(d: D) -> Result<Option<(usize, usize)>, D::Error> {
    custom(crate::size::parse_ec(&String::deserialize(d)?))
}

/// Checks `text` with the parser of the flag whose clap id is `id`: the ranges and choices
/// of a key live in one place, `ServeArgs`, so the file cannot accept what the flag refuses
/// (two had drifted when the file kept its own copy). Only a refused value is an error here;
/// what the flag needs beside it (`--nvme-tls` needs `--nvme-tcp`) is checked after merging.
fn flag_accepts(id: &str, text: &str) -> Result<(), String> {
    use clap::error::ErrorKind;
    use clap::Args;
    let cmd = ServeArgs::augment_args(clap::Command::new("serve"));
    let long = cmd
        .get_arguments()
        .find(|a| a.get_id() == id)
        .and_then(|a| a.get_long())
        .unwrap_or_else(|| panic!("config key {id} names no flag of serve"))
        .to_string();
    match cmd.try_get_matches_from(["serve".to_string(), format!("--{long}={text}")]) {
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::InvalidValue | ErrorKind::ValueValidation
            ) =>
        {
            // clap's message without its "error: " and its pointer to --help.
            let text = e.to_string();
            let lines: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
                .collect();
            let msg = lines.join(" ");
            Err(msg.strip_prefix("error: ").unwrap_or(&msg).to_string())
        }
        _ => Ok(()),
    }
}

/// A value the flag `id`'s own parser must accept.
fn checked<'de, D, T>(d: D, id: &str) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + ToString,
{
    let v = T::deserialize(d)?;
    flag_accepts(id, &v.to_string()).map_err(serde::de::Error::custom)?;
    Ok(Some(v))
}

/// `fn key(d)`: deserializes the key as `T` and checks it with its flag's parser.
macro_rules! checked_by_flag {
    ($($key:ident: $t:ty),* $(,)?) => {$(
        fn $key<'de, D: Deserializer<'de>>(d: D) -> Result<Option<$t>, D::Error> {
            checked(d, stringify!($key))
        }
    )*};
}

checked_by_flag!(
    busy_poll_us: u64,
    read_poll_us: u64,
    nbd_reactors: u64,
    scrub_interval_hours: u64,
    scrub_rate_mib: u64,
    stripe_writers: u64,
    max_handshakes_per_peer: u64,
    drives: usize,
    sim_timing: String,
    tls: String,
    nvme_tls: String,
);

fn search<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    for p in &v {
        flag_accepts("search", p).map_err(serde::de::Error::custom)?;
    }
    Ok(Some(v))
}

/// "on" / "off", or true / false.
fn rebuild_reserve<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OnOff {
        Bool(bool),
        Text(String),
    }
    let text = match OnOff::deserialize(d)? {
        OnOff::Bool(b) => if b { "on" } else { "off" }.to_string(),
        OnOff::Text(t) => t,
    };
    flag_accepts("rebuild_reserve", &text)
        .map_err(|e| serde::de::Error::custom(format!("{e} (or true or false)")))?;
    Ok(Some(text))
}

/// `[HOST:]PORT`, checked here so the error points at the line.
fn listen_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Addr {
        Port(u16),
        Text(String),
    }
    let text = match Addr::deserialize(d)? {
        Addr::Port(p) => p.to_string(),
        Addr::Text(t) => t,
    };
    custom(crate::ops::listen_address(&text).map(|_| text))
}

/// Reads and checks a config file.
pub fn load(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--config {}: cannot read it", path.display()))?;
    parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Parses a config file's text; the error starts with "line N, column M: what is wrong",
/// then quotes the line and marks the place (toml's rendering).
pub fn parse(text: &str) -> Result<FileConfig, String> {
    toml::from_str::<FileConfig>(text).map_err(|e| {
        let rendered = e.to_string();
        // toml's rendering: "TOML parse error at line N, column M", the quoted line, the
        // message; keep the quote, say the place and the message first.
        let quote: Vec<&str> = rendered
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with(' ') || l.contains(" | ") || l.ends_with(" |"))
            .collect();
        match e.span() {
            Some(span) => {
                let before = text.get(..span.start).unwrap_or(text);
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(
                    "line {line}, column {column}: {}\n{}",
                    e.message().trim_end(),
                    quote.join("\n")
                )
            }
            None => e.message().trim_end().to_string(),
        }
    })
}

/// The flags given on this process's command line (clap ids: `busy_poll_us`), which the
/// config file must not override; found by parsing the `serve` arguments again.
pub fn command_line_flags() -> Result<HashSet<String>> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let at = if args.get(1).is_some_and(|a| a == "serve") {
        1
    } else {
        args.iter()
            .position(|a| a == "serve")
            .context("cannot find the serve subcommand on the command line")?
    };
    flags_of(&args[at..])
}

/// The flags (clap ids) given in `args` (`serve` first).
pub fn flags_of(args: &[std::ffi::OsString]) -> Result<HashSet<String>> {
    use clap::Args;
    let m = ServeArgs::augment_args(clap::Command::new("serve"))
        .try_get_matches_from(args)
        .context("reading the command line again")?;
    Ok(m.ids()
        .map(|id| id.as_str().to_string())
        .filter(|id| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
        .collect())
}

/// Applies the file's settings to `a` where the command line (`given`) did not set them;
/// relative paths are taken from `base` (the file's directory).
pub fn apply(a: &mut ServeArgs, f: FileConfig, given: &HashSet<String>, base: &Path) {
    let path = |p: PathBuf| if p.is_relative() { base.join(p) } else { p };
    macro_rules! set {
        ($field:ident) => {
            set!($field, |v| v)
        };
        ($field:ident, $conv:expr) => {
            if let Some(v) = f.$field {
                if !given.contains(stringify!($field)) {
                    #[allow(clippy::redundant_closure_call)]
                    {
                        a.$field = ($conv)(v);
                    }
                }
            }
        };
    }
    macro_rules! switch {
        ($field:ident) => {
            if let Some(v) = f.$field {
                if !given.contains(stringify!($field)) {
                    a.$field = v;
                }
            }
        };
    }
    set!(data, path);
    set!(listen);
    set!(nvme_tcp, Some);
    set!(nvme_nqn, Some);
    set!(nvme_allow_host);
    set!(nvme_dhchap_secret, |p| Some(path(p)));
    set!(nvme_dhchap_dhgroup, Some);
    set!(nvme_tls);
    set!(nvme_tls_psk, |p| Some(path(p)));
    set!(socket, |p| Some(path(p)));
    switch!(stdio);
    set!(drives, Some);
    set!(drive, |v: Vec<PathBuf>| v.into_iter().map(path).collect());
    set!(search, |v: Vec<String>| v
        .into_iter()
        .map(|g| {
            if Path::new(&g).is_relative() {
                base.join(g).display().to_string()
            } else {
                g
            }
        })
        .collect());
    switch!(force);
    switch!(sparse);
    set!(ec);
    set!(drive_size, Some);
    set!(volume_size);
    switch!(memory);
    // A preset's name as it is; a file's path from the file's directory.
    set!(sim_drives, |v: String| Some(
        if flashpool_sim::presets::preset_text(&v).is_some() {
            v
        } else {
            path(PathBuf::from(v)).to_string_lossy().into_owned()
        }
    ));
    set!(sim_timing);
    set!(rebuild_delay);
    set!(busy_poll_us);
    set!(read_poll_us);
    set!(nbd_reactors);
    set!(rebuild_reserve);
    set!(stripe_writers);
    set!(scrub_interval_hours);
    set!(scrub_rate_mib);
    set!(handshake_timeout);
    set!(max_handshakes_per_peer);
    set!(tls);
    set!(tls_certificates, |p| Some(path(p)));
    set!(tls_psk, |p| Some(path(p)));
    switch!(tls_verify_peer);
    set!(metrics, Some);
    set!(api, Some);
    set!(api_token_file, |p| Some(path(p)));
    switch!(api_allow_remote);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn args(cmd: &[&str]) -> (ServeArgs, HashSet<String>) {
        let mut v = vec!["serve"];
        v.extend_from_slice(cmd);
        let os: Vec<std::ffi::OsString> = v.iter().map(Into::into).collect();
        (Cli::parse_from(&v).serve, flags_of(&os).unwrap())
    }

    #[test]
    fn every_flag_is_a_key() {
        use clap::Args;
        // The unknown-key error lists every key the file takes.
        let err = parse("no-such-key = 1\n").unwrap_err();
        assert!(err.starts_with("line 1, column 1:"), "{err}");
        let cmd = ServeArgs::augment_args(clap::Command::new("serve"));
        for a in cmd.get_arguments() {
            let Some(long) = a.get_long() else { continue };
            if long == "config" || long == "help" {
                continue;
            }
            assert!(
                err.contains(&format!("`{long}`")),
                "flag --{long} has no config key: {err}"
            );
        }
    }

    #[test]
    fn file_fills_in_and_flags_win() {
        let f = parse(
            "listen = \"127.0.0.1:1234\"\nbusy-poll-us = 7\nsparse = true\ndrive = [\"a.img\", \"/dev/b\"]\ndrive-size = \"64M\"\nvolume-size = 1048576\nec = \"2+1\"\nrebuild-reserve = false\nmetrics = 9100\n",
        )
        .unwrap();
        let (mut a, given) = args(&["--busy-poll-us", "9"]);
        apply(&mut a, f, &given, Path::new("/etc/fp"));
        assert_eq!(a.listen, "127.0.0.1:1234");
        assert_eq!(a.busy_poll_us, 9, "the flag wins");
        assert!(a.sparse);
        assert_eq!(
            a.drive,
            vec![PathBuf::from("/etc/fp/a.img"), PathBuf::from("/dev/b")]
        );
        assert_eq!(a.drive_size, Some(64 << 20));
        assert_eq!(a.volume_size, 1 << 20);
        assert_eq!(a.ec, (2, 1));
        assert_eq!(a.rebuild_reserve, "off");
        assert_eq!(a.metrics.as_deref(), Some("9100"));
        assert_eq!(a.data, PathBuf::from("flashpool-data"), "default kept");
    }

    /// `sim-drives` is a preset's name or a simulator file's path; a relative path is the
    /// config file's neighbour, as every path in it is.
    #[test]
    fn sim_drives_file_is_taken_from_the_files_directory() {
        for (value, want) in [
            ("ssd.toml", "/etc/fp/ssd.toml"),
            ("sims/ssd.toml", "/etc/fp/sims/ssd.toml"),
            ("/opt/ssd.toml", "/opt/ssd.toml"),
            ("tlc", "tlc"),
            ("small", "small"),
        ] {
            let f = parse(&format!("sim-drives = {value:?}\n")).unwrap();
            let (mut a, given) = args(&[]);
            apply(&mut a, f, &given, Path::new("/etc/fp"));
            assert_eq!(a.sim_drives.as_deref(), Some(want), "{value}");
        }
        let f = parse("sim-drives = \"ssd.toml\"\n").unwrap();
        let (mut a, given) = args(&["--sim-drives", "here.toml"]);
        apply(&mut a, f, &given, Path::new("/etc/fp"));
        assert_eq!(
            a.sim_drives.as_deref(),
            Some("here.toml"),
            "the flag wins as given"
        );
    }

    #[test]
    fn flag_equal_to_its_default_still_wins() {
        let f = parse("busy-poll-us = 7\n").unwrap();
        let d = flashpool_nbd::config::DEFAULT_BUSY_POLL
            .as_micros()
            .to_string();
        let (mut a, given) = args(&["--busy-poll-us", &d]);
        apply(&mut a, f, &given, Path::new("."));
        assert_eq!(a.busy_poll_us.to_string(), d);
    }

    #[test]
    fn nvme_host_access_keys() {
        let text = "nvme-tcp = \"127.0.0.1:4420\"\nnvme-allow-host = [\"nqn.2014-08.org.nvmexpress:uuid:a\"]\nnvme-dhchap-secret = \"secrets\"\nnvme-dhchap-dhgroup = \"ffdhe3072\"\n";
        let f = parse(text).unwrap();
        let (mut a, given) = args(&[]);
        apply(&mut a, f, &given, Path::new("/etc/flashpool"));
        assert_eq!(a.nvme_allow_host, ["nqn.2014-08.org.nvmexpress:uuid:a"]);
        assert_eq!(
            a.nvme_dhchap_secret.as_deref(),
            Some(Path::new("/etc/flashpool/secrets")),
            "relative to the file"
        );
        assert_eq!(a.nvme_dhchap_dhgroup.as_deref(), Some("ffdhe3072"));
        let text =
            "nvme-tcp = \"127.0.0.1:4420\"\nnvme-tls = \"require\"\nnvme-tls-psk = \"tls.psk\"\n";
        let (mut a, given) = args(&[]);
        apply(
            &mut a,
            parse(text).unwrap(),
            &given,
            Path::new("/etc/flashpool"),
        );
        assert_eq!(a.nvme_tls, "require");
        assert_eq!(
            a.nvme_tls_psk.as_deref(),
            Some(Path::new("/etc/flashpool/tls.psk"))
        );
        let (mut a, given) = args(&["--nvme-tcp", "127.0.0.1:1", "--nvme-tls", "on"]);
        apply(&mut a, parse(text).unwrap(), &given, Path::new("."));
        assert_eq!(a.nvme_tls, "on", "the flag wins");
        let err = parse("\nnvme-tls = \"maybe\"\n").unwrap_err();
        assert!(err.starts_with("line 2, column "), "{err}");
        let err = parse("\nnvme-allow-host = \"nqn.x\"\n").unwrap_err();
        assert!(err.starts_with("line 2, column "), "{err}");
    }

    /// The file takes a value exactly when the flag does (both ask the flag's parser), and
    /// a refusal says what the flag would.
    #[test]
    fn keys_take_what_their_flags_take() {
        for (key, values) in [
            ("stripe-writers", &["0", "1", "64", "65"][..]),
            ("drives", &["0", "1", "64", "65"][..]),
            ("nbd-reactors", &["0", "256", "257"][..]),
            ("busy-poll-us", &["0", "1000000", "1000001"][..]),
            ("read-poll-us", &["0", "1000000", "1000001"][..]),
            ("scrub-interval-hours", &["0", "87600", "87601"][..]),
            ("scrub-rate-mib", &["0", "1", "100000", "100001"][..]),
            ("max-handshakes-per-peer", &["0", "1", "100001"][..]),
            ("sim-timing", &["\"real\"", "\"off\"", "\"fast\""][..]),
            ("tls", &["\"off\"", "\"require\"", "\"maybe\""][..]),
            ("nvme-tls", &["\"on\"", "\"maybe\""][..]),
            ("rebuild-reserve", &["\"on\"", "\"off\"", "\"maybe\""][..]),
            ("volume-size", &["0", "\"0\"", "\"0G\"", "1", "\"1G\""][..]),
        ] {
            for v in values {
                let file = parse(&format!("{key} = {v}\n"));
                let flag = Cli::try_parse_from([
                    "serve".to_string(),
                    format!("--{key}={}", v.trim_matches('"')),
                ]);
                let flag_refused = matches!(&flag, Err(e) if matches!(
                    e.kind(),
                    clap::error::ErrorKind::InvalidValue | clap::error::ErrorKind::ValueValidation
                ));
                assert_eq!(file.is_err(), flag_refused, "{key} = {v}: {file:?}");
                if let Err(e) = file {
                    assert!(e.contains(&format!("--{key}")), "{key} = {v}: {e}");
                }
            }
        }
        let err = parse("search = [\"a\", \"[\"]\n").unwrap_err();
        assert!(err.contains("not a valid glob"), "{err}");
        assert!(parse("rebuild-reserve = false\n").is_ok());
    }

    #[test]
    fn errors_name_the_line() {
        for (text, line, words) in [
            ("listen = \"x:1\"\n\nbogus = 3\n", 3, &["bogus"][..]),
            ("busy-poll-us = 5000000\n", 1, &["1000000"][..]),
            ("\ndrive-size = \"12Q\"\n", 2, &["suffix"][..]),
            ("tls = \"maybe\"\n", 1, &["off, on, require"][..]),
            ("ec = 4\n", 1, &["string"][..]),
            (
                "\nvolume-size = \"0M\"\n",
                2,
                &["--volume-size", "volume size 0"][..],
            ),
            ("listen = \n", 1, &[][..]),
            ("metrics = \"nowhere:port\"\n", 1, &["metrics", "port"][..]),
            ("[serve]\nlisten = \"a:1\"\n", 1, &["serve"][..]),
        ] {
            let err = parse(text).unwrap_err();
            assert!(
                err.starts_with(&format!("line {line}, column ")),
                "{text:?}: {err}"
            );
            for w in words {
                assert!(err.contains(w), "{text:?}: {err} lacks {w}");
            }
        }
    }
}
