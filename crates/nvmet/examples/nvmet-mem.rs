//! nvmet-mem: serve sparse RAM namespaces over NVMe/TCP, for tests (the
//! kernel initiator check, tests/e2e/check-kernel-nvme.sh) before the target
//! is wired into `flashpool serve`.
//!
//! Flags: `--listen HOST:PORT` (default 127.0.0.1:4420), `--nqn NQN` (default
//! nqn.2024-01.io.flashpool:mem), `--size SIZE` per namespace (default 256M),
//! `--namespaces N` (default 1), `--block-size 512|4096` (default 4096).
//! Prints `nvme-tcp://ADDR/NQN` once listening; stops on SIGINT/SIGTERM.
//! SIGUSR1 adds a namespace (the next NSID), SIGUSR2 removes the last one:
//! connected hosts get a namespace-attribute-changed asynchronous event.
//! NVMET_LOG sets the tracing filter (e.g. NVMET_LOG=debug).
//! `--allow-host NQN` (repeated) limits the hosts that may connect;
//! `--dhchap-secret FILE` (lines `HOSTNQN DHHC-1:..: [CTRL-SECRET]`) makes
//! those hosts authenticate with DH-HMAC-CHAP (tests/e2e/check-kernel-nvme-auth.sh);
//! `--dhchap-dhgroup ffdheN` makes the exchange use that DH group when offered.
//! `--tls off|on|require` with `--tls-psk FILE` (lines `HOSTNQN NVMeTLSkey-1:..:`)
//! serves TLS 1.3 with pre-shared keys (tests/e2e/check-kernel-nvme-tls.sh).

use std::sync::Arc;

use flashpool_nvmet::{HostAccess, MemNamespace, Server, Subsystem, TargetConfig};

mod common;
use common::parse_size;

fn main() {
    if let Err(e) = run() {
        eprintln!("nvmet-mem: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut listen = "127.0.0.1:4420".to_string();
    let mut nqn = "nqn.2024-01.io.flashpool:mem".to_string();
    let mut size = 256u64 << 20;
    let mut count = 1u32;
    let mut bs = 4096u32;
    let mut allowed = Vec::new();
    let mut secrets = None;
    let mut dhgroup = None;
    let mut tls_mode = flashpool_nvmet::TlsMode::Off;
    let mut tls_psk = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |n: &str| it.next().ok_or_else(|| format!("{n} needs a value"));
        match arg.as_str() {
            "--listen" => listen = val("--listen")?,
            "--nqn" => nqn = val("--nqn")?,
            "--allow-host" => allowed.push(val("--allow-host")?),
            "--dhchap-dhgroup" => {
                let g = val("--dhchap-dhgroup")?;
                dhgroup =
                    Some(flashpool_nvmet::auth::dhgroup_by_name(&g).ok_or_else(|| {
                        format!("--dhchap-dhgroup {g}: not null or ffdhe2048..8192")
                    })?);
            }
            "--dhchap-secret" => secrets = Some(std::path::PathBuf::from(val("--dhchap-secret")?)),
            "--tls" => tls_mode = val("--tls")?.parse().map_err(|e| format!("--tls {e}"))?,
            "--tls-psk" => tls_psk = Some(std::path::PathBuf::from(val("--tls-psk")?)),
            "--size" => size = parse_size(&val("--size")?)?,
            "--namespaces" => {
                count = val("--namespaces")?
                    .parse()
                    .map_err(|_| "bad --namespaces")?
            }
            "--block-size" => {
                bs = val("--block-size")?
                    .parse()
                    .map_err(|_| "bad --block-size")?;
                if bs != 512 && bs != 4096 {
                    return Err("--block-size must be 512 or 4096".into());
                }
            }
            "-h" | "--help" => {
                println!("usage: nvmet-mem [--listen HOST:PORT] [--nqn NQN] [--size SIZE] [--namespaces N] [--block-size 512|4096] [--allow-host NQN]... [--dhchap-secret FILE] [--dhchap-dhgroup null|ffdhe2048..ffdhe8192] [--tls off|on|require] [--tls-psk FILE]");
                return Ok(());
            }
            other => return Err(format!("unknown argument '{other}'").into()),
        }
    }
    if std::env::var_os("NVMET_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("NVMET_LOG"))
            .init();
    }
    let ns = move |i: u32| {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(b"nvmetmem");
        id[12..].copy_from_slice(&i.to_be_bytes());
        Arc::new(MemNamespace::new(size, bs, id))
    };
    let nqn_sig = nqn.clone();
    let mut sub = Subsystem::new(nqn.clone(), "nvmet-mem");
    let (access, warning) = HostAccess::configure(&allowed, secrets.as_deref())?;
    if let Some(w) = warning {
        eprintln!("nvmet-mem: warning: {w}");
    }
    sub.access = access;
    sub.access.dhgroup = dhgroup.filter(|&g| g != 0);
    for i in 1..=count {
        sub.add_namespace(i, ns(i));
    }
    let (tls, warning) = flashpool_nvmet::NvmeTls::configure(tls_mode, tls_psk.as_deref())?;
    if let Some(w) = warning {
        eprintln!("nvmet-mem: warning: {w}");
    }
    if let Some(t) = &tls {
        eprintln!("nvmet-mem: TLS {:?}: {}", t.mode, t.describe);
    }
    let config = TargetConfig {
        subsystems: vec![sub],
        tls,
        ..Default::default()
    };
    let server = Server::bind(listen.as_str(), config)?;
    let stop = server.shutdown_handle();
    let target = server.target().clone();
    use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGUSR1, SIGUSR2])?;
    std::thread::spawn(move || {
        let mut last = count;
        for sig in signals.forever() {
            match sig {
                // Hot-plug: a namespace more (SIGUSR1) or the last one less (SIGUSR2).
                SIGUSR1 => {
                    last += 1;
                    target.add_namespace(&nqn_sig, last, ns(last));
                    eprintln!("nvmet-mem: added namespace {last}");
                }
                SIGUSR2 if last > 0 => {
                    target.remove_namespace(&nqn_sig, last);
                    eprintln!("nvmet-mem: removed namespace {last}");
                    last -= 1;
                }
                SIGUSR2 => {}
                _ => {
                    stop.shutdown();
                    break;
                }
            }
        }
    });
    println!("nvme-tcp://{}/{nqn}", server.local_addr()?);
    use std::io::Write;
    std::io::stdout().flush()?;
    server.run()?;
    Ok(())
}
