//! A caller-owned cache of [`find_var`](ScopeTree::find_var) results:
//! [`Resolver`].
//!
//! # Why an entry stays correct
//!
//! The answer of `find_var(scope, name)` depends on two things only: the
//! chain of ancestors of `scope`, and which scopes of that chain hold a
//! variable named `name`.
//!
//! - The chain of a live scope never changes: parents are fixed at creation.
//!   A deleted scope's key never becomes live again (generational keys, and a
//!   slot is retired rather than reused at its last version), so an entry
//!   keyed by a deleted scope can never be used again: the scope check fails
//!   first, with the same error as the tree's.
//! - The tree keeps, per name, a *variable epoch*: a counter bumped whenever a
//!   variable of that name is created, erased, removed, freed with its scope,
//!   or renamed (the old name and the new). An entry records the epoch of its
//!   name when it was filled; while the epoch is unchanged, no variable of
//!   that name was created or destroyed anywhere, so the answer — a variable,
//!   or none — is still the answer.
//!
//! Values written with `set` do not change which variable a name resolves
//! to, so they never invalidate anything.

use std::fmt;

use slotmap::Key;

use crate::arena::{ScopeId, ScopeKey, TreeTag, VarId, VarKey};
use crate::error::Error;
use crate::names::Name;
use crate::tree::ScopeTree;

/// One cached answer: `find_var(scope, sym)` was `var` at epoch `epoch` of
/// `sym`. A null `scope` marks an empty entry.
#[derive(Copy, Clone)]
struct Entry {
    scope: ScopeKey,
    sym: u32,
    var: Option<VarKey>,
    epoch: u64,
}

impl Entry {
    fn empty() -> Self {
        Entry {
            scope: ScopeKey::null(),
            sym: 0,
            var: None,
            epoch: 0,
        }
    }
}

/// Entries per set: a new entry may go to either way of its set.
const WAYS: usize = 2;

/// The most entries a resolver holds (32 B each: 512 MiB).
const MAX_CAPACITY: usize = 1 << 24;

/// A cache of [`find_var`](ScopeTree::find_var) answers, owned by the caller,
/// whose repeated lookups cost the same at any depth.
///
/// A hit costs a scope-handle check, a hash of (scope, symbol) and one
/// comparison of the name's variable epoch: O(1), no walk, no allocation. A
/// miss walks like `find_var` (O(depth)) and stores the answer. Answers stay
/// correct whatever happens to the tree between calls — variables created
/// (shadowing included), erased, removed, renamed, scopes deleted and their
/// slots reused — because every change to the variables of a name bumps
/// that name's epoch in the tree (an O(1) counter increment on each create,
/// free or rename), and a deleted scope's handle never matches again. See
/// `docs/design.md`.
///
/// # Capacity and eviction
///
/// A fixed number of entries ([`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY)
/// for [`new`](Self::new), or [`with_capacity`](Self::with_capacity)),
/// allocated on the first miss (32 bytes each) and never grown: a resolver's
/// memory is bounded whatever it is asked. Entries are grouped in sets of
/// two; a (scope, name) pair can live only in the set its hash picks. A new
/// answer replaces, in its set, the entry for the same pair, else an empty
/// or outdated entry (scope deleted, or epoch changed), else the older of
/// the two. So a resolver asked about more pairs than it holds keeps
/// answering correctly and simply misses more.
///
/// # Several trees
///
/// A resolver serves one tree at a time. Handles and symbols of another tree
/// are refused with the tree's own errors, as [`ScopeTree::find_var`] refuses
/// them. Called with a different tree (a valid scope of that tree), it
/// forgets every entry first, so the entries of two trees never mix: keep
/// one resolver per tree.
///
/// ```
/// use scopetree::{Resolver, ScopeTree};
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "W")?;
/// let step = tree.new_scope(tree.root())?;
/// let mut r = Resolver::new();
/// assert_eq!(r.find_var(&tree, step, "W")?, Some(w)); // a miss: walks
/// assert_eq!(r.find_var(&tree, step, "W")?, Some(w)); // a hit
/// let w2 = tree.var(step, "W")?; // shadows the root's W
/// assert_eq!(r.find_var(&tree, step, "W")?, Some(w2));
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Clone)]
pub struct Resolver {
    tag: Option<TreeTag>,
    entries: Vec<Entry>,
    /// Number of sets, a power of two; `entries` is empty or holds
    /// `sets * WAYS` entries.
    sets: usize,
    len: usize,
    hits: u64,
    misses: u64,
}

