//! The arena: one module that owns every invariant of the tree.
//!
//! [`Arena`] holds all scopes and variables in two generational slot maps,
//! the name table, and the dense side arrays that lookups walk. Its fields are
//! private to this module; the public [`ScopeTree`](crate::ScopeTree) and the
//! layers above it (steps, workers, the resolver, sharing, checkpoints) call
//! the crate-internal methods below and never write a field themselves.
//!
//! | file | role |
//! |---|---|
//! | `keys.rs` | keys, handles ([`ScopeId`], [`VarId`], [`Symbol`], [`TreeTag`]) and how a key is read |
//! | `slots.rs` | what a slot holds: scope slots with their variable tables, variable slots with their values |
//! | `interner.rs` | the name table: interning, use counts, idle sweeps, per-name epochs |
//! | `links.rs` | the only code that links and unlinks scopes and variables, and frees them |
//! | `walk.rs` | the only walks: parents, kids, pre-order, the lookup walk, paths |
//!
//! Invariants (each kept by `links.rs`, checked by the model tests):
//! 1. Every live scope but the root has a live parent; `up[slot(s)]` is that
//!    parent and never changes while `s` lives. The kid list of a scope links
//!    exactly its live kids, in creation order.
//! 2. Every live variable belongs to exactly one live scope, whose table has
//!    exactly one entry for it, under the variable's name; `sigs[slot(s)]`
//!    has the bit of every name in `s`'s table (and maybe more).
//! 3. A scope is *narrow* or *wide* (a flag in its state). None of the
//!    named kids of a narrow scope is in `named_kids`, and each of them is
//!    among its first `KID_SCAN` kids. A scope turns wide when a named kid
//!    would be made past its first `KID_SCAN` kids, and narrow again when
//!    its kids are dropped; `named_kids` has one entry per live named kid of
//!    a wide scope, under the scope's slot index and the kid's name.
//! 4. A name's use count is the number of live scopes and variables that
//!    carry it; its epoch changes whenever a variable of that name is
//!    created, freed or renamed.
//! 5. A slot whose version reached `u32::MAX` is retired, never freed, so a
//!    stale key cannot alias after slotmap's versions wrap.

mod interner;
mod keys;
mod links;
mod slots;
mod walk;

use std::mem;

use rustc_hash::FxHashMap;
use slotmap::{Key, SlotMap};

pub(crate) use interner::{Interner, Sym};
pub use keys::{ScopeId, Symbol, TreeTag, VarId};
pub(crate) use keys::{ScopeKey, SlotLabel, VarKey};
pub(crate) use links::resume;
pub(crate) use slots::{Entry, INLINE_VARS, Payload, ScopeSlot, TextFind, VarSlot};
pub(crate) use walk::{KeyWalk, Structure};

use keys::slot_index;
use slots::{KID_SCAN, ScopeName, ScopeState, hash_table_bytes};

/// All scopes and variables of one tree; see the module docs.
pub(crate) struct Arena {
    scopes: SlotMap<ScopeKey, ScopeSlot>,
    vars: SlotMap<VarKey, VarSlot>,
    names: Interner,
    root: ScopeKey,
    tag: TreeTag,
    retired_scopes: usize,
    retired_vars: usize,
    /// Spilled variable tables kept for reuse, so that step churn does not
    /// allocate.
    spare_tables: Vec<Vec<Entry>>,
    /// The parent of each scope slot, by slot index (null for the root).
    up: Vec<ScopeKey>,
    /// The name signature of each scope slot, by slot index: bit `sym % 64`
    /// is set for every local name, so a lookup skips a level whose
    /// signature lacks the bit without touching its slot.
    sigs: Vec<u64>,
    /// Every live named kid of a wide scope, by its parent's slot index and
    /// its name (see [`kid_index_key`] and invariant 3).
    named_kids: FxHashMap<u64, ScopeKey>,
}

/// The key of a named kid in `named_kids`: its parent's slot index and its
/// name. The parent's version is not needed: a slot holds at most one live
/// scope, and when a scope is freed its kids are freed with it, taking their
/// entries along, so every entry under a slot index belongs to the scope
/// living there now.
#[inline]
fn kid_index_key(parent: ScopeKey, sym: Sym) -> u64 {
    ((slot_index(parent) as u64) << 32) | u64::from(sym)
}

/// Size of a slotmap slot holding a `T`: the value and a `u32` version,
/// rounded up to the alignment.
fn arena_slot_bytes<T>() -> usize {
    (mem::size_of::<T>() + mem::size_of::<u32>()).next_multiple_of(mem::align_of::<T>().max(4))
}

/// Bytes of one scope in the arena: its slot (with slotmap's version) and
/// its entries in the parent and signature arrays.
pub(crate) fn scope_slot_bytes() -> usize {
    arena_slot_bytes::<ScopeSlot>() + mem::size_of::<ScopeKey>() + mem::size_of::<u64>()
}

/// Bytes of one variable slot in the arena, value payload excluded.
pub(crate) fn var_slot_bytes() -> usize {
    arena_slot_bytes::<VarSlot>()
}

