//! The step layer's error type.

use crate::error::ShowPath;

/// Everything that can go wrong when using [`StepScopes`](crate::StepScopes):
/// a step that is not live, a step variable of other step scopes, and the
/// tree's errors for bad handles and names.
///
/// ```
/// use scopetree::{ScopeTree, StepError, StepScopes};
/// let mut tree = ScopeTree::new();
/// let steps = StepScopes::new(&tree, tree.root())?;
/// assert!(matches!(steps.scope(3), Err(StepError::NoSuchStep { step: 3, .. })));
/// # Ok::<(), StepError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// A handle, name or read failed as it would on the tree.
    #[error(transparent)]
    Tree(#[from] crate::Error),
    /// A step of a [`StepScopes`](crate::StepScopes) that is not live was asked for.
    #[error(
        "step {step} is not live in the step scopes under `{}` (live steps: {first}..{end}); \
         `push` it first, or use a larger window to keep older steps",
        ShowPath(scope)
    )]
    NoSuchStep {
        /// The step asked for.
        step: usize,
        /// The oldest live step.
        first: usize,
        /// One past the newest live step.
        end: usize,
        /// Path of the step scopes' parent scope.
        scope: String,
    },
    /// A [`StepVar`](crate::StepVar) was used with step scopes that did not
    /// declare it.
    #[error(
        "step variable `{name}` was declared by other step scopes, not by the step scopes \
         under `{}`; get it from these with `declare` or `step_var`",
        ShowPath(scope)
    )]
    ForeignStepVar {
        /// The step variable's name (or its column, if the name is unknown here).
        name: String,
        /// Path of the parent scope of the step scopes it was used with.
        scope: String,
    },
}
