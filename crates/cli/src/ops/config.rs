//! `flashpool serve --config FILE`: every setting of `flashpool serve` in a TOML file, keyed by
//! the flag's long name (`listen = "0.0.0.0:10809"`, `busy-poll-us = 50`, `drive = [...]`).
//! Flags given on the command line override the file (a list flag such as `--drive` replaces
//! the file's list; a switch such as `--sparse` can only turn a setting on). Unknown keys and
//! bad values are errors naming the file and the line. Relative paths in the file are taken
//! from the file's directory.

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
    #[serde(default, deserialize_with = "tls_mode")]
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
    #[serde(default, deserialize_with = "busy_poll")]
    pub busy_poll_us: Option<u64>,
    #[serde(default, deserialize_with = "busy_poll")]
    pub read_poll_us: Option<u64>,
    #[serde(default, deserialize_with = "reactors")]
    pub nbd_reactors: Option<u64>,
    #[serde(default, deserialize_with = "on_off")]
    pub rebuild_reserve: Option<String>,
    #[serde(default, deserialize_with = "stripe_writers")]
    pub stripe_writers: Option<u64>,
    #[serde(default, deserialize_with = "scrub_interval")]
    pub scrub_interval_hours: Option<u64>,
    #[serde(default, deserialize_with = "scrub_rate")]
    pub scrub_rate_mib: Option<u64>,
    pub handshake_timeout: Option<u64>,
    #[serde(default, deserialize_with = "per_peer")]
    pub max_handshakes_per_peer: Option<u64>,
    #[serde(default, deserialize_with = "tls_mode")]
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

fn volume_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    size(d, "volume-size").map(|(n, _)| Some(n))
}

fn ec<'de, D: Deserializer<'de>>(d: D) -> Result<Option<(usize, usize)>, D::Error> {
    custom(crate::size::parse_ec(&String::deserialize(d)?))
}

fn ranged<'de, D: Deserializer<'de>>(d: D, lo: u64, hi: u64) -> Result<Option<u64>, D::Error> {
    let v = u64::deserialize(d)?;
    if !(lo..=hi).contains(&v) {
        return Err(serde::de::Error::custom(format!(
            "{v} is not in {lo}..={hi}"
        )));
    }
    Ok(Some(v))
}

fn busy_poll<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    ranged(d, 0, 1_000_000)
}

fn reactors<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    ranged(d, 0, 256)
}

fn search<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    for p in &v {
        crate::serve::parse_search(p)
            .map_err(|e| serde::de::Error::custom(format!("{p:?}: {e}")))?;
    }
    Ok(Some(v))
}

fn scrub_interval<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    ranged(d, 0, 87_600)
}

fn scrub_rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    ranged(d, 1, 100_000)
}

fn stripe_writers<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    ranged(d, 1, 64)
}

fn per_peer<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    ranged(d, 1, 100_000)
}

fn drives<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let max = flashpool_engine::format::superblock::MAX_DRIVES as u64;
    ranged(d, 1, max).map(|v| v.map(|n| n as usize))
}

fn one_of<'de, D: Deserializer<'de>>(d: D, allowed: &[&str]) -> Result<Option<String>, D::Error> {
    let v = String::deserialize(d)?;
    if !allowed.contains(&v.as_str()) {
        return Err(serde::de::Error::custom(format!(
            "{v:?}: expected one of {}",
            allowed.join(", ")
        )));
    }
    Ok(Some(v))
}

fn sim_timing<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    one_of(d, &["real", "off"])
}

fn tls_mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    one_of(d, &["off", "on", "require"])
}

/// "on" / "off", or true / false.
fn on_off<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OnOff {
        Bool(bool),
        Text(String),
    }
    match OnOff::deserialize(d)? {
        OnOff::Bool(b) => Ok(Some(if b { "on" } else { "off" }.into())),
        OnOff::Text(t) if t == "on" || t == "off" => Ok(Some(t)),
        OnOff::Text(t) => Err(serde::de::Error::custom(format!(
            "{t:?}: expected \"on\" or \"off\" (or true or false)"
        ))),
    }
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
    set!(sim_drives, Some);
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

    #[test]
    fn errors_name_the_line() {
        for (text, line, words) in [
            ("listen = \"x:1\"\n\nbogus = 3\n", 3, &["bogus"][..]),
            ("busy-poll-us = 5000000\n", 1, &["1000000"][..]),
            ("\ndrive-size = \"12Q\"\n", 2, &["suffix"][..]),
            ("tls = \"maybe\"\n", 1, &["off, on, require"][..]),
            ("ec = 4\n", 1, &["string"][..]),
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
