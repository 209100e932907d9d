//! NVMe in-band authentication, DH-HMAC-CHAP (NVMe Base Specification 2.0,
//! 8.13 "In-band authentication"; Fabrics Authentication Send / Receive), the
//! controller's side, one transaction state per queue.
//!
//! A subsystem that holds a secret for a host requires authentication: the
//! Connect response of every queue of that host sets AUTHREQ.ATR
//! ([`CONNECT_AUTHREQ_ATR`]) and, until the transaction on that queue succeeds,
//! the queue refuses every command but Connect, Authentication Send/Receive,
//! Property Get and Disconnect with [`crate::status::Status::AUTH_REQUIRED`]
//! (see `connection.rs` and `fabrics.rs`). The messages, host first:
//!
//! 1. AUTH_Negotiate (Send): the hashes and DH groups the host supports. The
//!    controller picks the hash whose length matches the host key (a 48-byte
//!    key selects SHA-384), else the first one offered; and the configured DH
//!    group when offered (`HostAccess::dhgroup`), else the NULL group when
//!    offered, else the first FFDHE group offered.
//! 2. DH-HMAC-CHAP_Challenge (Receive): hash, DH group, a random challenge C1,
//!    sequence number S1, and the controller's DH public value.
//! 3. DH-HMAC-CHAP_Reply (Send): the host's response R1 = HMAC(Kh', C1' || S1
//!    || T_ID || SC_C || "HostHost" || hostnqn || 0 || subnqn), where Kh' is the
//!    transformed host key ([`crate::secret`]) and C1' is C1, or with a DH group
//!    HMAC(H(g^xy), C1); optionally a challenge C2 for the controller
//!    (bidirectional) and the host's DH public value.
//! 4. DH-HMAC-CHAP_Success1 (Receive): success, with the controller's response
//!    R2 = HMAC(Kc', C2' || S2 || T_ID || SC_C || "Controller" || subnqn || 0 ||
//!    hostnqn) when the host asked for it; or AUTH_Failure1 with the reason.
//! 5. DH-HMAC-CHAP_Success2 (Send): the host accepted R2. A host may also send
//!    AUTH_Failure2 at any point.
//!
//! Message parsing never trusts a length field: every field is bounds-checked
//! against the data actually received, and a bad message becomes an
//! AUTH_Failure1 with "incorrect payload" or "incorrect message", never a
//! panic. OpenSSL does the hashing, HMAC and DH (the `openssl` crate is
//! already the workspace's TLS library).

use std::sync::Arc;

use openssl::bn::BigNum;
use openssl::dh::Dh;
use openssl::pkey::Private;

use crate::secret::{hmac, same, HashId, HostSecrets};

/// SECP of Authentication Send/Receive: the DH-HMAC-CHAP protocol.
pub const SECP_DHCHAP: u8 = 0xE9;
/// Connect response: AUTHREQ.ATR, authentication transaction required (bit 17).
pub const CONNECT_AUTHREQ_ATR: u64 = 1 << 17;

/// AUTH-TYPE values.
pub const TYPE_COMMON: u8 = 0x00;
pub const TYPE_DHCHAP: u8 = 0x01;
/// AUTH-ID values.
pub const MSG_NEGOTIATE: u8 = 0x00;
pub const MSG_CHALLENGE: u8 = 0x01;
pub const MSG_REPLY: u8 = 0x02;
pub const MSG_SUCCESS1: u8 = 0x03;
pub const MSG_SUCCESS2: u8 = 0x04;
pub const MSG_FAILURE2: u8 = 0xF0;
pub const MSG_FAILURE1: u8 = 0xF1;
/// The DH-HMAC-CHAP protocol descriptor's AuthID.
pub const AUTHID_DHCHAP: u8 = 0x01;
/// Failure reason code: authentication failure.
pub const REASON_FAILED: u8 = 0x01;
/// Failure reason code explanations.
pub const FAIL_FAILED: u8 = 0x01;
pub const FAIL_NOT_USABLE: u8 = 0x02;
pub const FAIL_CONCAT_MISMATCH: u8 = 0x03;
pub const FAIL_HASH_UNUSABLE: u8 = 0x04;
pub const FAIL_DHGROUP_UNUSABLE: u8 = 0x05;
pub const FAIL_INCORRECT_PAYLOAD: u8 = 0x06;
pub const FAIL_INCORRECT_MESSAGE: u8 = 0x07;

/// DH group IDs: 0 NULL (no exchange), 1..=5 ffdhe2048..ffdhe8192.
pub const DHGROUP_NULL: u8 = 0;

/// The default of [`crate::controller::Deadlines::auth_deadline`] (why 30 s: see
/// there): how long a queue may stay connected without authenticating; then its
/// connection closes, so a host that claims an NQN but holds no secret cannot
/// keep controllers busy.
pub const AUTH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Size of the fixed part of Challenge, Reply and Success1.
const HDR: usize = 16;
/// Size of one AUTH_Negotiate protocol descriptor.
const DESCRIPTOR: usize = 64;

/// The PEM parameters and prime size in bytes of FFDHE group `id`.
fn ffdhe(id: u8) -> Option<(&'static str, usize)> {
    use crate::ffdhe::*;
    match id {
        1 => Some((FFDHE2048, 256)),
        2 => Some((FFDHE3072, 384)),
        3 => Some((FFDHE4096, 512)),
        4 => Some((FFDHE6144, 768)),
        5 => Some((FFDHE8192, 1024)),
        _ => None,
    }
}

