//! The NVMe/TCP TLS secure channel (NVMe/TCP transport specification, TLS binding): TLS 1.3
//! with an external pre-shared key, as the Linux initiator does it (`nvme connect --tls`, the
//! handshake run by tlshd with GnuTLS, the key from the kernel's `.nvme` keyring).
//!
//! A TLS connection starts with the ClientHello (the server tells it from a plain ICReq by the
//! first byte, 0x16 against 0x00: [`crate::server`]); the handshake runs here, then the shared
//! pump (`flashpool_tlspump`) carries the session and the queue runs over a plain socket pair
//! exactly as over TCP ([`crate::connection::serve_tls`]).
//!
//! OpenSSL's TLS 1.3 **find-session callback** (`SSL_CTX_set_psk_find_session_callback`)
//! supplies the key, not the older `set_psk_server_callback`: in TLS 1.3 that callback's keys
//! are always taken as SHA-256 keys (TLS_AES_128_GCM_SHA256), while NVMe's `:02:` keys are
//! SHA-384 keys that must run with TLS_AES_256_GCM_SHA384. The callback gets the identity the
//! client offers (`NVMe0R0H host sub` or `NVMe1R0H host sub digest`), derives that host's TLS
//! PSK ([`crate::psk`]) and returns a session carrying the key and the cipher suite of its
//! hash. A client-hello callback first narrows the cipher suites to that hash, so a client
//! offering both suites still negotiates the one the key needs. An unknown identity gets no
//! key and, the server having no certificate, the handshake fails; a wrong key fails the PSK
//! binder check. The `openssl` crate has no binding for the find-session callback, so the few
//! libssl calls it needs are declared here (OpenSSL 1.1.1 or newer).
//!
//! No session tickets are sent (the kernel's TLS socket would have to hand them to the
//! initiator, which has no use for them).

use std::ffi::{c_int, c_uchar};
use std::io;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use foreign_types::ForeignTypeRef;
use openssl::ex_data::Index;
use openssl::ssl::{
    ClientHelloResponse, Ssl, SslContext, SslContextBuilder, SslContextRef, SslMethod, SslMode,
    SslOptions, SslRef, SslVersion,
};
use openssl_sys as ffi;

use crate::psk::{HostPsks, PskIdentity};
use crate::secret::HashId;

/// Whether hosts may or must use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// Plain TCP only (a ClientHello gets a C2HTermReq: it is not an ICReq).
    #[default]
    Off,
    /// TLS or plain, as the host starts.
    On,
    /// TLS only: a plain connection is closed before ICResp.
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<TlsMode, String> {
        match s {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "require" => Ok(TlsMode::Require),
            _ => Err(format!("{s:?}: expected off, on or require")),
        }
    }
}

/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a finished handshake established.
#[derive(Debug, Clone)]
pub struct TlsPeer {
    /// The PSK identity the host used (its host NQN must be the Connect command's).
    pub identity: PskIdentity,
    /// The negotiated cipher suite.
    pub cipher: String,
}

/// The target's TLS setup, built once and shared by every connection.
#[derive(Clone)]
pub struct NvmeTls {
    pub mode: TlsMode,
    ctx: SslContext,
    /// What the keys are, for logs.
    pub describe: String,
}

impl std::fmt::Debug for NvmeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NvmeTls({:?}, {})", self.mode, self.describe)
    }
}

// libssl calls the `openssl` crate does not bind (OpenSSL >= 1.1.1).
type FindSessionCb =
    unsafe extern "C" fn(*mut ffi::SSL, *const c_uchar, usize, *mut *mut ffi::SSL_SESSION) -> c_int;
type UseSessionCb = unsafe extern "C" fn(
    *mut ffi::SSL,
    *const ffi::EVP_MD,
    *mut *const c_uchar,
    *mut usize,
    *mut *mut ffi::SSL_SESSION,
) -> c_int;
extern "C" {
    fn SSL_CTX_set_psk_find_session_callback(ctx: *mut ffi::SSL_CTX, cb: Option<FindSessionCb>);
    fn SSL_CTX_set_psk_use_session_callback(ctx: *mut ffi::SSL_CTX, cb: Option<UseSessionCb>);
    fn SSL_SESSION_new() -> *mut ffi::SSL_SESSION;
    fn SSL_SESSION_set1_master_key(
        s: *mut ffi::SSL_SESSION,
        key: *const c_uchar,
        len: usize,
    ) -> c_int;
    fn SSL_SESSION_set_cipher(s: *mut ffi::SSL_SESSION, c: *const ffi::SSL_CIPHER) -> c_int;
    fn SSL_SESSION_set_protocol_version(s: *mut ffi::SSL_SESSION, v: c_int) -> c_int;
    fn SSL_CIPHER_find(ssl: *mut ffi::SSL, bytes: *const c_uchar) -> *const ffi::SSL_CIPHER;
}

/// The cipher suite of a hash, by name and by its two-byte code.
fn suite(h: HashId) -> (&'static str, [u8; 2]) {
    match h {
        HashId::Sha384 => ("TLS_AES_256_GCM_SHA384", [0x13, 0x02]),
        _ => ("TLS_AES_128_GCM_SHA256", [0x13, 0x01]),
    }
}

