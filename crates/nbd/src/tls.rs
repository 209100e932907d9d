//! TLS for NBD (`NBD_OPT_STARTTLS`), as nbdkit and qemu-nbd do it: X.509 certificates laid out
//! as nbdkit expects (`ca-cert.pem`, `server-cert.pem`, `server-key.pem` in one directory; with
//! `verify_peer`, clients must present a certificate the CA signed) or pre-shared keys in the
//! psktool format (`identity:hexkey` per line).
//!
//! OpenSSL (the `openssl` crate) does the cryptography: rustls has no external-PSK support in a
//! release, and PSK is what `nbdinfo --tls-psk-file` and qemu's `tls-creds-psk` speak. An
//! OpenSSL session cannot be read and written from two threads at once, while the transmission
//! phase reads requests on one thread and writes replies from several; so after the TLS
//! handshake the shared **pump** (`flashpool_tlspump`, also used by NVMe/TCP) moves bytes
//! between the TLS socket and one end of a Unix socket pair, and the rest of the server runs
//! over the other end exactly as over a plain socket.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::RawFd;

use crate::transport::dup;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openssl::ssl::{
    Ssl, SslAcceptor, SslContext, SslFiletype, SslMethod, SslMode, SslVerifyMode, SslVersion,
};

/// Whether clients may or must use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is answered `NBD_REP_ERR_UNSUP`.
    #[default]
    Off,
    /// TLS when the client asks for it.
    On,
    /// TLS before anything else: other options get `NBD_REP_ERR_TLS_REQD`.
    Require,
}

/// Where the server's credentials come from.
#[derive(Debug, Clone)]
pub enum TlsCredentials {
    /// A directory holding `ca-cert.pem`, `server-cert.pem` and `server-key.pem`; with
    /// `verify_peer` the client must present a certificate signed by that CA.
    X509 { dir: PathBuf, verify_peer: bool },
    /// A psktool file: `identity:hexkey` lines.
    Psk { file: PathBuf },
}

/// A server's TLS setup, built once and shared by every connection.
#[derive(Clone)]
pub struct Tls {
    pub mode: TlsMode,
    ctx: SslContext,
    /// What the credentials are, for logs.
    pub describe: String,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tls({:?}, {})", self.mode, self.describe)
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn ssl_err(what: &str, e: openssl::error::ErrorStack) -> io::Error {
    invalid(format!("{what}: {e}"))
}

/// Reads a psktool file: `identity:hexkey` per line (blank lines and `#` comments skipped).
pub fn read_psk_file(path: &Path) -> io::Result<HashMap<String, Vec<u8>>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(format!("cannot read the PSK file {}: {e}", path.display())))?;
    let mut keys = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| invalid(format!("{}:{}: {why}", path.display(), n + 1));
        let (id, hex) = line
            .rsplit_once(':')
            .ok_or_else(|| bad("expected identity:hexkey"))?;
        if id.is_empty() || id.len() > 128 {
            return Err(bad("the identity must be 1 to 128 bytes"));
        }
        if hex.is_empty() || hex.len() % 2 != 0 || hex.len() > 2 * 64 {
            return Err(bad("the key must be 1 to 64 bytes in hexadecimal"));
        }
        let key = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| bad("the key is not hexadecimal"))?;
        if keys.insert(id.to_string(), key).is_some() {
            return Err(bad("identity listed twice"));
        }
    }
    if keys.is_empty() {
        return Err(invalid(format!("{}: no keys", path.display())));
    }
    Ok(keys)
}