/// The DH group named `name` ("null", "ffdhe2048".."ffdhe8192").
pub fn dhgroup_by_name(name: &str) -> Option<u8> {
    (0..=5).find(|&g| dhgroup_name(g) == name)
}

/// The name of DH group `id` (logs).
pub fn dhgroup_name(id: u8) -> &'static str {
    match id {
        0 => "null",
        1 => "ffdhe2048",
        2 => "ffdhe3072",
        3 => "ffdhe4096",
        4 => "ffdhe6144",
        5 => "ffdhe8192",
        _ => "unknown",
    }
}

/// Where the transaction is: the message the controller expects next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// AUTH_Negotiate (Send).
    Negotiate,
    /// The host reads the Challenge (Receive).
    Challenge,
    /// DH-HMAC-CHAP_Reply (Send).
    Reply,
    /// The host reads Success1 (Receive).
    Success1,
    /// DH-HMAC-CHAP_Success2 (Send), or a new AUTH_Negotiate.
    Success2,
    /// The host reads AUTH_Failure1 (Receive); the explanation is kept.
    Failure1(u8),
    /// The transaction failed for good (the host sent AUTH_Failure2, or a
    /// message out of order): only a new AUTH_Negotiate restarts it.
    Failed,
}

/// The outcome of an Authentication Send or Receive, for the command's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// The buffer the host gave for Receive is smaller than the message.
    BufferTooSmall,
}

/// One queue's DH-HMAC-CHAP state.
pub struct QueueAuth {
    secrets: Arc<HostSecrets>,
    hostnqn: String,
    subnqn: String,
    /// The DH group preferred when offered (None: NULL first).
    prefer_group: Option<u8>,
    /// When the queue connected.
    since: std::time::Instant,
    step: Step,
    authenticated: bool,
    tid: u16,
    hash: HashId,
    dhgroup: u8,
    c1: Vec<u8>,
    s1: u32,
    /// The host's challenge and sequence number (bidirectional).
    c2: Option<(Vec<u8>, u32)>,
    /// The controller's DH key for this transaction.
    dh: Option<Dh<Private>>,
    /// The DH shared secret g^xy, left-padded to the prime's size.
    session_key: Option<Vec<u8>>,
}

impl std::fmt::Debug for QueueAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueAuth")
            .field("hostnqn", &self.hostnqn)
            .field("step", &self.step)
            .field("authenticated", &self.authenticated)
            .finish_non_exhaustive()
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A random nonzero sequence number.
fn seqnum() -> u32 {
    let mut b = [0u8; 4];
    loop {
        if openssl::rand::rand_bytes(&mut b).is_err() {
            return 1;
        }
        let v = u32::from_le_bytes(b);
        if v != 0 {
            return v;
        }
    }
}

impl QueueAuth {
    /// The state of a queue of host `hostnqn` connected to subsystem `subnqn`,
    /// which must authenticate with `secrets`.
    pub fn new(secrets: Arc<HostSecrets>, hostnqn: &str, subnqn: &str) -> QueueAuth {
        QueueAuth {
            secrets,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            prefer_group: None,
            since: std::time::Instant::now(),
            step: Step::Negotiate,
            authenticated: false,
            tid: 0,
            hash: HashId::Sha256,
            dhgroup: DHGROUP_NULL,
            c1: Vec::new(),
            s1: 0,
            c2: None,
            dh: None,
            session_key: None,
        }
    }

    /// Use DH group `group` (1..=5) whenever the host offers it.
    pub fn prefer_dhgroup(mut self, group: Option<u8>) -> QueueAuth {
        self.prefer_group = group.filter(|&g| ffdhe(g).is_some());
        self
    }

    /// Whether the queue may run commands.
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// Not authenticated `deadline` (the target's auth deadline, by default
    /// [`AUTH_DEADLINE`]) after Connect: the connection must close.
    pub fn expired(&self, deadline: std::time::Duration) -> bool {
        !self.authenticated && self.since.elapsed() > deadline
    }

    /// The hash and DH group of the last transaction (logs, tests).
    pub fn negotiated(&self) -> (HashId, u8) {
        (self.hash, self.dhgroup)
    }

    fn fail(&mut self, why: u8) {
        self.step = Step::Failure1(why);
        self.authenticated = false;
        self.clear();
    }

    fn clear(&mut self) {
        self.c1.clear();
        self.c2 = None;
        self.dh = None;
        self.session_key = None;
    }

