//! The arena: [`ScopeTree`], its scope and variable slots, and the structural
//! operations (creating and deleting scopes, kids, parents, depth, paths).

use std::any::Any;
use std::fmt;
use std::mem;
use std::panic::{self, AssertUnwindSafe};

use slotmap::{Key, SlotMap};
use smallvec::SmallVec;

use crate::error::Error;
use crate::handle::{ScopeId, ScopeKey, SlotLabel, TreeTag, VarId, VarKey, key_index, key_version};
use crate::names::{FxHashMap, Interner, Name, NameRef, Symbol, validate_name};
use crate::value::Payload;

/// How many variables a scope holds inline, before its table moves to the heap.
pub const INLINE_VARS: usize = 4;

/// Past this many local variables a scope also keeps a hash index.
pub(crate) const INDEX_THRESHOLD: usize = 16;

/// At most this many spilled variable tables are kept for reuse...
const SPARE_TABLES: usize = 256;
/// ...and only those whose capacity is at most this.
const SPARE_TABLE_MAX_CAP: usize = 64;

/// A named kid is looked for among the first `KID_SCAN` kids of its parent
/// before the index of named kids is probed: walking a few kids costs less
/// than hashing, and most parents have few kids.
const KID_SCAN: usize = 4;

/// The key of a named kid in `ScopeTree::named_kids`: its parent's slot index
/// and its name. The parent's version is not needed: a slot holds at most one
/// live scope, and when a scope is freed its kids are freed with it, taking
/// their entries along, so every entry under a slot index belongs to the
/// scope living there now.
#[inline]
fn kid_index_key(parent: ScopeKey, sym: u32) -> u64 {
    ((slot_index(parent) as u64) << 32) | u64::from(sym)
}

/// `ScopeSlot::name` of an unnamed scope.
pub(crate) const NO_NAME: u32 = u32::MAX;
/// `ScopeSlot::depth` of a retired slot (see [`ScopeTree::free_scope`]).
const RETIRED: u32 = u32::MAX;

/// The first panic raised by a value's `Drop` while the tree was dropping
/// values, held until the tree's bookkeeping is complete (see
/// [`ScopeTree::free_vars`]).
pub(crate) type DeferredPanic = Option<Box<dyn Any + Send>>;

/// Passes on the panic a value's `Drop` raised during a call, if any.
pub(crate) fn resume(deferred: DeferredPanic) {
    if let Some(payload) = deferred {
        panic::resume_unwind(payload);
    }
}

/// One local variable of a scope: its interned name and its slot.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) sym: u32,
    pub(crate) var: VarKey,
}

/// The bit a symbol sets in a scope's name signature.
#[inline]
pub(crate) fn sig_bit(sym: u32) -> u64 {
    1u64 << (sym & 63)
}

/// A scope's local variables, in creation order.
///
/// Up to [`INLINE_VARS`] entries live inline in the scope slot; past
/// [`INDEX_THRESHOLD`] a hash index from symbol to position is kept
/// alongside, so a local lookup is O(1) in a wide scope and a short scan in a
/// small one.
///
/// Removing from an indexed table leaves a hole (`None`) instead of shifting
/// the entries after it; the holes are squeezed out, in one pass that keeps
/// the order, once they outnumber the live entries. Removal and rename are
/// therefore O(1) amortised at any width, and listings keep creation order.
/// A table without an index never holds a hole: it is short, so a removal
/// shifts at most [`INDEX_THRESHOLD`] entries.
#[derive(Default)]
pub(crate) struct VarTable {
    entries: SmallVec<[Option<Entry>; INLINE_VARS]>,
    /// Symbol to position in `entries`, past [`INDEX_THRESHOLD`] entries; it
    /// holds one key per live entry, so its length is the table's.
    index: Option<Box<FxHashMap<u32, usize>>>,
}

impl VarTable {
    #[inline]
    pub(crate) fn find(&self, sym: u32) -> Option<VarKey> {
        self.entry(self.position(sym)?).map(|e| e.var)
    }

    /// The entry at `pos`, if it is not a hole.
    #[inline]
    pub(crate) fn entry(&self, pos: usize) -> Option<Entry> {
        self.entries.get(pos).copied().flatten()
    }

    /// The position of `sym` in `entries`. O(1).
    #[inline]
    pub(crate) fn position(&self, sym: u32) -> Option<usize> {
        match &self.index {
            Some(ix) => ix.get(&sym).copied(),
            None => self
                .entries
                .iter()
                .position(|e| e.is_some_and(|e| e.sym == sym)),
        }
    }

