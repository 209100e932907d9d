//! `flashpool serve`: open (or create) the pool in a data dir and export its volumes over NBD
//! until SIGINT or SIGTERM, then flush, checkpoint and exit 0.

use crate::datadir::{self, OpenRequest, PoolShape};
use crate::export::PoolExports;
use crate::size::{parse_drive_size, parse_ec, parse_volume_size};
use anyhow::{Context, Result};
use clap::Args;
use flashpool_nbd::{Config, Server};
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `flashpool serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Read settings from this TOML file: keys are the long flag names (`listen =
    /// "0.0.0.0:10809"`, `busy-poll-us = 50`, `drive = ["/dev/sdb", "/dev/sdc"]`); flags given
    /// here override it; relative paths in it are taken from its directory (docs/OPERATIONS.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data dir holding the pool (created on first run).
    #[arg(long, default_value = "flashpool-data")]
    pub data: PathBuf,
    /// TCP address to listen on.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub listen: String,
    /// Also serve every volume over NVMe/TCP on `HOST[:PORT]` (port 4420 when none): one
    /// subsystem per pool, one namespace per volume.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub nvme_tcp: Option<String>,
    /// The NVMe subsystem NQN (default: derived from the pool's UUID).
    #[arg(long, requires = "nvme_tcp")]
    pub nvme_nqn: Option<String>,
    /// Only this host NQN may connect over NVMe/TCP (repeat for more hosts; the hosts of
    /// --nvme-dhchap-secret are allowed too). Without either, any host may connect.
    #[arg(long, value_name = "HOSTNQN", requires = "nvme_tcp")]
    pub nvme_allow_host: Vec<String>,
    /// DH-HMAC-CHAP secrets: a file of lines `HOSTNQN DHHC-1:..: [CONTROLLER-SECRET]`; each
    /// host listed must authenticate (and may authenticate the target with the controller
    /// secret); only listed or --nvme-allow-host hosts may connect. Keep it mode 600.
    #[arg(long, value_name = "FILE", requires = "nvme_tcp")]
    pub nvme_dhchap_secret: Option<PathBuf>,
    /// The DH group of DH-HMAC-CHAP when the host offers it: null (no Diffie-Hellman exchange)
    /// or ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192 (the Linux host offers them
    /// all). Default: null.
    #[arg(long, value_name = "GROUP", requires = "nvme_dhchap_secret")]
    pub nvme_dhchap_dhgroup: Option<String>,
    /// TLS for NVMe/TCP (TLS 1.3 with pre-shared keys, `nvme connect --tls`): off; on (hosts
    /// may use it); require (plain connections are closed). Needs --nvme-tls-psk.
    #[arg(long, default_value = "off", value_parser = ["off", "on", "require"], requires = "nvme_tcp")]
    pub nvme_tls: String,
    /// NVMe/TCP TLS pre-shared keys: a file of lines `HOSTNQN NVMeTLSkey-1:..:` (as `nvme
    /// gen-tls-key` prints them), one per host. Refused if others may read it: chmod 600.
    #[arg(long, value_name = "FILE", requires = "nvme_tcp")]
    pub nvme_tls_psk: Option<PathBuf>,
    /// Also listen on this Unix socket.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Serve one connection on stdin/stdout, for clients that run the server as a
    /// subprocess and talk over its stdin/stdout (libnbd's nbd_connect_command: `nbdsh -c
    /// 'h.connect_command(["flashpool", "serve", "--stdio"])'`, `nbdfuse DIR --command
    /// flashpool serve --stdio`). `nbdinfo -- [ flashpool serve ]` and nbdcopy's `[ ... ]`
    /// pass a socket by systemd socket activation instead: run it there without --stdio.
    #[arg(long)]
    pub stdio: bool,
    /// Number of drive files of a new pool (default 5, under DIR/drives/; at most 64).
    #[arg(long, conflicts_with = "drive", value_parser = parse_drive_count)]
    pub drives: Option<usize>,
    /// A block device (used whole) or file (created at --drive-size if missing) for a new
    /// pool, repeated once per drive; also a place to look for the members of an existing
    /// pool. Refused if it holds a filesystem, a partition table or another pool, unless
    /// --force.
    #[arg(long = "drive", value_name = "PATH")]
    pub drive: Vec<PathBuf>,
    /// A path or glob to search for members that moved (e.g. '/dev/disk/by-id/*'), repeated;
    /// kept in the data dir's member record.
    #[arg(long, value_name = "GLOB", value_parser = parse_search)]
    pub search: Vec<String>,
    /// Create the pool over --drive devices even if they hold a filesystem, a partition table
    /// or another pool's superblock.
    #[arg(long)]
    pub force: bool,
    /// Leave new drive files sparse (by default they are allocated, so the host filesystem
    /// filling up cannot fail the pool).
    #[arg(long)]
    pub sparse: bool,
    /// Protection of a new pool: K data + M parity chunks per stripe (M = 0, 1 or 2).
    #[arg(long, default_value = "4+1", value_parser = parse_ec)]
    pub ec: (usize, usize),
    /// Size of each drive file of a new pool [default: 1G, or what fits when the filesystem
    /// under the data dir has less room for them].
    #[arg(long, value_parser = parse_drive_size)]
    pub drive_size: Option<u64>,
    /// Size of the `default` volume of a new pool (thin).
    #[arg(long, default_value = "1G", value_parser = parse_volume_size)]
    pub volume_size: u64,
    /// Memory drives instead of files (benchmarks; nothing survives exit). Their memory is
    /// taken and touched whole at start (drives x --drive-size: 5 GiB for the default shape),
    /// so page faults stay off the write path; refused when more than the memory available.
    #[arg(long)]
    pub memory: bool,
    /// Simulated SSDs instead of files: a `flashpool sim` preset name (slc, mlc, tlc, qlc,
    /// small) or a simulator TOML file, scaled to --drive-size. Data in memory (nothing
    /// survives exit); each drive's FTL counts NAND programs, GC moves and erases, and
    /// `status` shows the end-to-end write amplification and each drive's latency.
    #[arg(long, value_name = "PRESET|FILE")]
    pub sim_drives: Option<String>,
    /// With --sim-drives: `real` makes every drive operation take the time the device's NAND
    /// would (reads wait behind programs and erases on their die, writes behind the device's
    /// own GC); `off` completes them at once (counters only).
    #[arg(long, default_value = "real", value_parser = ["real", "off"])]
    pub sim_timing: String,
    /// Seconds a failed drive gets to come back (a transient fault) before its data is
    /// rebuilt onto the other drives.
    #[arg(long, default_value_t = 30)]
    pub rebuild_delay: u64,
    /// Longest busy poll, in microseconds (0 = off): a connection that has answered
    /// everything polls its socket up to this long (adapted to the client: polling backs off
    /// while the client is slow or idle) before it sleeps. Lower latency at low queue depth,
    /// for CPU time while it polls; at most half the CPUs poll at once (docs/NBD.md). At most
    /// 1000000.
    #[arg(long, default_value_t = flashpool_nbd::config::DEFAULT_BUSY_POLL.as_micros() as u64,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub busy_poll_us: u64,
    /// Polling while reads are in flight, in microseconds (0 = off, the default): an NBD
    /// connection whose reads are on the drives, with nothing else to do, asks them and its
    /// socket for up to this long before it sleeps, so it takes the next completion or
    /// request without a wake-up, for the CPU time it spins. For machines with cores to
    /// spare; shares busy polling's bound on connections polling at once (docs/NBD.md). At
    /// most 1000000.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub read_poll_us: u64,
    /// NBD reactor threads (0 = a thread per connection, the default): a fixed set of
    /// threads, each serving many connections past their handshake, with its own workers
    /// for flushes and large writes (docs/NBD.md). Busy polling and read polling do not
    /// apply to them. Also read from FLASHPOOL_NBD_REACTORS. At most 256.
    #[arg(long, default_value_t = 0, env = "FLASHPOOL_NBD_REACTORS",
          value_parser = clap::value_parser!(u64).range(0..=256))]
    pub nbd_reactors: u64,
    /// Hold back room to rebuild a lost member's data: hosts get ENOSPC for new blocks before
    /// live data exceeds what the pool could hold after losing one more member (on), or may
    /// fill the pool to the last segment (off).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub rebuild_reserve: String,
    /// Threads that write sealed stripes to file and block-device drives (memory drives
    /// take none), so host writes go on filling stripes while the drives work.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub stripe_writers: u64,
    /// Hours between background scrubs (every stripe read and checked, damage repaired);
    /// 0 turns the background scrub off (`flashpool scrub` still works). At most 87600 (ten
    /// years).
    #[arg(long, default_value_t = 168, value_parser = clap::value_parser!(u64).range(0..=87_600))]
    pub scrub_interval_hours: u64,
    /// Read rate of the background scrub, in MiB/s.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub scrub_rate_mib: u64,
    /// Seconds a client gets from connecting to the end of the NBD handshake (0 = no limit);
    /// slow or idle clients are disconnected so they cannot lock others out.
    #[arg(long, default_value_t = 10)]
    pub handshake_timeout: u64,
    /// Connections in handshake at once from one peer address.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_handshakes_per_peer: u64,
    /// TLS for NBD (NBD_OPT_STARTTLS): off; on (clients may use it); require (clients must,
    /// before anything else). Needs --tls-certificates or --tls-psk.
    #[arg(long, default_value = "off", value_parser = ["off", "on", "require"])]
    pub tls: String,
    /// Directory holding ca-cert.pem, server-cert.pem and server-key.pem (nbdkit's layout).
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Pre-shared keys for TLS-PSK, in psktool's format (identity:hexkey per line).
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// With --tls-certificates: clients must present a certificate signed by ca-cert.pem.
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (a bare PORT listens on
    /// 127.0.0.1 only).
    #[arg(long, value_name = "[HOST:]PORT")]
    pub metrics: Option<String>,
    /// Serve the admin JSON API (docs/openapi.yaml) on a listener of its own (a bare PORT
    /// listens on 127.0.0.1 only); needs --api-token-file. With --api-token-file alone, the
    /// API is served on the --metrics listener.
    #[arg(long, value_name = "[HOST:]PORT")]
    pub api: Option<String>,
    /// File whose first line is the admin API's bearer token (16 characters at least):
    /// requests without `Authorization: Bearer TOKEN` are refused (401).
    #[arg(long, value_name = "FILE")]
    pub api_token_file: Option<PathBuf>,
    /// Let the admin API answer peers that are not on this machine (by default it answers
    /// loopback peers only, and --api refuses a non-loopback address).
    #[arg(long)]
    pub api_allow_remote: bool,
}