    /// Authentication Send: a message from the host (the command's data,
    /// exactly TL bytes). Protocol errors are not command errors: they move
    /// the transaction to AUTH_Failure1, which the next Receive returns.
    pub fn send(&mut self, msg: &[u8]) {
        if msg.len() < 2 {
            return self.fail(FAIL_INCORRECT_PAYLOAD);
        }
        let (auth_type, auth_id) = (msg[0], msg[1]);
        if auth_type == TYPE_COMMON && auth_id == MSG_NEGOTIATE {
            // A negotiate (re)starts the transaction at any step.
            return self.negotiate(msg);
        }
        if msg.len() < 6 {
            return self.fail(FAIL_INCORRECT_PAYLOAD);
        }
        let tid = le16(msg, 4);
        match (auth_type, auth_id, self.step) {
            (TYPE_DHCHAP, MSG_FAILURE2, _) => {
                tracing::warn!(
                    hostnqn = self.hostnqn,
                    reason = msg.get(7).copied().unwrap_or(0),
                    "host failed DH-HMAC-CHAP authentication (AUTH_Failure2)"
                );
                self.authenticated = false;
                self.step = Step::Failed;
                self.clear();
            }
            _ if tid != self.tid => self.fail(FAIL_INCORRECT_PAYLOAD),
            (TYPE_DHCHAP, MSG_REPLY, Step::Reply) => self.reply(msg),
            (TYPE_DHCHAP, MSG_SUCCESS2, Step::Success2) => {
                if self.c2.is_some() {
                    tracing::debug!(hostnqn = self.hostnqn, "host accepted the controller");
                }
                self.authenticated = true;
                self.step = Step::Negotiate;
                self.clear();
            }
            _ => {
                tracing::warn!(
                    hostnqn = self.hostnqn,
                    auth_type,
                    auth_id,
                    step = ?self.step,
                    "authentication message out of order"
                );
                self.fail(FAIL_INCORRECT_MESSAGE);
            }
        }
    }

    fn negotiate(&mut self, msg: &[u8]) {
        self.clear();
        if msg.len() < 8 {
            return self.fail(FAIL_INCORRECT_PAYLOAD);
        }
        self.tid = le16(msg, 4);
        let (sc_c, napd) = (msg[6], msg[7] as usize);
        if sc_c != 0 {
            return self.fail(FAIL_CONCAT_MISMATCH);
        }
        // The DH-HMAC-CHAP descriptor among the NAPD given (within the data).
        let desc = (0..napd)
            .filter_map(|i| msg.get(8 + i * DESCRIPTOR..8 + (i + 1) * DESCRIPTOR))
            .find(|d| d[0] == AUTHID_DHCHAP);
        let Some(d) = desc else {
            return self.fail(FAIL_INCORRECT_PAYLOAD);
        };
        let (halen, dhlen) = (d[2] as usize, d[3] as usize);
        if halen > 30 || dhlen > 30 {
            return self.fail(FAIL_INCORRECT_PAYLOAD);
        }
        let hashes: Vec<HashId> = d[4..4 + halen]
            .iter()
            .filter_map(|&h| HashId::from_id(h))
            .collect();
        let groups = &d[34..34 + dhlen];
        let by_key = HashId::from_len(self.secrets.host.key_len()).filter(|h| hashes.contains(h));
        let Some(hash) = by_key.or(hashes.first().copied()) else {
            return self.fail(FAIL_HASH_UNUSABLE);
        };
        let preferred = self.prefer_group.filter(|g| groups.contains(g));
        let group = if preferred.is_some() {
            preferred
        } else if groups.contains(&DHGROUP_NULL) {
            Some(DHGROUP_NULL)
        } else {
            groups.iter().copied().find(|&g| ffdhe(g).is_some())
        };
        let Some(group) = group else {
            return self.fail(FAIL_DHGROUP_UNUSABLE);
        };
        self.hash = hash;
        self.dhgroup = group;
        self.step = Step::Challenge;
    }

    fn reply(&mut self, msg: &[u8]) {
        let hl = self.hash.size();
        if msg.len() < HDR || msg[6] as usize != hl {
            return self.fail(FAIL_INCORRECT_PAYLOAD);
        }
        let cvalid = msg[8] != 0;
        let dhvlen = le16(msg, 10) as usize;
        let s2 = le32(msg, 12);
        let Some(body) = msg.get(HDR..HDR + 2 * hl + dhvlen) else {
            return self.fail(FAIL_INCORRECT_PAYLOAD);
        };
        let (rval, rest) = body.split_at(hl);
        let (c2, dhv) = rest.split_at(hl);
        match (&self.dh, dhvlen) {
            (None, 0) => {}
            (Some(dh), n) if n > 0 => match session_key(dh, self.dhgroup, dhv) {
                Some(k) => self.session_key = Some(k),
                None => return self.fail(FAIL_DHGROUP_UNUSABLE),
            },
            _ => return self.fail(FAIL_INCORRECT_PAYLOAD),
        }
        let want = host_response(
            self.hash,
            &self.secrets.host.transformed(&self.hostnqn),
            &self.augmented(&self.c1),
            self.s1,
            self.tid,
            &self.hostnqn,
            &self.subnqn,
        );
        if !same(rval, &want) {
            tracing::warn!(
                hostnqn = self.hostnqn,
                subnqn = self.subnqn,
                "DH-HMAC-CHAP: the host's response does not match its secret"
            );
            return self.fail(FAIL_FAILED);
        }
        if cvalid {
            if self.secrets.ctrl.is_none() {
                tracing::warn!(
                    hostnqn = self.hostnqn,
                    "host asks to authenticate the controller, which has no controller secret for it"
                );
                return self.fail(FAIL_FAILED);
            }
            self.c2 = Some((c2.to_vec(), s2));
        } else {
            // Unidirectional: the host is authenticated now.
            self.c2 = None;
            self.authenticated = true;
        }
        self.step = Step::Success1;
    }

    /// C or, with a DH group, HMAC(H(session key), C).
    fn augmented(&self, c: &[u8]) -> Vec<u8> {
        match &self.session_key {
            Some(k) => hmac(self.hash, &self.hash.hash(k), &[c]),
            None => c.to_vec(),
        }
    }