impl Default for Resolver {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolver")
            .field("tree", &self.tag)
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("hits", &self.hits)
            .field("misses", &self.misses)
            .finish()
    }
}

impl Resolver {
    /// Entries of a resolver made with [`new`](Self::new): 1024 (32 KiB once
    /// allocated).
    pub const DEFAULT_CAPACITY: usize = 1024;

    /// An empty resolver of [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY)
    /// entries. Allocates nothing until its first miss. O(1).
    ///
    /// ```
    /// use scopetree::Resolver;
    /// let r = Resolver::new();
    /// assert!(r.is_empty());
    /// assert_eq!(r.capacity(), Resolver::DEFAULT_CAPACITY);
    /// ```
    pub fn new() -> Self {
        Self::with_capacity(Self::DEFAULT_CAPACITY)
    }

    /// An empty resolver holding at most `capacity` entries, rounded up to a
    /// power of two and clamped to 2 ..= 2^24. Allocates nothing until its
    /// first miss, then `capacity` × 32 bytes once. O(1).
    ///
    /// ```
    /// use scopetree::Resolver;
    /// assert_eq!(Resolver::with_capacity(100).capacity(), 128);
    /// assert_eq!(Resolver::with_capacity(0).capacity(), 2);
    /// ```
    pub fn with_capacity(capacity: usize) -> Self {
        let entries = capacity.clamp(WAYS, MAX_CAPACITY).next_power_of_two();
        Resolver {
            tag: None,
            entries: Vec::new(),
            sets: entries / WAYS,
            len: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// The most entries this resolver holds. O(1).
    ///
    /// ```
    /// use scopetree::Resolver;
    /// assert_eq!(Resolver::with_capacity(64).capacity(), 64);
    /// ```
    pub fn capacity(&self) -> usize {
        self.sets * WAYS
    }

    /// Entries held, up to [`capacity`](Self::capacity). Some may be
    /// outdated (their scope deleted or their name's variables changed):
    /// those are never returned and are replaced first. O(1).
    ///
    /// ```
    /// use scopetree::{Resolver, ScopeTree};
    /// let mut tree = ScopeTree::new();
    /// tree.var(tree.root(), "w")?;
    /// let mut r = Resolver::new();
    /// r.find_var(&tree, tree.root(), "w")?;
    /// assert_eq!(r.len(), 1);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the resolver holds no entry. O(1).
    ///
    /// ```
    /// use scopetree::Resolver;
    /// assert!(Resolver::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many [`find_var`](Self::find_var) calls were answered from an
    /// entry, and how many walked the tree, since the resolver was made
    /// (calls that failed or named a name the tree never saw count as
    /// neither). O(1).
    ///
    /// ```
    /// use scopetree::{Resolver, ScopeTree};
    /// let mut tree = ScopeTree::new();
    /// tree.var(tree.root(), "w")?;
    /// let mut r = Resolver::new();
    /// r.find_var(&tree, tree.root(), "w")?;
    /// r.find_var(&tree, tree.root(), "w")?;
    /// assert_eq!(r.hits_and_misses(), (1, 1));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// Forgets every entry, keeping the allocation (and the counts of
    /// [`hits_and_misses`](Self::hits_and_misses)). O(capacity).
    ///
    /// ```
    /// use scopetree::{Resolver, ScopeTree};
    /// let mut tree = ScopeTree::new();
    /// tree.var(tree.root(), "w")?;
    /// let mut r = Resolver::new();
    /// r.find_var(&tree, tree.root(), "w")?;
    /// r.clear();
    /// assert!(r.is_empty());
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn clear(&mut self) {
        self.entries.fill(Entry::empty());
        self.len = 0;
        self.tag = None;
    }

    /// [`ScopeTree::find_var`] through the cache: the same answer, the same
    /// errors, in O(1) on a hit (after hashing the name once when it is
    /// given as text; never when it is a [`Symbol`](crate::Symbol)), and
    /// O(depth of `scope`) on a miss, which stores the answer. Never
    /// allocates, except the resolver's table on its first miss.
    ///
    /// # Errors
    /// As [`ScopeTree::find_var`]: [`Error::StaleScope`] or
    /// [`Error::ForeignScope`] for a bad scope, [`Error::InvalidName`] or
    /// [`Error::ForeignSymbol`] for a bad name. Nothing is stored then.
    ///
    /// ```
    /// use scopetree::{Resolver, ScopeTree};
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let w = tree.var(root, "W")?;
    /// let step = tree.new_scope(root)?;
    /// let mut r = Resolver::new();
    /// assert_eq!(r.find_var(&tree, step, "W")?, Some(w));
    /// tree.remove_var(w)?;
    /// assert_eq!(r.find_var(&tree, step, "W")?, None);
    /// tree.delete_scope(step)?;
    /// assert!(r.find_var(&tree, step, "W").is_err()); // stale scope
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn find_var(
        &mut self,
        tree: &ScopeTree,
        scope: ScopeId,
        name: impl Name,
    ) -> Result<Option<VarId>, Error> {
        let s = tree.check_scope(scope)?;
        let Some(sym) = tree.lookup_name(name.as_name_ref())? else {
            return Ok(None);
        };
        if self.tag != Some(tree.tag()) {
            self.clear();
            self.tag = Some(tree.tag());
        }
        let epoch = tree.arena().names().epoch(sym);
        let first = self.set_of(s, sym) * WAYS;
        if let Some(set) = self.entries.get(first..first + WAYS) {
            for e in set {
                if e.scope == s && e.sym == sym && e.epoch == epoch {
                    self.hits += 1;
                    return Ok(e.var.map(|v| VarId::new(v, tree.tag())));
                }
            }
        }
        self.misses += 1;
        let var = tree.arena().find_sym(s, sym).map(|(_, v)| v);
        self.store(
            tree,
            first,
            Entry {
                scope: s,
                sym,
                var,
                epoch,
            },
        );
        Ok(var.map(|v| VarId::new(v, tree.tag())))
    }

    /// The set a (scope, symbol) pair lives in: the high bits of a
    /// multiplicative hash of both.
    #[inline]
    fn set_of(&self, scope: ScopeKey, sym: u32) -> usize {
        let x = scope
            .data()
            .as_ffi()
            .wrapping_add(u64::from(sym).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let h = x.wrapping_mul(0xd6e8_feb8_6659_fd93);
        (h >> 32) as usize & (self.sets - 1)
    }

    /// Puts `new` in the set starting at `first` (see the type's eviction
    /// policy), allocating the table on first use.
    fn store(&mut self, tree: &ScopeTree, first: usize, new: Entry) {
        if self.entries.is_empty() {
            self.entries = vec![Entry::empty(); self.sets * WAYS];
        }
        let Some(set) = self.entries.get_mut(first..first + WAYS) else {
            return;
        };
        let reusable = |e: &Entry| {
            e.scope.is_null()
                || tree.arena().scope(e.scope).is_none()
                || tree.arena().names().epoch(e.sym) != e.epoch
        };
        // Way 0 holds the newer entry, way 1 the older. The victim is the
        // outdated entry of the same pair, else the first reusable way, else
        // the older; the ways before it move down one.
        let victim = set
            .iter()
            .position(|e| e.scope == new.scope && e.sym == new.sym)
            .or_else(|| set.iter().position(reusable))
            .unwrap_or(WAYS - 1);
        if set[victim].scope.is_null() {
            self.len += 1;
        }
        set.copy_within(0..victim, 1);
        set[0] = new;
    }
}
