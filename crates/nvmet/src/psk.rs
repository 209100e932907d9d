//! NVMe/TCP TLS pre-shared keys: the PSK interchange format (`NVMeTLSkey-1:HH:<base64>:`,
//! as `nvme gen-tls-key` prints it), the derivation of the retained PSK, the PSK identity and
//! the TLS PSK exactly as libnvme 1.13 / nvme-cli 2.13 derive them before inserting the key
//! into the kernel's `.nvme` keyring (which is what the Linux initiator and tlshd then offer),
//! and the PSK file of `flashpool serve --nvme-tls-psk` (`HOSTNQN NVMeTLSkey-1:..:` lines).
//!
//! The derivation (NVMe/TCP transport specification, "TLS PSK and PSK identity derivation"),
//! with the hash H of the key (SHA-256 for 32-byte keys, SHA-384 for 48-byte ones):
//!
//! - retained PSK = HKDF-Expand-Label(HKDF-Extract(0, configured), "HostNQN", hostnqn, L),
//!   or the configured key itself when the key's hash field is `00`;
//! - identity v0 = `NVMe0RHH <hostnqn> <subnqn>`; v1 = `NVMe1RHH <hostnqn> <subnqn> <digest>`
//!   with digest = `base64(HMAC-H(retained, "<hostnqn> <subnqn> NVMe-over-Fabrics"))`;
//! - TLS PSK = HKDF-Expand-Label(HKDF-Extract(0, retained), "nvme-tls-psk", context, L), the
//!   context being the whole identity (v0) or `HH <digest>` (v1).
//!
//! libnvme builds the HKDF info of its "Expand-Label" as `le16(L) "tls13 " label context`,
//! without RFC 8446's length bytes before label and context (newer libnvme calls this the
//! "compat" derivation and keeps it for interoperability); the keys the kernel holds are
//! made that way, so this module does the same. Known answers: libnvme's `test/psk.c`
//! identities and an independent Python implementation (`tests/vectors/tls_psk.py`).

use std::collections::HashMap;
use std::fmt;

use base64::Engine;

use crate::secret::{hmac, HashId};

/// A configured PSK in the interchange format.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredPsk {
    /// The key's hash field: 0 (use as retained PSK), 1 (SHA-256), 2 (SHA-384).
    pub transform: u8,
    /// 32 or 48 bytes.
    pub key: Vec<u8>,
}

impl fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ConfiguredPsk({:02}, {} bytes)",
            self.transform,
            self.key.len()
        )
    }
}