    /// Authentication Receive with allocation length `al`: the message the
    /// transaction is at, zero-padded to `al` bytes.
    pub fn receive(&mut self, al: usize) -> Result<Vec<u8>, AuthError> {
        let msg = match self.step {
            Step::Challenge => match self.challenge() {
                Ok(m) => m,
                Err(why) => {
                    self.fail(why);
                    self.failure1(why)
                }
            },
            Step::Success1 => self.success1(),
            Step::Failure1(why) => {
                self.step = Step::Failed;
                self.failure1(why)
            }
            _ => {
                self.fail(FAIL_FAILED);
                self.step = Step::Failed;
                self.failure1(FAIL_FAILED)
            }
        };
        if msg.len() > al {
            self.fail(FAIL_INCORRECT_PAYLOAD);
            return Err(AuthError::BufferTooSmall);
        }
        let mut out = msg;
        out.resize(al, 0);
        Ok(out)
    }

    fn challenge(&mut self) -> Result<Vec<u8>, u8> {
        let hl = self.hash.size();
        let mut c1 = vec![0u8; hl];
        openssl::rand::rand_bytes(&mut c1).map_err(|_| FAIL_FAILED)?;
        let mut dhv = Vec::new();
        if self.dhgroup != DHGROUP_NULL {
            let (pem, size) = ffdhe(self.dhgroup).ok_or(FAIL_DHGROUP_UNUSABLE)?;
            let key = Dh::params_from_pem(pem.as_bytes())
                .and_then(|p| p.generate_key())
                .map_err(|_| FAIL_DHGROUP_UNUSABLE)?;
            dhv = pad(&key.public_key().to_vec(), size).ok_or(FAIL_DHGROUP_UNUSABLE)?;
            self.dh = Some(key);
        }
        self.c1 = c1;
        self.s1 = seqnum();
        let mut m = vec![0u8; HDR];
        m[0] = TYPE_DHCHAP;
        m[1] = MSG_CHALLENGE;
        m[4..6].copy_from_slice(&self.tid.to_le_bytes());
        m[6] = hl as u8;
        m[8] = self.hash.id();
        m[9] = self.dhgroup;
        m[10..12].copy_from_slice(&(dhv.len() as u16).to_le_bytes());
        m[12..16].copy_from_slice(&self.s1.to_le_bytes());
        m.extend_from_slice(&self.c1);
        m.extend_from_slice(&dhv);
        self.step = Step::Reply;
        Ok(m)
    }

    fn success1(&mut self) -> Vec<u8> {
        let hl = self.hash.size();
        let mut m = vec![0u8; HDR];
        m[0] = TYPE_DHCHAP;
        m[1] = MSG_SUCCESS1;
        m[4..6].copy_from_slice(&self.tid.to_le_bytes());
        m[6] = hl as u8;
        match (&self.c2, &self.secrets.ctrl) {
            (Some((c2, s2)), Some(ctrl)) => {
                m[8] = 1; // RVALID
                let r = ctrl_response(
                    self.hash,
                    &ctrl.transformed(&self.subnqn),
                    &self.augmented(c2),
                    *s2,
                    self.tid,
                    &self.hostnqn,
                    &self.subnqn,
                );
                m.extend_from_slice(&r);
                // Authenticated once the host accepts the controller (Success2).
                self.step = Step::Success2;
            }
            _ => {
                // Some hosts send Success2 even when unidirectional: accept it.
                self.step = Step::Success2;
            }
        }
        tracing::info!(
            hostnqn = self.hostnqn,
            hash = self.hash.name(),
            dhgroup = dhgroup_name(self.dhgroup),
            bidirectional = self.c2.is_some(),
            "DH-HMAC-CHAP: host authenticated"
        );
        m
    }

    fn failure1(&self, why: u8) -> Vec<u8> {
        let mut m = vec![0u8; 8];
        m[0] = TYPE_COMMON;
        m[1] = MSG_FAILURE1;
        m[4..6].copy_from_slice(&self.tid.to_le_bytes());
        m[6] = REASON_FAILED;
        m[7] = why;
        m
    }
}

/// `v` left-padded with zeros to `len` bytes (None if longer).
fn pad(v: &[u8], len: usize) -> Option<Vec<u8>> {
    let lead = len.checked_sub(v.len())?;
    let mut out = vec![0u8; lead];
    out.extend_from_slice(v);
    Some(out)
}

/// The DH shared secret with the host's public value `dhv` (checked to be in
/// 2..=p-2), padded to the prime's size.
fn session_key(dh: &Dh<Private>, group: u8, dhv: &[u8]) -> Option<Vec<u8>> {
    let (_, size) = ffdhe(group)?;
    if dhv.len() != size {
        return None;
    }
    let y = BigNum::from_slice(dhv).ok()?;
    let one = BigNum::from_u32(1).ok()?;
    let mut p_1 = BigNum::new().ok()?;
    p_1.checked_sub(dh.prime_p(), &one).ok()?;
    if y <= one || y >= p_1 {
        return None;
    }
    pad(&dh.compute_key(&y).ok()?, size)
}