/// The HTTP listeners asked for, bound before the data dir is touched.
struct HttpPlan {
    metrics: Option<std::net::TcpListener>,
    api: Option<std::net::TcpListener>,
    token: Option<crate::ops::http_api::Token>,
}

/// `--search`: a valid glob (a bad one would be kept in the member record and skipped at
/// every open, with a warning nobody reads until a member has moved).
pub(crate) fn parse_search(s: &str) -> Result<String, String> {
    glob::Pattern::new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("not a valid glob: {e}"))
}

/// `--drives`: 1 to the engine's most members (`MAX_DRIVES`), checked before any file is made.
pub(crate) fn parse_drive_count(s: &str) -> Result<usize, String> {
    use flashpool_engine::format::superblock::MAX_DRIVES;
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_DRIVES).contains(&n) => Ok(n),
        _ => Err(format!("expected 1 to {MAX_DRIVES} drives")),
    }
}

fn bind(flag: &str, spec: &str) -> Result<(std::net::TcpListener, bool)> {
    use std::net::ToSocketAddrs;
    let addr = crate::ops::listen_address(spec).with_context(|| flag.to_string())?;
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .with_context(|| format!("{flag} {addr:?}: not a HOST:PORT address"))?
        .collect();
    let l = std::net::TcpListener::bind(&addrs[..])
        .with_context(|| format!("{flag} {addr}: cannot listen there"))?;
    let loopback = l.local_addr().is_ok_and(|a| crate::ops::is_loopback(&a));
    Ok((l, loopback))
}

