//! The sharing layer's error type.

use crate::arena::ScopeId;
use crate::error::{ShowPath, short_type_name, show_type};
use crate::sharing::reuse::Reuse;

/// Everything that can go wrong when using a
/// [`VariableStore`](crate::sharing::VariableStore): TensorFlow's sharing
/// errors (a variable that exists where the scope only creates, a variable
/// missing where it only reuses, a share of another type or shape, an
/// initializer that does not fit, a template that creates late), and the
/// tree's errors for bad handles and names.
///
/// Custom getters, templates and scope bodies return it too; a tree call
/// inside them converts with `?`.
///
/// ```
/// use scopetree::sharing::{Error, Initializer, VariableStore, VarSpec};
/// let mut store = VariableStore::new();
/// let root = store.root_scope();
/// let spec = || VarSpec::new("w").initializer(Initializer::constant(0.5_f32));
/// store.get_variable(&root, spec())?;
/// let err = store.get_variable(&root, spec()).unwrap_err();
/// assert!(matches!(err, Error::VariableExists { .. }));
/// let err = store.variable("a//w").unwrap_err();
/// assert!(matches!(err, Error::Tree(scopetree::Error::InvalidName { .. })));
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A handle, name or read failed as it would on the tree.
    #[error(transparent)]
    Tree(#[from] crate::Error),
    /// `get_variable` found the variable, but the scope only creates
    /// (TensorFlow's "Variable … already exists, disallowed").
    #[error(
        "variable `{name}` already exists in scope `{}`, and that scope does not reuse variables; \
         did you mean to enter the scope with `Reuse::Reuse` (share it) or `Reuse::AutoReuse` \
         (create it only if absent)? Otherwise pick another name",
        ShowPath(scope)
    )]
    VariableExists {
        /// The variable's name in its scope.
        name: String,
        /// Full name of the scope.
        scope: String,
    },
    /// `get_variable` in `Reuse` mode found no variable of that full name.
    #[error(
        "variable `{name}` does not exist in scope `{}` (or was not created there), and the scope \
         is in `Reuse::Reuse` mode, which never creates; create it first, or enter the scope with \
         `Reuse::AutoReuse` to create it if absent",
        ShowPath(scope)
    )]
    VariableMissing {
        /// The variable's name in its scope.
        name: String,
        /// Full name of the scope.
        scope: String,
    },
    /// A reuse asked for a shape that the held value's shape is not
    /// compatible with.
    #[error(
        "trying to share variable `{name}` of scope `{}`, but the specified shape is {expected} \
         and the found shape is {found}; ask for a compatible shape (or none), or use another name",
        ShowPath(scope)
    )]
    ShapeMismatch {
        /// The variable's name in its scope.
        name: String,
        /// Full name of the scope.
        scope: String,
        /// The shape asked for.
        expected: String,
        /// The shape held.
        found: String,
    },
    /// A reuse asked for another value type than the variable holds.
    #[error(
        "trying to share variable `{name}` of scope `{}` as a `{}`, but it holds a `{}`; \
         ask for the held type, or use another name",
        ShowPath(scope),
        show_type(expected, found),
        show_type(found, expected)
    )]
    ShareTypeMismatch {
        /// The variable's name in its scope.
        name: String,
        /// Full name of the scope.
        scope: String,
        /// The type asked for.
        expected: &'static str,
        /// The type held.
        found: &'static str,
    },
    /// The initializer made a value whose shape does not fit the spec's.
    #[error(
        "the initializer of variable `{name}` in scope `{}` made a value of shape {found}, \
         but the specified shape is {expected}; fix the initializer or the shape",
        ShowPath(scope)
    )]
    InitShapeMismatch {
        /// The variable's name in its scope.
        name: String,
        /// Full name of the scope.
        scope: String,
        /// The shape asked for.
        expected: String,
        /// The shape of the value made.
        found: String,
    },
    /// A fallible initializer
    /// ([`Initializer::try_with_shape`](crate::sharing::Initializer::try_with_shape))
    /// failed. Nothing was created.
    #[error(
        "the initializer of variable `{name}` in scope `{}` failed: {source}; nothing was \
         created",
        ShowPath(scope)
    )]
    InitFailed {
        /// The variable's name in its scope.
        name: String,
        /// Full name of the scope.
        scope: String,
        /// The initializer's error.
        #[source]
        source: crate::sharing::InitError,
    },
    /// `get_variable` had to create a variable but found no initializer.
    #[error(
        "variable `{name}` in scope `{}` must be created but has no initializer for a `{}`; \
         give one in the spec (`VarSpec::initializer`) or as a scope default \
         (`ScopeOpts::initializer`)",
        ShowPath(scope),
        short_type_name(value_type)
    )]
    InitializerRequired {
        /// The variable's name in its scope.
        name: String,
        /// Full name of the scope.
        scope: String,
        /// The value type asked for.
        value_type: &'static str,
    },
    /// A constant initializer was given together with a shape.
    #[error(
        "variable `{name}` in scope `{}` has a constant initializer and a shape; a constant \
         brings its own shape, so do not specify one (or use `Initializer::with_shape`)",
        ShowPath(scope)
    )]
    ConstantWithShape {
        /// The variable's name in its scope.
        name: String,
        /// Full name of the scope.
        scope: String,
    },
    /// A shape-taking initializer was given no fully defined shape.
    #[error(
        "variable `{name}` in scope `{}` has a shape-taking initializer, but its shape is \
         {shape}, not fully defined; give a fully defined shape, or use \
         `Initializer::from_fn` or `Initializer::constant`",
        ShowPath(scope)
    )]
    ShapeRequired {
        /// The variable's name in its scope.
        name: String,
        /// Full name of the scope.
        scope: String,
        /// The shape given (`unknown` if none).
        shape: String,
    },
    /// A default-named scope was asked to reuse (TensorFlow's "reuse=True
    /// cannot be used without a name_or_scope").
    #[error(
        "the default-named scope `{default_name}` under scope `{}` cannot be entered with \
         {reuse:?}: reuse needs a name; enter it by name (`variable_scope`) or re-enter a \
         captured scope",
        ShowPath(scope)
    )]
    ReuseWithoutName {
        /// The default name given.
        default_name: String,
        /// Full name of the scope it was asked under.
        scope: String,
        /// The reuse mode asked for.
        reuse: Reuse,
    },
    /// A template call after the first one created trainable variables.
    #[error(
        "template `{template}` (scope `{}`) created trainable variable(s) {names:?} after its \
         first call; a template may only create variables on its first call: use \
         `get_variable` with names that do not depend on the call, or make them non-trainable",
        ShowPath(scope)
    )]
    TemplateCreatedVariable {
        /// The template's name.
        template: String,
        /// Full name of the template's scope.
        scope: String,
        /// Full names of the variables created.
        names: Vec<String>,
    },
    /// The scope a template captured was deleted.
    #[error(
        "template `{template}` captured scope {scope:?}, which was deleted; its variables are \
         gone, so make a new template rather than call this one"
    )]
    StaleTemplate {
        /// The template's name.
        template: String,
        /// The stale scope handle.
        scope: ScopeId,
    },
}
