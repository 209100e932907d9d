//! The discovery log page (Get Log Page 0x70 on a discovery controller): one
//! entry per NVM subsystem this target serves to the asking host (subsystems
//! whose allow-list refuses the host are left out), all on this port (TCP, IPv4
//! or IPv6). With TLS configured, TSAS names the TLS 1.3 secure channel and
//! TREQ says whether it is required (`require`) or not (`on`).

use crate::controller::Target;
use crate::pdu::{put16, put64, put_str};
use crate::tls::TlsMode;

/// Size of the header and of each entry.
pub const ENTRY_LEN: usize = 1024;

/// TREQ secure channel values (bits 1:0).
pub const TREQ_REQUIRED: u8 = 0x01;
pub const TREQ_NOT_REQUIRED: u8 = 0x02;
/// TSAS.SECTYPE for TCP: TLS 1.3.
pub const SECTYPE_TLS13: u8 = 0x01;

/// The log page for host `hostnqn`. `local_addr` ("IP:PORT" of the connection)
/// supplies the address and port when the configuration names none.
pub fn log_page(target: &Target, local_addr: &str, hostnqn: &str) -> Vec<u8> {
    let (laddr, lport) = match local_addr.rsplit_once(':') {
        Some((a, p)) => (a.trim_start_matches('[').trim_end_matches(']'), p),
        None => (local_addr, ""),
    };
    let traddr = if target.config.traddr.is_empty() {
        laddr
    } else {
        target.config.traddr.as_str()
    };
    let trsvcid = if target.config.trsvcid.is_empty() {
        lport
    } else {
        target.config.trsvcid.as_str()
    };
    let mode = target.config.tls.as_ref().map_or(TlsMode::Off, |t| t.mode);
    let (treq, sectype) = match mode {
        TlsMode::Off => (TREQ_NOT_REQUIRED, 0),
        TlsMode::On => (TREQ_NOT_REQUIRED, SECTYPE_TLS13),
        TlsMode::Require => (TREQ_REQUIRED, SECTYPE_TLS13),
    };
    let subsystems: Vec<_> = target
        .subsystems
        .iter()
        .filter(|s| s.access.permits(hostnqn))
        .collect();
    let n = subsystems.len();
    let mut b = vec![0u8; ENTRY_LEN * (n + 1)];
    put64(&mut b, 0, 1); // GENCTR: the configuration never changes while serving
    put64(&mut b, 8, n as u64); // NUMREC
    for (i, s) in subsystems.iter().enumerate() {
        let e = ENTRY_LEN * (i + 1);
        b[e] = 3; // TRTYPE: TCP
        b[e + 1] = if traddr.contains(':') { 2 } else { 1 }; // ADRFAM
        b[e + 2] = 2; // SUBTYPE: NVM subsystem
        b[e + 3] = treq; // TREQ: secure channel required or not
        put16(&mut b, e + 4, 1); // PORTID
        put16(&mut b, e + 6, 0xFFFF); // CNTLID: dynamic
        put16(&mut b, e + 8, 32); // ASQSZ
        put_str(&mut b, e + 32, 32, trsvcid, b' ');
        put_str(&mut b, e + 256, 256, &s.nqn, 0);
        put_str(&mut b, e + 512, 256, traddr, b' ');
        b[e + 768] = sectype; // TSAS.SECTYPE: none or TLS 1.3
    }
    b
}
