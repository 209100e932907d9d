//! DH-HMAC-CHAP secrets (NVMe Base Specification 2.0, 8.13.5.8 "DH-HMAC-CHAP
//! secret representation"): parsing `DHHC-1:XX:<base64>:` strings, the key
//! transformation, the HMAC helper the protocol uses, and the secrets file of
//! `flashpool serve --nvme-dhchap-secret` / `nvmet-mem`.
//!
//! Kept apart from the protocol ([`crate::auth`]) because it is also what the
//! command line checks at startup: a bad secret must stop the server before it
//! listens, not fail the first host that connects.
//!
//! The representation: `DHHC-1:` then two hex digits naming the hash of the
//! key transformation (00 none, 01 SHA-256, 02 SHA-384, 03 SHA-512), then the
//! base64 of the key (32, 48 or 64 bytes; with a transformation hash, exactly
//! that hash's length) followed by the CRC-32 (IEEE) of the key, little
//! endian, then `:`. The transformed key is HMAC(hash, key, NQN ||
//! "NVMe-over-Fabrics"), the NQN being the host's for the host secret and the
//! subsystem's for the controller secret; with hash 00 it is the key itself.
//! This is what `nvme gen-dhchap-key` writes and Linux parses.

use std::fmt;

use base64::Engine;
use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;

/// A DH-HMAC-CHAP hash function (the protocol's HashID values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashId {
    Sha256 = 1,
    Sha384 = 2,
    Sha512 = 3,
}

impl HashId {
    /// The hash of a protocol HashID (None for unknown ones).
    pub fn from_id(id: u8) -> Option<HashId> {
        match id {
            1 => Some(HashId::Sha256),
            2 => Some(HashId::Sha384),
            3 => Some(HashId::Sha512),
            _ => None,
        }
    }

    /// The hash whose output has `len` bytes.
    pub fn from_len(len: usize) -> Option<HashId> {
        match len {
            32 => Some(HashId::Sha256),
            48 => Some(HashId::Sha384),
            64 => Some(HashId::Sha512),
            _ => None,
        }
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    /// Output length in bytes.
    pub fn size(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HashId::Sha256 => "hmac(sha256)",
            HashId::Sha384 => "hmac(sha384)",
            HashId::Sha512 => "hmac(sha512)",
        }
    }

    fn digest(self) -> MessageDigest {
        match self {
            HashId::Sha256 => MessageDigest::sha256(),
            HashId::Sha384 => MessageDigest::sha384(),
            HashId::Sha512 => MessageDigest::sha512(),
        }
    }

    /// The plain hash of `data`.
    pub fn hash(self, data: &[u8]) -> Vec<u8> {
        openssl::hash::hash(self.digest(), data)
            .map(|d| d.to_vec())
            .unwrap_or_default()
    }
}

/// HMAC(`hash`, `key`, the concatenation of `parts`). Empty only if OpenSSL
/// fails, which a caller comparing responses treats as a mismatch.
pub fn hmac(hash: HashId, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let run = || -> Result<Vec<u8>, openssl::error::ErrorStack> {
        let pkey = PKey::hmac(key)?;
        let mut s = Signer::new(hash.digest(), &pkey)?;
        for p in parts {
            s.update(p)?;
        }
        s.sign_to_vec()
    };
    run().unwrap_or_default()
}

/// Compare two byte strings in time independent of where they differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && !a.is_empty() && openssl::memcmp::eq(a, b)
}

/// Why a secret string is not a valid DH-HMAC-CHAP secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("does not start with \"DHHC-1:\"")]
    Prefix,
    #[error("the transformation hash field {0:?} is not 00, 01, 02 or 03")]
    Hash(String),
    #[error("the key is not valid base64")]
    Base64,
    #[error("the key is {0} bytes; a key is 32, 48 or 64 bytes")]
    Length(usize),
    #[error(
        "a {key}-byte key cannot use transformation hash {hash:02} (it needs a {need}-byte key)"
    )]
    LengthForHash { key: usize, hash: u8, need: usize },
    #[error("the key's CRC-32 does not match (a typo or a truncated secret?)")]
    Crc,
    #[error("does not end with ':'")]
    Suffix,
}

/// A parsed secret: the key and its transformation hash. Its `Debug` hides
/// the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
    transform: Option<HashId>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Secret({} bytes, transform {:?})",
            self.key.len(),
            self.transform
        )
    }
}