impl Arena {
    /// An arena holding only a root scope, with room for the given numbers
    /// of scopes and variables (clamped to what an arena can index).
    pub(crate) fn with_capacity(scopes: usize, vars: usize) -> Self {
        const MAX_SLOTS: usize = (u32::MAX - 1) as usize;
        let (scopes, vars) = (scopes.clamp(1, MAX_SLOTS), vars.min(MAX_SLOTS));
        let mut scope_map = SlotMap::with_capacity_and_key(scopes);
        let root = scope_map.insert(ScopeSlot::new(ScopeName::NONE, ScopeState::live(0)));
        let hot = scope_map.capacity() + 1;
        let mut arena = Arena {
            scopes: scope_map,
            vars: SlotMap::with_capacity_and_key(vars),
            names: Interner::default(),
            root,
            tag: TreeTag::fresh(),
            retired_scopes: 0,
            retired_vars: 0,
            spare_tables: Vec::new(),
            up: Vec::with_capacity(hot),
            sigs: Vec::with_capacity(hot),
            named_kids: FxHashMap::default(),
        };
        arena.set_hot(root, ScopeKey::null());
        arena
    }

    /// The tag every handle of this arena carries.
    #[inline]
    pub(crate) fn tag(&self) -> TreeTag {
        self.tag
    }

    /// The root scope's key.
    #[inline]
    pub(crate) fn root(&self) -> ScopeKey {
        self.root
    }

    /// Live scopes, the root included.
    pub(crate) fn scope_count(&self) -> usize {
        self.scopes.len() - self.retired_scopes
    }

    /// Live variables.
    pub(crate) fn var_count(&self) -> usize {
        self.vars.len() - self.retired_vars
    }

    /// The slot of a live scope. O(1).
    #[inline]
    pub(crate) fn scope(&self, key: ScopeKey) -> Option<&ScopeSlot> {
        self.scopes.get(key).filter(|s| !s.is_retired())
    }

    /// The slot of a live variable. O(1).
    #[inline]
    pub(crate) fn var(&self, key: VarKey) -> Option<&VarSlot> {
        self.vars.get(key).filter(|s| !s.is_retired())
    }

    /// The slot of `key` whether live or retired: the value fast path reads
    /// it and treats a retired slot's empty value as a miss. O(1).
    #[inline]
    pub(crate) fn var_slot_any(&self, key: VarKey) -> Option<&VarSlot> {
        self.vars.get(key)
    }

    /// The slot of a live variable, for value writes. O(1).
    #[inline]
    pub(crate) fn var_mut(&mut self, key: VarKey) -> Option<&mut VarSlot> {
        self.vars.get_mut(key).filter(|s| !s.is_retired())
    }

    /// The slots of `N` distinct live variables at once; `None` if any is
    /// dead or two keys are equal. O(N²) for the distinctness check.
    pub(crate) fn vars_disjoint_mut<const N: usize>(
        &mut self,
        keys: [VarKey; N],
    ) -> Option<[&mut VarSlot; N]> {
        let slots = self.vars.get_disjoint_mut(keys)?;
        slots.iter().all(|s| !s.is_retired()).then_some(slots)
    }

    /// The parent of a live scope; `None` for the root or a dead key. O(1).
    #[inline]
    pub(crate) fn parent(&self, key: ScopeKey) -> Option<ScopeKey> {
        self.scope(key)?;
        let p = self.up.get(slot_index(key)).copied()?;
        (!p.is_null()).then_some(p)
    }

    /// The kid of the live scope `parent` named `sym`: a walk of its first
    /// `KID_SCAN` kids while it is narrow, one probe of the named-kid index
    /// once it is wide (invariant 3). O(1).
    #[inline]
    pub(crate) fn kid_by_sym(&self, parent: ScopeKey, sym: Sym) -> Option<ScopeKey> {
        let p = self.scope(parent)?;
        if p.is_wide() {
            return self.named_kids.get(&kid_index_key(parent, sym)).copied();
        }
        // A narrow scope's named kids are among its first `KID_SCAN`.
        self.kids(parent)
            .take(KID_SCAN)
            .find(|&k| self.scopes.get(k).and_then(ScopeSlot::name) == Some(sym))
    }

    // ----- names ----------------------------------------------------------

    /// The name table (read-only: interning and counting go through the
    /// methods below, which keep the use counts right).
    #[inline]
    pub(crate) fn names(&self) -> &Interner {
        &self.names
    }

    /// Interns a (validated) name. The caller records the use by creating a
    /// scope or variable with it, or pins it. (A create that fails after
    /// interning fails on a name already in use, so nothing is left over.)
    pub(crate) fn intern(&mut self, name: &str) -> Sym {
        self.names.intern(name)
    }

    /// Keeps `sym` for the arena's lifetime.
    pub(crate) fn pin(&mut self, sym: Sym) {
        self.names.pin(sym);
    }

    // ----- memory -----------------------------------------------------------

    /// Heap bytes used by the arena's own tables, value payloads excluded.
    /// O(number of scopes).
    pub(crate) fn heap_bytes(&self) -> usize {
        let arenas = (self.scopes.capacity() + 1) * arena_slot_bytes::<ScopeSlot>()
            + self.up.capacity() * mem::size_of::<ScopeKey>()
            + self.sigs.capacity() * mem::size_of::<u64>()
            + hash_table_bytes::<u64, ScopeKey>(self.named_kids.capacity())
            + (self.vars.capacity() + 1) * var_slot_bytes();
        let tables: usize = self.scopes.values().map(|s| s.vars.heap_bytes()).sum();
        let spares: usize = self
            .spare_tables
            .iter()
            .map(|b| b.capacity() * mem::size_of::<Entry>())
            .sum();
        arenas + tables + spares + self.names.heap_bytes()
    }
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Arena>();
};
