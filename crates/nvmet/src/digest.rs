//! NVMe/TCP header and data digests: CRC32C (Castagnoli) over the PDU header
//! (HDGST) or the PDU data (DDGST), sent little-endian after what it covers.

/// The CRC32C digest of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// The 4 wire bytes of the digest of `data`.
pub fn digest_bytes(data: &[u8]) -> [u8; 4] {
    crc32c(data).to_le_bytes()
}

/// Whether the 4 wire bytes `got` are the digest of `data`.
pub fn verify(data: &[u8], got: &[u8]) -> bool {
    got.len() == 4 && digest_bytes(data) == got[..4]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // RFC 3720 B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert!(verify(b"abc", &digest_bytes(b"abc")));
        assert!(!verify(b"abd", &digest_bytes(b"abc")));
        assert!(!verify(b"abc", &[0, 1]));
    }
}