impl ConfiguredPsk {
    /// Parses `NVMeTLSkey-1:HH:<base64(key + crc32)>:`; errors never quote the key.
    pub fn parse(s: &str) -> Result<ConfiguredPsk, String> {
        let rest = s
            .strip_prefix("NVMeTLSkey-1:")
            .ok_or("not a PSK in interchange format (NVMeTLSkey-1:HH:...:)")?;
        let (hh, rest) = rest
            .split_once(':')
            .ok_or("no hash field (NVMeTLSkey-1:HH:...:)")?;
        let transform = match hh {
            "00" => 0,
            "01" => 1,
            "02" => 2,
            _ => return Err(format!("hash field {hh:?} is not 00, 01 or 02")),
        };
        let b64 = rest
            .strip_suffix(':')
            .ok_or("the key does not end with ':'")?;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| "the key is not base64".to_string())?;
        if raw.len() != 36 && raw.len() != 52 {
            return Err(format!(
                "the key is {} bytes; 32 or 48 (and a CRC-32) expected",
                raw.len().saturating_sub(4)
            ));
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err("the key's CRC-32 does not match (mistyped key?)".into());
        }
        let want = match transform {
            1 => Some(32),
            2 => Some(48),
            _ => None,
        };
        if want.is_some_and(|w| w != key.len()) {
            return Err(format!(
                "hash field {hh} needs a {}-byte key, this one has {}",
                want.unwrap_or(0),
                key.len()
            ));
        }
        Ok(ConfiguredPsk {
            transform,
            key: key.to_vec(),
        })
    }

    /// The interchange form of this key.
    pub fn encode(&self) -> String {
        let mut raw = self.key.clone();
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        format!(
            "NVMeTLSkey-1:{:02}:{}:",
            self.transform,
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    /// The hash of every derivation step (and of the TLS cipher suite).
    pub fn hash(&self) -> HashId {
        if self.key.len() == 48 {
            HashId::Sha384
        } else {
            HashId::Sha256
        }
    }

    /// The PSK identity's hash specifier (`RHH`): 1 SHA-256, 2 SHA-384.
    pub fn cipher_id(&self) -> u8 {
        self.hash().id()
    }

    /// The retained PSK for host `hostnqn`.
    pub fn retained(&self, hostnqn: &str) -> Vec<u8> {
        if self.transform == 0 {
            return self.key.clone();
        }
        expand_label(
            self.hash(),
            &self.key,
            b"HostNQN",
            &[hostnqn.as_bytes()],
            self.key.len(),
        )
    }

    /// The PSK identity (version 0 or 1) and TLS PSK for `hostnqn` and `subnqn`.
    pub fn tls_psk(&self, hostnqn: &str, subnqn: &str, version: u8) -> (String, Vec<u8>) {
        let h = self.hash();
        let retained = self.retained(hostnqn);
        let hh = format!("{:02}", self.cipher_id());
        if version == 0 {
            let identity = format!("NVMe0R{hh} {hostnqn} {subnqn}");
            let psk = expand_label(
                h,
                &retained,
                b"nvme-tls-psk",
                &[identity.as_bytes()],
                self.key.len(),
            );
            (identity, psk)
        } else {
            let mac = hmac(
                h,
                &retained,
                &[
                    hostnqn.as_bytes(),
                    b" ",
                    subnqn.as_bytes(),
                    b" NVMe-over-Fabrics",
                ],
            );
            let digest = base64::engine::general_purpose::STANDARD.encode(mac);
            let identity = format!("NVMe1R{hh} {hostnqn} {subnqn} {digest}");
            let psk = expand_label(
                h,
                &retained,
                b"nvme-tls-psk",
                &[hh.as_bytes(), b" ", digest.as_bytes()],
                self.key.len(),
            );
            (identity, psk)
        }
    }
}

/// HKDF-Extract with no salt, then libnvme's HKDF-Expand-Label (see the module comment).
fn expand_label(h: HashId, ikm: &[u8], label: &[u8], context: &[&[u8]], len: usize) -> Vec<u8> {
    // No salt: RFC 5869 uses HashLen zero bytes (OpenSSL refuses an empty HMAC key).
    let prk = hmac(h, &vec![0u8; h.size()], &[ikm]);
    if prk.is_empty() {
        return Vec::new();
    }
    let mut info = Vec::new();
    info.extend_from_slice(&(len as u16).to_le_bytes());
    info.extend_from_slice(b"tls13 ");
    info.extend_from_slice(label);
    for c in context {
        info.extend_from_slice(c);
    }
    let mut out = Vec::with_capacity(len + h.size());
    let mut t: Vec<u8> = Vec::new();
    let mut i = 1u8;
    while out.len() < len {
        t = hmac(h, &prk, &[&t, &info, &[i]]);
        if t.is_empty() {
            return Vec::new();
        }
        out.extend_from_slice(&t);
        i = i.wrapping_add(1);
    }
    out.truncate(len);
    out
}

/// A PSK identity as a client offers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PskIdentity {
    pub version: u8,
    /// 1 SHA-256, 2 SHA-384.
    pub cipher: u8,
    pub hostnqn: String,
    pub subnqn: String,
}