fn http_plan(a: &ServeArgs) -> Result<HttpPlan> {
    let token = a
        .api_token_file
        .as_deref()
        .map(crate::ops::http_api::Token::load)
        .transpose()?;
    if a.api.is_some() && token.is_none() {
        anyhow::bail!(
            "--api needs --api-token-file FILE (the API refuses requests without its bearer token)"
        );
    }
    if token.is_some() && a.api.is_none() && a.metrics.is_none() {
        anyhow::bail!(
            "--api-token-file needs --api [HOST:]PORT or --metrics [HOST:]PORT to serve the API on"
        );
    }
    let metrics = match &a.metrics {
        Some(spec) => {
            let (l, loopback) = bind("--metrics", spec)?;
            if !loopback && token.is_some() && a.api.is_none() && !a.api_allow_remote {
                tracing::warn!("the admin API shares the --metrics listener, which is not loopback: it answers loopback peers only (--api-allow-remote)");
            }
            Some(l)
        }
        None => None,
    };
    let api = match &a.api {
        Some(spec) => {
            let (l, loopback) = bind("--api", spec)?;
            if !loopback && !a.api_allow_remote {
                anyhow::bail!("--api {spec}: not a loopback address; --api-allow-remote lets other machines reach the admin API");
            }
            Some(l)
        }
        None => None,
    };
    Ok(HttpPlan {
        metrics,
        api,
        token,
    })
}