fn keys_index() -> Index<SslContext, Arc<HostPsks>> {
    static I: OnceLock<Index<SslContext, Arc<HostPsks>>> = OnceLock::new();
    *I.get_or_init(|| SslContext::new_ex_index().expect("OpenSSL ex_data index"))
}

fn peer_index() -> Index<Ssl, PskIdentity> {
    static I: OnceLock<Index<Ssl, PskIdentity>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
}

/// A TLS 1.3 session holding `key` for the cipher suite of `h` (null on failure).
///
/// # Safety
/// `ssl` must be a live SSL object.
unsafe fn psk_session(ssl: *mut ffi::SSL, key: &[u8], h: HashId) -> *mut ffi::SSL_SESSION {
    let code = suite(h).1;
    let cipher = SSL_CIPHER_find(ssl, code.as_ptr());
    if cipher.is_null() {
        return std::ptr::null_mut();
    }
    let s = SSL_SESSION_new();
    if s.is_null() {
        return s;
    }
    if SSL_SESSION_set1_master_key(s, key.as_ptr(), key.len()) != 1
        || SSL_SESSION_set_cipher(s, cipher) != 1
        || SSL_SESSION_set_protocol_version(s, ffi::TLS1_3_VERSION) != 1
    {
        ffi::SSL_SESSION_free(s);
        return std::ptr::null_mut();
    }
    s
}

/// The server's find-session callback: the identity's key, or no session (1 either way: 0
/// would abort the handshake with an internal error instead of a clean refusal).
unsafe extern "C" fn find_session(
    ssl: *mut ffi::SSL,
    id: *const c_uchar,
    idlen: usize,
    out: *mut *mut ffi::SSL_SESSION,
) -> c_int {
    let r = std::panic::catch_unwind(|| {
        // SAFETY: OpenSSL passes a live SSL, `idlen` bytes at `id`, and a place for the session.
        unsafe {
            *out = std::ptr::null_mut();
            if id.is_null() || idlen == 0 || idlen > 1024 {
                return;
            }
            let identity = std::slice::from_raw_parts(id, idlen);
            let sref = SslRef::from_ptr_mut(ssl);
            let Some(keys) = sref.ssl_context().ex_data(keys_index()).cloned() else {
                return;
            };
            match keys.lookup(identity) {
                Some((pid, key, h)) => {
                    let s = psk_session(ssl, &key, h);
                    if !s.is_null() {
                        sref.set_ex_data(peer_index(), pid);
                        *out = s;
                    }
                }
                None => tracing::warn!(
                    identity = %String::from_utf8_lossy(identity),
                    "TLS: PSK identity refused (no key for that host, another hash, or a wrong digest)"
                ),
            }
        }
    });
    if r.is_err() {
        // SAFETY: `out` is OpenSSL's place for the session.
        unsafe { *out = std::ptr::null_mut() };
    }
    1
}

/// The first PSK identity a ClientHello offers (its `pre_shared_key` extension).
fn offered_identity(ssl: &SslRef) -> Option<Vec<u8>> {
    let mut p: *const c_uchar = std::ptr::null();
    let mut len: usize = 0;
    // SAFETY: called from the client-hello callback; OpenSSL points `p` at `len` bytes it owns
    // for the duration of the callback.
    let ext = unsafe {
        if ffi::SSL_client_hello_get0_ext(ssl.as_ptr(), 41, &mut p, &mut len) != 1 || p.is_null() {
            return None;
        }
        std::slice::from_raw_parts(p, len)
    };
    // identities<7..2^16-1>: { opaque identity<1..2^16-1>; uint32 age; } ...
    let list = ext.get(2..)?;
    let n = u16::from_be_bytes([*list.first()?, *list.get(1)?]) as usize;
    list.get(2..2 + n).map(<[u8]>::to_vec)
}

impl NvmeTls {
    /// The TLS of `flashpool serve --nvme-tls MODE --nvme-tls-psk FILE` (and nvmet-mem's
    /// `--tls`/`--tls-psk`): None when off; `on`/`require` need the PSK file, read and checked
    /// now. Also returns the file's warning, if any ([`HostPsks::load`]).
    pub fn configure(
        mode: TlsMode,
        psk_file: Option<&std::path::Path>,
    ) -> Result<(Option<Arc<NvmeTls>>, Option<String>), String> {
        if mode == TlsMode::Off {
            return Ok((None, None));
        }
        let Some(path) = psk_file else {
            return Err(format!(
                "NVMe/TCP TLS {mode:?} needs a PSK file (HOSTNQN NVMeTLSkey-1:..: lines)"
            ));
        };
        let (keys, warning) = HostPsks::load(path)?;
        let describe = format!(
            "TLS 1.3 PSK, {} host(s) from {}",
            keys.keys.len(),
            path.display()
        );
        Ok((Some(Arc::new(NvmeTls::new(mode, keys, describe)?)), warning))
    }