    /// How many variables the table holds.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.index
            .as_ref()
            .map_or(self.entries.len(), |ix| ix.len())
    }

    /// The entries and holes in creation order (for iterators that keep
    /// their own count of live entries).
    pub(crate) fn slots(&self) -> &[Option<Entry>] {
        &self.entries
    }

    /// The entries in creation order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = Entry> + Clone + '_ {
        self.entries.iter().filter_map(|e| *e)
    }

    /// Appends an entry, taking a spare heap buffer when the inline space is
    /// full so that steady-state churn does not allocate.
    fn push(&mut self, e: Entry, spares: &mut Vec<Vec<Option<Entry>>>) {
        if !self.entries.spilled() && self.entries.len() == INLINE_VARS {
            if let Some(mut buf) = spares.pop() {
                buf.extend(self.entries.drain(..));
                self.entries = SmallVec::from_vec(buf);
            }
        }
        self.entries.push(Some(e));
        let pos = self.entries.len() - 1;
        if let Some(ix) = &mut self.index {
            ix.insert(e.sym, pos);
        } else if self.entries.len() > INDEX_THRESHOLD {
            self.reindex();
        }
    }

    /// Removes `sym`'s entry, keeping the order of the others. O(1)
    /// amortised.
    pub(crate) fn remove(&mut self, sym: u32) -> Option<Entry> {
        let pos = self.position(sym)?;
        let e = match &mut self.index {
            None => self.entries.remove(pos)?,
            Some(ix) => {
                ix.remove(&sym);
                self.entries.get_mut(pos)?.take()?
            }
        };
        let live = self.len();
        if self.entries.len() - live > live.max(INDEX_THRESHOLD) {
            self.compact();
        }
        Some(e)
    }

    /// Removes every entry whose symbol `pred` accepts, in one pass, and
    /// returns them in order. O(entries).
    pub(crate) fn remove_where(&mut self, mut pred: impl FnMut(u32) -> bool) -> Vec<Entry> {
        let mut out = Vec::new();
        self.entries.retain(|e| match e {
            Some(x) if pred(x.sym) => {
                out.push(*x);
                false
            }
            Some(_) => true,
            None => false,
        });
        if self.index.is_some() {
            self.reindex();
        }
        out
    }

    /// Renames the entry at `pos` in place. O(1).
    pub(crate) fn rename_at(&mut self, pos: usize, sym: u32) {
        let Some(Some(e)) = self.entries.get_mut(pos) else {
            return;
        };
        if let Some(ix) = &mut self.index {
            ix.remove(&e.sym);
            ix.insert(sym, pos);
        }
        e.sym = sym;
    }

    /// Squeezes out the holes, keeping the order, and rebuilds the index (or
    /// drops it, once the table is short again). O(entries).
    fn compact(&mut self) {
        self.entries.retain(|e| e.is_some());
        self.reindex();
    }

    fn reindex(&mut self) {
        if self.entries.len() <= INDEX_THRESHOLD && self.entries.iter().all(Option::is_some) {
            self.index = None;
            return;
        }
        let ix = self.index.get_or_insert_with(Default::default);
        ix.clear();
        for (pos, e) in self.entries.iter().enumerate() {
            if let Some(e) = e {
                ix.insert(e.sym, pos);
            }
        }
    }

    /// Empties the table, handing back its buffer.
    fn take_entries(&mut self) -> SmallVec<[Option<Entry>; INLINE_VARS]> {
        self.index = None;
        mem::take(&mut self.entries)
    }

    /// Heap bytes of the spilled buffer and the index.
    fn heap_bytes(&self) -> usize {
        let spilled = if self.entries.spilled() {
            self.entries.capacity() * mem::size_of::<Option<Entry>>()
        } else {
            0
        };
        let index = self.index.as_ref().map_or(0, |ix| {
            mem::size_of::<FxHashMap<u32, usize>>() + hash_table_bytes::<u32, usize>(ix.capacity())
        });
        spilled + index
    }

    /// The name signature of the current entries.
    pub(crate) fn signature(&self) -> u64 {
        self.iter().fold(0, |s, e| s | sig_bit(e.sym))
    }
}

/// A scope in the arena.
///
/// The two fields a lookup reads at every level, the parent and the name
/// signature, are not here: they live in [`ScopeTree::up`] and
/// [`ScopeTree::sigs`], dense arrays indexed by slot index, so that a walk up
/// the tree is one 8-byte load per level. `repr(C)` keeps the table, which a
/// lookup reads when a signature matches, at the front of the slot.
#[repr(C)]
pub(crate) struct ScopeSlot {
    pub(crate) vars: VarTable,
    pub(crate) first_kid: ScopeKey,
    pub(crate) last_kid: ScopeKey,
    pub(crate) prev_sib: ScopeKey,
    pub(crate) next_sib: ScopeKey,
    pub(crate) name: u32,
    pub(crate) depth: u32,
}

impl ScopeSlot {
    fn new(name: u32, depth: u32) -> Self {
        ScopeSlot {
            vars: VarTable::default(),
            first_kid: ScopeKey::null(),
            last_kid: ScopeKey::null(),
            prev_sib: ScopeKey::null(),
            next_sib: ScopeKey::null(),
            name,
            depth,
        }
    }

    #[inline]
    pub(crate) fn is_retired(&self) -> bool {
        self.depth == RETIRED
    }
}

/// A variable in the arena. A retired slot has a null owner.
pub(crate) struct VarSlot {
    pub(crate) value: Option<Box<dyn Payload>>,
    pub(crate) owner: ScopeKey,
    pub(crate) name: u32,
}

impl VarSlot {
    #[inline]
    pub(crate) fn is_retired(&self) -> bool {
        self.owner.is_null()
    }
}