/// The NVMe/TCP TLS of `--nvme-tls` / `--nvme-tls-psk`, read and checked before the data dir is
/// touched (a bad or world-readable key file stops the server here).
fn nvme_tls(a: &ServeArgs) -> Result<Option<Arc<flashpool_nvmet::NvmeTls>>> {
    let mode: flashpool_nvmet::TlsMode = a
        .nvme_tls
        .parse()
        .map_err(|e| anyhow::anyhow!("--nvme-tls {e}"))?;
    if mode == flashpool_nvmet::TlsMode::Off && a.nvme_tls_psk.is_some() {
        anyhow::bail!("--nvme-tls-psk needs --nvme-tls on or require");
    }
    let (tls, warning) = flashpool_nvmet::NvmeTls::configure(mode, a.nvme_tls_psk.as_deref())
        .map_err(|e| anyhow::anyhow!("--nvme-tls / --nvme-tls-psk: {e}"))?;
    if let Some(w) = warning {
        tracing::warn!("{w}");
        eprintln!("warning: {w}");
    }
    if let Some(t) = &tls {
        tracing::info!("NVMe/TCP TLS {:?}: {}", t.mode, t.describe);
    }
    Ok(tls)
}

/// The TLS setup the flags ask for (None: off); every inconsistency is an error.
fn tls_from(a: &ServeArgs) -> Result<Option<flashpool_nbd::Tls>> {
    use flashpool_nbd::{Tls, TlsCredentials, TlsMode};
    let mode = match a.tls.as_str() {
        "on" => TlsMode::On,
        "require" => TlsMode::Require,
        _ => TlsMode::Off,
    };
    let creds = match (&a.tls_certificates, &a.tls_psk) {
        (Some(_), Some(_)) => anyhow::bail!("--tls-certificates and --tls-psk exclude each other"),
        (Some(dir), None) => Some(TlsCredentials::X509 {
            dir: dir.clone(),
            verify_peer: a.tls_verify_peer,
        }),
        (None, Some(file)) => Some(TlsCredentials::Psk { file: file.clone() }),
        (None, None) => None,
    };
    if a.tls_verify_peer && a.tls_certificates.is_none() {
        anyhow::bail!("--tls-verify-peer needs --tls-certificates");
    }
    match (mode, creds) {
        (TlsMode::Off, None) => Ok(None),
        (TlsMode::Off, Some(_)) => {
            anyhow::bail!("--tls-certificates/--tls-psk given but --tls is off: say --tls on or --tls require")
        }
        (_, None) => anyhow::bail!(
            "--tls {} needs --tls-certificates DIR or --tls-psk FILE",
            a.tls
        ),
        (mode, Some(c)) => {
            if a.stdio {
                anyhow::bail!("--tls is for network listeners, not --stdio");
            }
            Ok(Some(Tls::new(mode, &c).context("TLS")?))
        }
    }
}

/// Checks before the data dir is touched that `--socket` can be listened on, as
/// `Server::listen_unix` will decide later: a path that exists is refused unless it is a
/// socket nobody answers on (a server that died); a new one must be creatable.
fn check_socket(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::net::{UnixListener, UnixStream};
    match std::fs::symlink_metadata(path) {
        Ok(md) if !md.file_type().is_socket() => {
            anyhow::bail!("--socket {}: it exists and is not a socket", path.display())
        }
        Ok(_) => match UnixStream::connect(path) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
            _ => anyhow::bail!(
                "--socket {}: another server is listening there",
                path.display()
            ),
        },
        Err(_) => {
            UnixListener::bind(path)
                .with_context(|| format!("--socket {}: cannot listen there", path.display()))?;
            let _ = std::fs::remove_file(path);
            Ok(())
        }
    }
}

/// Warns when flags that shape a new pool were given on the command line for a pool that
/// exists: they are ignored, and saying nothing let a user believe `--ec 8+2` took effect.
fn warn_shape_ignored(dir: &std::path::Path, pool: &flashpool_engine::Pool) {
    let Ok(given) = crate::ops::config::command_line_flags() else {
        return;
    };
    let flags: Vec<&str> = [
        ("drives", "--drives"),
        ("ec", "--ec"),
        ("drive_size", "--drive-size"),
        ("volume_size", "--volume-size"),
        ("sparse", "--sparse"),
    ]
    .into_iter()
    .filter(|(id, _)| given.contains(*id))
    .map(|(_, flag)| flag)
    .collect();
    if !flags.is_empty() {
        let info = pool.info();
        tracing::warn!(
            "{} holds a pool already: {} shape a new pool only and are ignored; the pool keeps its shape ({}+{}, {} members, drives of {} MiB)",
            dir.display(),
            flags.join(", "),
            info.k,
            info.m,
            info.member_drives,
            info.drive_size >> 20
        );
    }
}

