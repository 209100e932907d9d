//! The HTTP listeners of `flashpool serve`: `GET /metrics` (Prometheus text, `--metrics`) and
//! the admin JSON API under `/api/v1/` (`--api`, or on the metrics listener when only
//! `--api-token-file` is given), on `tiny_http` (small, synchronous, threads: like the rest of
//! the server).
//!
//! Every API request needs `Authorization: Bearer TOKEN` with the token of `--api-token-file`
//! (401 otherwise); peers that are not loopback addresses get 403 unless `--api-allow-remote`.
//! Each route becomes an [`Op`] and is carried out by `admin::execute`, the code the admin
//! socket runs: one place owns each operation. docs/openapi.yaml describes the routes.

use crate::admin::{execute, AdminCtx, Failure, Op, OpError};
use crate::ops::metrics::Metrics;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiny_http::{Header, Method, Request, Response, Server};

/// Largest request body read (JSON arguments are small).
const MAX_BODY: u64 = 64 << 10;

/// Threads answering requests of one listener: long operations (a rebuild, a scrub) hold
/// one each while the others answer status and metrics.
const WORKERS: usize = 4;

/// The bearer token of the API.
pub struct Token(Vec<u8>);

impl Token {
    /// Reads the token from `path`: its first line, surrounding whitespace removed; at least
    /// 16 characters.
    pub fn load(path: &Path) -> Result<Token> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--api-token-file {}: cannot read it", path.display()))?;
        let token = text.lines().next().unwrap_or("").trim();
        if token.len() < 16 {
            bail!(
                "--api-token-file {}: the token (its first line) must have at least 16 characters (e.g. `openssl rand -hex 32 > {}`)",
                path.display(),
                path.display()
            );
        }
        if token.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
            bail!(
                "--api-token-file {}: the token must be printable ASCII without spaces",
                path.display()
            );
        }
        use std::os::unix::fs::PermissionsExt;
        if let Ok(md) = std::fs::metadata(path) {
            if md.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    file = %path.display(),
                    "the API token file is readable by other users: chmod 600 it"
                );
            }
        }
        Ok(Token(token.as_bytes().to_vec()))
    }

    /// Compares in time independent of where the first difference is.
    fn matches(&self, given: &[u8]) -> bool {
        let mut diff = u8::from(self.0.len() != given.len());
        for (i, a) in self.0.iter().enumerate() {
            diff |= a ^ given.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }
}

/// The admin API's settings.
pub struct Api {
    pub ctx: Arc<AdminCtx>,
    pub token: Token,
    /// Answer peers that are not loopback addresses.
    pub allow_remote: bool,
}

/// What one HTTP listener serves.
pub struct Door {
    pub metrics: Option<Arc<Metrics>>,
    pub api: Option<Arc<Api>>,
}