/// A tree of scopes holding named, typed variables, all in one generational
/// arena.
///
/// A new tree has one scope, the [root](ScopeTree::root). Every other scope has
/// a parent; a variable belongs to exactly one scope. Lookups with
/// [`find_var`](ScopeTree::find_var) walk from a scope up to the root, so a
/// step scope sees the parameters of the model scope above it, and a name in a
/// kid shadows the same name in a parent.
///
/// Handles ([`ScopeId`], [`VarId`]) are `Copy` keys, never references: after
/// [`delete_scope`](ScopeTree::delete_scope) every handle into the deleted
/// subtree reports [`Error::StaleScope`] or [`Error::StaleVar`] and never
/// aliases a newer scope or variable, even once the slot has been reused, and
/// even after 2^31 reuses of one slot (such a slot is retired; see
/// `docs/design.md`).
///
/// `ScopeTree` is `Send + Sync`: share `&ScopeTree` between threads to read.
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let root = tree.root();
/// let w = tree.var(root, "W")?;
/// tree.set(w, vec![0.5_f32; 4])?;
///
/// let step = tree.new_scope(root)?;
/// let h = tree.var(step, "h")?;
/// assert_eq!(tree.find_var(step, "W")?, Some(w)); // found in the parent
///
/// tree.delete_scope(step)?;
/// assert!(tree.get::<f32>(h).is_err()); // stale, not dangling
/// assert_eq!(tree.get::<Vec<f32>>(w)?.len(), 4);
/// # Ok::<(), scopetree::Error>(())
/// ```
pub struct ScopeTree {
    pub(crate) scopes: SlotMap<ScopeKey, ScopeSlot>,
    pub(crate) vars: SlotMap<VarKey, VarSlot>,
    pub(crate) names: Interner,
    pub(crate) root: ScopeKey,
    pub(crate) tag: TreeTag,
    retired_scopes: usize,
    retired_vars: usize,
    pub(crate) unique_counter: u64,
    spare_tables: Vec<Vec<Option<Entry>>>,
    /// The parent of each scope slot, by slot index (null for the root).
    /// A live scope's entry is set when it is created and never changes.
    pub(crate) up: Vec<ScopeKey>,
    /// The name signature of each scope slot, by slot index: bit `sym % 64` is
    /// set for every local name, so a lookup skips a level whose signature
    /// lacks the bit without touching its slot.
    pub(crate) sigs: Vec<u64>,
    /// Every live named scope, by [`kid_index_key`] (its parent's slot index
    /// and its name): the index behind [`kid`](ScopeTree::kid) and the name
    /// check of [`new_named_scope`](ScopeTree::new_named_scope) for parents
    /// with more than [`KID_SCAN`] kids. Written when a named scope is created
    /// and when it is freed (`free_scope`, which every deletion goes
    /// through); unnamed scopes never touch it.
    named_kids: FxHashMap<u64, ScopeKey>,
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ScopeTree>();
};

impl Default for ScopeTree {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ScopeTree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopeTree")
            .field("tag", &self.tag)
            .field("scopes", &self.scope_count())
            .field("vars", &self.var_count())
            .field("names", &self.names.len())
            .finish()
    }
}

impl ScopeTree {
    /// Creates a tree holding only its root scope. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let tree = ScopeTree::new();
    /// assert_eq!(tree.scope_count(), 1);
    /// assert_eq!(tree.var_count(), 0);
    /// ```
    pub fn new() -> Self {
        Self::with_capacity(1, 0)
    }

    /// Creates a tree with room for `scopes` scopes and `vars` variables
    /// before its arenas reallocate.
    ///
    /// The capacities are hints, clamped to the most slots an arena can index
    /// (2^32 − 2). As with `Vec::with_capacity`, an allocation the system
    /// cannot satisfy aborts the process; it does not panic.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let tree = ScopeTree::with_capacity(1024, 8192);
    /// assert_eq!(tree.scope_count(), 1);
    /// ```
    pub fn with_capacity(scopes: usize, vars: usize) -> Self {
        const MAX_SLOTS: usize = (u32::MAX - 1) as usize;
        let (scopes, vars) = (scopes.clamp(1, MAX_SLOTS), vars.min(MAX_SLOTS));
        let mut scope_map = SlotMap::with_capacity_and_key(scopes);
        let root = scope_map.insert(ScopeSlot::new(NO_NAME, 0));
        let hot = scope_map.capacity() + 1;
        let mut tree = ScopeTree {
            scopes: scope_map,
            vars: SlotMap::with_capacity_and_key(vars),
            names: Interner::default(),
            root,
            tag: TreeTag::fresh(),
            retired_scopes: 0,
            retired_vars: 0,
            unique_counter: 0,
            spare_tables: Vec::new(),
            up: Vec::with_capacity(hot),
            sigs: Vec::with_capacity(hot),
            named_kids: FxHashMap::default(),
        };
        tree.set_hot(root, ScopeKey::null());
        tree
    }

    /// The tag carried by every handle of this tree.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let tree = ScopeTree::new();
    /// assert_eq!(tree.root().tree(), tree.tag());
    /// ```
    pub fn tag(&self) -> TreeTag {
        self.tag
    }