/// Runs `flashpool serve`.
pub fn run(mut a: ServeArgs) -> Result<()> {
    if let Some(file) = a.config.clone() {
        let settings = crate::ops::config::load(&file)?;
        let given = crate::ops::config::command_line_flags()?;
        let base = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        crate::ops::config::apply(&mut a, settings, &given, base);
        // clap checked these on the command line alone.
        if a.drives.is_some() && !a.drive.is_empty() {
            anyhow::bail!(
                "drives and drive (--drives, --drive) exclude each other ({} sets one of them)",
                file.display()
            );
        }
        if a.nvme_nqn.is_some() && a.nvme_tcp.is_none() {
            anyhow::bail!("nvme-nqn (--nvme-nqn) needs nvme-tcp (--nvme-tcp)");
        }
        if a.nvme_dhchap_dhgroup.is_some() && a.nvme_dhchap_secret.is_none() {
            anyhow::bail!(
                "nvme-dhchap-dhgroup (--nvme-dhchap-dhgroup) needs nvme-dhchap-secret \
                 (--nvme-dhchap-secret)"
            );
        }
        if (!a.nvme_allow_host.is_empty()
            || a.nvme_dhchap_secret.is_some()
            || a.nvme_tls != "off"
            || a.nvme_tls_psk.is_some())
            && a.nvme_tcp.is_none()
        {
            anyhow::bail!(
                "nvme-allow-host, nvme-dhchap-secret, nvme-tls and nvme-tls-psk \
                 (--nvme-allow-host, --nvme-dhchap-secret, --nvme-tls, --nvme-tls-psk) \
                 need nvme-tcp (--nvme-tcp)"
            );
        }
    }
    // Read and check the NVMe host secrets now, before touching the data dir.
    let nvme_access = match &a.nvme_tcp {
        Some(_) => {
            let (access, warning) = flashpool_nvmet::HostAccess::configure(
                &a.nvme_allow_host,
                a.nvme_dhchap_secret.as_deref(),
            )
            .map_err(|e| anyhow::anyhow!("--nvme-dhchap-secret / --nvme-allow-host: {e}"))?;
            if let Some(w) = warning {
                tracing::warn!("{w}");
                eprintln!("warning: {w}");
            }
            let mut access = access;
            if let Some(g) = &a.nvme_dhchap_dhgroup {
                let id = flashpool_nvmet::auth::dhgroup_by_name(g).ok_or_else(|| {
                    anyhow::anyhow!(
                        "--nvme-dhchap-dhgroup {g:?}: null, ffdhe2048, ffdhe3072, ffdhe4096, \
                         ffdhe6144 or ffdhe8192"
                    )
                })?;
                access.dhgroup = Some(id).filter(|&g| g != 0);
            }
            access
        }
        None => flashpool_nvmet::HostAccess::default(),
    };
    let nvme_tls = nvme_tls(&a)?;
    let tls = tls_from(&a)?;
    let mut http = http_plan(&a)?;
    if !a.stdio && std::env::var_os("LISTEN_FDS").is_none() {
        // Check the address (and that the port is free) before touching the data dir, so a
        // typo never leaves a new pool behind.
        use std::net::ToSocketAddrs;
        let addrs: Vec<_> = a
            .listen
            .to_socket_addrs()
            .with_context(|| format!("--listen {:?}: not a HOST:PORT address", a.listen))?
            .collect();
        if let Err(e) = std::net::TcpListener::bind(&addrs[..]) {
            // The metrics and API listeners are bound by now: a port they took is named, not
            // blamed on --listen alone.
            for (flag, l) in [("--metrics", &http.metrics), ("--api", &http.api)] {
                if let Some(taken) = l.as_ref().and_then(|l| l.local_addr().ok()) {
                    if addrs.iter().any(|x| x.port() == taken.port()) {
                        anyhow::bail!(
                            "--listen {} and {flag} ({taken}) name the same port: give them different ports",
                            a.listen
                        );
                    }
                }
            }
            return Err(e).with_context(|| format!("--listen {}: cannot listen there", a.listen));
        }
        if let Some(path) = &a.socket {
            check_socket(path)?;
        }
    }
    if a.memory && !a.drive.is_empty() {
        anyhow::bail!("--memory and --drive exclude each other");
    }
    let sim = match &a.sim_drives {
        None => None,
        Some(_) if !a.drive.is_empty() || a.memory => {
            anyhow::bail!("--sim-drives excludes --memory and --drive")
        }
        Some(p) => Some(crate::sim_drive::load_config(p)?),
    };
    let req = OpenRequest {
        shape: PoolShape {
            drives: a.drives.unwrap_or(5),
            k: a.ec.0,
            m: a.ec.1,
            drive_size: a.drive_size,
            memory: a.memory || sim.is_some(),
            sparse: a.sparse,
            sim_real_time: sim.is_some() && a.sim_timing == "real",
            sim,
        },
        default_volume: a.volume_size,
        drives: a.drive.clone(),
        search: a.search.clone(),
        force: a.force,
        create: true,
        read_only: false,
        read_only_if_full: true,
    };
    let dd = datadir::open(&a.data, &req)?;
    if !dd.created {
        warn_shape_ignored(&dd.dir, &dd.pool);
    }
    let info = dd.pool.info();
    tracing::info!(
        data = %dd.dir.display(),
        created = dd.created,
        drives = info.drive_count,
        protection = %format!("{}+{}", info.k, info.m),
        "pool ready"
    );
    dd.pool.set_rebuild_reserve(a.rebuild_reserve == "on");
    // Sealed stripes are written by threads of their own, so host writes go on while
    // the drives work (engine `stripe_writer.rs`); memory drives complete at once, and there
    // the hand-off would cost more than the write.
    if !dd.pool.drives_complete_inline() {
        dd.pool.start_stripe_writers(a.stripe_writers as usize)?;
    }
    let dd_dir = dd.dir.clone();
    let pool = Arc::new(dd.pool);
    let stop_cleaner = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let window = Arc::new(crate::wa_window::WaWindow::default());
    let controls = Arc::new(crate::admin::Controls::default());
    let cleaner = spawn_cleaner(
        pool.clone(),
        stop_cleaner.clone(),
        a.rebuild_delay,
        window.clone(),
        controls.clone(),
    );
    let admin = Arc::new(crate::admin::AdminCtx {
        pool: pool.clone(),
        dir: dd_dir.clone(),
        window: window.clone(),
        controls: controls.clone(),
        rebuild_reserve: a.rebuild_reserve == "on",
        nvme: std::sync::OnceLock::new(),
    });
    if a.scrub_interval_hours > 0 {
        spawn_scrubber(
            pool.clone(),
            std::time::Duration::from_secs(a.scrub_interval_hours * 3600),
            a.scrub_rate_mib << 20,
        );
    }
    if !a.memory {
        let path = crate::admin::spawn(admin.clone())?;
        tracing::info!(socket = %path.display(), "admin socket");
    }
    let metrics = match http.metrics.is_some() {
        true => Some(Arc::new(
            crate::ops::metrics::Metrics::new(pool.clone(), controls.clone())
                .context("setting up metrics")?,
        )),
        false => None,
    };
    let api = http.token.take().map(|token| {
        Arc::new(crate::ops::http_api::Api {
            ctx: admin.clone(),
            token,
            allow_remote: a.api_allow_remote,
        })
    });
    if let Some(l) = http.metrics.take() {
        use crate::ops::http_api::{spawn, Door};
        let with_api = a.api.is_none();
        let door = Door {
            metrics: metrics.clone(),
            api: if with_api { api.clone() } else { None },
        };
        let addr = spawn(l, door, "--metrics")?;
        eprintln!("metrics on http://{addr}/metrics");
        if with_api && api.is_some() {
            eprintln!("admin API on http://{addr}/api/v1/");
        }
    }
    if let Some(l) = http.api.take() {
        use crate::ops::http_api::{spawn, Door};
        let door = Door {
            metrics: None,
            api: api.clone(),
        };
        let addr = spawn(l, door, "--api")?;
        eprintln!("admin API on http://{addr}/api/v1/");
    }
    if a.nbd_reactors > 0 && a.read_poll_us > 0 {
        // Not refused: the reactors may come from FLASHPOOL_NBD_REACTORS, the polling from a
        // config file written for connection threads.
        tracing::warn!(
            read_poll_us = a.read_poll_us,
            nbd_reactors = a.nbd_reactors,
            "read polling applies to connection threads, not reactors: read-poll-us has no effect with nbd-reactors"
        );
    }
    let config = Config {
        busy_poll: std::time::Duration::from_micros(a.busy_poll_us),
        read_poll: std::time::Duration::from_micros(a.read_poll_us),
        reactors: a.nbd_reactors as usize,
        handshake_timeout: std::time::Duration::from_secs(a.handshake_timeout),
        max_handshakes_per_peer: a.max_handshakes_per_peer as usize,
        tls: tls.clone(),
        ..Config::default()
    };
    if let Some(t) = &tls {
        tracing::info!(mode = ?t.mode, "TLS: {}", t.describe);
    }
    let scheme = if tls.is_some() { "nbds" } else { "nbd" };
    let exports: Arc<dyn flashpool_nbd::ExportSet> = match &metrics {
        // Counted per volume for /metrics; uncounted (nothing on the I/O path) otherwise.
        Some(m) => Arc::new(m.exports()),
        None => Arc::new(PoolExports(pool.clone())),
    };
    let mut server = Server::new(exports, config)?;
    let nvme = match &a.nvme_tcp {
        Some(addr) => {
            let (running, uri, sync) = crate::nvme::spawn(
                &pool,
                addr,
                a.nvme_nqn.clone(),
                nvme_access.clone(),
                nvme_tls.clone(),
            )?;
            let _ = admin.nvme.set(sync);
            if a.stdio {
                eprintln!("{uri}");
            } else {
                println!("{uri}");
            }
            Some(running)
        }
        None => None,
    };
    let say = |line: String| {
        if a.stdio {
            eprintln!("{line}")
        } else {
            println!("{line}")
        }
    };
    if a.stdio {
        server.run_stdio().context("serving stdin/stdout")?;
    } else {
        let activated = server.listen_activated().context("socket activation")?;
        if activated == 0 {
            let addr = server
                .listen_tcp(&a.listen)
                .with_context(|| format!("listening on {}", a.listen))?;
            for v in pool.volumes() {
                say(format!("{scheme}://{addr}/{}", v.name));
            }
            if let Some(s) = &a.socket {
                server
                    .listen_unix(s)
                    .with_context(|| format!("listening on {}", s.display()))?;
                for v in pool.volumes() {
                    say(format!(
                        "{scheme}+unix:///{}?socket={}",
                        v.name,
                        s.display()
                    ));
                }
            }
        } else {
            // Spawned by a client (nbdinfo -- [ ... ]): stdout may be the client's own output.
            eprintln!("serving on {activated} socket-activated listener(s)");
        }
        let handle = server.shutdown_handle();
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
        ])?;
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(signal = sig, "shutting down");
                handle.shutdown();
            }
        });
        use std::io::Write;
        let _ = std::io::stdout().flush();
        server.run().context("serving NBD")?;
    }
    if let Some(n) = nvme {
        // Every NVMe/TCP connection ends before the pool closes under it.
        if let Err(e) = n.shutdown_and_join() {
            tracing::warn!(error = %e, "stopping the NVMe/TCP target");
        }
    }
    stop_cleaner.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = cleaner.join();
    if !a.memory {
        let _ = std::fs::remove_file(crate::admin::socket_path(&dd_dir));
    }
    pool.close().context("closing the pool")?;
    tracing::info!("pool closed cleanly");
    Ok(())
}

