//! memserve: serve sparse in-memory disks over NBD, for tests and
//! benchmarks before (and beside) the real pool engine.
//!
//! Flags mirror `flashpool serve` so the end-to-end scripts run against
//! either: `--data DIR` (exports are loaded from / saved to DIR/NAME.img
//! across restarts; saved on SIGINT/SIGTERM after the connections drained),
//! `--listen HOST:PORT` (default 127.0.0.1:10809), `--socket PATH`, `--stdio`,
//! plus `--size SIZE` (default 1G) and `--export NAME` (more exports besides
//! `default`, which also answers to the empty name), `--no-tcp`,
//! `--workers N` (requests in flight per connection: `max_in_flight_per_connection`),
//! `--busy-poll-us N` (`Config::busy_poll`; 0 = off, default 50),
//! `--null` (exports store nothing: writes are dropped, reads return zeros, like nbdkit's
//! null plugin; what the front-end alone costs per request, for `bench/nbd-bench.sh`).
//! Socket activation (LISTEN_PID/LISTEN_FDS) replaces the listeners.

use std::path::PathBuf;
use std::sync::Arc;

use flashpool_nbd::{Config, Export, ExportError, Extent, MemExport, Server, StaticExports};

/// An export that stores nothing (`--null`): every request succeeds at once, reads return
/// zeros, and block status reports one zero hole.
struct NullExport(u64);

impl NullExport {
    fn check(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        flashpool_nbd::export::check_range(self.0, offset, len)
    }
}

impl Export for NullExport {
    fn size(&self) -> u64 {
        self.0
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.check(offset, buf.len() as u64)?;
        buf.fill(0);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        self.check(offset, data.len() as u64)
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.check(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.check(offset, len)
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, ExportError> {
        self.check(offset, len)?;
        Ok(vec![Extent::hole(len)])
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        Some('t' | 'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("bad size '{s}'"))
}

struct Args {
    data: Option<PathBuf>,
    listen: String,
    socket: Option<PathBuf>,
    stdio: bool,
    no_tcp: bool,
    size: u64,
    exports: Vec<String>,
    workers: Option<usize>,
    busy_poll_us: u64,
    null: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        data: None,
        listen: "127.0.0.1:10809".into(),
        socket: None,
        stdio: false,
        no_tcp: false,
        size: 1 << 30,
        exports: vec!["default".into()],
        workers: None,
        busy_poll_us: flashpool_nbd::config::DEFAULT_BUSY_POLL.as_micros() as u64,
        null: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--data" => a.data = Some(val("--data")?.into()),
            "--listen" => a.listen = val("--listen")?,
            "--socket" => a.socket = Some(val("--socket")?.into()),
            "--stdio" => a.stdio = true,
            "--no-tcp" => a.no_tcp = true,
            "--null" => a.null = true,
            "--size" => a.size = parse_size(&val("--size")?)?,
            "--export" => a.exports.push(val("--export")?),
            "--busy-poll-us" => {
                a.busy_poll_us = val("--busy-poll-us")?
                    .parse()
                    .map_err(|_| "bad --busy-poll-us")?
            }
            "--workers" => {
                a.workers = Some(val("--workers")?.parse().map_err(|_| "bad --workers")?)
            }
            "-h" | "--help" => {
                println!("usage: memserve [--data DIR] [--listen HOST:PORT] [--socket PATH] [--stdio] [--no-tcp] [--size SIZE] [--export NAME]... [--workers N] [--busy-poll-us N] [--null]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    Ok(a)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("memserve: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    if std::env::var_os("MEMSERVE_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("MEMSERVE_LOG"))
            .init();
    }
    if args.null && args.data.is_some() {
        return Err("--null stores nothing: it takes no --data".into());
    }
    if let Some(d) = &args.data {
        std::fs::create_dir_all(d)?;
    }
    let mut set = StaticExports::new();
    let mut disks = Vec::new();
    for name in &args.exports {
        if args.null {
            let disk = Arc::new(NullExport(args.size));
            set.add(name.clone(), format!("null disk '{name}'"), disk);
            continue;
        }
        let image = args.data.as_ref().map(|d| d.join(format!("{name}.img")));
        let disk = match &image {
            Some(p) if p.exists() => MemExport::load(p)?,
            _ => MemExport::new(args.size),
        };
        let disk = Arc::new(disk);
        set.add(name.clone(), format!("memory disk '{name}'"), disk.clone());
        disks.push((image, disk));
    }
    set.set_default("default");
    let mut config = Config {
        busy_poll: std::time::Duration::from_micros(args.busy_poll_us),
        ..Config::default()
    };
    if let Some(w) = args.workers {
        config.max_in_flight_per_connection = w;
    }
    let mut server = Server::new(Arc::new(set), config)?;
    let stop = server.shutdown_handle();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            stop.shutdown();
        }
    });
    if args.stdio {
        server.run_stdio()?;
    } else {
        let activated = server.listen_activated()?;
        if activated == 0 {
            if !args.no_tcp {
                let a = server.listen_tcp(args.listen.as_str())?;
                println!("nbd://{a}/");
            }
            if let Some(p) = &args.socket {
                server.listen_unix(p)?;
                println!("nbd+unix:///?socket={}", p.display());
            }
        }
        use std::io::Write;
        std::io::stdout().flush()?;
        server.run()?;
    }
    for (image, disk) in disks {
        if let Some(p) = image {
            disk.save(&p)?;
        }
    }
    Ok(())
}