    /// Builds the server's TLS context for `keys` (`--nvme-tls-psk`).
    pub fn new(mode: TlsMode, keys: HostPsks, describe: String) -> Result<NvmeTls, String> {
        let e = |e: openssl::error::ErrorStack| format!("TLS setup: {e}");
        let mut b = SslContextBuilder::new(SslMethod::tls_server()).map_err(e)?;
        b.set_min_proto_version(Some(SslVersion::TLS1_3))
            .map_err(e)?;
        b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384")
            .map_err(e)?;
        b.set_options(SslOptions::NO_TICKET);
        b.set_num_tickets(0).map_err(e)?;
        b.set_mode(SslMode::ACCEPT_MOVING_WRITE_BUFFER | SslMode::ENABLE_PARTIAL_WRITE);
        b.set_ex_data(keys_index(), Arc::new(keys));
        // Narrow the suites to the offered key's hash before OpenSSL picks one.
        b.set_client_hello_callback(|ssl, _alert| {
            if let Some(pid) = offered_identity(ssl).and_then(|i| PskIdentity::parse(&i)) {
                let h = if pid.cipher == 2 {
                    HashId::Sha384
                } else {
                    HashId::Sha256
                };
                ssl.set_ciphersuites(suite(h).0)?;
            }
            Ok(ClientHelloResponse::SUCCESS)
        });
        // SAFETY: installs a callback with the signature libssl expects on a context we own.
        unsafe { SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_session)) };
        Ok(NvmeTls {
            mode,
            ctx: b.build(),
            describe,
        })
    }

    /// The TLS side of a connection whose first byte was a TLS record: the handshake (at most
    /// [`HANDSHAKE_TIMEOUT`]), then the pump; returns the plain end and what the handshake
    /// established. Any failure is an error to log, the connection then dropped.
    pub fn accept(&self, stream: TcpStream) -> io::Result<(UnixStream, TlsPeer)> {
        let refused = |m: String| io::Error::new(io::ErrorKind::PermissionDenied, m);
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let _ = stream.set_nodelay(true);
        let ssl = Ssl::new(&self.ctx).map_err(|e| refused(format!("TLS session: {e}")))?;
        let tls = ssl
            .accept(stream)
            .map_err(|e| refused(format!("TLS handshake failed: {e}")))?;
        let Some(identity) = tls.ssl().ex_data(peer_index()).cloned() else {
            return Err(refused("TLS handshake without a PSK".into()));
        };
        let cipher = tls
            .ssl()
            .current_cipher()
            .map_or_else(String::new, |c| c.name().to_string());
        tls.get_ref().set_read_timeout(None)?;
        tls.get_ref().set_write_timeout(None)?;
        let plain = flashpool_tlspump::start(tls, "nvmet-tls")?;
        Ok((plain, TlsPeer { identity, cipher }))
    }
}

/// What a client context offers (tests and tools: an OpenSSL NVMe/TCP TLS client).
struct ClientPsk {
    identity: Vec<u8>,
    key: Vec<u8>,
    hash: HashId,
}

fn client_index() -> Index<SslContext, ClientPsk> {
    static I: OnceLock<Index<SslContext, ClientPsk>> = OnceLock::new();
    *I.get_or_init(|| SslContext::new_ex_index().expect("OpenSSL ex_data index"))
}

unsafe extern "C" fn use_session(
    ssl: *mut ffi::SSL,
    _md: *const ffi::EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    out: *mut *mut ffi::SSL_SESSION,
) -> c_int {
    // SAFETY: OpenSSL passes a live SSL and places for the identity and the session; the
    // identity bytes live in the context's ex_data, as long as the context.
    unsafe {
        *out = std::ptr::null_mut();
        let ctx: &SslContextRef = SslRef::from_ptr(ssl).ssl_context();
        let Some(c) = ctx.ex_data(client_index()) else {
            return 0;
        };
        let s = psk_session(ssl, &c.key, c.hash);
        if s.is_null() {
            return 0;
        }
        *id = c.identity.as_ptr();
        *idlen = c.identity.len();
        *out = s;
    }
    1
}

/// A TLS 1.3 client context offering `identity` with TLS PSK `key` (of hash `hash`: the cipher
/// suite is that hash's only). For tests and tools; the Linux initiator uses tlshd.
pub fn client_context(identity: &str, key: &[u8], hash: HashId) -> Result<SslContext, String> {
    let e = |e: openssl::error::ErrorStack| format!("TLS client setup: {e}");
    let mut b = SslContextBuilder::new(SslMethod::tls_client()).map_err(e)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3))
        .map_err(e)?;
    b.set_ciphersuites(suite(hash).0).map_err(e)?;
    b.set_ex_data(
        client_index(),
        ClientPsk {
            identity: identity.as_bytes().to_vec(),
            key: key.to_vec(),
            hash,
        },
    );
    // SAFETY: installs a callback with the signature libssl expects on a context we own.
    unsafe { SSL_CTX_set_psk_use_session_callback(b.as_ptr(), Some(use_session)) };
    Ok(b.build())
}