/// Serves `door` on `listener` with worker threads of their own; returns the bound address.
/// `what` names the flag in errors.
pub fn spawn(listener: std::net::TcpListener, door: Door, what: &str) -> Result<SocketAddr> {
    let local = listener.local_addr()?;
    // tiny_http sets no timeouts on its connections; Linux gives accepted sockets the
    // listener's send timeout, so a client that stops reading an answer is dropped after
    // IO_TIMEOUT instead of holding a thread for ever. (Not the receive timeout: on the
    // listener it would time out accept() too.)
    set_timeout(&listener, libc::SO_SNDTIMEO, IO_TIMEOUT)
        .with_context(|| format!("{what} {local}: setting socket timeouts"))?;
    let spare = listener
        .try_clone()
        .with_context(|| format!("{what} {local}"))?;
    let server = Server::from_listener(listener, None)
        .map_err(|e| anyhow::anyhow!("{what} {local}: {e}"))?;
    let current = Arc::new(std::sync::RwLock::new(Arc::new(server)));
    let door = Arc::new(door);
    let spare = Arc::new(spare);
    for n in 0..WORKERS {
        let (current, door, spare) = (current.clone(), door.clone(), spare.clone());
        std::thread::Builder::new()
            .name(format!("http-{n}"))
            .spawn(move || loop {
                let server = current.read().unwrap_or_else(|e| e.into_inner()).clone();
                match server.recv_timeout(std::time::Duration::from_secs(1)) {
                    Ok(Some(req)) => handle(&door, req),
                    Ok(None) => {}
                    Err(e) => {
                        // tiny_http's accept thread stops at the first accept error (out of
                        // file descriptors, say): start a new server on the same socket, so
                        // the listener outlives the error.
                        tracing::warn!(error = %e, "HTTP listener: accepting again");
                        std::thread::sleep(std::time::Duration::from_millis(200));
                        let mut cur = current.write().unwrap_or_else(|e| e.into_inner());
                        if Arc::ptr_eq(&cur, &server) {
                            match spare.try_clone().map_err(|e| e.to_string()).and_then(|l| {
                                Server::from_listener(l, None).map_err(|e| e.to_string())
                            }) {
                                Ok(s) => *cur = Arc::new(s),
                                Err(e) => tracing::error!(error = %e, "HTTP listener"),
                            }
                        }
                    }
                }
            })
            .context("starting an HTTP thread")?;
    }
    Ok(local)
}

/// How long a connection may sit in the middle of a request or an answer.
const IO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn set_timeout(
    l: &std::net::TcpListener,
    opt: libc::c_int,
    t: std::time::Duration,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt on a socket we own, with a timeval that lives across the call and
    // its exact size.
    let r = unsafe {
        libc::setsockopt(
            l.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("a valid static header")
}

fn json_response(code: u16, v: &Value) -> Response<std::io::Cursor<Vec<u8>>> {
    let mut body = serde_json::to_vec_pretty(v).unwrap_or_default();
    body.push(b'\n');
    Response::from_data(body)
        .with_status_code(code)
        .with_header(header("Content-Type", "application/json"))
        .with_header(header("Cache-Control", "no-store"))
}

fn error_response(code: u16, msg: &str) -> Response<std::io::Cursor<Vec<u8>>> {
    json_response(code, &serde_json::json!({ "error": msg }))
}

fn handle(door: &Door, mut req: Request) {
    let url = req.url().to_string();
    let path = url.split('?').next().unwrap_or("").to_string();
    let method = req.method().clone();
    let resp = if path == "/metrics" {
        match (&door.metrics, &method) {
            (Some(m), Method::Get | Method::Head) => match m.render() {
                Ok(text) => Response::from_data(text.into_bytes())
                    .with_header(header("Content-Type", prometheus::TEXT_FORMAT)),
                Err(e) => {
                    tracing::warn!(error = %e, "encoding metrics");
                    error_response(500, &format!("encoding metrics: {e}"))
                }
            },
            (Some(_), _) => error_response(405, "GET /metrics"),
            (None, _) => error_response(404, "no metrics on this listener (--metrics)"),
        }
    } else if path == "/api" || path.starts_with("/api/") {
        match &door.api {
            Some(api) => api_response(api, &mut req, &method, &path),
            None => error_response(
                404,
                "no admin API on this listener (--api, or --api-token-file for the metrics listener)",
            ),
        }
    } else if path == "/" {
        let mut routes = vec![];
        if door.metrics.is_some() {
            routes.push("/metrics");
        }
        if door.api.is_some() {
            routes.push("/api/v1/");
        }
        json_response(
            200,
            &serde_json::json!({ "flashpool": env!("CARGO_PKG_VERSION"), "routes": routes }),
        )
    } else {
        error_response(404, &format!("no such path {path:?}"))
    };
    if let Err(e) = req.respond(resp) {
        tracing::debug!(error = %e, "HTTP client went away before the answer");
    }
}

fn api_response(
    api: &Api,
    req: &mut Request,
    method: &Method,
    path: &str,
) -> Response<std::io::Cursor<Vec<u8>>> {
    let remote_ok = api.allow_remote || req.remote_addr().is_some_and(crate::ops::is_loopback);
    if !remote_ok {
        return error_response(
            403,
            "the admin API answers loopback peers only (--api-allow-remote)",
        );
    }
    let bearer = req
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .and_then(|h| h.value.as_str().strip_prefix("Bearer "))
        .map(|t| t.trim().as_bytes().to_vec());
    if !bearer.is_some_and(|t| api.token.matches(&t)) {
        return error_response(401, "missing or wrong bearer token (Authorization: Bearer TOKEN, the token of --api-token-file)")
            .with_header(header("WWW-Authenticate", "Bearer realm=\"flashpool\""));
    }
    let mut body = Vec::new();
    if let Err(e) = req.as_reader().take(MAX_BODY + 1).read_to_end(&mut body) {
        return error_response(400, &format!("reading the request body: {e}"));
    }
    if body.len() as u64 > MAX_BODY {
        return error_response(413, "request body over 64 KiB");
    }
    let args: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Default::default())
    } else {
        match serde_json::from_slice(&body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return error_response(400, "the request body must be a JSON object"),
            Err(e) => return error_response(400, &format!("the request body is not JSON: {e}")),
        }
    };
    let op = match route(method, path, &args) {
        Ok(op) => op,
        Err((code, msg)) => return error_response(code, &msg),
    };
    let started = std::time::Instant::now();
    let what = format!("{op:?}");
    let read_only = op.read_only();
    let created = matches!(op, Op::VolumeCreate { .. });
    let result = execute(&api.ctx, op);
    if !read_only {
        tracing::info!(
            op = %what,
            peer = ?req.remote_addr(),
            ok = result.is_ok(),
            secs = started.elapsed().as_secs_f64(),
            "admin API"
        );
    }
    match result {
        Ok(v) => json_response(if created { 201 } else { 200 }, &v),
        Err(e) => error_response(code_of(&e), &e.message()),
    }
}

