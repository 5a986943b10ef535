//! The checksums the ranks compare: xxh3-128 (the `xxhash-rust` crate), a
//! hash made for integrity checks, over a variable's bytes, a manifest's
//! bytes, or a plan's per-variable hashes in order. The same on every rank
//! and every build (no seed), and independent of the byte order of the
//! host (the hashes are combined as little-endian bytes).

use xxhash_rust::xxh3::{Xxh3, xxh3_128};

use crate::checkpoint::{Dtype, convert_floats_into};
use crate::ranks::transport::collective::Digest;

/// The hash of one variable's bytes.
pub(in crate::ranks) type VarHash = u128;

/// The xxh3-128 of one variable's bytes. O(len); allocates nothing.
pub(in crate::ranks) fn hash_bytes(bytes: &[u8]) -> VarHash {
    xxh3_128(bytes)
}

/// The xxh3-128 of a tensor's bytes as a save writes them: elements of
/// `held` written as `written` (the same dtype, or floats converted by a
/// save's `floats_as`), fed piece by piece in order. Checksums are of the
/// bytes in the file, so a load checks them before it converts anything.
pub(in crate::ranks) struct WrittenHasher {
    held: Dtype,
    written: Dtype,
    hash: Xxh3,
    /// The converted bytes of one piece (empty when nothing converts).
    out: Vec<u8>,
}

/// The most converted bytes a [`WrittenHasher`] holds at once.
const CONVERTED_PIECE: usize = 1 << 20;

impl WrittenHasher {
    /// A hasher of `held` elements written as `written`. O(1).
    pub(in crate::ranks) fn new(held: Dtype, written: Dtype) -> Self {
        Self {
            held,
            written,
            hash: Xxh3::new(),
            out: Vec::new(),
        }
    }

    /// Adds the next whole elements of the tensor, as held. O(len);
    /// converting, holds at most 1 MiB of converted bytes.
    pub(in crate::ranks) fn update(&mut self, bytes: &[u8]) {
        if self.held == self.written {
            self.hash.update(bytes);
            return;
        }
        let (from, to) = (self.held.bitsize() / 8, self.written.bitsize() / 8);
        let per = (CONVERTED_PIECE / to).max(1);
        for chunk in bytes.chunks(per * from) {
            let n = chunk.len() / from * to;
            self.out.resize(n.max(self.out.len()), 0);
            convert_floats_into(self.held, self.written, chunk, &mut self.out[..n]);
            self.hash.update(&self.out[..n]);
        }
    }

    /// The xxh3-128 of the bytes written. O(1).
    pub(in crate::ranks) fn digest(&self) -> VarHash {
        self.hash.digest128()
    }
}

/// The xxh3-128 of `bytes` (elements of `held`) as a save writes them in
/// `written`: see [`WrittenHasher`]. O(len).
pub(in crate::ranks) fn written_hash(held: Dtype, written: Dtype, bytes: &[u8]) -> VarHash {
    let mut h = WrittenHasher::new(held, written);
    h.update(bytes);
    h.digest()
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

    /// A converted tensor's checksum is that of the converted bytes, fed
    /// whole or in pieces, across the 1 MiB conversion pieces.
    #[test]
    fn written_hashes_are_of_the_bytes_as_written() {
        let n = 300_000;
        let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 - 5.0).collect();
        let held: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let converted = |to: Dtype| {
            let mut out = vec![0_u8; n * to.bitsize() / 8];
            convert_floats_into(Dtype::F32, to, &held, &mut out);
            out
        };
        let bf16 = converted(Dtype::BF16);
        assert_eq!(
            written_hash(Dtype::F32, Dtype::BF16, &held),
            hash_bytes(&bf16)
        );
        assert_eq!(
            written_hash(Dtype::F32, Dtype::F32, &held),
            hash_bytes(&held)
        );
        let f64s = converted(Dtype::F64);
        // 2.4 MB of f64 output: three conversion pieces.
        assert_eq!(
            written_hash(Dtype::F32, Dtype::F64, &held),
            hash_bytes(&f64s)
        );
        let mut h = WrittenHasher::new(Dtype::F32, Dtype::BF16);
        for piece in held.chunks(4 * 1001) {
            h.update(piece);
        }
        assert_eq!(h.digest(), hash_bytes(&bf16));
    }
}
