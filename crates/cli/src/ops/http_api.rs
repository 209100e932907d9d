//! The HTTP listeners of `flashpool serve`: `GET /metrics` (Prometheus text, `--metrics`) and
//! the admin JSON API under `/api/v1/` (`--api`, or on the metrics listener when only
//! `--api-token-file` is given), on `hyper` 1.x (HTTP/1.1 only) over a small tokio runtime that
//! each listener owns: one thread for the sockets, a bounded blocking pool for the work.
//!
//! Every API request needs `Authorization: Bearer TOKEN` with the token of `--api-token-file`
//! (401 otherwise); peers that are not loopback addresses get 403 unless `--api-allow-remote`.
//! Each route becomes an [`Op`] and is carried out by `admin::execute`, the code the admin
//! socket runs: one place owns each operation. docs/openapi.yaml describes the routes.
//!
//! What a client can make a listener hold is bounded: connections ([`MAX_CONNECTIONS`]), the
//! time to send a request's head ([`HEADER_READ_TIMEOUT`], also the idle time of a kept-alive
//! connection) and its body ([`BODY_READ_TIMEOUT`]), the head's size ([`MAX_HEAD_BYTES`],
//! [`MAX_HEADERS`]), the body's ([`MAX_BODY`]), the time an answer may wait on a client that
//! does not read it ([`WRITE_STALL_TIMEOUT`]), and the operations running at once
//! ([`MAX_CHANGES`]). A body that is not read (a path that takes none, a refused request, one
//! declared over the limit) is never read: the answer says `Connection: close`. Accept errors
//! (out of file descriptors) are logged and retried after a pause; the listener never ends.

use crate::admin::{execute, AdminCtx, Failure, Op, OpError};
use crate::ops::metrics::Metrics;
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;

/// Largest request body read (JSON arguments are small). A body declared longer is answered
/// 413 without reading it; a chunked one is cut at this size.
const MAX_BODY: u64 = 64 << 10;

/// Largest request head (request line and headers) taken: hyper's read buffer and its header
/// size limit. Real requests have a few hundred bytes; without a bound a client could make the
/// server buffer megabytes per connection before any authentication (431 past it).
const MAX_HEAD_BYTES: usize = 16 << 10;

/// Most header lines in a request head (431 past it): curl and Prometheus send under ten.
const MAX_HEADERS: usize = 64;

/// Time a client has to send a whole request head, from the moment the connection is ready for
/// one: so also how long an idle kept-alive connection is kept. A client that connects and
/// sends nothing (or one byte a minute) holds a connection slot for no longer than this.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a client has to send a whole request body (at most [`MAX_BODY`]), once its head is
/// read: a body declared and never sent does not hold a connection for ever (408, closed).
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long writing an answer may make no progress (a client that stops reading it) before the
/// connection is dropped.
const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections served at once by one listener. At the cap the listener stops accepting until
/// one ends (new clients wait in the kernel's backlog); each connection ends within the
/// timeouts above unless it is waiting on an operation it asked for.
const MAX_CONNECTIONS: usize = 64;

/// Operations that change something (a rebuild, a scrub, a volume create: some take minutes)
/// running at once per listener, as the four worker threads of the earlier server; read-only
/// ones (status, lists) and scrapes do not wait for these.
const MAX_CHANGES: usize = 4;

/// Threads of a listener's blocking pool, where operations and metrics rendering run (the
/// socket thread never waits on the pool).
const BLOCKING_THREADS: usize = 16;

/// First and longest pause after an accept error (out of file descriptors, say): the loop
/// waits, logs, and accepts again, doubling the pause while the errors go on.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

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

/// A listener's state shared by its connections.
struct Shared {
    door: Door,
    changes: Arc<Semaphore>,
}

/// Serves `door` on `listener` with a runtime and threads of its own; returns the bound
/// address. `what` names the flag in errors.
pub fn spawn(listener: std::net::TcpListener, door: Door, what: &str) -> Result<SocketAddr> {
    let local = listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_name("http-work")
        .build()
        .with_context(|| format!("{what} {local}: starting the HTTP runtime"))?;
    listener
        .set_nonblocking(true)
        .with_context(|| format!("{what} {local}"))?;
    let listener = {
        let _in = rt.enter();
        tokio::net::TcpListener::from_std(listener).with_context(|| format!("{what} {local}"))?
    };
    let shared = Arc::new(Shared {
        door,
        changes: Arc::new(Semaphore::new(MAX_CHANGES)),
    });
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || rt.block_on(accept_loop(listener, shared)))
        .context("starting the HTTP thread")?;
    Ok(local)
}

