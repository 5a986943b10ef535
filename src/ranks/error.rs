//! The ranks layer's error type.

use std::fmt;

use crate::error::ShowPath;
use crate::short;

/// How many groups of ranks, or runs of rank numbers, a message shows.
const SHOWN: usize = 8;

/// Why a call of the ranks layer failed. Every message names the variable,
/// the synchronised scope and what to do, and stays a few hundred bytes long
/// whatever the input (names and paths are cut, rank lists are shortened).
///
/// The errors that compare ranks ([`Disagree`](Self::Disagree),
/// [`Diverged`](Self::Diverged)) are built from data every rank received, so
/// every rank returns the same error. A failed call changes no value.
///
/// ```
/// use scopetree::ranks::{Error, SingleProcess, Collective};
/// let err = SingleProcess.broadcast_bytes(1, &mut [0_u8; 4]).unwrap_err();
/// assert!(matches!(err, Error::BadRank { rank: 1, size: 1, .. }));
/// ```
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A handle or read failed as it would on the tree.
    #[error(transparent)]
    Tree(#[from] crate::Error),

    /// Saving or loading the checkpoint failed on this rank.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::Error),

    /// The candle store failed on this rank: listing its variables, making
    /// a tensor, saving or loading it (boxed: candle's errors are large).
    #[cfg(feature = "candle")]
    #[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
    #[error(transparent)]
    Candle(Box<crate::candle::Error>),

    /// A variable under the synchronised scope holds a value the ranks layer
    /// cannot send (or no value). Nothing was sent.
    #[error(
        "variable `{}` in scope `{}` {}; {}",
        short::path(key),
        ShowPath(scope),
        match holds { Some(t) => format!("holds {}", short::name(&crate::short_type_name(t))), None => "has no value".to_owned() },
        wanted
    )]
    Unsupported {
        /// The variable's full name relative to the synchronised scope.
        key: String,
        /// Path of the synchronised scope.
        scope: String,
        /// The type name of its value; `None` when it has no value.
        holds: Option<&'static str>,
        /// What the call accepts, and what to do.
        wanted: &'static str,
    },

    /// The ranks do not hold the same variables: their manifests (full
    /// names, dtypes, shapes) differ. Every rank returns this same error and
    /// nothing was sent.
    #[error(
        "ranks disagree on the variables of scope `{}`: first difference at `{}`: {}; \
         build the same model on every rank (same names, dtypes and shapes) before synchronising",
        ShowPath(scope),
        short::path(key),
        groups(sides)
    )]
    Disagree {
        /// Path of the synchronised scope (as this rank names it).
        scope: String,
        /// The first full name, in full-name order, on which ranks differ.
        key: String,
        /// What each group of ranks holds under that name (`F32 [3, 4]`, or
        /// `absent`), and the ranks of the group, ascending.
        sides: Vec<(String, Vec<usize>)>,
    },

    /// The ranks' parameters are no longer bit-identical. Every rank returns
    /// this same error; nothing changed.
    #[error(
        "parameters of scope `{}` diverged across ranks: first difference at `{}`: {}; \
         broadcast them again from one rank or reload the last checkpoint",
        ShowPath(scope),
        short::path(key),
        groups(sides)
    )]
    Diverged {
        /// Path of the synchronised scope.
        scope: String,
        /// The first full name whose bytes differ between ranks.
        key: String,
        /// Groups of ranks holding the same bytes there (`digest 0x…`), the
        /// ranks of each group ascending.
        sides: Vec<(String, Vec<usize>)>,
    },

    /// This rank's tree changed since the plan was built: a variable was
    /// deleted, or holds another type or length. Every rank stopped before
    /// sending anything.
    #[error(
        "variable `{}` of scope `{}` changed since the plan was built ({reason}); \
         keep the synchronised variables' types and lengths, or build a new plan",
        short::path(key),
        ShowPath(scope)
    )]
    Changed {
        /// The variable's full name relative to the synchronised scope.
        key: String,
        /// Path of the synchronised scope.
        scope: String,
        /// What changed.
        reason: String,
    },

    /// Another rank failed the same call (its own error says why); this
    /// rank stopped with it, before sending anything that depends on it.
    #[error(
        "{op} failed on {} (see the error there); this rank stopped with it and changed nothing",
        ranks_text(ranks)
    )]
    PeerFailed {
        /// The call that failed.
        op: &'static str,
        /// The ranks where it failed, ascending.
        ranks: Vec<usize>,
    },

    /// The ranks passed different values for an argument every rank must
    /// pass alike (a plan's bucket size, a broadcast's or a save's root, an
    /// all-reduce's [`Reduce`](super::Reduce)). MPI would hang or mix
    /// buffers; every rank returns this same error instead, before sending
    /// anything that depends on the argument.
    #[error(
        "{op}: ranks passed different {what}: {}; pass the same on every rank",
        groups(sides)
    )]
    ArgumentsDiffer {
        /// The call.
        op: &'static str,
        /// The argument.
        what: &'static str,
        /// Each value passed, and the ranks that passed it, ascending.
        sides: Vec<(String, Vec<usize>)>,
    },

    /// A rank number outside the world, or a world too large for the layer.
    #[error("rank {rank} is not in a world of {size} rank(s) ({what}); pass a rank below {size}")]
    BadRank {
        /// The rank asked for.
        rank: usize,
        /// The world's size.
        size: usize,
        /// Which argument it was.
        what: &'static str,
    },

    /// Buffers of a collective call that do not fit each other (a bug in
    /// the caller: the ranks layer never makes such a call), or more elements
    /// than MPI can count in one call.
    #[error("{op}: {reason}")]
    BadBuffers {
        /// The collective call.
        op: &'static str,
        /// What does not fit.
        reason: String,
    },

    /// NCCL or the CUDA driver failed a call on this rank, or a tensor is
    /// not on the communicator's device (feature `nccl`). Nothing this
    /// rank holds changed.
    #[cfg(feature = "nccl")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
    #[error("{op}: {reason}")]
    Nccl {
        /// The call.
        op: &'static str,
        /// What failed, and what to do.
        reason: String,
    },

    /// A bad option (a bucket of zero bytes, a timeout of zero).
    #[error("bad option: {reason}")]
    BadOption {
        /// What is wrong, and what to pass instead.
        reason: String,
    },

    /// The bytes a rank read for a tensor of a checkpoint do not match the
    /// checksum that the save wrote beside them: the file was corrupted
    /// after the save. The load changed nothing on any rank.
    #[error(
        "the bytes of `{}` in {file} do not match the checksum its save wrote (the file is \
         corrupted); restore it or load an earlier checkpoint",
        short::path(key)
    )]
    Corrupted {
        /// The tensor's key.
        key: String,
        /// The file that holds it.
        file: String,
    },

    /// A rank's tree does not hold the [sliced state](super::SlicedState)
    /// its plan's partition gives it: a piece missing, of another type or
    /// length, or held for a piece the rank does not own.
    #[error(
        "sliced state `{}` of scope `{}`: {reason}; hold exactly the pieces of \
         SyncPlan::state_partition for this rank",
        short::name(key),
        short::path(scope)
    )]
    BadState {
        /// The state variable's key, relative to the state's scope.
        key: String,
        /// The state's scope.
        scope: String,
        /// What is wrong.
        reason: String,
    },

    /// A manifest received from another rank could not be read (ranks
    /// running different builds of the program).
    #[error(
        "the manifest of rank {rank} is unreadable ({reason}); run the same build on every rank"
    )]
    BadManifest {
        /// The rank that sent it.
        rank: usize,
        /// What is wrong with it.
        reason: String,
    },
}