impl Tls {
    /// Builds the server's TLS context; every problem (a missing file, a key that does not
    /// match its certificate, a malformed PSK file) is a clear error naming the file.
    pub fn new(mode: TlsMode, creds: &TlsCredentials) -> io::Result<Tls> {
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
            .map_err(|e| ssl_err("TLS setup", e))?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(|e| ssl_err("TLS setup", e))?;
        // Non-blocking writes may be retried with the rest of a buffer that moved.
        b.set_mode(SslMode::ACCEPT_MOVING_WRITE_BUFFER | SslMode::ENABLE_PARTIAL_WRITE);
        let describe = match creds {
            TlsCredentials::X509 { dir, verify_peer } => {
                let f = |n: &str| dir.join(n);
                for n in ["ca-cert.pem", "server-cert.pem", "server-key.pem"] {
                    if !f(n).is_file() {
                        return Err(invalid(format!("{} is missing", f(n).display())));
                    }
                }
                b.set_certificate_chain_file(f("server-cert.pem"))
                    .map_err(|e| ssl_err(&format!("{}", f("server-cert.pem").display()), e))?;
                b.set_private_key_file(f("server-key.pem"), SslFiletype::PEM)
                    .map_err(|e| ssl_err(&format!("{}", f("server-key.pem").display()), e))?;
                b.check_private_key()
                    .map_err(|e| ssl_err("server-key.pem does not match server-cert.pem", e))?;
                b.set_ca_file(f("ca-cert.pem"))
                    .map_err(|e| ssl_err(&format!("{}", f("ca-cert.pem").display()), e))?;
                if *verify_peer {
                    b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
                } else {
                    b.set_verify(SslVerifyMode::NONE);
                }
                format!(
                    "X.509 certificates in {}{}",
                    dir.display(),
                    if *verify_peer {
                        ", client certificates verified"
                    } else {
                        ""
                    }
                )
            }
            TlsCredentials::Psk { file } => {
                let keys = Arc::new(read_psk_file(file)?);
                let n = keys.len();
                // PSK cipher suites for TLS 1.2 (GnuTLS clients offer them); TLS 1.3 uses the
                // key through the same callback.
                b.set_cipher_list("PSK:ECDHE-PSK:DHE-PSK:!NULL")
                    .map_err(|e| ssl_err("TLS PSK cipher list", e))?;
                b.set_psk_server_callback(move |_ssl, identity, out| {
                    let id = identity.and_then(|i| std::str::from_utf8(i).ok());
                    match id.and_then(|i| keys.get(i)) {
                        Some(k) if k.len() <= out.len() => {
                            out[..k.len()].copy_from_slice(k);
                            Ok(k.len())
                        }
                        _ => {
                            tracing::info!(identity = ?id, "TLS-PSK: unknown identity refused");
                            Ok(0)
                        }
                    }
                });
                format!("TLS-PSK, {n} identities from {}", file.display())
            }
        };
        Ok(Tls {
            mode,
            ctx: b.build().into_context(),
            describe,
        })
    }

    /// Runs the server side of the TLS handshake on socket `fd` (a duplicate is taken; the
    /// caller's descriptor stays open), then starts the pump; returns the plain end of the
    /// socket pair the session continues on.
    pub fn start(&self, fd: RawFd, peer: &str) -> io::Result<UnixStream> {
        let sock = File::from(dup(fd)?);
        let ssl = Ssl::new(&self.ctx).map_err(|e| ssl_err("TLS session", e))?;
        // The handshake runs blocking (the caller's socket has its handshake deadline).
        let stream = ssl.accept(sock).map_err(|e| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("TLS handshake: {e}"),
            )
        })?;
        tracing::debug!(
            "{peer}: TLS {} {}",
            stream.ssl().version_str(),
            stream.ssl().current_cipher().map_or("", |c| c.name())
        );
        flashpool_tlspump::start(stream, "nbd-tls")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_files_parse_and_bad_lines_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keys.psk");
        std::fs::write(
            &p,
            "# keys\nalice:00112233445566778899aabbccddeeff\n\nbob:abcd\n",
        )
        .unwrap();
        let k = read_psk_file(&p).unwrap();
        assert_eq!(k["alice"].len(), 16);
        assert_eq!(k["bob"], vec![0xab, 0xcd]);
        for (text, want) in [
            ("alice\n", ":1: expected identity:hexkey"),
            ("alice:xyz1\n", ":1: the key is not hexadecimal"),
            ("ok:00\nalice:abc\n", ":2: the key must be"),
            ("a:00\na:11\n", ":2: identity listed twice"),
            ("# nothing\n", "no keys"),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = read_psk_file(&p).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        assert!(read_psk_file(&dir.path().join("none")).is_err());
    }

    #[test]
    fn missing_certificates_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = Tls::new(
            TlsMode::Require,
            &TlsCredentials::X509 {
                dir: dir.path().to_owned(),
                verify_peer: false,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("ca-cert.pem is missing"), "{e}");
    }
}
