//! The consistency check across ranks: the ranks compare the digests of
//! their values and, when they differ, name the first variable whose bytes
//! differ and the ranks on each side.

use super::agree::settle;
use crate::ranks::error::Error;
use crate::ranks::transport::collective::{Collective, Digest};
use crate::ranks::vars::checksum::VarHash;
use crate::ranks::vars::manifest::Manifest;

/// The consistency check across ranks once each rank has hashed its values
/// (`digests`, one per variable of `manifest`, and their digest `local`):
/// see [`SyncPlan::check_consistency`]. A collective call.
pub(in crate::ranks) fn compare_values<C: Collective + ?Sized>(
    comm: &C,
    gathered: &mut [Digest],
    digests: &[VarHash],
    manifest: &Manifest,
    local: Result<Digest, Error>,
) -> Result<(), Error> {
    let mine = settle(comm, gathered, "consistency check", local, None)?;
    comm.all_gather_digest(&mine, gathered)?;
    if gathered.iter().all(|d| *d == mine) {
        return Ok(());
    }
    // Every rank's per-variable hashes, rank by rank.
    const HASH_BYTES: usize = std::mem::size_of::<VarHash>();
    let n = digests.len();
    let mut mine_bytes: Vec<u8> = digests.iter().flat_map(|d| d.to_le_bytes()).collect();
    let mut all: Vec<Vec<VarHash>> = Vec::with_capacity(comm.size());
    for r in 0..comm.size() {
        let mut buf = if r == comm.rank() {
            std::mem::take(&mut mine_bytes)
        } else {
            vec![0_u8; n * HASH_BYTES]
        };
        comm.broadcast_bytes(r, &mut buf)?;
        all.push(
            buf.chunks_exact(HASH_BYTES)
                .map(|c| VarHash::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
        );
    }
    let first = (0..n).find(|&i| all.iter().any(|d| d[i] != all[0][i]));
    let (key, sides) = match first {
        Some(i) => {
            let mut sides: Vec<(VarHash, Vec<usize>)> = Vec::new();
            for (r, d) in all.iter().enumerate() {
                match sides.iter_mut().find(|(h, _)| *h == d[i]) {
                    Some((_, ranks)) => ranks.push(r),
                    None => sides.push((d[i], vec![r])),
                }
            }
            let sides = sides
                .into_iter()
                .map(|(h, ranks)| (format!("bytes with hash {h:#034x}"), ranks))
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