fn code_of(e: &OpError) -> u16 {
    match e.failure {
        Failure::BadRequest => 400,
        Failure::NotFound => 404,
        Failure::Conflict => 409,
        Failure::Unavailable => 503,
        Failure::Internal => 500,
    }
}

type RouteError = (u16, String);

fn bad(msg: impl Into<String>) -> RouteError {
    (400, msg.into())
}

/// Field `name` of the JSON body, if present.
fn field<'a>(args: &'a Value, name: &str) -> Option<&'a Value> {
    args.get(name).filter(|v| !v.is_null())
}

fn bool_field(args: &Value, name: &str) -> Result<bool, RouteError> {
    match field(args, name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(format!("{name:?} must be true or false"))),
    }
}

fn string_field(args: &Value, name: &str) -> Result<Option<String>, RouteError> {
    match field(args, name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(format!("{name:?} must be a string"))),
    }
}

/// A size: bytes as a number, or a string with a suffix ("64M", "1GiB").
fn size_field(args: &Value, name: &str) -> Result<Option<u64>, RouteError> {
    match field(args, name) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(format!("{name:?} must be a whole number of bytes"))),
        Some(Value::String(s)) => crate::size::parse_size(s)
            .map(Some)
            .map_err(|e| bad(format!("{name:?}: {e:#}"))),
        Some(_) => Err(bad(format!(
            "{name:?} must be bytes or a size such as \"64M\""
        ))),
    }
}

fn compression_field(
    args: &Value,
    name: &str,
) -> Result<Option<flashpool_engine::Compression>, RouteError> {
    string_field(args, name)?
        .map(|s| {
            s.parse()
                .map_err(|e: flashpool_engine::Error| bad(e.to_string()))
        })
        .transpose()
}

fn index(s: &str) -> Result<usize, RouteError> {
    s.parse()
        .map_err(|_| (404, format!("no drive {s:?}: drives are numbered from 0")))
}