#[cfg(feature = "candle")]
impl From<crate::candle::Error> for Error {
    fn from(e: crate::candle::Error) -> Self {
        match e {
            // A store's load verifies the checksums the ranks' saves write:
            // the ranks' own error says so, as their checks do.
            crate::candle::Error::Checkpoint(crate::checkpoint::Error::Corrupted { key, path }) => {
                Error::Corrupted { key, file: path }
            }
            other => Error::Candle(Box::new(other)),
        }
    }
}

/// `F32 [3, 4] on ranks 0-2, 5; absent on rank 3`, at most [`SHOWN`] groups.
fn groups(sides: &[(String, Vec<usize>)]) -> String {
    let mut s = String::new();
    for (i, (what, ranks)) in sides.iter().take(SHOWN).enumerate() {
        if i > 0 {
            s.push_str("; ");
        }
        s.push_str(&format!("{} on {}", short::name(what), ranks_text(ranks)));
    }
    if sides.len() > SHOWN {
        s.push_str(&format!("; … {} more groups", sides.len() - SHOWN));
    }
    s
}

/// `rank 3`, or `ranks 0-2, 5, 7` with consecutive ranks joined into runs
/// and at most [`SHOWN`] runs shown. O(ranks).
pub(crate) fn ranks_text(ranks: &[usize]) -> String {
    struct Runs<'a>(&'a [usize]);
    impl fmt::Display for Runs<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let mut shown = 0;
            let mut i = 0;
            while i < self.0.len() {
                let mut j = i;
                while j + 1 < self.0.len() && self.0[j + 1] == self.0[j] + 1 {
                    j += 1;
                }
                if shown == SHOWN {
                    return write!(f, ", … ({} ranks in all)", self.0.len());
                }
                if shown > 0 {
                    f.write_str(", ")?;
                }
                if j > i {
                    write!(f, "{}-{}", self.0[i], self.0[j])?;
                } else {
                    write!(f, "{}", self.0[i])?;
                }
                shown += 1;
                i = j + 1;
            }
            Ok(())
        }
    }
    if ranks.len() == 1 {
        format!("rank {}", ranks[0])
    } else {
        format!("ranks {}", Runs(ranks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_lists_are_runs_and_stay_short() {
        assert_eq!(ranks_text(&[3]), "rank 3");
        assert_eq!(ranks_text(&[0, 1, 2, 5, 7, 8]), "ranks 0-2, 5, 7-8");
        let every_other: Vec<usize> = (0..10_000).step_by(2).collect();
        let s = ranks_text(&every_other);
        assert!(s.ends_with("… (5000 ranks in all)"), "{s}");
        assert!(s.len() < 80, "{s}");
    }

    #[test]
    fn group_lists_stay_short() {
        let sides: Vec<_> = (0..100).map(|r| ("x".repeat(1000), vec![r])).collect();
        let s = groups(&sides);
        assert!(s.len() < 1000, "{}", s.len());
        assert!(s.ends_with("… 92 more groups"), "{s}");
    }
}