impl PskIdentity {
    /// Parses `NVMe<v>R<hh> <hostnqn> <subnqn>[ <digest>]` (retained keys only: a generated
    /// `G` key needs secure concatenation, which this target does not do).
    pub fn parse(id: &[u8]) -> Option<PskIdentity> {
        let s = std::str::from_utf8(id).ok()?;
        let mut f = s.split(' ');
        let head = f.next()?;
        let hostnqn = f.next()?;
        let subnqn = f.next()?;
        let digest = f.next();
        if f.next().is_some() || head.len() != 8 || !head.starts_with("NVMe") {
            return None;
        }
        let b = head.as_bytes();
        let version = match b[4] {
            b'0' => 0,
            b'1' => 1,
            _ => return None,
        };
        if b[5] != b'R' {
            return None;
        }
        let cipher = match &head[6..8] {
            "01" => 1,
            "02" => 2,
            _ => return None,
        };
        if (version == 1) != digest.is_some() || hostnqn.is_empty() || subnqn.is_empty() {
            return None;
        }
        Some(PskIdentity {
            version,
            cipher,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
        })
    }
}

/// The configured PSK of each host (`--nvme-tls-psk FILE`).
#[derive(Clone, Default, Debug)]
pub struct HostPsks {
    pub keys: HashMap<String, ConfiguredPsk>,
}

impl HostPsks {
    /// The TLS PSK for an identity a client offered, if the identity is well formed, names a
    /// host with a configured key whose hash matches, and (v1) carries the right digest.
    pub fn lookup(&self, identity: &[u8]) -> Option<(PskIdentity, Vec<u8>, HashId)> {
        let id = PskIdentity::parse(identity)?;
        let key = self.keys.get(&id.hostnqn)?;
        if key.cipher_id() != id.cipher {
            return None;
        }
        let (want, psk) = key.tls_psk(&id.hostnqn, &id.subnqn, id.version);
        if psk.len() != key.key.len() || !crate::secret::same(want.as_bytes(), identity) {
            return None;
        }
        Some((id, psk, key.hash()))
    }

    /// Parses a PSK file: `HOSTNQN NVMeTLSkey-1:..:` per line, `#` comments and blank lines
    /// skipped. Errors name the line and never quote a key.
    pub fn parse(text: &str) -> Result<HostPsks, String> {
        let mut keys = HashMap::new();
        for l in crate::hostfile::host_lines(text, 1..=1, "HOSTNQN NVMeTLSkey-1:..:")? {
            let key = ConfiguredPsk::parse(l.keys[0])
                .map_err(|e| format!("line {}: PSK of {}: {e}", l.n, l.hostnqn))?;
            keys.insert(l.hostnqn.to_string(), key);
        }
        Ok(HostPsks { keys })
    }

