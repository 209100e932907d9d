//! CRC32C (Castagnoli), the checksum of every on-disk structure: of bytes ([`checksum`]), and of
//! a concatenation from the CRCs of its parts ([`combine`]), so a chunk's checksum is derived
//! from the checksums its blocks already carry instead of reading every byte a second time.
//!
//! The bytes are checksummed by the `crc-fast` crate: carry-less-multiply folding (AVX-512
//! VPCLMULQDQ, PCLMULQDQ, or ARMv8 PMULL, picked at run time), about twice the `crc32c` crate's
//! speed (three interleaved SSE4.2 `crc32` instructions) from 512 bytes up on this project's
//! machines: 87 against 184 ns per 4 KiB block, the checksum every write and read computes. The
//! `crc32c` crate stays as the reference the tests compare with.
//!
//! The arithmetic is zlib's `crc32_combine` (Mark Adler): appending `n` bytes to a message
//! multiplies its CRC by x^(8n) modulo the CRC polynomial, so crc(A‖B) = crc(A)·x^(8|B|) ⊕
//! crc(B), the pre- and post-inversions cancelling out. Products are computed bit by bit in
//! the reflected domain (bit 31 is x^0); x^(8n) comes from a table of x^(2^k). The `crc32c`
//! crate's own `crc32c_combine` squares 32×32 matrices per bit of the length (microseconds),
//! too slow for a per-block call; here the shift for one 4 KiB block is a constant and a
//! combine costs one 32-step product.

use crate::format::BLOCK;

/// CRC32C of `data`.
#[inline]
pub fn checksum(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// CRC32C of the concatenation of `parts`.
pub fn checksum_parts(parts: &[&[u8]]) -> u32 {
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    for p in parts {
        d.update(p);
    }
    d.finalize() as u32
}

/// The CRC32C (Castagnoli) polynomial, reflected.
const POLY: u32 = 0x82F6_3B78;

/// a·b modulo POLY, both in reflected bit order.
const fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut m = 1u32 << 31;
    let mut p = 0u32;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                break;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// x^(2^k) modulo POLY for k in 0..32 (enough for lengths below 2^29 bytes).
const X2N: [u32; 32] = {
    let mut t = [0u32; 32];
    t[0] = 1 << 30; // x^1
    let mut k = 1;
    while k < 32 {
        t[k] = mul_mod(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// x^(8n) modulo POLY: the factor that shifts a CRC past `n` more bytes.
const fn x_pow_8n(mut n: u64) -> u32 {
    assert!(n < 1 << 29, "lengths beyond the table");
    let mut p = 1u32 << 31; // x^0
    let mut k = 3; // 8n = n·2^3
    while n != 0 {
        if n & 1 != 0 {
            p = mul_mod(X2N[k], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// The shift past one 4 KiB block, the length of nearly every stored block.
const BLOCK_SHIFT: u32 = x_pow_8n(BLOCK as u64);

/// crc32c(A‖B) from crc32c(A), crc32c(B) and B's length.
pub fn combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    let shift = if len_b == BLOCK {
        BLOCK_SHIFT
    } else {
        x_pow_8n(len_b as u64)
    };
    mul_mod(shift, crc_a) ^ crc_b
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_values() {
        let a = b"123456789";
        assert_eq!(crc32c::crc32c(a), 0xE306_9283);
        let (x, y) = a.split_at(4);
        assert_eq!(
            combine(crc32c::crc32c(x), crc32c::crc32c(y), y.len()),
            0xE306_9283
        );
        assert_eq!(combine(0x1234_5678, 0, 0), 0x1234_5678, "an empty B");
        assert_eq!(combine(0, crc32c::crc32c(a), a.len()), crc32c::crc32c(a));
    }

    #[test]
    fn checksum_of_every_short_length_and_alignment() {
        let data: Vec<u8> = (0..1100u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for skip in 0..16 {
            for len in 0..1024 {
                let d = &data[skip..skip + len];
                assert_eq!(
                    checksum(d),
                    crc32c::crc32c(d),
                    "length {len} at offset {skip}"
                );
            }
        }
    }

    #[test]
    fn whole_blocks() {
        let blocks: Vec<Vec<u8>> = (0..5u8)
            .map(|i| (0..BLOCK).map(|j| (j as u8).wrapping_mul(i + 7)).collect())
            .collect();
        let mut run = 0;
        let mut all = Vec::new();
        for b in &blocks {
            run = combine(run, crc32c::crc32c(b), b.len());
            all.extend_from_slice(b);
            assert_eq!(run, crc32c::crc32c(&all));
        }
    }

    proptest! {
        /// The fast checksum against the `crc32c` crate, at every length and alignment around
        /// the SIMD paths' block sizes, whole and in parts.
        #[test]
        fn checksum_matches_the_reference(
            data in proptest::collection::vec(any::<u8>(), 0..9000),
            skip in 0usize..64,
            cut in any::<proptest::sample::Index>(),
        ) {
            let d = &data[skip.min(data.len())..];
            prop_assert_eq!(checksum(d), crc32c::crc32c(d));
            let (a, b) = d.split_at(cut.index(d.len() + 1));
            prop_assert_eq!(checksum_parts(&[a, b]), crc32c::crc32c(d));
            prop_assert_eq!(checksum_parts(&[]), crc32c::crc32c(&[]));
        }

        /// Against the bytes, and against the crc32c crate's own (matrix) combine.
        #[test]
        fn matches_the_concatenation(
            a in proptest::collection::vec(any::<u8>(), 0..300),
            b in proptest::collection::vec(any::<u8>(), 0..5000),
        ) {
            let (ca, cb) = (crc32c::crc32c(&a), crc32c::crc32c(&b));
            let mut ab = a.clone();
            ab.extend_from_slice(&b);
            prop_assert_eq!(combine(ca, cb, b.len()), crc32c::crc32c(&ab));
            prop_assert_eq!(combine(ca, cb, b.len()), crc32c::crc32c_combine(ca, cb, b.len()));
        }
    }
}
