//! Link surgery: the only code that creates, links, unlinks, renames and
//! frees scopes and variables, keeping the invariants listed in `mod.rs`
//! (parent arrays, kid lists, variable tables, signatures, the named-kid
//! index, name use counts and epochs, slot retirement).

use std::any::Any;
use std::mem;
use std::panic::{self, AssertUnwindSafe};

use slotmap::Key;
use smallvec::SmallVec;

use super::interner::Sym;
use super::keys::{at_last_version, slot_index};
use super::slots::{Entry, INLINE_VARS, ScopeName, ScopeSlot, ScopeState, VarSlot, sig_bit};
use super::{Arena, KID_SCAN, ScopeKey, VarKey, kid_index_key};

/// A scope's signature is recomputed after a removal or rename only while
/// its table holds at most this many variables (see `Arena::refresh_sig`).
const SIG_RECOMPUTE_MAX: usize = 64;

/// At most this many spilled variable tables are kept for reuse...
const SPARE_TABLES: usize = 256;
/// ...and only those whose capacity is at most this.
const SPARE_TABLE_MAX_CAP: usize = 64;

/// The first panic raised by a value's `Drop` while the arena was dropping
/// values, held until the arena's bookkeeping is complete (see
/// [`Arena::free_vars`]).
pub(crate) type DeferredPanic = Option<Box<dyn Any + Send>>;

/// Passes on the panic a value's `Drop` raised during a call, if any.
pub(crate) fn resume(deferred: DeferredPanic) {
    if let Some(payload) = deferred {
        panic::resume_unwind(payload);
    }
}

impl Arena {
    /// Creates a kid of the live scope `parent`, after its existing kids.
    /// The caller checked that no kid of `parent` has the name. O(1).
    pub(crate) fn insert_scope(&mut self, parent: ScopeKey, name: Option<Sym>) -> ScopeKey {
        let Some(p) = self.scope(parent) else {
            return ScopeKey::null();
        };
        let depth = p.depth().unwrap_or(0).saturating_add(1);
        let prev = p.last_kid;
        let mut slot = ScopeSlot::new(ScopeName::new(name), ScopeState::live(depth));
        slot.prev_sib = prev;
        let key = self.scopes.insert(slot);
        self.set_hot(key, parent);
        if let Some(sym) = name {
            self.names.acquire(sym);
        }
        if let Some(prev_slot) = self.scopes.get_mut(prev) {
            prev_slot.next_sib = key;
        }
        let Some(p) = self.scopes.get_mut(parent) else {
            return key;
        };
        if p.first_kid.is_null() {
            p.first_kid = key;
        }
        p.last_kid = key;
        // Only a named kid can turn its parent wide: when it lands past the
        // parent's first `KID_SCAN` kids (a first kid cannot: no walk).
        if let Some(sym) = name {
            if p.is_wide() {
                self.named_kids.insert(kid_index_key(parent, sym), key);
            } else if !prev.is_null() && self.kids(parent).nth(KID_SCAN).is_some() {
                if let Some(p) = self.scopes.get_mut(parent) {
                    p.state = p.state.with_wide(true);
                }
                self.index_kids(parent);
            }
        }
        key
    }

    /// Puts every named kid of `parent`, which has just turned wide, into
    /// the named-kid index. O(kids), once per turn: each kid is walked
    /// here at most once before its parent's kids are dropped.
    fn index_kids(&mut self, parent: ScopeKey) {
        let named: Vec<(Sym, ScopeKey)> = self
            .kids(parent)
            .filter_map(|k| Some((self.scopes.get(k)?.name()?, k)))
            .collect();
        for (sym, k) in named {
            self.named_kids.insert(kid_index_key(parent, sym), k);
        }
    }

    /// Records the parent of a new scope slot and clears its signature.
    pub(super) fn set_hot(&mut self, key: ScopeKey, parent: ScopeKey) {
        let i = slot_index(key);
        if self.up.len() <= i {
            self.up.resize(i + 1, ScopeKey::null());
            self.sigs.resize(i + 1, 0);
        }
        self.up[i] = parent;
        self.sigs[i] = 0;
    }

