//! How ranks agree before a collective: each rank tells the others whether
//! its local work failed and which arguments it passed ([`settle`]), so that
//! a failure or a differing argument is an error on every rank instead of a
//! hang; and how a plan starts ([`start`]).

use super::options::{PlanOptions, Reduce};
use crate::ranks::error::Error;
use crate::ranks::transport::collective::{Collective, DIGEST_BYTES, Digest};
use crate::ranks::vars::manifest::Manifest;

/// An argument every rank must pass alike: its name, its value here, and
/// how to show a value.
pub(crate) type Same = (&'static str, u64, fn(u64) -> String);

/// Tells every rank whether `local` failed here, and learns where it failed
/// elsewhere: this rank's error if it failed, else [`Error::PeerFailed`]
/// naming the ranks that failed, else [`Error::ArgumentsDiffer`] when the
/// ranks passed different values of `same`, else the value. A collective
/// call (one all-gather of 16 bytes per rank). Allocates only on failure.
pub(crate) fn settle<C: Collective + ?Sized, T>(
    comm: &C,
    gathered: &mut [Digest],
    op: &'static str,
    local: Result<T, Error>,
    same: Option<Same>,
) -> Result<T, Error> {
    let mut mine = [0_u8; DIGEST_BYTES];
    mine[0] = u8::from(local.is_err());
    if let Some((_, v, _)) = same {
        mine[8..].copy_from_slice(&v.to_le_bytes());
    }
    comm.all_gather_digest(&mine, gathered)?;
    let value = local?;
    if gathered.iter().any(|d| d[0] != 0) {
        return Err(Error::PeerFailed {
            op,
            ranks: (0..gathered.len())
                .filter(|&r| gathered[r][0] != 0)
                .collect(),
        });
    }
    if let Some((what, _, show)) = same {
        if gathered.iter().any(|d| d[8..] != mine[8..]) {
            let mut sides: Vec<(u64, Vec<usize>)> = Vec::new();
            for (r, d) in gathered.iter().enumerate() {
                let v = u64::from_le_bytes(d[8..].try_into().unwrap_or_default());
                match sides.iter_mut().find(|(x, _)| *x == v) {
                    Some((_, ranks)) => ranks.push(r),
                    None => sides.push((v, vec![r])),
                }
            }
            return Err(Error::ArgumentsDiffer {
                op,
                what,
                sides: sides.into_iter().map(|(v, r)| (show(v), r)).collect(),
            });
        }
    }
    Ok(value)
}

/// A count as a message shows it.
pub(crate) fn show_count(v: u64) -> String {
    v.to_string()
}

impl Reduce {
    /// The reduction as an argument every rank must pass alike.
    pub(in crate::ranks) fn same(self) -> Same {
        let code = match self {
            Reduce::Sum => 0,
            Reduce::Mean => 1,
        };
        ("reductions", code, show_reduce)
    }
}

/// A [`Reduce`] sent as a number, as a message shows it.
pub(in crate::ranks) fn show_reduce(v: u64) -> String {
    match v {
        0 => "Reduce::Sum".to_owned(),
        1 => "Reduce::Mean".to_owned(),
        _ => format!("an unknown reduction ({v})"),
    }
}

/// Starts a plan on every rank: checks the bucket size, exchanges the
/// outcome of the local work `local` (so that no rank waits for one that
/// returned) and the bucket sizes, then agrees on the manifest `of`
/// `local`'s value. Returns the value and a buffer of one digest per rank.
/// A collective call.
pub(in crate::ranks) fn start<C: Collective + ?Sized, T>(
    comm: &C,
    opts: &PlanOptions,
    local: Result<T, Error>,
    of: impl Fn(&T) -> &Manifest,
) -> Result<(T, Vec<Digest>), Error> {
    let local = if opts.bucket_bytes == 0 {
        Err(Error::BadOption {
            reason: "a bucket of 0 bytes; pass at least one element's size \
                     (the default is 2 MiB)"
                .into(),
        })
    } else if !(1..=8).contains(&opts.bucket_buffers) {
        Err(Error::BadOption {
            reason: format!(
                "{} bucket buffer pairs; pass 1 to 8 (the default is 1)",
                opts.bucket_buffers
            ),
        })
    } else if opts.timeout == Some(std::time::Duration::ZERO) {
        Err(Error::BadOption {
            reason: "a timeout of zero; pass a positive timeout, or \
                     PlanOptions::without_timeout (the default is 10 minutes)"
                .into(),
        })
    } else {
        local
    };
    let mut gathered = vec![[0_u8; DIGEST_BYTES]; comm.size()];
    let same: Same = ("bucket sizes", opts.bucket_bytes as u64, show_count);
    let value = settle(comm, &mut gathered, "building the plan", local, Some(same))?;
    // The variables sent from their own buffers make calls of their own:
    // every rank must pick the same ones.
    let direct: Same = ("direct sizes", opts.direct_bytes as u64, show_count);
    settle(
        comm,
        &mut gathered,
        "building the plan",
        Ok(()),
        Some(direct),
    )?;
    of(&value).agree(comm)?;
    Ok((value, gathered))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank `rank` of a world whose other ranks' all-gather contributions
    /// are `theirs` (this rank's slot is filled with what it sends).
    struct Scripted {
        rank: usize,
        theirs: Vec<Digest>,
    }

    impl Collective for Scripted {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.theirs.len()
        }
        fn all_reduce_sum_f32(&self, _: &[f32], _: &mut [f32]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn all_reduce_sum_f64(&self, _: &[f64], _: &mut [f64]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn reduce_scatter_sum_f32(&self, _: &[f32], _: &mut [f32]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn reduce_scatter_sum_f64(&self, _: &[f64], _: &mut [f64]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn all_gather_bytes(&self, _: &[u8], _: &mut [u8]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn broadcast_bytes(&self, _: usize, _: &mut [u8]) -> Result<(), Error> {
            unreachable!("settle only all-gathers")
        }
        fn all_gather_digest(&self, mine: &Digest, all: &mut [Digest]) -> Result<(), Error> {
            all.copy_from_slice(&self.theirs);
            all[self.rank] = *mine;
            Ok(())
        }
        fn barrier(&self) -> Result<(), Error> {
            Ok(())
        }
    }

    fn sent(failed: bool, value: u64) -> Digest {
        let mut d = [0_u8; DIGEST_BYTES];
        d[0] = u8::from(failed);
        d[8..].copy_from_slice(&value.to_le_bytes());
        d
    }

    #[test]
    fn differing_arguments_name_who_passed_what_on_every_rank() {
        let theirs = vec![
            sent(false, 0),
            sent(false, 0),
            sent(false, 1),
            sent(false, 0),
        ];
        let mut gathered = vec![[0_u8; DIGEST_BYTES]; 4];
        let mut messages = Vec::new();
        for (rank, mine) in [(0, 0), (2, 1)] {
            let comm = Scripted {
                rank,
                theirs: theirs.clone(),
            };
            let same: Same = ("roots", mine, show_count);
            let err = settle(&comm, &mut gathered, "broadcast", Ok(()), Some(same)).unwrap_err();
            messages.push(err.to_string());
        }
        assert_eq!(messages[0], messages[1]);
        assert_eq!(
            messages[0],
            "broadcast: ranks passed different roots: 0 on ranks 0-1, 3; 1 on rank 2; \
             pass the same on every rank"
        );
    }

    #[test]
    fn a_failure_elsewhere_comes_before_differing_arguments() {
        let theirs = vec![sent(false, 0), sent(true, 1)];
        let mut gathered = vec![[0_u8; DIGEST_BYTES]; 2];
        let comm = Scripted { rank: 0, theirs };
        let same: Same = ("reductions", 0, show_reduce);
        let err = settle(&comm, &mut gathered, "all-reduce", Ok(()), Some(same)).unwrap_err();
        assert!(matches!(err, Error::PeerFailed { ref ranks, .. } if ranks == &[1]));
        assert_eq!(
            err.to_string(),
            "all-reduce failed on rank 1 (see the error there); this rank stopped with it and \
             changed nothing"
        );
        let theirs = vec![sent(false, 0), sent(false, 1)];
        let comm = Scripted { rank: 0, theirs };
        let err = settle(&comm, &mut gathered, "all-reduce", Ok(()), Some(same)).unwrap_err();
        assert!(
            err.to_string()
                .contains("Reduce::Sum on rank 0; Reduce::Mean on rank 1")
        );
        // Agreeing ranks pass.
        let comm = Scripted {
            rank: 0,
            theirs: vec![sent(false, 0), sent(false, 0)],
        };
        assert!(settle(&comm, &mut gathered, "all-reduce", Ok(7), Some(same)).is_ok());
    }
}