/// How often a member whose drive file was deleted is named again in the log.
const UNLINKED_REMINDER: std::time::Duration = std::time::Duration::from_secs(600);

/// Logs, at error level, each member whose drive file was deleted while the server holds it
/// open (`Pool::unlinked_members`): when it is first seen and every `UNLINKED_REMINDER` after.
/// Nothing fails meanwhile (the open file serves as before), which is why the log must say it:
/// a restart will not find the member. `told`: the members named, and when.
fn report_unlinked(pool: &flashpool_engine::Pool, told: &mut Vec<(usize, std::time::Instant)>) {
    let now_unlinked = pool.unlinked_members();
    told.retain(|(m, _)| now_unlinked.contains(m));
    let due: Vec<usize> = now_unlinked
        .into_iter()
        .filter(|m| {
            told.iter()
                .find(|(t, _)| t == m)
                .is_none_or(|(_, at)| at.elapsed() >= UNLINKED_REMINDER)
        })
        .collect();
    if due.is_empty() {
        return; // the usual turn: no member list built
    }
    let drives = pool.drives();
    for m in due {
        told.retain(|(t, _)| *t != m);
        told.push((m, std::time::Instant::now()));
        let path = drives.get(m).map_or("?", |d| d.identity.as_str());
        tracing::error!(
            drive = m,
            path,
            "the member's drive file was deleted while the server holds it open: it still \
             serves, but a restart will find the member missing; put a drive in its place \
             (`flashpool drive replace N PATH`) or remove it (`flashpool drive remove N`) \
             while the server runs"
        );
    }
}