/// The host's response: HMAC(hash, Kh', C1' || S1 || T_ID || SC_C ||
/// "HostHost" || hostnqn || 0 || subnqn).
pub fn host_response(
    hash: HashId,
    key: &[u8],
    challenge: &[u8],
    seq: u32,
    tid: u16,
    hostnqn: &str,
    subnqn: &str,
) -> Vec<u8> {
    hmac(
        hash,
        key,
        &[
            challenge,
            &seq.to_le_bytes(),
            &tid.to_le_bytes(),
            &[0],
            b"HostHost",
            hostnqn.as_bytes(),
            &[0],
            subnqn.as_bytes(),
        ],
    )
}

/// The controller's response: HMAC(hash, Kc', C2' || S2 || T_ID || SC_C ||
/// "Controller" || subnqn || 0 || hostnqn).
pub fn ctrl_response(
    hash: HashId,
    key: &[u8],
    challenge: &[u8],
    seq: u32,
    tid: u16,
    hostnqn: &str,
    subnqn: &str,
) -> Vec<u8> {
    hmac(
        hash,
        key,
        &[
            challenge,
            &seq.to_le_bytes(),
            &tid.to_le_bytes(),
            &[0],
            b"Controller",
            subnqn.as_bytes(),
            &[0],
            hostnqn.as_bytes(),
        ],
    )
}

/// Host side of the exchange, for the tests here and the protocol tests (the
/// target never uses it): builds AUTH_Negotiate, Reply and Success2 from the
/// host's view.
pub mod host {
    use super::*;

    /// AUTH_Negotiate offering `hashes` and `groups`.
    pub fn negotiate(tid: u16, hashes: &[u8], groups: &[u8]) -> Vec<u8> {
        let mut m = vec![0u8; 8 + DESCRIPTOR];
        m[0] = TYPE_COMMON;
        m[1] = MSG_NEGOTIATE;
        m[4..6].copy_from_slice(&tid.to_le_bytes());
        m[7] = 1; // NAPD
        m[8] = AUTHID_DHCHAP;
        m[10] = hashes.len() as u8;
        m[11] = groups.len() as u8;
        m[12..12 + hashes.len()].copy_from_slice(hashes);
        m[42..42 + groups.len()].copy_from_slice(groups);
        m
    }

    /// A challenge as the host reads it.
    pub struct Challenge {
        pub hash: HashId,
        pub dhgroup: u8,
        pub c1: Vec<u8>,
        pub s1: u32,
        /// The controller's DH public value (empty for the NULL group).
        pub dhv: Vec<u8>,
    }

    /// Parse a DH-HMAC-CHAP_Challenge.
    pub fn parse_challenge(m: &[u8]) -> Option<Challenge> {
        if m.len() < HDR || m[0] != TYPE_DHCHAP || m[1] != MSG_CHALLENGE {
            return None;
        }
        let hash = HashId::from_id(m[8])?;
        let hl = m[6] as usize;
        let dhvlen = le16(m, 10) as usize;
        let c1 = m.get(HDR..HDR + hl)?.to_vec();
        let dhv = m.get(HDR + hl..HDR + hl + dhvlen)?.to_vec();
        Some(Challenge {
            hash,
            dhgroup: m[9],
            c1,
            s1: le32(m, 12),
            dhv,
        })
    }

    /// The host's DH key and the session key for the controller's value
    /// `ctrl_dhv` in `group` (None for the NULL group).
    pub fn dh_exchange(group: u8, ctrl_dhv: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        let (pem, size) = ffdhe(group)?;
        let key = Dh::params_from_pem(pem.as_bytes())
            .ok()?
            .generate_key()
            .ok()?;
        let public = pad(&key.public_key().to_vec(), size)?;
        let sess = session_key(&key, group, ctrl_dhv)?;
        Some((public, sess))
    }

    /// C or HMAC(H(session key), C).
    pub fn augment(hash: HashId, session: Option<&[u8]>, c: &[u8]) -> Vec<u8> {
        match session {
            Some(k) => hmac(hash, &hash.hash(k), &[c]),
            None => c.to_vec(),
        }
    }

    /// DH-HMAC-CHAP_Reply.
    pub fn reply(tid: u16, rval: &[u8], c2: Option<(&[u8], u32)>, dhv: &[u8]) -> Vec<u8> {
        let hl = rval.len();
        let mut m = vec![0u8; HDR];
        m[0] = TYPE_DHCHAP;
        m[1] = MSG_REPLY;
        m[4..6].copy_from_slice(&tid.to_le_bytes());
        m[6] = hl as u8;
        m[10..12].copy_from_slice(&(dhv.len() as u16).to_le_bytes());
        m.extend_from_slice(rval);
        match c2 {
            Some((c, s2)) => {
                m[8] = 1;
                m[12..16].copy_from_slice(&s2.to_le_bytes());
                m.extend_from_slice(c);
            }
            None => m.extend_from_slice(&vec![0u8; hl]),
        }
        m.extend_from_slice(dhv);
        m
    }

    /// DH-HMAC-CHAP_Success2.
    pub fn success2(tid: u16) -> Vec<u8> {
        let mut m = vec![0u8; 16];
        m[0] = TYPE_DHCHAP;
        m[1] = MSG_SUCCESS2;
        m[4..6].copy_from_slice(&tid.to_le_bytes());
        m
    }

    /// AUTH_Failure2.
    pub fn failure2(tid: u16, why: u8) -> Vec<u8> {
        let mut m = vec![0u8; 8];
        m[0] = TYPE_DHCHAP;
        m[1] = MSG_FAILURE2;
        m[4..6].copy_from_slice(&tid.to_le_bytes());
        m[6] = REASON_FAILED;
        m[7] = why;
        m
    }