    /// The root scope. It lives as long as the tree. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let tree = ScopeTree::new();
    /// assert_eq!(tree.parent(tree.root())?, None);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn root(&self) -> ScopeId {
        ScopeId::new(self.root, self.tag)
    }

    /// Number of live scopes, the root included. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// tree.new_scope(tree.root())?;
    /// assert_eq!(tree.scope_count(), 2);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn scope_count(&self) -> usize {
        self.scopes.len() - self.retired_scopes
    }

    /// Number of live variables in the whole tree. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// tree.var(tree.root(), "w")?;
    /// assert_eq!(tree.var_count(), 1);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn var_count(&self) -> usize {
        self.vars.len() - self.retired_vars
    }

    /// Whether `scope` is a live scope of this tree (`false` for stale or
    /// foreign handles). O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let s = tree.new_scope(tree.root())?;
    /// tree.delete_scope(s)?;
    /// assert!(!tree.contains_scope(s));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn contains_scope(&self, scope: ScopeId) -> bool {
        self.scope_slot(scope).is_ok()
    }

    /// Whether `var` is a live variable of this tree (`false` for stale or
    /// foreign handles). O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// assert!(tree.contains_var(w));
    /// tree.remove_var(w)?;
    /// assert!(!tree.contains_var(w));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn contains_var(&self, var: VarId) -> bool {
        self.var_slot(var).is_ok()
    }

    // ----- handle checks --------------------------------------------------

    /// Resolves a scope handle, or says why it cannot be resolved.
    #[inline]
    pub(crate) fn scope_slot(&self, scope: ScopeId) -> Result<&ScopeSlot, Error> {
        if scope.tree != self.tag {
            return Err(Error::ForeignScope {
                scope,
                tree: self.tag,
            });
        }
        match self.scopes.get(scope.key) {
            Some(slot) if !slot.is_retired() => Ok(slot),
            _ => Err(Error::StaleScope { scope }),
        }
    }

    /// Checks a scope handle and returns its key.
    #[inline]
    pub(crate) fn check_scope(&self, scope: ScopeId) -> Result<ScopeKey, Error> {
        self.scope_slot(scope).map(|_| scope.key)
    }

    /// Resolves a variable handle, or says why it cannot be resolved.
    #[inline]
    pub(crate) fn var_slot(&self, var: VarId) -> Result<&VarSlot, Error> {
        match self.var_slot_unretired(var)? {
            slot if slot.is_retired() => Err(Error::StaleVar { var }),
            slot => Ok(slot),
        }
    }

    /// Like [`var_slot`](Self::var_slot) but lets a retired slot through; the
    /// caller must treat `owner.is_null()` as stale. Used by the value fast
    /// path, where a retired slot's empty value already leads to the slow path.
    #[inline]
    pub(crate) fn var_slot_unretired(&self, var: VarId) -> Result<&VarSlot, Error> {
        if var.tree != self.tag {
            return Err(Error::ForeignVar {
                var,
                tree: self.tag,
            });
        }
        // A `match`, not `ok_or`: an eagerly built error is dropped on every
        // successful read, a call on the hot path of `get`.
        match self.vars.get(var.key) {
            Some(slot) => Ok(slot),
            None => Err(Error::StaleVar { var }),
        }
    }

    /// Mutable [`var_slot`](Self::var_slot).
    #[inline]
    pub(crate) fn var_slot_mut(&mut self, var: VarId) -> Result<&mut VarSlot, Error> {
        if var.tree != self.tag {
            return Err(Error::ForeignVar {
                var,
                tree: self.tag,
            });
        }
        match self.vars.get_mut(var.key) {
            Some(slot) if !slot.is_retired() => Ok(slot),
            _ => Err(Error::StaleVar { var }),
        }
    }

    // ----- names ------------------------------------------------------------

    /// Interns `name` in this tree and returns its [`Symbol`], which later
    /// calls accept in place of the string to skip hashing it. O(len(name));
    /// allocates only the first time a name is seen.
    ///
    /// An interned name is pinned: it stays in the tree's name table for the
    /// tree's lifetime, so its symbol never goes stale. Names that only
    /// scopes and variables carry are freed with their last carrier.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty name or one containing `/`.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.intern("w")?;
    /// assert_eq!(tree.intern("w")?, w);
    /// assert!(tree.intern("a/b").is_err());
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn intern(&mut self, name: &str) -> Result<Symbol, Error> {
        validate_name(name)?;
        let idx = self.names.intern(name);
        self.names.pin(idx);
        Ok(self.symbol_of(idx))
    }

    /// The symbol of `name` if a scope or variable of the tree carries that
    /// name or it was [interned](Self::intern), without interning it.
    /// O(len(name)).
    ///
    /// A symbol got here stays valid while the name is in use; once no scope
    /// or variable carries it (and it was never interned) the name is freed and
    /// the symbol reports [`Error::StaleSymbol`]. Use [`intern`](Self::intern)
    /// for a symbol that never goes stale.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// assert_eq!(tree.symbol("w"), None);
    /// let w = tree.intern("w")?;
    /// assert_eq!(tree.symbol("w"), Some(w));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn symbol(&self, name: &str) -> Option<Symbol> {
        self.names.get(name).map(|idx| self.symbol_of(idx))
    }

    fn symbol_of(&self, idx: u32) -> Symbol {
        Symbol {
            idx,
            generation: self.names.generation(idx),
            tree: self.tag,
        }
    }

    /// The text of a symbol. O(1).
    ///
    /// # Errors
    /// [`Error::ForeignSymbol`] if `sym` was interned by another tree;
    /// [`Error::StaleSymbol`] if its name was freed (see
    /// [`symbol`](Self::symbol)).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let sym = tree.intern("bias")?;
    /// assert_eq!(tree.resolve(sym)?, "bias");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn resolve(&self, sym: Symbol) -> Result<&str, Error> {
        self.check_symbol(sym)?;
        Ok(self.names.text(sym.idx))
    }

    #[inline]
    fn check_symbol(&self, sym: Symbol) -> Result<u32, Error> {
        if sym.tree != self.tag {
            Err(Error::ForeignSymbol {
                symbol: sym,
                tree: self.tag,
            })
        } else if !self.names.is_current(sym.idx, sym.generation) {
            Err(Error::StaleSymbol { symbol: sym })
        } else {
            Ok(sym.idx)
        }
    }

    /// The symbol index of a name for a lookup: `Ok(None)` if the name is
    /// not interned, so it cannot be anywhere in the tree.
    #[inline]
    pub(crate) fn lookup_name(&self, name: NameRef<'_>) -> Result<Option<u32>, Error> {
        match name {
            NameRef::Str(s) => {
                validate_name(s)?;
                Ok(self.names.get(s))
            }
            NameRef::Sym(sym) => self.check_symbol(sym).map(Some),
        }
    }

    /// The symbol index of a name for a create, interning it if new. The
    /// caller records the use (`insert_var`, `insert_scope`) or, if the create
    /// fails, calls `names.free_if_unused`.
    pub(crate) fn intern_name(&mut self, name: NameRef<'_>) -> Result<u32, Error> {
        match name {
            NameRef::Str(s) => {
                validate_name(s)?;
                Ok(self.names.intern(s))
            }
            NameRef::Sym(sym) => self.check_symbol(sym),
        }
    }

    /// Like [`intern_name`](Self::intern_name), and pins the name, for a layer
    /// that keeps the symbol across calls (step variables).
    pub(crate) fn intern_pinned(&mut self, name: NameRef<'_>) -> Result<u32, Error> {
        let idx = self.intern_name(name)?;
        self.names.pin(idx);
        Ok(idx)
    }

    /// The text of a name, for messages (cut to a bounded length). A foreign
    /// or stale symbol shows as its debug form.
    pub(crate) fn name_text(&self, name: NameRef<'_>) -> String {
        match name {
            NameRef::Str(s) => crate::short::name(s),
            NameRef::Sym(sym) if self.check_symbol(sym).is_ok() => {
                crate::short::name(self.names.text(sym.idx))
            }
            NameRef::Sym(sym) => format!("{sym:?}"),
        }
    }

    // ----- structure ----------------------------------------------------------

    /// Creates an unnamed kid of `parent`, after its existing kids. O(1).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for a bad `parent`.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let b = tree.new_scope(a)?;
    /// assert_eq!(tree.depth(b)?, 2);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn new_scope(&mut self, parent: ScopeId) -> Result<ScopeId, Error> {
        let p = self.check_scope(parent)?;
        Ok(self.insert_scope(p, NO_NAME))
    }

    /// Creates a kid of `parent` named `name`, after its existing kids. A named
    /// scope can be found again with [`kid`](Self::kid) and shows its name in
    /// paths and dumps. O(1) amortised after hashing the name: the name check
    /// walks at most 4 kids of `parent`, then probes the tree's index of named
    /// kids.
    ///
    /// # Errors
    /// [`Error::ScopeNameTaken`] if a kid of `parent` already has that name;
    /// [`Error::InvalidName`]; [`Error::StaleScope`] or
    /// [`Error::ForeignScope`] for a bad `parent`.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let enc = tree.new_named_scope(tree.root(), "encoder")?;
    /// assert_eq!(tree.path(enc)?, "encoder");
    /// assert!(tree.new_named_scope(tree.root(), "encoder").is_err());
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn new_named_scope(&mut self, parent: ScopeId, name: impl Name) -> Result<ScopeId, Error> {
        let p = self.check_scope(parent)?;
        let name = name.as_name_ref();
        let sym = self.intern_name(name)?;
        if self.kid_by_sym(p, sym).is_some() {
            return Err(Error::ScopeNameTaken {
                name: self.name_text(name),
                scope: self.error_path(p),
            });
        }
        Ok(self.insert_scope(p, sym))
    }

    /// The kid of `parent` named `name`, if any. O(1) after hashing the name
    /// (no hashing of text when `name` is a [`Symbol`]), however many kids
    /// `parent` has: a walk of at most 4 kids, then one probe of the tree's
    /// index of named kids.
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let enc = tree.new_named_scope(tree.root(), "encoder")?;
    /// assert_eq!(tree.kid(tree.root(), "encoder")?, Some(enc));
    /// assert_eq!(tree.kid(tree.root(), "decoder")?, None);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn kid(&self, parent: ScopeId, name: impl Name) -> Result<Option<ScopeId>, Error> {
        let p = self.check_scope(parent)?;
        let Some(sym) = self.lookup_name(name.as_name_ref())? else {
            return Ok(None);
        };
        Ok(self.kid_by_sym(p, sym).map(|k| ScopeId::new(k, self.tag)))
    }

    /// The kid of the live scope `parent` named `sym`: a walk of its first
    /// [`KID_SCAN`] kids, then, if it has more, one probe of the index.
    #[inline]
    pub(crate) fn kid_by_sym(&self, parent: ScopeKey, sym: u32) -> Option<ScopeKey> {
        let mut k = self.scopes.get(parent)?.first_kid;
        for _ in 0..KID_SCAN {
            // A null key ends the list: no kid has the name.
            let slot = self.scopes.get(k)?;
            if slot.name == sym {
                return Some(k);
            }
            k = slot.next_sib;
        }
        if k.is_null() {
            return None;
        }
        let found = self.named_kids.get(&kid_index_key(parent, sym)).copied();
        debug_assert!(found.is_none_or(|f| self.parent_key(f) == parent));
        found
    }

    /// The name of a scope made with [`new_named_scope`](Self::new_named_scope);
    /// `None` for unnamed scopes and the root. O(1).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let enc = tree.new_named_scope(tree.root(), "encoder")?;
    /// assert_eq!(tree.scope_name(enc)?, Some("encoder"));
    /// assert_eq!(tree.scope_name(tree.root())?, None);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn scope_name(&self, scope: ScopeId) -> Result<Option<&str>, Error> {
        let slot = self.scope_slot(scope)?;
        Ok((slot.name != NO_NAME).then(|| self.names.text(slot.name)))
    }

    fn insert_scope(&mut self, parent: ScopeKey, name: u32) -> ScopeId {
        if name != NO_NAME {
            self.names.acquire(name);
        }
        let (depth, prev) = match self.scopes.get(parent) {
            Some(p) => (p.depth.saturating_add(1).min(RETIRED - 1), p.last_kid),
            None => (0, ScopeKey::null()),
        };
        let mut slot = ScopeSlot::new(name, depth);
        slot.prev_sib = prev;
        let key = self.scopes.insert(slot);
        self.set_hot(key, parent);
        if name != NO_NAME {
            self.named_kids.insert(kid_index_key(parent, name), key);
        }
        if let Some(prev_slot) = self.scopes.get_mut(prev) {
            prev_slot.next_sib = key;
        }
        if let Some(p) = self.scopes.get_mut(parent) {
            if p.first_kid.is_null() {
                p.first_kid = key;
            }
            p.last_kid = key;
        }
        ScopeId::new(key, self.tag)
    }

    /// Records the parent of a new scope slot and clears its signature.
    fn set_hot(&mut self, key: ScopeKey, parent: ScopeKey) {
        let i = slot_index(key);
        if self.up.len() <= i {
            self.up.resize(i + 1, ScopeKey::null());
            self.sigs.resize(i + 1, 0);
        }
        self.up[i] = parent;
        self.sigs[i] = 0;
    }

    /// The parent key of a live scope (or of one just freed); null for the root.
    #[inline]
    pub(crate) fn parent_key(&self, key: ScopeKey) -> ScopeKey {
        self.up.get(slot_index(key)).copied().unwrap_or_default()
    }

    /// Sets the name signature of a live scope from its table.
    pub(crate) fn refresh_sig(&mut self, key: ScopeKey) {
        let sig = self.scopes.get(key).map_or(0, |s| s.vars.signature());
        if let Some(s) = self.sigs.get_mut(slot_index(key)) {
            *s = sig;
        }
    }

    /// The parent of `scope`; `None` for the root. O(1).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let s = tree.new_scope(tree.root())?;
    /// assert_eq!(tree.parent(s)?, Some(tree.root()));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn parent(&self, scope: ScopeId) -> Result<Option<ScopeId>, Error> {
        let parent = self.parent_key(self.check_scope(scope)?);
        Ok((!parent.is_null()).then(|| ScopeId::new(parent, self.tag)))
    }

    /// The depth of `scope`: 0 for the root, 1 for its kids, and so on. O(1).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let s = tree.new_scope(tree.root())?;
    /// assert_eq!(tree.depth(s)?, 1);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn depth(&self, scope: ScopeId) -> Result<usize, Error> {
        Ok(self.scope_slot(scope)?.depth as usize)
    }

    /// Whether `kid` is a direct kid of `parent`. O(1).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for either handle.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let b = tree.new_scope(a)?;
    /// assert!(tree.has_kid(a, b)?);
    /// assert!(!tree.has_kid(tree.root(), b)?);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn has_kid(&self, parent: ScopeId, kid: ScopeId) -> Result<bool, Error> {
        let p = self.check_scope(parent)?;
        Ok(self.parent_key(self.check_scope(kid)?) == p)
    }

    /// Number of direct kids of `scope`. O(number of kids).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// tree.new_scope(tree.root())?;
    /// tree.new_scope(tree.root())?;
    /// assert_eq!(tree.kid_count(tree.root())?, 2);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn kid_count(&self, scope: ScopeId) -> Result<usize, Error> {
        Ok(self.kids(scope)?.count())
    }

    /// The path of `scope` from the root: kid names joined by `/`, with an
    /// unnamed scope shown by its slot as `#3v1`; `""` for the root.
    /// O(depth).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let enc = tree.new_named_scope(tree.root(), "encoder")?;
    /// let l1 = tree.new_named_scope(enc, "layer_1")?;
    /// assert_eq!(tree.path(l1)?, "encoder/layer_1");
    /// assert_eq!(tree.path(tree.root())?, "");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn path(&self, scope: ScopeId) -> Result<String, Error> {
        let k = self.check_scope(scope)?;
        Ok(self.path_of(k))
    }

    /// The path of a live scope key (see [`path`](Self::path)).
    pub(crate) fn path_of(&self, key: ScopeKey) -> String {
        path_in(&self.scopes, &self.up, &self.names, key)
    }

    /// The path of `key` as an error keeps it: cut in the middle when long
    /// (see `short::path`), so that an error stays small however deep the
    /// scope. O(depth).
    pub(crate) fn error_path(&self, key: ScopeKey) -> String {
        crate::short::path(&self.path_of(key))
    }

    /// Appends one path component: the scope's name or `#idx v version`.
    pub(crate) fn push_component(&self, out: &mut String, key: ScopeKey) {
        push_component_in(&self.scopes, &self.names, out, key);
    }

    // ----- deletion ---------------------------------------------------------------

    /// Deletes `scope`, all its descendants and all their variables. Every
    /// handle into the deleted subtree reports stale from now on.
    ///
    /// O(size of the subtree), iterative (no recursion, no allocation), and
    /// independent of how many siblings `scope` has.
    ///
    /// # Errors
    /// [`Error::RootScope`] for the root; [`Error::StaleScope`] or
    /// [`Error::ForeignScope`].
    ///
    /// # Panics
    /// Only if a value's own `Drop` panics. That panic is passed on once the
    /// whole subtree is deleted, so the tree stays consistent and usable.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let b = tree.new_scope(a)?;
    /// let v = tree.var(b, "v")?;
    /// tree.delete_scope(a)?;
    /// assert!(!tree.contains_scope(b));
    /// assert!(!tree.contains_var(v));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn delete_scope(&mut self, scope: ScopeId) -> Result<(), Error> {
        let k = self.check_scope(scope)?;
        if k == self.root {
            return Err(Error::RootScope);
        }
        self.unlink(k);
        let mut deferred = None;
        self.free_subtree(k, &mut deferred);
        resume(deferred);
        Ok(())
    }

    /// Deletes `kid`, which must be a direct kid of `parent` (Paddle's
    /// `Scope::DeleteScope`). Same cost as [`delete_scope`](Self::delete_scope).
    ///
    /// # Errors
    /// [`Error::NotAKid`] if `kid` is not a kid of `parent`;
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for either handle.
    ///
    /// # Panics
    /// Only if a value's own `Drop` panics, as for [`delete_scope`](Self::delete_scope).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let b = tree.new_scope(a)?;
    /// assert!(tree.delete_kid(tree.root(), b).is_err());
    /// tree.delete_kid(a, b)?;
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn delete_kid(&mut self, parent: ScopeId, kid: ScopeId) -> Result<(), Error> {
        if !self.has_kid(parent, kid)? {
            return Err(Error::NotAKid {
                kid: self.error_path(kid.key),
                scope: self.error_path(parent.key),
            });
        }
        self.delete_scope(kid)
    }

    /// Deletes every kid of `scope` (and their subtrees), keeping `scope` and
    /// its own variables (Paddle's `DropKids`). O(size of the deleted subtrees).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// # Panics
    /// Only if a value's own `Drop` panics, as for [`delete_scope`](Self::delete_scope).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// tree.new_scope(root)?;
    /// tree.new_scope(root)?;
    /// tree.drop_kids(root)?;
    /// assert_eq!(tree.scope_count(), 1);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn drop_kids(&mut self, scope: ScopeId) -> Result<(), Error> {
        let k = self.check_scope(scope)?;
        let first = match self.scopes.get_mut(k) {
            Some(slot) => {
                slot.last_kid = ScopeKey::null();
                mem::replace(&mut slot.first_kid, ScopeKey::null())
            }
            None => ScopeKey::null(),
        };
        let mut kid = first;
        let mut deferred = None;
        while !kid.is_null() {
            let next = self
                .scopes
                .get(kid)
                .map_or(ScopeKey::null(), |s| s.next_sib);
            self.free_subtree(kid, &mut deferred);
            kid = next;
        }
        resume(deferred);
        Ok(())
    }

    /// Detaches `key` from its parent's kid list. O(1).
    fn unlink(&mut self, key: ScopeKey) {
        let Some(slot) = self.scopes.get(key) else {
            return;
        };
        let (parent, prev, next) = (self.parent_key(key), slot.prev_sib, slot.next_sib);
        if let Some(p) = self.scopes.get_mut(prev) {
            p.next_sib = next;
        }
        if let Some(n) = self.scopes.get_mut(next) {
            n.prev_sib = prev;
        }
        if let Some(p) = self.scopes.get_mut(parent) {
            if p.first_kid == key {
                p.first_kid = next;
            }
            if p.last_kid == key {
                p.last_kid = prev;
            }
        }
    }

    /// Frees the subtree rooted at `top`, which is already unlinked from its
    /// parent. Post-order without a stack: descend to the leftmost leaf, free
    /// it, make its next sibling its parent's first kid, climb, repeat. Each
    /// edge is walked down once and up once.
    fn free_subtree(&mut self, top: ScopeKey, deferred: &mut DeferredPanic) {
        let mut node = top;
        loop {
            while let Some(first) = self
                .scopes
                .get(node)
                .map(|s| s.first_kid)
                .filter(|k| !k.is_null())
            {
                node = first;
            }
            let Some(slot) = self.free_scope(node, deferred) else {
                return;
            };
            if node == top {
                return;
            }
            // The freed slot's `up` entry is only overwritten when the slot
            // is reused, which cannot happen before the next insert.
            let parent = self.parent_key(node);
            if let Some(p) = self.scopes.get_mut(parent) {
                p.first_kid = slot.next_sib;
            }
            node = parent;
        }
    }

    /// Removes one scope slot and its variables, returning the slot.
    ///
    /// A slot whose version is `u32::MAX` would wrap to a version that stale
    /// handles already carry if it were freed and reused, so it is retired:
    /// it stays occupied by an empty tombstone and is never handed out again.
    fn free_scope(&mut self, key: ScopeKey, deferred: &mut DeferredPanic) -> Option<ScopeSlot> {
        let mut slot = if key_version(key.data()) == u32::MAX {
            let live = self.scopes.get_mut(key)?;
            let mut tomb = ScopeSlot::new(NO_NAME, RETIRED);
            mem::swap(live, &mut tomb);
            self.retired_scopes += 1;
            tomb
        } else {
            self.scopes.remove(key)?
        };
        if slot.name != NO_NAME {
            // The freed slot's `up` entry still holds its parent (see
            // `free_subtree`).
            let index_key = kid_index_key(self.parent_key(key), slot.name);
            if self.named_kids.get(&index_key) == Some(&key) {
                self.named_kids.remove(&index_key);
            }
            self.names.release(slot.name);
        }
        let table = slot.vars.take_entries();
        self.free_vars(&table, |e| e.map(|e| e.var).unwrap_or_default(), deferred);
        self.recycle_table(table);
        Some(slot)
    }

    /// Keeps a spilled table buffer for the next scope that outgrows its
    /// inline space.
    fn recycle_table(&mut self, table: SmallVec<[Option<Entry>; INLINE_VARS]>) {
        if table.spilled()
            && table.capacity() <= SPARE_TABLE_MAX_CAP
            && self.spare_tables.len() < SPARE_TABLES
        {
            let mut buf = table.into_vec();
            buf.clear();
            self.spare_tables.push(buf);
        }
    }

    /// Frees the variable slots of `items` and drops their values.
    ///
    /// A value's `Drop` is user code and may panic. Each slot is out of the
    /// arena before its value is dropped, so the tree is consistent at that
    /// point; a panic is caught, the remaining slots are freed all the same,
    /// and the first panic is kept in `deferred` for the public call to pass
    /// on when its own bookkeeping is done. No cost beyond one
    /// `catch_unwind` per call when nothing panics.
    pub(crate) fn free_vars<T>(
        &mut self,
        items: &[T],
        key: impl Fn(&T) -> VarKey,
        deferred: &mut DeferredPanic,
    ) {
        let mut next = 0;
        while next < items.len() {
            let caught = panic::catch_unwind(AssertUnwindSafe(|| {
                while let Some(item) = items.get(next) {
                    next += 1;
                    drop(self.free_var(key(item)));
                }
            }));
            if let Err(payload) = caught {
                deferred.get_or_insert(payload);
            }
        }
    }

    /// Removes one variable slot (retiring it at the last version, as
    /// [`free_scope`](Self::free_scope) does) and returns its value. Bumps the
    /// variable epoch of its name (see [`Resolver`](crate::Resolver)).
    pub(crate) fn free_var(&mut self, key: VarKey) -> Option<Box<dyn Payload>> {
        let live = self.vars.get_mut(key)?;
        if live.is_retired() {
            return None;
        }
        self.names.bump(live.name);
        self.names.release(live.name);
        if key_version(key.data()) == u32::MAX {
            let value = live.value.take();
            live.owner = ScopeKey::null();
            live.name = NO_NAME;
            self.retired_vars += 1;
            value
        } else {
            self.vars.remove(key)?.value
        }
    }

    /// Creates a variable in `scope` (which must be live and must not hold
    /// `sym`) and bumps the variable epoch of `sym`. O(1) amortised.
    pub(crate) fn insert_var(&mut self, scope: ScopeKey, sym: u32) -> VarId {
        let key = self.vars.insert(VarSlot {
            value: None,
            owner: scope,
            name: sym,
        });
        self.names.bump(sym);
        self.names.acquire(sym);
        if let Some(slot) = self.scopes.get_mut(scope) {
            slot.vars
                .push(Entry { sym, var: key }, &mut self.spare_tables);
            if let Some(sig) = self.sigs.get_mut(slot_index(scope)) {
                *sig |= sig_bit(sym);
            }
        }
        VarId::new(key, self.tag)
    }

    /// The scope key of a live variable.
    pub(crate) fn owner_key(&self, var: VarId) -> Result<ScopeKey, Error> {
        Ok(self.var_slot(var)?.owner)
    }

    /// Heap bytes used by the tree's own tables, value payloads excluded:
    /// both arenas at their capacity, spilled variable tables and indexes, and
    /// the interner. O(number of scopes).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let before = tree.heap_bytes();
    /// for i in 0..100 {
    ///     tree.var(tree.root(), format!("v{i}"))?;
    /// }
    /// assert!(tree.heap_bytes() > before);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn heap_bytes(&self) -> usize {
        let arenas = (self.scopes.capacity() + 1) * arena_slot_bytes::<ScopeSlot>()
            + self.up.capacity() * mem::size_of::<ScopeKey>()
            + self.sigs.capacity() * mem::size_of::<u64>()
            + hash_table_bytes::<u64, ScopeKey>(self.named_kids.capacity())
            + (self.vars.capacity() + 1) * var_slot_bytes();
        let tables: usize = self.scopes.values().map(|s| s.vars.heap_bytes()).sum();
        let spares: usize = self
            .spare_tables
            .iter()
            .map(|b| b.capacity() * mem::size_of::<Option<Entry>>())
            .sum();
        arenas + tables + spares + self.names.heap_bytes()
    }
}