/// Segments the cleaner thread indexes for degraded reads per turn (each a scan of its chunk
/// headers, tens of milliseconds on a disk), so a turn stays short.
const DEGRADED_INDEX_PER_TURN: usize = 4;

/// Background cleaning: while fewer segments are free than the high watermark, the cleaner
/// runs here, so host writes rarely meet the foreground watermark (where they clean first).
fn spawn_cleaner(
    pool: Arc<flashpool_engine::Pool>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    rebuild_delay: u64,
    window: Arc<crate::wa_window::WaWindow>,
    controls: Arc<crate::admin::Controls>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("cleaner".into())
        .spawn(move || {
            let mut lost_since: Option<std::time::Instant> = None;
            // After a failed rebuild: when to try again, and the wait after that (doubling up
            // to 10 minutes: retried, never silently; status shows the failure meanwhile).
            let mut retry_at: Option<std::time::Instant> = None;
            let mut backoff = std::time::Duration::from_secs(10);
            let mut last_sample: Option<std::time::Instant> = None;
            // Segments indexed for degraded reads since a member went out of service.
            let mut indexed: Option<(usize, std::time::Instant)> = None;
            // Members whose drive file was deleted, and when that was last logged.
            let mut unlinked_told: Vec<(usize, std::time::Instant)> = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if last_sample.is_none_or(|t| t.elapsed().as_secs() >= 10) {
                    window.sample(pool.stats());
                    last_sample = Some(std::time::Instant::now());
                }
                for d in pool.readmit_healthy_drives() {
                    tracing::info!(drive = d, "drive healthy again: back in service");
                }
                if let Err(e) = pool.sync_member_states() {
                    tracing::error!(error = %e, "cannot record a member's state in the superblocks");
                }
                report_unlinked(&pool, &mut unlinked_told);
                if pool.needs_rebuild() {
                    // Find the stripes of the lost member's segments now, a few per turn, so
                    // degraded reads do not scan chunk headers inside the read.
                    let n = pool.prepare_degraded_reads(DEGRADED_INDEX_PER_TURN);
                    let (total, since) =
                        indexed.get_or_insert_with(|| (0, std::time::Instant::now()));
                    if n > 0 {
                        *total += n;
                    } else if *total > 0 {
                        tracing::info!(
                            segments = *total,
                            secs = since.elapsed().as_secs_f64(),
                            "stripes of the lost member's segments indexed for degraded reads"
                        );
                        *total = 0;
                        *since = std::time::Instant::now();
                    }
                } else {
                    indexed = None;
                }
                let now = std::time::Instant::now();
                if !pool.needs_rebuild() {
                    lost_since = None;
                    retry_at = None;
                    backoff = std::time::Duration::from_secs(10);
                } else if lost_since.get_or_insert(now).elapsed().as_secs() >= rebuild_delay
                    && retry_at.is_none_or(|t| now >= t)
                    && !controls.rebuild_paused.load(std::sync::atomic::Ordering::SeqCst)
                {
                    tracing::warn!("a drive is out of service: rebuilding its data onto the others");
                    match pool.rebuild() {
                        Ok(st) => {
                            tracing::info!(segments = st.total_segments, mib = st.moved_bytes >> 20, "rebuild done");
                            retry_at = None;
                        }
                        Err(e) => {
                            let attempts = pool.rebuild_status().failed_attempts;
                            tracing::error!(
                                error = %e,
                                attempts,
                                retry_in_secs = backoff.as_secs(),
                                "rebuild failed: the pool runs without full redundancy until it succeeds"
                            );
                            retry_at = Some(now + backoff);
                            backoff = (backoff * 2).min(std::time::Duration::from_secs(600));
                        }
                    }
                }
                match pool.repair_pending() {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(segments = n, "repaired segments where reads met bad blocks"),
                    Err(e) => tracing::warn!(error = %e, "repair of segments with bad blocks failed; retried later"),
                }
                let high = pool.gc_high_water();
                if !controls.cleaner_paused.load(std::sync::atomic::Ordering::SeqCst)
                    && pool.info().free_segments < high
                {
                    match pool.gc_background(high) {
                        Ok(n) if n > 0 => tracing::debug!(cleaned = n, "background cleaning"),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "background cleaning failed; retrying in 10 s");
                            std::thread::sleep(std::time::Duration::from_secs(10));
                        }
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        })
        .expect("spawning the cleaner thread")
}

