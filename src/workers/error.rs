//! The worker layer's error type.

use std::fmt;

use crate::error::ShowPath;

/// Everything that can go wrong when splitting a tree between workers or
/// using a [`WorkerScope`](crate::WorkerScope): the split's own misuses, and
/// the tree's errors for bad handles and reads.
///
/// ```
/// use scopetree::{ScopeTree, WorkerError};
/// let mut tree = ScopeTree::new();
/// let a = tree.new_scope(tree.root())?;
/// let err = tree.split_workers(&[a, a]).unwrap_err();
/// assert!(matches!(err, WorkerError::OverlappingWorkers { .. }));
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A handle, name or read failed as it would on the tree.
    #[error(transparent)]
    Tree(#[from] crate::Error),
    /// A worker of a split ([`ScopeTree::split_workers`](crate::ScopeTree::split_workers))
    /// used a variable in a way the split does not allow it.
    #[error(
        "variable `{name}` in scope `{}`, used by the worker of scope `{}`: {reason}",
        ShowPath(scope),
        ShowPath(worker)
    )]
    WorkerAccess {
        /// The variable's name.
        name: String,
        /// Path of the variable's scope.
        scope: String,
        /// Path of the worker's scope.
        worker: String,
        /// What was not allowed, and what to do instead.
        reason: WorkerAccessReason,
    },
    /// Two scopes passed to [`ScopeTree::split_workers`](crate::ScopeTree::split_workers)
    /// overlap: the same scope twice, or one inside the other.
    #[error(
        "worker scopes `{}` and `{}` overlap (the same scope twice, or one inside the other); \
         give each worker a disjoint subtree, for example sibling kids of the model scope",
        ShowPath(scope),
        ShowPath(other)
    )]
    OverlappingWorkers {
        /// Path of one of the two scopes.
        scope: String,
        /// Path of the other.
        other: String,
    },
}

/// Why a worker of a split may not use a variable (see [`WorkerError::WorkerAccess`]).
///
/// ```
/// use scopetree::WorkerAccessReason;
/// assert!(WorkerAccessReason::ReadOnly.to_string().contains("read-only"));
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerAccessReason {
    /// A write to a shared variable (outside every worker's subtree).
    ReadOnly,
    /// A read or write of a variable in another worker's subtree.
    OtherWorker,
    /// A split-long borrow ([`WorkerScope::shared`](crate::WorkerScope::shared))
    /// of a variable the worker itself owns and may write.
    NotShared,
}

impl fmt::Display for WorkerAccessReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WorkerAccessReason::ReadOnly => {
                "it is shared and read-only while the tree is split between workers; \
                 write it after the split ends, on the tree (for example when reducing gradients)"
            }
            WorkerAccessReason::OtherWorker => {
                "it belongs to another worker's subtree; a worker reads and writes only its own \
                 subtree and reads the shared variables, so use the handle in the worker that owns it"
            }
            WorkerAccessReason::NotShared => {
                "it belongs to this worker, so it cannot be borrowed for the whole split; \
                 read it with `get`, or borrow several at once with `get_disjoint_mut`"
            }
        })
    }
}