    /// Unlinks the live scope `key` (not the root) from its parent and frees
    /// it with its subtree. O(subtree), no allocation, no recursion.
    pub(crate) fn delete_subtree(&mut self, key: ScopeKey) -> DeferredPanic {
        let mut deferred = None;
        if key == self.root || self.scope(key).is_none() {
            return deferred;
        }
        self.unlink(key);
        self.free_subtree(key, &mut deferred);
        deferred
    }

    /// Frees every kid subtree of the live scope `key`. O(subtrees).
    pub(crate) fn drop_kids(&mut self, key: ScopeKey) -> DeferredPanic {
        let mut deferred = None;
        let first = match self.scopes.get_mut(key) {
            Some(slot) if !slot.is_retired() => {
                // Each kid's index entry goes when it is freed.
                slot.state = slot.state.with_wide(false);
                slot.last_kid = ScopeKey::null();
                mem::replace(&mut slot.first_kid, ScopeKey::null())
            }
            _ => ScopeKey::null(),
        };
        let mut kid = first;
        while !kid.is_null() {
            let next = self
                .scopes
                .get(kid)
                .map_or(ScopeKey::null(), |s| s.next_sib);
            self.free_subtree(kid, &mut deferred);
            kid = next;
        }
        deferred
    }

    fn unlink(&mut self, key: ScopeKey) {
        let Some(slot) = self.scopes.get(key) else {
            return;
        };
        let (parent, prev, next) = (self.up[slot_index(key)], slot.prev_sib, slot.next_sib);
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

    /// Frees `top` and everything below it, post-order, without a stack:
    /// descend to a leaf, free it, continue with its next sibling (the
    /// parent's new first kid) or climb. `top` must already be unlinked.
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
            let parent = self.up[slot_index(node)];
            if let Some(p) = self.scopes.get_mut(parent) {
                p.first_kid = slot.next_sib;
            }
            node = parent;
        }
    }

    /// Frees one scope slot (retiring it at its last version) and its
    /// variables; returns the old slot for its sibling link.
    fn free_scope(&mut self, key: ScopeKey, deferred: &mut DeferredPanic) -> Option<ScopeSlot> {
        let mut slot = if at_last_version(key) {
            let live = self.scopes.get_mut(key)?;
            let mut tomb = ScopeSlot::new(ScopeName::NONE, ScopeState::RETIRED);
            mem::swap(live, &mut tomb);
            self.retired_scopes += 1;
            tomb
        } else {
            self.scopes.remove(key)?
        };
        if let Some(sym) = slot.name() {
            // The freed slot's `up` entry still holds its parent (see
            // `free_subtree`).
            let index_key = kid_index_key(self.up[slot_index(key)], sym);
            if self.named_kids.get(&index_key) == Some(&key) {
                self.named_kids.remove(&index_key);
            }
            self.names.release(sym);
        }
        let table = slot.vars.take_entries();
        // A hole's key is null: `free_var` skips it.
        self.free_vars(&table, |e| e.var, deferred);
        self.recycle_table(table);
        Some(slot)
    }

    fn recycle_table(&mut self, table: SmallVec<[Entry; INLINE_VARS]>) {
        if table.spilled()
            && table.capacity() <= SPARE_TABLE_MAX_CAP
            && self.spare_tables.len() < SPARE_TABLES
        {
            let mut buf = table.into_vec();
            buf.clear();
            self.spare_tables.push(buf);
        }
    }

    /// Frees the variable slots of `items` (already unlinked from their
    /// tables) and drops their values. A value whose `Drop` panics does not
    /// stop the others: the first panic is kept in `deferred`, to be resumed
    /// by the caller once every slot is freed.
    fn free_vars<T>(
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

    /// Frees one variable slot (retiring it at its last version) and returns
    /// its value, for the caller to drop.
    fn free_var(&mut self, key: VarKey) -> Option<Box<dyn super::Payload>> {
        let live = self.vars.get_mut(key)?;
        if live.is_retired() {
            return None;
        }
        self.names.release_var(live.name);
        if at_last_version(key) {
            let value = live.value.take();
            live.owner = None;
            self.retired_vars += 1;
            value
        } else {
            self.vars.remove(key)?.value
        }
    }

    /// Creates a variable named `sym` in the live scope `scope`. The caller
    /// checked that the scope has no variable of that name. O(1) amortised.
    #[inline]
    pub(crate) fn insert_var(&mut self, scope: ScopeKey, sym: Sym) -> VarKey {
        // One probe of the scope: its slot stays borrowed while the other
        // fields (variables, names, signatures, spare tables) are written.
        let Some(slot) = self.scopes.get_mut(scope).filter(|s| !s.is_retired()) else {
            return VarKey::null();
        };
        let key = self.vars.insert(VarSlot {
            value: None,
            owner: Some(scope),
            name: sym,
        });
        slot.vars
            .push(Entry { sym, var: key }, &mut self.spare_tables);
        self.names.acquire_var(sym);
        if let Some(sig) = self.sigs.get_mut(slot_index(scope)) {
            *sig |= sig_bit(sym);
        }
        key
    }

    /// Removes the variables named `syms` from the live scope `scope` (or,
    /// with `keep`, every variable but them) and frees them; returns how many
    /// were removed and the first panic a value's `Drop` raised. O(names)
    /// without `keep`, O(local variables + names) with it.
    pub(crate) fn remove_vars(
        &mut self,
        scope: ScopeKey,
        syms: &[Sym],
        keep: bool,
    ) -> (usize, DeferredPanic) {
        let removed: Vec<Entry> = match self.scopes.get_mut(scope) {
            Some(slot) if slot.is_retired() => Vec::new(),
            None => Vec::new(),
            Some(slot) if keep => {
                let kept: rustc_hash::FxHashSet<Sym> = syms.iter().copied().collect();
                slot.vars.remove_where(|sym| !kept.contains(&sym))
            }
            Some(slot) => syms
                .iter()
                .filter_map(|&sym| slot.vars.remove(sym))
                .collect(),
        };
        self.refresh_sig(scope);
        let mut deferred = None;
        self.free_vars(&removed, |e| e.var, &mut deferred);
        (removed.len(), deferred)
    }

    /// Renames the variable at position `pos` of the live scope `scope` to
    /// `sym`. `Err(())` if another variable of the scope has that name;
    /// renaming to its own name is a no-op. O(1).
    pub(crate) fn rename_var(
        &mut self,
        scope: ScopeKey,
        pos: usize,
        sym: Sym,
    ) -> Result<VarKey, ()> {
        let Some(slot) = self.scopes.get_mut(scope).filter(|s| !s.is_retired()) else {
            return Err(());
        };
        let Some(Entry { sym: old, var }) = slot.vars.entry(pos) else {
            return Err(());
        };
        match slot.vars.find(sym) {
            Some(existing) if existing == var => return Ok(var),
            Some(_) => return Err(()),
            None => {}
        }
        slot.vars.rename_at(pos, sym);
        if let Some(sig) = self.sigs.get_mut(slot_index(scope)) {
            *sig |= sig_bit(sym);
        }
        self.names.bump(old);
        self.names.acquire_var(sym);
        self.names.release(old);
        self.refresh_sig(scope);
        if let Some(v) = self.vars.get_mut(var) {
            v.name = sym;
        }
        Ok(var)
    }

    /// Brings the name signature of a live scope up to date after names
    /// left its table: recomputed from a table of at most
    /// [`SIG_RECOMPUTE_MAX`] entries, else left as it is. The signature only
    /// has to be a superset of the table's bits (a stale bit costs one table
    /// probe in a lookup), and a table that wide sets nearly all 64 bits
    /// anyway; recomputing it would make each removal O(k). O(1).
    fn refresh_sig(&mut self, key: ScopeKey) {
        let Some(slot) = self.scopes.get(key) else {
            return;
        };
        if slot.vars.len() > SIG_RECOMPUTE_MAX {
            return;
        }
        let sig = slot.vars.signature();
        if let Some(s) = self.sigs.get_mut(slot_index(key)) {
            *s = sig;
        }
    }
}