/// Bytes of one scope in the arena: its slot (with slotmap's version) and its
/// entries in the parent and signature arrays that lookups walk.
///
/// ```
/// assert!(scopetree::scope_slot_bytes() <= 128);
/// ```
pub fn scope_slot_bytes() -> usize {
    arena_slot_bytes::<ScopeSlot>() + mem::size_of::<ScopeKey>() + mem::size_of::<u64>()
}

/// The slot index of a key: its low 32 bits (slotmap's `KeyData` layout).
#[inline]
pub(crate) fn slot_index(key: ScopeKey) -> usize {
    key_index(key.data()) as usize
}

/// Bytes of one variable slot in the arena (the slot plus slotmap's version),
/// value payload excluded.
///
/// ```
/// assert!(scopetree::var_slot_bytes() <= 64);
/// ```
pub fn var_slot_bytes() -> usize {
    arena_slot_bytes::<VarSlot>()
}

/// Approximate heap bytes of a `HashMap<K, V>` of capacity `cap` (hashbrown:
/// one entry and one control byte per bucket).
fn hash_table_bytes<K, V>(cap: usize) -> usize {
    cap * (mem::size_of::<(K, V)>() + 1)
}

/// Size of a slotmap slot holding a `T`: the value and a `u32` version,
/// rounded up to the alignment.
fn arena_slot_bytes<T>() -> usize {
    (mem::size_of::<T>() + mem::size_of::<u32>()).next_multiple_of(mem::align_of::<T>().max(4))
}