async fn accept_loop(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        // At the cap, wait for a connection to end before taking the next one.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return; // never closed
        };
        let (stream, peer) = match listener.accept().await {
            Ok(c) => {
                backoff = ACCEPT_BACKOFF_MIN;
                c
            }
            Err(e) => {
                tracing::warn!(error = %e, pause = ?backoff, "HTTP listener: accept failed; accepting again after a pause");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(&shared, peer, req).await) }
            });
            let io = TokioIo::new(StallGuard::new(stream));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .max_header_size(MAX_HEAD_BYTES)
                .max_headers(MAX_HEADERS)
                .serve_connection(io, service);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "HTTP connection ended");
            }
            drop(slot);
        });
    }
}

/// A connection whose writes fail with `TimedOut` once they have made no progress for
/// [`WRITE_STALL_TIMEOUT`] (tokio's sockets are non-blocking: `SO_SNDTIMEO` does not apply).
struct StallGuard {
    inner: tokio::net::TcpStream,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl StallGuard {
    fn new(inner: tokio::net::TcpStream) -> Self {
        StallGuard {
            inner,
            stalled: None,
        }
    }

    /// After a write that could not proceed: arm the timer, or fail when it has run out.
    fn pending_write<T>(&mut self, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<T>> {
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL_TIMEOUT)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client stopped reading the answer",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for StallGuard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallGuard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.pending_write(cx),
            r => {
                self.stalled = None;
                r
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.pending_write(cx),
            r => {
                self.stalled = None;
                r
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

type Answer = Response<Full<Bytes>>;

fn answer(code: u16, content_type: &'static str, body: Vec<u8>) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = hyper::StatusCode::from_u16(code).expect("a valid status code");
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json_response(code: u16, v: &Value) -> Answer {
    let mut body = serde_json::to_vec_pretty(v).unwrap_or_default();
    body.push(b'\n');
    let mut r = answer(code, "application/json", body);
    r.headers_mut()
        .insert("Cache-Control", HeaderValue::from_static("no-store"));
    r
}

fn error_response(code: u16, msg: &str) -> Answer {
    json_response(code, &serde_json::json!({ "error": msg }))
}

/// Whether a request has a body that may still be unread.
fn has_body(req: &Request<Incoming>) -> bool {
    !req.body().is_end_stream()
}

async fn handle(shared: &Shared, peer: SocketAddr, req: Request<Incoming>) -> Answer {
    let door = &shared.door;
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let unread_body = has_body(&req);
    let mut resp = if path == "/metrics" {
        match (&door.metrics, &method) {
            (Some(m), &Method::GET | &Method::HEAD) => {
                let m = m.clone();
                match tokio::task::spawn_blocking(move || m.render()).await {
                    Ok(Ok(text)) => answer(200, prometheus::TEXT_FORMAT, text.into_bytes()),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "encoding metrics");
                        error_response(500, &format!("encoding metrics: {e}"))
                    }
                    Err(e) => error_response(500, &format!("encoding metrics: {e}")),
                }
            }
            (Some(_), _) => {
                let mut r = error_response(405, "GET /metrics");
                r.headers_mut()
                    .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
                r
            }
            (None, _) => error_response(404, "no metrics on this listener (--metrics)"),
        }
    } else if path == "/api" || path.starts_with("/api/") {
        match &door.api {
            Some(api) => return api_response(shared, api, peer, req, &method, &path).await,
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
    if unread_body {
        close(&mut resp);
    }
    resp
}

/// Marks an answer as the connection's last (its request body is not read, or not all of it).
fn close(resp: &mut Answer) {
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
}

async fn api_response(
    shared: &Shared,
    api: &Arc<Api>,
    peer: SocketAddr,
    req: Request<Incoming>,
    method: &Method,
    path: &str,
) -> Answer {
    let unread_body = has_body(&req);
    let refused = |mut r: Answer| {
        if unread_body {
            close(&mut r);
        }
        r
    };
    let remote_ok = api.allow_remote || crate::ops::is_loopback(&peer);
    if !remote_ok {
        return refused(error_response(
            403,
            "the admin API answers loopback peers only (--api-allow-remote)",
        ));
    }
    let bearer = req
        .headers()
        .get_all(hyper::header::AUTHORIZATION)
        .iter()
        .next()
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_credentials)
        .map(|t| t.as_bytes().to_vec());
    if !bearer.is_some_and(|t| api.token.matches(&t)) {
        let mut r = error_response(401, "missing or wrong bearer token (Authorization: Bearer TOKEN, the token of --api-token-file)");
        r.headers_mut().insert(
            "WWW-Authenticate",
            HeaderValue::from_static("Bearer realm=\"flashpool\""),
        );
        return refused(r);
    }
    if req.body().size_hint().lower() > MAX_BODY {
        let mut r = error_response(413, "request body over 64 KiB");
        close(&mut r);
        return r;
    }
    let body = Limited::new(req.into_body(), MAX_BODY as usize);
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, body.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) => {
            let mut r = if e.is::<http_body_util::LengthLimitError>() {
                error_response(413, "request body over 64 KiB")
            } else {
                error_response(400, &format!("reading the request body: {e}"))
            };
            close(&mut r);
            return r;
        }
        Err(_) => {
            let mut r = error_response(
                408,
                &format!(
                    "reading the request body: not all sent within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            );
            close(&mut r);
            return r;
        }
    };
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
        Err((code, msg)) => {
            let mut r = error_response(code, &msg);
            if code == 405 {
                if let Some(methods) = segments(path).ok().and_then(|p| allowed_methods(&p)) {
                    r.headers_mut()
                        .insert(ALLOW, HeaderValue::from_static(methods));
                }
            }
            return r;
        }
    };
    let started = std::time::Instant::now();
    let what = format!("{op:?}");
    let read_only = op.read_only();
    let created = matches!(op, Op::VolumeCreate { .. });
    // Changes wait for a slot; the permit goes with the work, so an operation whose client
    // went away still counts until it ends.
    let permit = if read_only {
        None
    } else {
        match shared.changes.clone().acquire_owned().await {
            Ok(p) => Some(p),
            Err(_) => return error_response(503, "the HTTP listener is shutting down"),
        }
    };
    let ctx = api.ctx.clone();
    let done = tokio::task::spawn_blocking(move || {
        let r = execute(&ctx, op);
        drop(permit);
        r
    })
    .await;
    let result = match done {
        Ok(r) => r,
        Err(e) => return error_response(500, &format!("the operation failed: {e}")),
    };
    if !read_only {
        tracing::info!(
            op = %what,
            peer = %peer,
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

/// Field `name` of the JSON body, if present. A `null` is present: no field is nullable, so
/// it is refused as of the wrong type rather than read as the field left out.
fn field<'a>(args: &'a Value, name: &str) -> Option<&'a Value> {
    args.get(name)
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

/// The credentials of an `Authorization` header's value of the Bearer scheme, whose name is
/// case-insensitive (RFC 9110 11.1: `bearer` and `BEARER` are `Bearer`).
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("Bearer")
        .then(|| credentials.trim())
}

/// `%XX` escapes of a path segment decoded (RFC 3986 2.1): `%6Fdd` is `odd`. A `%` not
/// followed by two hex digits, or bytes that are not UTF-8 once decoded, are a bad request.
fn percent_decode(segment: &str) -> Result<String, RouteError> {
    let b = segment.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = |j: usize| b.get(j).and_then(|c| (*c as char).to_digit(16));
            match (hex(i + 1), hex(i + 2)) {
                (Some(hi), Some(lo)) => out.push((hi * 16 + lo) as u8),
                _ => {
                    return Err(bad(format!(
                        "path segment {segment:?}: a % must start an escape of two hex digits"
                    )))
                }
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| {
        bad(format!(
            "path segment {segment:?} is not UTF-8 once decoded"
        ))
    })
}

/// The segments of an API path after `/api/v1`, each percent-decoded (an escaped `/` stays
/// inside its segment).
fn segments(path: &str) -> Result<Vec<String>, RouteError> {
    let rest = path.strip_prefix("/api/v1").ok_or_else(|| {
        (
            404,
            format!("no such path {path:?} (the API is under /api/v1/)"),
        )
    })?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return Err((404, format!("no such path {path:?}")));
    }
    rest.split('/')
        .filter(|p| !p.is_empty())
        .map(percent_decode)
        .collect()
}

/// The methods a path of the API answers (a 405's `Allow`), or None for a path it does not
/// have (404).
fn allowed_methods<S: AsRef<str>>(parts: &[S]) -> Option<&'static str> {
    let parts: Vec<&str> = parts.iter().map(AsRef::as_ref).collect();
    Some(match parts.as_slice() {
        ["status"] | ["rebuild"] | ["cleaner"] => "GET",
        ["volumes"] | ["drives"] => "GET, POST",
        ["volumes", _] => "GET, PATCH, DELETE",
        ["drives", _, "fail" | "remove" | "readmit" | "replace"]
        | ["rebuild", "start" | "pause" | "resume"]
        | ["cleaner", "run" | "pause" | "resume"]
        | ["scrub"] => "POST",
        _ => return None,
    })
}

/// The operation a request names.
pub fn route(method: &Method, path: &str, args: &Value) -> Result<Op, RouteError> {
    let segments = segments(path)?;
    let parts: Vec<&str> = segments.iter().map(String::as_str).collect();
    let op = match (method.as_str(), parts.as_slice()) {
        ("GET", ["status"]) => Op::Status,
        ("GET", ["volumes"]) => Op::VolumeList,
        ("POST", ["volumes"]) => {
            only(args, &["name", "size", "compression"])?;
            Op::VolumeCreate {
                name: string_field(args, "name")?.ok_or_else(|| bad("\"name\" is required"))?,
                size: size_field(args, "size")?.ok_or_else(|| bad("\"size\" is required"))?,
                compression: compression_field(args, "compression")?.unwrap_or_default(),
            }
        }
        ("GET", ["volumes", name]) => Op::VolumeGet {
            name: name.to_string(),
        },
        ("PATCH", ["volumes", name]) => {
            only(args, &["size", "force", "compression"])?;
            let size = size_field(args, "size")?;
            let compression = compression_field(args, "compression")?;
            if size.is_none() && field(args, "force").is_some() {
                return Err(bad(
                    "\"force\" goes with a resize (\"size\"), not alone nor with \"compression\"",
                ));
            }
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
        ("DELETE", ["volumes", name]) => {
            only(args, &[])?;
            Op::VolumeDelete {
                name: name.to_string(),
            }
        }
        ("GET", ["drives"]) => Op::DriveList,
        ("POST", ["drives"]) => {
            only(args, &["path", "force"])?;
            Op::DriveAdd {
                path: path_field(args, "path")?,
                force: bool_field(args, "force")?,
            }
        }
        ("POST", ["drives", i, "fail"]) => {
            only(args, &["force"])?;
            Op::DriveFail {
                index: index(i)?,
                force: bool_field(args, "force")?,
            }
        }
        ("POST", ["drives", i, "remove"]) => {
            only(args, &[])?;
            Op::DriveRemove { index: index(i)? }
        }
        ("POST", ["drives", i, "readmit"]) => {
            only(args, &[])?;
            Op::DriveReadmit { index: index(i)? }
        }
        ("POST", ["drives", i, "replace"]) => {
            only(args, &["path", "force"])?;
            Op::DriveReplace {
                old: index(i)?,
                path: path_field(args, "path")?.ok_or_else(|| bad("\"path\" is required"))?,
                force: bool_field(args, "force")?,
            }
        }
        ("GET", ["rebuild"]) => Op::RebuildStatus,
        ("POST", ["rebuild", action @ ("start" | "pause" | "resume")]) => {
            only(args, &[])?;
            match *action {
                "start" => Op::Rebuild,
                "pause" => Op::RebuildPause,
                _ => Op::RebuildResume,
            }
        }
        ("GET", ["cleaner"]) => Op::CleanerStatus,
        ("POST", ["cleaner", "run"]) => {
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
        ("POST", ["cleaner", action @ ("pause" | "resume")]) => {
            only(args, &[])?;
            if *action == "pause" {
                Op::CleanerPause
            } else {
                Op::CleanerResume
            }
        }
        ("POST", ["scrub"]) => {
            only(args, &["check_only"])?;
            Op::Scrub {
                repair: !bool_field(args, "check_only")?,
            }
        }
        (_, parts) => {
            return Err(match allowed_methods(parts) {
                Some(methods) => (
                    405,
                    format!("{method} is not allowed on {path} (it takes {methods})"),
                ),
                None => (404, format!("no such path {path:?}")),
            })
        }
    };
    if method == Method::GET {
        if !op.read_only() {
            return Err((405, format!("{method} is not allowed on {path}")));
        }
        // Routes that take no body refuse one with fields, GETs included.
        only(args, &[])?;
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
        assert_eq!(r(Method::GET, "/api/v1/status", json!({})), Ok(Op::Status));
        assert_eq!(
            r(
                Method::POST,
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
                Method::PATCH,
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
            r(Method::POST, "/api/v1/drives/2/fail", json!({})),
            Ok(Op::DriveFail {
                index: 2,
                force: false
            })
        );
        assert_eq!(
            r(Method::POST, "/api/v1/volumes", json!({"size": 1}))
                .unwrap_err()
                .0,
            400
        );
        assert_eq!(
            r(
                Method::POST,
                "/api/v1/volumes",
                json!({"name": "a", "size": 1, "sise": 2})
            )
            .unwrap_err()
            .0,
            400
        );
        assert_eq!(
            r(Method::GET, "/api/v1/drives/1/fail", json!({}))
                .unwrap_err()
                .0,
            405
        );
        assert_eq!(
            r(Method::DELETE, "/api/v1/status", json!({}))
                .unwrap_err()
                .0,
            405
        );
        assert_eq!(
            r(Method::GET, "/api/v2/status", json!({})).unwrap_err().0,
            404
        );
        assert_eq!(
            r(Method::POST, "/api/v1/drives/x/fail", json!({}))
                .unwrap_err()
                .0,
            404
        );
        assert_eq!(
            r(Method::POST, "/api/v1/drives", json!({"path": "rel/x.img"}))
                .unwrap_err()
                .0,
            400
        );
        // Routes without fields refuse fields; `force` only with a resize.
        for p in [
            "/api/v1/rebuild/start",
            "/api/v1/rebuild/pause",
            "/api/v1/rebuild/resume",
            "/api/v1/cleaner/pause",
            "/api/v1/cleaner/resume",
        ] {
            assert_eq!(
                r(Method::POST, p, json!({"x": 1})).unwrap_err().0,
                400,
                "{p}"
            );
            assert!(r(Method::POST, p, json!({})).is_ok(), "{p}");
        }
        assert_eq!(
            r(Method::DELETE, "/api/v1/volumes/a", json!({"x": 1}))
                .unwrap_err()
                .0,
            400
        );
        assert_eq!(
            r(
                Method::PATCH,
                "/api/v1/volumes/a",
                json!({"compression": "off", "force": true})
            )
            .unwrap_err()
            .0,
            400
        );
        assert_eq!(
            r(Method::PATCH, "/api/v1/volumes/a", json!({"force": true}))
                .unwrap_err()
                .0,
            400
        );
    }

    #[test]
    fn null_is_not_an_absent_field() {
        let r = |m: Method, p: &str, a: Value| route(&m, p, &a).map_err(|e| e.0);
        for (m, p, body) in [
            (Method::POST, "/api/v1/scrub", json!({"check_only": null})),
            (
                Method::POST,
                "/api/v1/cleaner/run",
                json!({"free_segments": null}),
            ),
            (Method::POST, "/api/v1/drives", json!({"path": null})),
            (Method::POST, "/api/v1/drives", json!({"force": null})),
            (
                Method::POST,
                "/api/v1/drives/1/fail",
                json!({"force": null}),
            ),
            (
                Method::POST,
                "/api/v1/drives/1/replace",
                json!({"path": "/x", "force": null}),
            ),
            (
                Method::PATCH,
                "/api/v1/volumes/a",
                json!({"size": 4096, "force": null}),
            ),
            (Method::PATCH, "/api/v1/volumes/a", json!({"size": null})),
            (
                Method::PATCH,
                "/api/v1/volumes/a",
                json!({"compression": "off", "size": null}),
            ),
            (
                Method::POST,
                "/api/v1/volumes",
                json!({"name": "a", "size": 1, "compression": null}),
            ),
        ] {
            assert_eq!(r(m.clone(), p, body.clone()), Err(400), "{m} {p} {body}");
        }
    }

    #[test]
    fn unknown_sub_paths_are_404_and_405_says_what_is_allowed() {
        let r = |m: Method, p: &str| route(&m, p, &json!({})).map_err(|e| e.0);
        for p in [
            "/api/v1/rebuild/foo",
            "/api/v1/cleaner/foo",
            "/api/v1/drives/0/foo",
            "/api/v1/drives/0",
            "/api/v1/volumes/a/b",
            "/api/v1/scrub/x",
            "/api/v1status",
        ] {
            for m in [Method::GET, Method::POST, Method::DELETE] {
                assert_eq!(r(m.clone(), p), Err(404), "{m} {p}");
            }
        }
        for (m, p, allow) in [
            (Method::GET, "/api/v1/rebuild/start", "POST"),
            (Method::DELETE, "/api/v1/cleaner/run", "POST"),
            (Method::GET, "/api/v1/drives/0/replace", "POST"),
            (Method::PUT, "/api/v1/volumes/a", "GET, PATCH, DELETE"),
            (Method::DELETE, "/api/v1/drives", "GET, POST"),
            (Method::POST, "/api/v1/status", "GET"),
        ] {
            assert_eq!(r(m.clone(), p), Err(405), "{m} {p}");
            let parts = segments(p).unwrap();
            assert_eq!(allowed_methods(&parts), Some(allow), "{p}");
            // Every method Allow names is routed there.
            for ok in allow.split(", ") {
                let ok: Method = ok.parse().unwrap();
                assert_ne!(r(ok.clone(), p), Err(405), "{ok} {p}");
            }
        }
    }

    #[test]
    fn path_segments_are_percent_decoded() {
        let r = |m: Method, p: &str| route(&m, p, &json!({}));
        assert_eq!(
            r(Method::GET, "/api/v1/volumes/%6Fdd"),
            Ok(Op::VolumeGet { name: "odd".into() })
        );
        assert_eq!(r(Method::GET, "/api/v1/%73tatus"), Ok(Op::Status));
        assert_eq!(
            r(Method::DELETE, "/api/v1/volumes/a%2Fb"),
            Ok(Op::VolumeDelete { name: "a/b".into() }),
            "an escaped slash stays in its segment (the name check refuses it)"
        );
        for bad in [
            "/api/v1/volumes/a%",
            "/api/v1/volumes/a%4",
            "/api/v1/volumes/a%zz",
            "/api/v1/volumes/a%+f",
            "/api/v1/volumes/%ff",
        ] {
            assert_eq!(r(Method::GET, bad).map_err(|e| e.0), Err(400), "{bad}");
        }
    }

    #[test]
    fn gets_refuse_a_body_with_fields() {
        for p in [
            "/api/v1/status",
            "/api/v1/volumes",
            "/api/v1/volumes/a",
            "/api/v1/drives",
            "/api/v1/rebuild",
            "/api/v1/cleaner",
        ] {
            assert!(route(&Method::GET, p, &json!({})).is_ok(), "{p}");
            assert_eq!(
                route(&Method::GET, p, &json!({"x": 1})).map_err(|e| e.0),
                Err(400),
                "{p}"
            );
        }
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        for v in ["Bearer abc", "bearer abc", "BEARER abc", "bEaReR  abc "] {
            assert_eq!(bearer_credentials(v), Some("abc"), "{v:?}");
        }
        for v in ["Basic abc", "Bearerabc", "Bearer", "Bear abc"] {
            assert_eq!(bearer_credentials(v), None, "{v:?}");
        }
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