/// Rejects body fields a route does not take, so a typo is not silently ignored.
fn only(args: &Value, allowed: &[&str]) -> Result<(), RouteError> {
    if let Value::Object(m) = args {
        if let Some(k) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(bad(format!(
                "unknown field {k:?}{}",
                if allowed.is_empty() {
                    " (this request takes no body)".to_string()
                } else {
                    format!(" (this request takes {})", allowed.join(", "))
                }
            )));
        }
    }
    Ok(())
}

/// An absolute path as the server must see it.
fn path_field(args: &Value, name: &str) -> Result<Option<PathBuf>, RouteError> {
    match string_field(args, name)? {
        None => Ok(None),
        Some(p) if Path::new(&p).is_absolute() => Ok(Some(PathBuf::from(p))),
        Some(p) => Err(bad(format!("{name:?} must be an absolute path, not {p:?}"))),
    }
}

/// The operation a request names.
pub fn route(method: &Method, path: &str, args: &Value) -> Result<Op, RouteError> {
    let rest = path.strip_prefix("/api/v1").ok_or_else(|| {
        (
            404,
            format!("no such path {path:?} (the API is under /api/v1/)"),
        )
    })?;
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    use Method::{Delete, Get, Patch, Post};
    let op = match (method, parts.as_slice()) {
        (Get, ["status"]) => Op::Status,
        (Get, ["volumes"]) => Op::VolumeList,
        (Post, ["volumes"]) => {
            only(args, &["name", "size", "compression"])?;
            Op::VolumeCreate {
                name: string_field(args, "name")?.ok_or_else(|| bad("\"name\" is required"))?,
                size: size_field(args, "size")?.ok_or_else(|| bad("\"size\" is required"))?,
                compression: compression_field(args, "compression")?.unwrap_or_default(),
            }
        }
        (Get, ["volumes", name]) => Op::VolumeGet {
            name: name.to_string(),
        },
        (Patch, ["volumes", name]) => {
            only(args, &["size", "force", "compression"])?;
            let size = size_field(args, "size")?;
            let compression = compression_field(args, "compression")?;
            match (size, compression) {
                (Some(size), None) => Op::VolumeResize {
                    name: name.to_string(),
                    size,
                    force: bool_field(args, "force")?,
                },
                (None, Some(compression)) => Op::VolumeCompression {
                    name: name.to_string(),
                    compression,
                },
                (Some(_), Some(_)) => {
                    return Err(bad("change \"size\" or \"compression\", one per request"))
                }
                (None, None) => return Err(bad("give \"size\" or \"compression\"")),
            }
        }
        (Delete, ["volumes", name]) => Op::VolumeDelete {
            name: name.to_string(),
        },
        (Get, ["drives"]) => Op::DriveList,
        (Post, ["drives"]) => {
            only(args, &["path", "force"])?;
            Op::DriveAdd {
                path: path_field(args, "path")?,
                force: bool_field(args, "force")?,
            }
        }
        (Post, ["drives", i, "fail"]) => {
            only(args, &["force"])?;
            Op::DriveFail {
                index: index(i)?,
                force: bool_field(args, "force")?,
            }
        }
        (Post, ["drives", i, "remove"]) => {
            only(args, &[])?;
            Op::DriveRemove { index: index(i)? }
        }
        (Post, ["drives", i, "readmit"]) => {
            only(args, &[])?;
            Op::DriveReadmit { index: index(i)? }
        }
        (Post, ["drives", i, "replace"]) => {
            only(args, &["path", "force"])?;
            Op::DriveReplace {
                old: index(i)?,
                path: path_field(args, "path")?.ok_or_else(|| bad("\"path\" is required"))?,
                force: bool_field(args, "force")?,
            }
        }
        (Get, ["rebuild"]) => Op::RebuildStatus,
        (Post, ["rebuild", "start"]) => Op::Rebuild,
        (Post, ["rebuild", "pause"]) => Op::RebuildPause,
        (Post, ["rebuild", "resume"]) => Op::RebuildResume,
        (Get, ["cleaner"]) => Op::CleanerStatus,
        (Post, ["cleaner", "run"]) => {
            only(args, &["free_segments"])?;
            Op::CleanerRun {
                free_segments: match field(args, "free_segments") {
                    None => None,
                    Some(v) => Some(
                        v.as_u64()
                            .and_then(|n| usize::try_from(n).ok())
                            .ok_or_else(|| bad("\"free_segments\" must be a whole number"))?,
                    ),
                },
            }
        }
        (Post, ["cleaner", "pause"]) => Op::CleanerPause,
        (Post, ["cleaner", "resume"]) => Op::CleanerResume,
        (Post, ["scrub"]) => {
            only(args, &["check_only"])?;
            Op::Scrub {
                repair: !bool_field(args, "check_only")?,
            }
        }
        (
            _,
            ["status"]
            | ["volumes"]
            | ["volumes", _]
            | ["drives"]
            | ["drives", _, _]
            | ["rebuild"]
            | ["rebuild", _]
            | ["cleaner"]
            | ["cleaner", _]
            | ["scrub"],
        ) => return Err((405, format!("{method} is not allowed on {path}"))),
        _ => return Err((404, format!("no such path {path:?}"))),
    };
    if method == &Get && !op.read_only() {
        return Err((405, format!("{method} is not allowed on {path}")));
    }
    Ok(op)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn routes() {
        let r = |m: Method, p: &str, a: Value| route(&m, p, &a);
        assert_eq!(r(Method::Get, "/api/v1/status", json!({})), Ok(Op::Status));
        assert_eq!(
            r(
                Method::Post,
                "/api/v1/volumes",
                json!({"name": "a", "size": "1G"})
            ),
            Ok(Op::VolumeCreate {
                name: "a".into(),
                size: 1 << 30,
                compression: Default::default()
            })
        );
        assert_eq!(
            r(
                Method::Patch,
                "/api/v1/volumes/a",
                json!({"size": 4096, "force": true})
            ),
            Ok(Op::VolumeResize {
                name: "a".into(),
                size: 4096,
                force: true
            })
        );
        assert_eq!(
            r(Method::Post, "/api/v1/drives/2/fail", json!({})),
            Ok(Op::DriveFail {
                index: 2,
                force: false
            })
        );
        assert_eq!(
            r(Method::Post, "/api/v1/volumes", json!({"size": 1}))
                .unwrap_err()
                .0,
            400
        );
        assert_eq!(
            r(
                Method::Post,
                "/api/v1/volumes",
                json!({"name": "a", "size": 1, "sise": 2})
            )
            .unwrap_err()
            .0,
            400
        );
        assert_eq!(
            r(Method::Get, "/api/v1/drives/1/fail", json!({}))
                .unwrap_err()
                .0,
            405
        );
        assert_eq!(
            r(Method::Delete, "/api/v1/status", json!({}))
                .unwrap_err()
                .0,
            405
        );
        assert_eq!(
            r(Method::Get, "/api/v2/status", json!({})).unwrap_err().0,
            404
        );
        assert_eq!(
            r(Method::Post, "/api/v1/drives/x/fail", json!({}))
                .unwrap_err()
                .0,
            404
        );
        assert_eq!(
            r(Method::Post, "/api/v1/drives", json!({"path": "rel/x.img"}))
                .unwrap_err()
                .0,
            400
        );
    }

    #[test]
    fn token_compare() {
        let t = Token(b"0123456789abcdef".to_vec());
        assert!(t.matches(b"0123456789abcdef"));
        assert!(!t.matches(b"0123456789abcdeg"));
        assert!(!t.matches(b"0123456789abcde"));
        assert!(!t.matches(b"0123456789abcdef0"));
        assert!(!t.matches(b""));
    }
}