    /// Run the whole transaction against `q` as a host holding `host_key`
    /// (and, to authenticate the controller, `ctrl_key`): whether the queue
    /// ended authenticated and what the host's last Receive returned.
    pub fn authenticate(
        q: &mut QueueAuth,
        host_key: &crate::secret::Secret,
        ctrl_key: Option<&crate::secret::Secret>,
        hashes: &[u8],
        groups: &[u8],
        hostnqn: &str,
        subnqn: &str,
    ) -> Result<(), String> {
        let tid = 7;
        q.send(&negotiate(tid, hashes, groups));
        let ch = q.receive(4096).map_err(|e| format!("{e:?}"))?;
        let Challenge {
            hash,
            dhgroup: group,
            c1,
            s1,
            dhv: ctrl_dhv,
        } = parse_challenge(&ch).ok_or_else(|| format!("not a challenge: {:02x?}", &ch[..8]))?;
        let (dhv, sess) = if group == DHGROUP_NULL {
            (Vec::new(), None)
        } else {
            let (p, s) = dh_exchange(group, &ctrl_dhv).ok_or("DH failed")?;
            (p, Some(s))
        };
        let r1 = host_response(
            hash,
            &host_key.transformed(hostnqn),
            &augment(hash, sess.as_deref(), &c1),
            s1,
            tid,
            hostnqn,
            subnqn,
        );
        let c2 = vec![0x5A; hash.size()];
        let s2 = 0x1234_5678;
        q.send(&reply(
            tid,
            &r1,
            ctrl_key.map(|_| (c2.as_slice(), s2)),
            &dhv,
        ));
        let s1m = q.receive(4096).map_err(|e| format!("{e:?}"))?;
        if s1m[0] != TYPE_DHCHAP || s1m[1] != MSG_SUCCESS1 {
            return Err(format!("no success1: {:02x?}", &s1m[..8]));
        }
        if let Some(ck) = ctrl_key {
            let want = ctrl_response(
                hash,
                &ck.transformed(subnqn),
                &augment(hash, sess.as_deref(), &c2),
                s2,
                tid,
                hostnqn,
                subnqn,
            );
            if s1m[8] != 1 || s1m.get(HDR..HDR + hash.size()) != Some(&want[..]) {
                q.send(&failure2(tid, FAIL_FAILED));
                return Err("controller response mismatch".into());
            }
            q.send(&success2(tid));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::host::*;
    use super::*;
    use crate::secret::Secret;

    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f2b7d76-5a7c-4c57-9b6e-5d6a1e3f1c11";
    const SUBNQN: &str = "nqn.2024-01.io.flashpool:test";

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn key(len: u8, hash: Option<HashId>) -> Secret {
        let k: Vec<u8> = (0..len).collect();
        Secret::parse(&Secret::encode(&k, hash)).unwrap()
    }

    fn queue(host: Secret, ctrl: Option<Secret>) -> QueueAuth {
        QueueAuth::new(Arc::new(HostSecrets { host, ctrl }), HOSTNQN, SUBNQN)
    }

    /// Known answers computed independently with Python's hmac/hashlib (a
    /// one-off script following the Linux host's nvme_auth_dhchap_setup_host_
    /// response / _ctrl_response description):
    ///   key = bytes(range(n)); kt = hmac(key, HOSTNQN + b"NVMe-over-Fabrics", sha)
    ///   (for the controller key: SUBNQN instead of HOSTNQN)
    ///   C = bytes([0xA5]) * hl; S = 0x01020304; T_ID = 0x0BAD
    ///   host: hmac(kt, C + S.le32 + T.le16 + b"\0" + b"HostHost" + HOSTNQN + b"\0" + SUBNQN)
    ///   ctrl: hmac(kt, C + S.le32 + T.le16 + b"\0" + b"Controller" + SUBNQN + b"\0" + HOSTNQN)
    ///   augmented (DH): hmac(sha(session), C) with session = bytes(range(256)),
    ///   then the host response over it with the SHA-256 key.
    #[test]
    fn responses_match_known_answers() {
        let cases = [
            (HashId::Sha256, 32u8, KAT_HOST_256, KAT_CTRL_256),
            (HashId::Sha384, 48, KAT_HOST_384, KAT_CTRL_384),
            (HashId::Sha512, 64, KAT_HOST_512, KAT_CTRL_512),
        ];
        for (h, n, host, ctrl) in cases {
            let k = key(n, Some(h));
            let c = vec![0xA5u8; h.size()];
            let r = host_response(
                h,
                &k.transformed(HOSTNQN),
                &c,
                0x0102_0304,
                0x0BAD,
                HOSTNQN,
                SUBNQN,
            );
            assert_eq!(hex(&r), host, "{h:?} host");
            let r = ctrl_response(
                h,
                &k.transformed(SUBNQN),
                &c,
                0x0102_0304,
                0x0BAD,
                HOSTNQN,
                SUBNQN,
            );
            assert_eq!(hex(&r), ctrl, "{h:?} controller");
        }
        let session: Vec<u8> = (0..=255).collect();
        let k = key(32, Some(HashId::Sha256));
        let c = augment(HashId::Sha256, Some(&session), &[0xA5; 32]);
        assert_eq!(hex(&c), KAT_AUG_256);
        let r = host_response(
            HashId::Sha256,
            &k.transformed(HOSTNQN),
            &c,
            0x0102_0304,
            0x0BAD,
            HOSTNQN,
            SUBNQN,
        );
        assert_eq!(hex(&r), KAT_HOST_AUG_256);
    }

    const KAT_HOST_256: &str = "6735aff83d0e03ebdcee1e6a399cf0601439800ba6e3e5c4aebe326946535199";
    const KAT_CTRL_256: &str = "9f588d5f01aedb78db9e4ddc3e6add95a5683adbbaf9c45702d7c3af54670d6b";
    const KAT_HOST_384: &str = "8af0f02ef12609b201162b3ac0776047e058b146d536c2f41bffbbf699bbab0515be81395334dd223cdbce984c383461";
    const KAT_CTRL_384: &str = "c8580b08ed7f368e9040c185dcf6af461e0e26de87e926a8885fd0b8d9e77b419886d4427ad0558a60e27952f9dd5ae0";
    const KAT_HOST_512: &str = "e5538298c2cf14c705def84ffbf46d3df641bb960bf313e4ef8e7a1c57e502fbfe54bf6d48235b5f635772f66303e3c1cb1312f93137aad669eb33e822903ff6";
    const KAT_CTRL_512: &str = "f953c862b1b2001245cb2f77fbde26e18be5aae685349528b2a2d939dc036e5e0eb6749d4cbf28424739bb3547b8472e3cc59d7a59462e10674c79cfee2fedca";
    const KAT_AUG_256: &str = "41085176b00704aa8b023c00dacdc16f0bbbc2f1621cfbeb512ecf6b064b0f5f";
    const KAT_HOST_AUG_256: &str =
        "bacb7d448589efa89e7cb0584c7adefba14347aab3335c30093f2d4b9c1f180d";

    #[test]
    fn unidirectional_null_group_each_hash() {
        for (n, h) in [
            (32, HashId::Sha256),
            (48, HashId::Sha384),
            (64, HashId::Sha512),
        ] {
            for t in [None, Some(h)] {
                let k = key(n, t);
                let mut q = queue(k.clone(), None);
                assert!(!q.authenticated());
                authenticate(
                    &mut q,
                    &k,
                    None,
                    &[1, 2, 3],
                    &[0, 1, 2, 3, 4, 5],
                    HOSTNQN,
                    SUBNQN,
                )
                .unwrap();
                assert!(q.authenticated());
                assert_eq!(
                    q.negotiated(),
                    (h, DHGROUP_NULL),
                    "hash follows the key length"
                );
            }
        }
    }

    #[test]
    fn hash_falls_back_to_what_the_host_offers() {
        let k = key(64, None);
        let mut q = queue(k.clone(), None);
        authenticate(&mut q, &k, None, &[2], &[0], HOSTNQN, SUBNQN).unwrap();
        assert_eq!(q.negotiated().0, HashId::Sha384);
    }

    #[test]
    fn bidirectional() {
        let hk = key(32, Some(HashId::Sha256));
        let ck = key(48, Some(HashId::Sha384));
        let mut q = queue(hk.clone(), Some(ck.clone()));
        authenticate(&mut q, &hk, Some(&ck), &[1, 2, 3], &[0], HOSTNQN, SUBNQN).unwrap();
        assert!(q.authenticated());
        // The host holding a different controller key rejects the controller.
        let wrong = key(48, None);
        let mut q = queue(hk.clone(), Some(ck));
        let e = authenticate(&mut q, &hk, Some(&wrong), &[1], &[0], HOSTNQN, SUBNQN).unwrap_err();
        assert!(e.contains("controller response"), "{e}");
        assert!(!q.authenticated());
        // A host asking for bidirectional when the controller has no secret: Failure1.
        let mut q = queue(hk.clone(), None);
        let e = authenticate(&mut q, &hk, Some(&hk), &[1], &[0], HOSTNQN, SUBNQN).unwrap_err();
        assert!(e.contains("no success1"), "{e}");
        assert!(!q.authenticated());
    }

    #[test]
    fn ffdhe_groups() {
        // Only the small group by default in tests (larger ones are slow unoptimized).
        for g in [1u8, 2] {
            let k = key(32, Some(HashId::Sha256));
            let mut q = queue(k.clone(), None);
            authenticate(&mut q, &k, None, &[1], &[g], HOSTNQN, SUBNQN).unwrap();
            assert!(q.authenticated());
            assert_eq!(q.negotiated().1, g);
        }
    }

    #[test]
    fn preferred_dhgroup() {
        let k = key(32, None);
        let mut q = queue(k.clone(), None).prefer_dhgroup(Some(1));
        authenticate(&mut q, &k, None, &[1], &[0, 1, 2], HOSTNQN, SUBNQN).unwrap();
        assert_eq!(q.negotiated().1, 1, "the preferred group when offered");
        let mut q = queue(k.clone(), None).prefer_dhgroup(Some(1));
        authenticate(&mut q, &k, None, &[1], &[0, 2], HOSTNQN, SUBNQN).unwrap();
        assert_eq!(q.negotiated().1, 0, "else NULL");
    }

    #[test]
    fn wrong_secret_fails() {
        let k = key(32, Some(HashId::Sha256));
        let other = Secret::parse(&Secret::encode(&[7u8; 32], Some(HashId::Sha256))).unwrap();
        for groups in [&[0u8][..], &[1u8][..]] {
            let mut q = queue(k.clone(), None);
            let e = authenticate(&mut q, &other, None, &[1], groups, HOSTNQN, SUBNQN).unwrap_err();
            assert!(e.contains("no success1"), "{e}");
            assert!(!q.authenticated());
        }
        // The failure message: AUTH_Failure1, reason "failed".
        let mut q = queue(k.clone(), None);
        q.send(&negotiate(3, &[1], &[0]));
        let ch = q.receive(4096).unwrap();
        assert!(parse_challenge(&ch).is_some());
        q.send(&reply(3, &[0u8; 32], None, &[]));
        let f = q.receive(64).unwrap();
        assert_eq!(
            &f[..8],
            &[
                TYPE_COMMON,
                MSG_FAILURE1,
                0,
                0,
                3,
                0,
                REASON_FAILED,
                FAIL_FAILED
            ]
        );
        assert_eq!(f.len(), 64, "padded to the allocation length");
        // The same host NQN but the transformed key of another host NQN.
        let mut q = queue(k.clone(), None);
        let e = authenticate(&mut q, &k, None, &[1], &[0], "nqn.other", SUBNQN).unwrap_err();
        assert!(e.contains("no success1"), "{e}");
    }

    #[test]
    fn negotiation_failures() {
        let k = key(32, None);
        let fail_of = |m: &[u8]| {
            let mut q = queue(k.clone(), None);
            q.send(m);
            let f = q.receive(4096).unwrap();
            assert_eq!((f[0], f[1]), (TYPE_COMMON, MSG_FAILURE1));
            assert!(!q.authenticated());
            f[7]
        };
        assert_eq!(fail_of(&negotiate(1, &[9], &[0])), FAIL_HASH_UNUSABLE);
        assert_eq!(fail_of(&negotiate(1, &[1], &[9])), FAIL_DHGROUP_UNUSABLE);
        let mut m = negotiate(1, &[1], &[0]);
        m[6] = 1; // SC_C: secure channel concatenation
        assert_eq!(fail_of(&m), FAIL_CONCAT_MISMATCH);
        let mut m = negotiate(1, &[1], &[0]);
        m[10] = 31; // HALEN beyond the list
        assert_eq!(fail_of(&m), FAIL_INCORRECT_PAYLOAD);
        assert_eq!(
            fail_of(&negotiate(1, &[1], &[0])[..40]),
            FAIL_INCORRECT_PAYLOAD
        );
        // Out of order: a Reply before any challenge.
        assert_eq!(
            fail_of(&reply(0, &[0; 32], None, &[])),
            FAIL_INCORRECT_MESSAGE
        );
        // A challenge bigger than the buffer: an error status, not a truncation.
        let mut q = queue(k.clone(), None);
        q.send(&negotiate(1, &[1], &[0]));
        assert_eq!(q.receive(20), Err(AuthError::BufferTooSmall));
    }

    #[test]
    fn wrong_transaction_id_fails() {
        let k = key(32, None);
        let mut q = queue(k.clone(), None);
        q.send(&negotiate(5, &[1], &[0]));
        let ch = q.receive(4096).unwrap();
        let c = parse_challenge(&ch).unwrap();
        let r = host_response(
            c.hash,
            &k.transformed(HOSTNQN),
            &c.c1,
            c.s1,
            5,
            HOSTNQN,
            SUBNQN,
        );
        q.send(&reply(6, &r, None, &[]));
        let f = q.receive(4096).unwrap();
        assert_eq!((f[1], f[7]), (MSG_FAILURE1, FAIL_INCORRECT_PAYLOAD));
        assert!(!q.authenticated());
        // A new negotiate starts over and succeeds.
        authenticate(&mut q, &k, None, &[1], &[0], HOSTNQN, SUBNQN).unwrap();
        assert!(q.authenticated());
        // Failure2 from the host revokes it.
        q.send(&failure2(7, FAIL_FAILED));
        assert!(!q.authenticated());
    }

    #[test]
    fn random_messages_never_panic() {
        let k = key(32, None);
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let valid = [
            negotiate(1, &[1, 2, 3], &[0, 1]),
            reply(1, &[0; 32], None, &[]),
            reply(1, &[0; 32], Some((&[1; 32], 9)), &[0xFF; 256]),
            success2(1),
            failure2(1, 1),
        ];
        for round in 0..3000 {
            let mut q = queue(k.clone(), Some(k.clone()));
            for _ in 0..6 {
                let r = next();
                let mut m = match r % 3 {
                    0 => valid[(r >> 8) as usize % valid.len()].clone(),
                    1 => {
                        let mut m = valid[(r >> 8) as usize % valid.len()].clone();
                        let flips = 1 + (r >> 16) % 4;
                        for i in 0..flips {
                            let v = next();
                            if !m.is_empty() {
                                let at = v as usize % m.len();
                                m[at] = (v >> 32) as u8;
                            }
                            if i == 0 && v % 5 == 0 {
                                m.truncate((v >> 40) as usize % (m.len() + 1));
                            }
                        }
                        m
                    }
                    _ => (0..(r >> 8) % 400).map(|_| next() as u8).collect(),
                };
                if round % 2 == 0 && m.len() > 1 {
                    m[0] = (r >> 24) as u8 & 1;
                }
                q.send(&m);
                let _ = q.receive(((r >> 32) % 600) as usize);
            }
        }
    }
}
