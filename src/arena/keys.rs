//! Typed handles: [`ScopeId`], [`VarId`], [`Symbol`] and the tag that ties
//! them to their tree; the arena keys inside them and how a key is read.
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

/// The slot-index half of a slotmap key.
///
/// slotmap documents `KeyData::as_ffi` as carrying no guarantee beyond a
/// round trip through `from_ffi`; slotmap 1.x packs `version << 32 | index`.
/// The arena's dense side arrays (`up`, `sigs`), the named-kid index and slot
/// retirement rest on that packing, so it is read only here and in
/// [`key_version`], and the test `slotmap_key_layout_is_index_and_version`
/// fails loudly if a slotmap release changes it (the dependency is pinned to
/// 1.x in `Cargo.toml` and `Cargo.lock`).
#[inline]
pub(crate) fn key_index(k: KeyData) -> u32 {
    k.as_ffi() as u32
}

/// The version half of a slotmap key (see [`key_index`]).
#[inline]
pub(crate) fn key_version(k: KeyData) -> u32 {
    (k.as_ffi() >> 32) as u32
}

/// The slot index of a scope key, as an index into the dense side arrays.
#[inline]
pub(crate) fn slot_index(key: ScopeKey) -> usize {
    key_index(key.data()) as usize
}

/// Whether a slot holding `key` has reached the last version slotmap can
/// give it: freeing it would let the version wrap, so it is retired instead.
#[inline]
pub(crate) fn at_last_version(key: impl Key) -> bool {
    key_version(key.data()) == u32::MAX
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

/// An interned name of one [`ScopeTree`](crate::ScopeTree).
///
/// Get one with [`ScopeTree::intern`](crate::ScopeTree::intern) and pass it
/// wherever a name is accepted to skip hashing the string. A symbol carries the
/// tag of its tree: using it with another tree returns
/// [`Error::ForeignSymbol`](crate::Error::ForeignSymbol). A symbol from
/// [`ScopeTree::symbol`](crate::ScopeTree::symbol) of a name that was later
/// freed returns [`Error::StaleSymbol`](crate::Error::StaleSymbol); one from
/// `intern` never goes stale.
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let w = tree.intern("w")?;
/// let id = tree.var(tree.root(), w)?;
/// assert_eq!(tree.find_var(tree.root(), w)?, Some(id));
/// assert_eq!(tree.resolve(w)?, "w");
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Symbol {
    pub(crate) idx: u32,
    pub(crate) generation: u32,
    pub(crate) tree: TreeTag,
}

impl Symbol {
    /// The symbol's index in its tree's interner (dense, from 0; the index of
    /// a freed name is reused by a later one, under a new generation). O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.intern("a")?;
    /// let b = tree.intern("b")?;
    /// assert_ne!(a.index(), b.index());
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn index(self) -> u32 {
        self.idx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arena reads slot indexes and versions out of slotmap keys (see
    /// [`key_index`]). This pins the layout it relies on: indexes are dense
    /// from 1 (slot 0 is slotmap's sentinel), a live key has an odd version,
    /// a freed-and-reused slot keeps its index with the version 2 higher, and
    /// `as_ffi` packs `version << 32 | index`. If a slotmap release changes
    /// any of this, this test fails before anything else can go wrong.
    #[test]
    fn slotmap_key_layout_is_index_and_version() {
        let mut map: slotmap::SlotMap<ScopeKey, ()> = slotmap::SlotMap::with_key();
        let a = map.insert(());
        let b = map.insert(());
        assert_eq!((slot_index(a), slot_index(b)), (1, 2));
        assert_eq!(key_version(a.data()), 1);
        map.remove(a);
        let c = map.insert(());
        assert_eq!(slot_index(c), 1, "the freed slot is reused");
        assert_eq!(key_version(c.data()), 3);
        assert_eq!(
            c.data().as_ffi(),
            (u64::from(key_version(c.data())) << 32) | 1
        );
        let back = ScopeKey::from(KeyData::from_ffi((3u64 << 32) | 1));
        assert_eq!(back, c);
        assert!(!at_last_version(c));
        let last = ScopeKey::from(KeyData::from_ffi((u64::from(u32::MAX) << 32) | 1));
        assert!(at_last_version(last));
    }

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