impl Secret {
    /// Parse `DHHC-1:XX:<base64 of key || crc32>:` (surrounding whitespace allowed).
    pub fn parse(s: &str) -> Result<Secret, SecretError> {
        let s = s.trim();
        let rest = s.strip_prefix("DHHC-1:").ok_or(SecretError::Prefix)?;
        let (hash, rest) = rest.split_once(':').ok_or(SecretError::Prefix)?;
        let transform = match hash {
            "00" => None,
            "01" | "02" | "03" => HashId::from_id(hash.as_bytes()[1] - b'0'),
            _ => return Err(SecretError::Hash(hash.to_string())),
        };
        let b64 = rest.strip_suffix(':').ok_or(SecretError::Suffix)?;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| SecretError::Base64)?;
        let key_len = raw.len().saturating_sub(4);
        if raw.len() < 4 || HashId::from_len(key_len).is_none() {
            return Err(SecretError::Length(key_len));
        }
        if let Some(h) = transform {
            if h.size() != key_len {
                return Err(SecretError::LengthForHash {
                    key: key_len,
                    hash: h.id(),
                    need: h.size(),
                });
            }
        }
        let (key, crc) = raw.split_at(key_len);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(SecretError::Crc);
        }
        Ok(Secret {
            key: key.to_vec(),
            transform,
        })
    }

    /// The `DHHC-1` string of a key (tests, and the guest test's wrong secret).
    pub fn encode(key: &[u8], transform: Option<HashId>) -> String {
        let mut raw = key.to_vec();
        raw.extend_from_slice(&crc32fast::hash(key).to_le_bytes());
        format!(
            "DHHC-1:{:02}:{}:",
            transform.map_or(0, HashId::id),
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    pub fn key_len(&self) -> usize {
        self.key.len()
    }

    pub fn transform_hash(&self) -> Option<HashId> {
        self.transform
    }

    /// The transformed key for `nqn` (the host NQN for a host secret, the
    /// subsystem NQN for a controller secret): the HMAC key of responses.
    pub fn transformed(&self, nqn: &str) -> Vec<u8> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => hmac(h, &self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

/// The secrets of one host: its own (which the host proves it holds) and,
/// optionally, the controller's (which the controller proves to the host:
/// bidirectional authentication).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSecrets {
    pub host: Secret,
    pub ctrl: Option<Secret>,
}

/// One line of a secrets file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretEntry {
    pub hostnqn: String,
    pub secrets: HostSecrets,
}

/// Parse a secrets file: one `HOSTNQN DHHC-1:...: [CTRL-SECRET]` per line
/// (fields separated by spaces or tabs), `#` comments and blank lines
/// ignored. Errors name the line; they never quote a secret.
pub fn parse_secrets_file(text: &str) -> Result<Vec<SecretEntry>, String> {
    let lines = crate::hostfile::host_lines(text, 1..=2, "HOSTNQN DHHC-1:..: [CONTROLLER-SECRET]")?;
    let mut out = Vec::with_capacity(lines.len());
    for l in lines {
        let (n, hostnqn) = (l.n, l.hostnqn);
        let host = Secret::parse(l.keys[0])
            .map_err(|e| format!("line {n}: host secret of {hostnqn}: {e}"))?;
        let ctrl = match l.keys.get(1) {
            Some(c) => Some(
                Secret::parse(c)
                    .map_err(|e| format!("line {n}: controller secret of {hostnqn}: {e}"))?,
            ),
            None => None,
        };
        out.push(SecretEntry {
            hostnqn: hostnqn.to_string(),
            secrets: HostSecrets { host, ctrl },
        });
    }
    Ok(out)
}

/// Read and parse a secrets file. `Ok((entries, warning))`: the warning is
/// set when the file can be read by group or others (mode bits 077).
pub fn load_secrets_file(
    path: &std::path::Path,
) -> Result<(Vec<SecretEntry>, Option<String>), String> {
    let (text, mode) = crate::hostfile::read(path)?;
    let entries = parse_secrets_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if entries.is_empty() {
        return Err(format!("{}: holds no secrets", path.display()));
    }
    let warning = (mode & 0o077 != 0).then(|| {
        format!(
            "{}: DH-HMAC-CHAP secrets file is readable by others (mode {mode:o}); chmod 600 it",
            path.display()
        )
    });
    Ok((entries, warning))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    // Known answers computed independently with Python's hashlib/hmac/base64/zlib
    // (one-off script, see docs/OPERATIONS.md "DH-HMAC-CHAP"):
    //   key = bytes(range(32)) (or range(48), range(64))
    //   secret = "DHHC-1:%02d:" % h + b64encode(key + crc32(key).to_bytes(4, "little")) + ":"
    //   transformed = hmac.new(key, HOSTNQN + b"NVMe-over-Fabrics", sha).hexdigest()
    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f2b7d76-5a7c-4c57-9b6e-5d6a1e3f1c11";
    const SECRET_00: &str = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    const SECRET_01: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    const SECRET_02: &str =
        "DHHC-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:";
    const SECRET_03: &str = "DHHC-1:03:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P4zODhA=:";
    const T01: &str = "301dfbe08e080bab1ef580f970829ed3e617c3098baa9a70cc8a516a4139b673";
    const T02: &str = "8271af7af52b567c90b9a1cf283250f162878cad062187957853ffd96d817d7bd181218f175fa40ce622aecb93238a96";
    const T03: &str = "793efee06949061d9872901f8d41a56c646712726ee98eec867c3390209ec86733354b24f56c5c67887b5d21ee67d72f1089bb85cf14396a653c7b86fe36f24f";

    #[test]
    fn parses_and_transforms_known_answers() {
        let s = Secret::parse(SECRET_00).unwrap();
        assert_eq!(s.key_len(), 32);
        assert_eq!(s.transform_hash(), None);
        assert_eq!(s.transformed(HOSTNQN), (0..32).collect::<Vec<u8>>());
        for (text, want, len) in [
            (SECRET_01, T01, 32),
            (SECRET_02, T02, 48),
            (SECRET_03, T03, 64),
        ] {
            let s = Secret::parse(text).unwrap();
            assert_eq!(s.key_len(), len);
            assert_eq!(hex(&s.transformed(HOSTNQN)), want, "{text}");
        }
    }

    #[test]
    fn encode_round_trips() {
        let key: Vec<u8> = (0..32).collect();
        assert_eq!(Secret::encode(&key, None), SECRET_00);
        let key: Vec<u8> = (0..64).collect();
        assert_eq!(Secret::encode(&key, Some(HashId::Sha512)), SECRET_03);
    }

    #[test]
    fn rejects_bad_secrets() {
        use SecretError::*;
        let bad = |s: &str| Secret::parse(s).unwrap_err();
        assert_eq!(bad("DHHC-2:00:AAAA:"), Prefix);
        assert_eq!(bad("DHHC-1:04:AAAA:"), Hash("04".into()));
        assert_eq!(bad("DHHC-1:1:AAAA:"), Hash("1".into()));
        assert_eq!(bad("DHHC-1:00:!!!!:"), Base64);
        assert_eq!(bad("DHHC-1:00:AAAA:"), Length(0));
        assert_eq!(bad(&SECRET_00[..SECRET_00.len() - 1]), Suffix);
        // A 32-byte key with the SHA-512 transformation.
        let k32 = SECRET_00.replacen(":00:", ":03:", 1);
        assert_eq!(
            bad(&k32),
            LengthForHash {
                key: 32,
                hash: 3,
                need: 64
            }
        );
        // One base64 character changed: the CRC catches it.
        let typo = SECRET_00.replacen("AAEC", "AAED", 1);
        assert_eq!(bad(&typo), Crc);
    }

    #[test]
    fn secrets_file() {
        let text = format!(
            "# hosts\n\n{HOSTNQN} {SECRET_01}\nnqn.2014-08.org.nvmexpress:uuid:other\t{SECRET_00} {SECRET_03}\n"
        );
        let e = parse_secrets_file(&text).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].hostnqn, HOSTNQN);
        assert!(e[0].secrets.ctrl.is_none());
        assert_eq!(e[1].secrets.ctrl.as_ref().unwrap().key_len(), 64);

        let err = parse_secrets_file(&format!("\n{HOSTNQN}\n")).unwrap_err();
        assert!(err.starts_with("line 2: expected"), "{err}");
        let err = parse_secrets_file(&format!("{HOSTNQN} {SECRET_00}\n{HOSTNQN} {SECRET_00}"))
            .unwrap_err();
        assert!(err.contains("line 2") && err.contains("twice"), "{err}");
        let err = parse_secrets_file("host1 DHHC-1:00:AAAA:").unwrap_err();
        assert!(err.contains("not a host NQN"), "{err}");
        let typo = SECRET_00.replacen("AAEC", "AAED", 1);
        let err = parse_secrets_file(&format!("#\n{HOSTNQN} {typo}")).unwrap_err();
        assert!(err.starts_with("line 2: host secret of"), "{err}");
        assert!(!err.contains("AAED"), "errors never quote a secret: {err}");
    }

    #[test]
    fn random_strings_never_panic() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let alphabet = b"DHC-1:0234+/=AZaz09 \t";
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 90) as usize;
            let s: String = (0..len)
                .map(|i| alphabet[((x >> (i % 50)) as usize + i) % alphabet.len()] as char)
                .collect();
            let _ = Secret::parse(&s);
            let _ = Secret::parse(&format!("DHHC-1:0{}:{s}:", x % 5));
            let _ = parse_secrets_file(&s);
        }
    }
}
