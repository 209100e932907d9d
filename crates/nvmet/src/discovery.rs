//! The discovery log page (Get Log Page 0x70 on a discovery controller): one
//! entry per NVM subsystem this target serves, all on this port (TCP, IPv4 or
//! IPv6, no security).

use crate::controller::Target;
use crate::pdu::{put16, put64, put_str};

/// Size of the header and of each entry.
pub const ENTRY_LEN: usize = 1024;

/// The whole log page. `local_addr` ("IP:PORT" of the connection) supplies the
/// address and port when the configuration names none.
pub fn log_page(target: &Target, local_addr: &str) -> Vec<u8> {
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
    let n = target.subsystems.len();
    let mut b = vec![0u8; ENTRY_LEN * (n + 1)];
    put64(&mut b, 0, 1); // GENCTR: the configuration never changes while serving
    put64(&mut b, 8, n as u64); // NUMREC
    for (i, s) in target.subsystems.iter().enumerate() {
        let e = ENTRY_LEN * (i + 1);
        b[e] = 3; // TRTYPE: TCP
        b[e + 1] = if traddr.contains(':') { 2 } else { 1 }; // ADRFAM
        b[e + 2] = 2; // SUBTYPE: NVM subsystem
        b[e + 3] = 0x02; // TREQ: secure channel not required
        put16(&mut b, e + 4, 1); // PORTID
        put16(&mut b, e + 6, 0xFFFF); // CNTLID: dynamic
        put16(&mut b, e + 8, 32); // ASQSZ
        put_str(&mut b, e + 32, 32, trsvcid, b' ');
        put_str(&mut b, e + 256, 256, &s.nqn, 0);
        put_str(&mut b, e + 512, 256, traddr, b' ');
        b[e + 768] = 0; // TSAS.SECTYPE: none
    }
    b
}