/// The path of a live scope key, from the arena's parts alone (the worker
/// split holds only those; see [`ScopeTree::path`]). O(depth).
pub(crate) fn path_in(
    scopes: &SlotMap<ScopeKey, ScopeSlot>,
    up: &[ScopeKey],
    names: &Interner,
    key: ScopeKey,
) -> String {
    let mut parts: Vec<ScopeKey> = Vec::new();
    let mut k = key;
    while scopes.contains_key(k) {
        let parent = up.get(slot_index(k)).copied().unwrap_or_default();
        if parent.is_null() {
            break;
        }
        parts.push(k);
        k = parent;
    }
    let mut out = String::new();
    for (i, k) in parts.iter().rev().enumerate() {
        if i > 0 {
            out.push('/');
        }
        push_component_in(scopes, names, &mut out, *k);
    }
    out
}

/// Appends one path component: the scope's name or `#idx v version`.
fn push_component_in(
    scopes: &SlotMap<ScopeKey, ScopeSlot>,
    names: &Interner,
    out: &mut String,
    key: ScopeKey,
) {
    use fmt::Write;
    match scopes.get(key) {
        Some(slot) if slot.name != NO_NAME => out.push_str(names.text(slot.name)),
        _ => {
            let _ = write!(out, "#{}", SlotLabel(key.data()));
        }
    }
}
