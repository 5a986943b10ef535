//! Digests of a plan's values: a hash per variable, their digest, and the
//! consistency check across ranks that names the first variable whose bytes
//! differ.

use std::hash::Hasher;

use rustc_hash::FxHasher;

use super::agree::settle;
use super::collective::{Collective, Digest};
use super::error::Error;
use super::manifest::{Manifest, digest_parts};

/// The hash of one variable's bytes, as a digest of values counts it.
pub(super) fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(bytes);
    h.finish()
}

/// The digest of the per-variable hashes `digests`.
pub(super) fn digest_of_hashes(digests: &[u64]) -> Digest {
    let mut all = FxHasher::default();
    for d in digests {
        all.write_u64(*d);
    }
    digest_parts(all.finish(), digests.len() as u64)
}

/// The consistency check across ranks once each rank has hashed its values
/// (`digests`, one per variable of `manifest`, and their digest `local`):
/// see [`SyncPlan::check_consistency`]. A collective call.
pub(super) fn compare_values<C: Collective + ?Sized>(
    comm: &C,
    gathered: &mut [Digest],
    digests: &[u64],
    manifest: &Manifest,
    local: Result<Digest, Error>,
) -> Result<(), Error> {
    let mine = settle(comm, gathered, "consistency check", local, None)?;
    comm.all_gather_digest(&mine, gathered)?;
    if gathered.iter().all(|d| *d == mine) {
        return Ok(());
    }
    // Every rank's per-variable hashes, rank by rank.
    let n = digests.len();
    let mut mine_bytes: Vec<u8> = digests.iter().flat_map(|d| d.to_le_bytes()).collect();
    let mut all: Vec<Vec<u64>> = Vec::with_capacity(comm.size());
    for r in 0..comm.size() {
        let mut buf = if r == comm.rank() {
            std::mem::take(&mut mine_bytes)
        } else {
            vec![0_u8; n * 8]
        };
        comm.broadcast_bytes(r, &mut buf)?;
        all.push(
            buf.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
        );
    }
    let first = (0..n).find(|&i| all.iter().any(|d| d[i] != all[0][i]));
    let (key, sides) = match first {
        Some(i) => {
            let mut sides: Vec<(u64, Vec<usize>)> = Vec::new();
            for (r, d) in all.iter().enumerate() {
                match sides.iter_mut().find(|(h, _)| *h == d[i]) {
                    Some((_, ranks)) => ranks.push(r),
                    None => sides.push((d[i], vec![r])),
                }
            }
            let sides = sides
                .into_iter()
                .map(|(h, ranks)| (format!("bytes with hash {h:#018x}"), ranks))
                .collect();
            (manifest.entries()[i].key.clone(), sides)
        }
        // Unreachable while every rank runs one build: equal
        // per-variable hashes make equal digests.
        None => (
            "(no single variable: the digests differ)".to_owned(),
            vec![("another digest".to_owned(), (0..comm.size()).collect())],
        ),
    };
    Err(Error::Diverged {
        scope: manifest.scope().to_owned(),
        key,
        sides,
    })
}
