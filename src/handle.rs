//! Typed handles: [`ScopeId`], [`VarId`] and the tag that ties them to their tree.
//!
//! A handle is a slotmap key (slot index and version) plus the [`TreeTag`] of
//! the [`ScopeTree`](crate::ScopeTree) that issued it. The version makes a
//! handle to a removed entry *stale* instead of letting it alias whatever reuses
//! the slot; the tag makes a handle from another tree *foreign* instead of
//! resolving it against the wrong arena.

use std::fmt;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

use slotmap::{Key, KeyData};

slotmap::new_key_type! {
    /// Arena key of a scope slot (crate-internal; users hold [`ScopeId`]).
    pub(crate) struct ScopeKey;
    /// Arena key of a variable slot (crate-internal; users hold [`VarId`]).
    pub(crate) struct VarKey;
}

/// The identity of one [`ScopeTree`](crate::ScopeTree), carried by every
/// handle it issues.
///
/// Tags come from a process-wide 64-bit counter, so no two trees of one
/// process ever share a tag (the counter would need 2^64 trees to wrap).
///
/// ```
/// use scopetree::ScopeTree;
/// let (a, b) = (ScopeTree::new(), ScopeTree::new());
/// assert_ne!(a.tag(), b.tag());
/// ```
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TreeTag(NonZeroU64);

impl TreeTag {
    /// Draws a fresh tag, never equal to one drawn before in this process.
    pub(crate) fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let raw = NEXT.fetch_add(1, Ordering::Relaxed);
        // The counter starts at 1 and would need 2^64 increments to reach 0.
        TreeTag(NonZeroU64::new(raw).unwrap_or(NonZeroU64::MIN))
    }

    /// The tag as a plain number (for logs and debugging).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// assert!(ScopeTree::new().tag().get() > 0);
    /// ```
    pub fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Debug for TreeTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

/// A slotmap key shown as `index v version` (`3v1`), the way slotmap does;
/// used by handle `Debug`, paths (`#3v1`) and DOT node ids (`s3v1`).
pub(crate) struct SlotLabel(pub(crate) KeyData);

impl fmt::Display for SlotLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}v{}", key_index(self.0), key_version(self.0))
    }
}

fn fmt_key(k: KeyData, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "{}", SlotLabel(k))
}

/// The slot-index half of a slotmap key (its low 32 bits).
#[inline]
pub(crate) fn key_index(k: KeyData) -> u32 {
    k.as_ffi() as u32
}

/// The version half of a slotmap key (its high 32 bits).
#[inline]
pub(crate) fn key_version(k: KeyData) -> u32 {
    (k.as_ffi() >> 32) as u32
}

/// A handle to a scope of a [`ScopeTree`](crate::ScopeTree).
///
/// `Copy`, 16 bytes, and valid for as long as the scope lives. Once the scope
/// is deleted, every call that takes the handle returns
/// [`Error::StaleScope`](crate::Error::StaleScope), even after the arena slot
/// has been reused by a new scope. A handle passed to another tree returns
/// [`Error::ForeignScope`](crate::Error::ForeignScope).
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let step = tree.new_scope(tree.root())?;
/// assert_eq!(tree.parent(step)?, Some(tree.root()));
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ScopeId {
    pub(crate) key: ScopeKey,
    pub(crate) tree: TreeTag,
}

impl ScopeId {
    pub(crate) fn new(key: ScopeKey, tree: TreeTag) -> Self {
        ScopeId { key, tree }
    }

    /// The tag of the tree that issued this handle.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let tree = ScopeTree::new();
    /// assert_eq!(tree.root().tree(), tree.tag());
    /// ```
    pub fn tree(self) -> TreeTag {
        self.tree
    }
}

impl fmt::Debug for ScopeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScopeId(")?;
        fmt_key(self.key.data(), f)?;
        write!(f, "@{:?})", self.tree)
    }
}

/// A handle to a variable of a [`ScopeTree`](crate::ScopeTree).
///
/// `Copy`, 16 bytes. Resolve it once (with [`ScopeTree::var`](crate::ScopeTree::var)
/// or [`ScopeTree::find_var`](crate::ScopeTree::find_var)) and read or write
/// through it without any string lookup. Once the variable is erased, or its
/// scope deleted, every call returns [`Error::StaleVar`](crate::Error::StaleVar).
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// tree.set(w, 1.5_f32)?;
/// assert_eq!(*tree.get::<f32>(w)?, 1.5);
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VarId {
    pub(crate) key: VarKey,
    pub(crate) tree: TreeTag,
}

impl VarId {
    pub(crate) fn new(key: VarKey, tree: TreeTag) -> Self {
        VarId { key, tree }
    }

    /// The tag of the tree that issued this handle.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// assert_eq!(w.tree(), tree.tag());
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn tree(self) -> TreeTag {
        self.tree
    }
}

impl fmt::Debug for VarId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("VarId(")?;
        fmt_key(self.key.data(), f)?;
        write!(f, "@{:?})", self.tree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_small_and_option_is_free() {
        assert_eq!(std::mem::size_of::<ScopeId>(), 16);
        assert_eq!(std::mem::size_of::<VarId>(), 16);
        assert_eq!(std::mem::size_of::<Option<VarId>>(), 16);
    }

    #[test]
    fn fresh_tags_differ() {
        let a = TreeTag::fresh();
        let b = TreeTag::fresh();
        assert!(b > a);
    }
}