    /// Reads a PSK file. A file others may read is refused; one the group may read is
    /// accepted with a warning (the second value).
    pub fn load(path: &std::path::Path) -> Result<(HostPsks, Option<String>), String> {
        let (text, mode) = crate::hostfile::read(path)?;
        if mode & 0o004 != 0 {
            return Err(format!(
                "{}: TLS PSK file is readable by others (mode {mode:o}); refusing it: chmod 600 it",
                path.display()
            ));
        }
        let keys = HostPsks::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if keys.keys.is_empty() {
            return Err(format!("{}: holds no PSKs", path.display()));
        }
        let warning = (mode & 0o070 != 0).then(|| {
            format!(
                "{}: TLS PSK file is readable by its group (mode {mode:o}); chmod 600 it",
                path.display()
            )
        });
        Ok((keys, warning))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    const HOST: &str = "nqn.psk-test-host";
    const SUB: &str = "nqn.psk-test-subsys";
    // libnvme test/psk.c: the configured keys and their interchange forms.
    const KEY32: &str = "5512DBB6737D0106F65975B773DFB011FFC344BCF442E2DD6D8BC4870B5D5B03";
    const IC01: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
    const IC02: &str =
        "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:";
    const IC00: &str = "NVMeTLSkey-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

    #[test]
    fn interchange_format_matches_libnvme() {
        let k = ConfiguredPsk::parse(IC01).unwrap();
        assert_eq!(k.transform, 1);
        assert_eq!(k.key, unhex(KEY32));
        assert_eq!(k.encode(), IC01);
        let k = ConfiguredPsk::parse(IC02).unwrap();
        assert_eq!(k.key.len(), 48);
        assert_eq!(k.encode(), IC02);
        assert_eq!(ConfiguredPsk::parse(IC00).unwrap().transform, 0);
    }

    /// Identities (v1 digests) from libnvme's test/psk.c ("compat" table, which is what
    /// libnvme 1.13 / nvme-cli 2.13 derive; `nvme check-tls-key -I 1` prints the same); the
    /// retained and TLS PSKs from the independent Python implementation
    /// `tests/vectors/tls_psk.py` (which reproduces those libnvme identities too).
    #[test]
    fn derivation_known_answers() {
        let cases = [
            (IC01, 0, "NVMe0R01 nqn.psk-test-host nqn.psk-test-subsys",
             "ad4cdadfcbaf4e353fcbd09aac891c4d75c5300fe5ee7bb04ae87726a312eddc",
             "09fb1983ac6d6d0353e7cae4f23daddd651c367fa347c59d9cf6936f5a83eafb"),
            (IC01, 1, "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys 66GuqV08TsAGII39teWUfwQwizjv06Jy8jOcX3NAAzM=",
             "ad4cdadfcbaf4e353fcbd09aac891c4d75c5300fe5ee7bb04ae87726a312eddc",
             "b9f5ab2a41ba6e72a23a12066302a2f775fa6c0942c8e0b18ca8ac07edf305e2"),
            (IC02, 0, "NVMe0R02 nqn.psk-test-host nqn.psk-test-subsys",
             "12d2452bc4783f50286bf940ad1caa05a304065e379024d9278ca7c9d8a42400c47029f198bfcdf5f14c07cb04eb7306",
             "2ee4754186a625b28a3936ef4a40d839c3ad958b2e017562ee07e2501f172ce999dc9c29033ea7ee33f814f192c13f47"),
            (IC02, 1, "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys RsKmYJ3nAn1ApjjMloJFbAkLPivONDAX/xW327YBUsn2eGShXSjCZvBaOxscLqmz",
             "12d2452bc4783f50286bf940ad1caa05a304065e379024d9278ca7c9d8a42400c47029f198bfcdf5f14c07cb04eb7306",
             "fcefe2e2a2e682b1447dcabf1ec268f78f08c63cd075753abcc8bda2c5c34d48d3014aa8d76ad80107e4f5c9f27e2149"),
            (IC00, 0, "NVMe0R01 nqn.psk-test-host nqn.psk-test-subsys",
             "5512dbb6737d0106f65975b773dfb011ffc344bcf442e2dd6d8bc4870b5d5b03",
             "e2b16189378b34adba9fec995ab479040cedec0bc7c6b47728ee4d8de6ff52ba"),
            (IC00, 1, "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys quJVUJjp/BImWR0UQay/MjSfEgyAr6TyBOWybS/B404=",
             "5512dbb6737d0106f65975b773dfb011ffc344bcf442e2dd6d8bc4870b5d5b03",
             "d50f6d3dd79345b6e8217744524df5ac0dc66964ff70cc5fd18e1b9d57ce7fcf"),
        ];
        for (ic, v, identity, retained, psk) in cases {
            let k = ConfiguredPsk::parse(ic).unwrap();
            assert_eq!(k.retained(HOST), unhex(retained), "{ic} retained");
            let (id, p) = k.tls_psk(HOST, SUB, v);
            assert_eq!(id, identity, "{ic} v{v}");
            assert_eq!(p, unhex(psk), "{ic} v{v} TLS PSK");
            // The server finds the same key from the identity alone.
            let keys = HostPsks {
                keys: HashMap::from([(HOST.to_string(), k.clone())]),
            };
            let (pid, lp, h) = keys.lookup(identity.as_bytes()).unwrap();
            assert_eq!((pid.version, pid.hostnqn.as_str()), (v, HOST));
            assert_eq!((lp, h), (unhex(psk), k.hash()));
        }
    }

    #[test]
    fn lookups_refuse_what_does_not_match() {
        let k = ConfiguredPsk::parse(IC01).unwrap();
        let keys = HostPsks {
            keys: HashMap::from([(HOST.to_string(), k)]),
        };
        for bad in [
            "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys AAAAqV08TsAGII39teWUfwQwizjv06Jy8jOcX3NAAzM=",
            "NVMe0R02 nqn.psk-test-host nqn.psk-test-subsys",
            "NVMe0R01 nqn.other-host nqn.psk-test-subsys",
            "NVMe0G01 nqn.psk-test-host nqn.psk-test-subsys",
            "NVMe0R01 nqn.psk-test-host nqn.psk-test-subsys extra",
            "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys",
            "NVMe2R01 nqn.psk-test-host nqn.psk-test-subsys",
            "NVMe0R01",
            "",
            "\u{0}\u{ff}",
        ] {
            assert!(keys.lookup(bad.as_bytes()).is_none(), "{bad:?}");
        }
        assert!(keys.lookup(&[0xff, 0xfe, 0x20]).is_none());
    }

    #[test]
    fn bad_keys_and_files_are_clear_errors() {
        for (s, want) in [
            ("NVMeTLSkey-1:01:AAAA:", "32 or 48"),
            (
                "NVMeTLSkey-1:03:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
                "not 00, 01 or 02",
            ),
            (
                "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrY:",
                "CRC-32",
            ),
            (
                "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
                "48-byte",
            ),
            (
                "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ",
                "end with",
            ),
            ("NVMeTLSkey-1:01:!!!!:", "base64"),
            ("DHHC-1:01:abc:", "interchange"),
        ] {
            let e = ConfiguredPsk::parse(s).unwrap_err();
            assert!(e.contains(want), "{s}: {e}");
            assert!(!e.contains("VRLb"), "the key is quoted: {e}");
        }
        let text = format!("# hosts\n{HOST} {IC01}\n\n");
        assert_eq!(HostPsks::parse(&text).unwrap().keys.len(), 1);
        for (t, want) in [
            (format!("{HOST} {IC01}\n{HOST} {IC02}\n"), "line 2: host"),
            (format!("\n{HOST}\n"), "line 2: expected"),
            (
                format!("host {IC01}\n"),
                "line 1: \"host\" is not a host NQN",
            ),
            (
                format!("# x\n{HOST} NVMeTLSkey-1:01:AAAA:\n"),
                "line 2: PSK of",
            ),
        ] {
            let e = HostPsks::parse(&t).unwrap_err();
            assert!(e.starts_with(want), "{e}");
        }
    }

    #[test]
    fn file_modes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("nvmet-psk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("psk");
        std::fs::write(&p, format!("{HOST} {IC01}\n")).unwrap();
        let set = |m| std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
        set(0o600);
        assert!(HostPsks::load(&p).unwrap().1.is_none());
        set(0o640);
        assert!(HostPsks::load(&p).unwrap().1.unwrap().contains("group"));
        set(0o644);
        assert!(HostPsks::load(&p)
            .unwrap_err()
            .contains("readable by others"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn random_identities_never_panic() {
        let keys = HostPsks::parse(&format!("{HOST} {IC01}\n")).unwrap();
        let mut x = 0x1234_5678_9abc_def0u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = (x % 80) as usize;
            let mut b: Vec<u8> = b"NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys ".to_vec();
            b.truncate((x >> 8) as usize % b.len());
            b.extend((0..n).map(|i| (x >> (i % 56)) as u8));
            let _ = keys.lookup(&b);
            let _ = ConfiguredPsk::parse(&String::from_utf8_lossy(&b));
        }
    }
}
