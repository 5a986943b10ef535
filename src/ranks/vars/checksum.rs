//! The checksums the ranks compare: xxh3-128 (the `xxhash-rust` crate), a
//! hash made for integrity checks, over a variable's bytes, a manifest's
//! bytes, or a plan's per-variable hashes in order. The same on every rank
//! and every build (no seed), and independent of the byte order of the
//! host (the hashes are combined as little-endian bytes).

use xxhash_rust::xxh3::{Xxh3, xxh3_128};

use crate::ranks::transport::collective::Digest;

/// The hash of one variable's bytes.
pub(in crate::ranks) type VarHash = u128;

/// The xxh3-128 of one variable's bytes. O(len); allocates nothing.
pub(in crate::ranks) fn hash_bytes(bytes: &[u8]) -> VarHash {
    xxh3_128(bytes)
}

/// The digest of some bytes: their xxh3-128, little-endian. O(len);
/// allocates nothing.
pub(in crate::ranks) fn digest_of(bytes: &[u8]) -> Digest {
    xxh3_128(bytes).to_le_bytes()
}

/// The digest of the per-variable hashes `hashes`, in order: the xxh3-128
/// of their little-endian bytes. O(hashes); allocates nothing.
pub(in crate::ranks) fn digest_of_hashes(hashes: &[VarHash]) -> Digest {
    let mut all = Xxh3::new();
    for h in hashes {
        all.update(&h.to_le_bytes());
    }
    all.digest128().to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_xxh3_128_of_the_bytes_in_order() {
        // xxh3-128 of the empty input, from the reference implementation's
        // test vectors.
        assert_eq!(hash_bytes(b""), 0x99aa_06d3_0147_98d8_6001_c324_468d_497f);
        assert_eq!(digest_of(b"abc"), xxh3_128(b"abc").to_le_bytes());
        let hashes = [hash_bytes(b"a"), hash_bytes(b"b")];
        let mut joined = hashes[0].to_le_bytes().to_vec();
        joined.extend_from_slice(&hashes[1].to_le_bytes());
        assert_eq!(digest_of_hashes(&hashes), digest_of(&joined));
        assert_ne!(
            digest_of_hashes(&hashes),
            digest_of_hashes(&[hashes[1], hashes[0]])
        );
    }
}
