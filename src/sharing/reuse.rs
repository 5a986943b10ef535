//! [`Reuse`]: the reuse mode of a variable scope or of one `get_variable`
//! call. A leaf: it depends on nothing else in the crate.

/// The reuse mode of a scope, or asked for when entering one.
///
/// | TensorFlow 1 | here |
/// |---|---|
/// | `reuse=None` / `reuse=False` | `Reuse::Inherit` |
/// | `reuse=True` | `Reuse::Reuse` |
/// | `reuse=tf.AUTO_REUSE` | `Reuse::AutoReuse` |
///
/// When entering a scope, `Inherit` takes the parent's mode, so `Reuse` is
/// sticky: a sub-scope cannot turn it off. `AutoReuse` asked for explicitly
/// wins over an inherited `Reuse` (as in TensorFlow). As a scope's resolved
/// mode, `Inherit` means nothing above set a mode: `get_variable` creates and
/// refuses to share (TensorFlow's `reuse=False` of the root scope).
///
/// ```
/// use scopetree::sharing::{Reuse, VariableStore, ScopeOpts};
/// let mut store = VariableStore::new();
/// let root = store.root_scope();
/// assert_eq!(root.reuse(), Reuse::Inherit);
/// store.variable_scope(&root, "a", Reuse::Reuse, |store, a| {
///     store.variable_scope(a, "b", ScopeOpts::new(), |_, b| {
///         assert_eq!(b.reuse(), Reuse::Reuse); // sticky
///         Ok(())
///     })
/// })?;
/// # Ok::<(), scopetree::sharing::Error>(())
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum Reuse {
    /// Take the parent's mode (TF `None`/`False`); as a resolved mode: create
    /// only, never share.
    #[default]
    Inherit,
    /// Share only: `get_variable` returns existing variables and fails on a
    /// missing one (TF `True`).
    Reuse,
    /// Get or create: share an existing variable, create a missing one
    /// (TF `AUTO_REUSE`).
    AutoReuse,
}

impl Reuse {
    /// `self` unless it is `Inherit`, then `parent` (Python's `reuse or
    /// parent.reuse`). O(1).
    ///
    /// ```
    /// use scopetree::sharing::Reuse;
    /// assert_eq!(Reuse::Inherit.or(Reuse::Reuse), Reuse::Reuse);
    /// assert_eq!(Reuse::AutoReuse.or(Reuse::Reuse), Reuse::AutoReuse);
    /// ```
    pub fn or(self, parent: Reuse) -> Reuse {
        if self == Reuse::Inherit { parent } else { self }
    }
}