/// The background scrub: every `interval` (the first after one interval, or at once when the
/// pool opened members one superblock generation behind: `Pool::unverified_members`), a
/// scrub at `rate` bytes per second that repairs what it can; its report shows in
/// `flashpool status`. The thread ends with the process.
fn spawn_scrubber(pool: Arc<flashpool_engine::Pool>, interval: std::time::Duration, rate: u64) {
    let spawned = std::thread::Builder::new()
        .name("scrubber".into())
        .spawn(move || loop {
            let behind = pool.unverified_members();
            if behind.is_empty() {
                std::thread::sleep(interval);
            } else {
                tracing::info!(members = ?behind, "scrubbing now to check members opened one generation behind");
            }
            match pool.scrub(true, Some(rate)) {
                Ok(r) if !r.unrecoverable.is_empty() => tracing::error!(
                    blocks = r.unrecoverable.len(),
                    "background scrub: blocks lost (`flashpool scrub --check-only` lists them)"
                ),
                Ok(r) if r.stripes_unavailable > 0 => tracing::error!(
                    stripes = r.stripes_unavailable,
                    blocks = r.blocks_unavailable,
                    "background scrub: stripes unreadable while members are out of service"
                ),
                Ok(r) => tracing::info!(
                    bad_chunks = r.bad_chunks,
                    repaired = r.segments_repaired,
                    "background scrub done"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "background scrub failed");
                    if !behind.is_empty() {
                        // Not at once again (a read-only pool cannot repair): in a minute.
                        std::thread::sleep(interval.min(std::time::Duration::from_secs(60)));
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the background scrub");
    }
}
