//! What the arena stores: scope slots with their variable tables, and
//! variable slots with their values. Each slot state is a type here, and the
//! arena (`super`) is the only writer of the fields that tie slots together.

use std::any::{Any, type_name};
use std::mem;

use rustc_hash::FxHashMap;
use slotmap::Key;
use smallvec::SmallVec;

use super::interner::Interner;
use super::interner::Sym;
use super::keys::{ScopeKey, VarKey};

/// How many variables a scope holds inline, before its table moves to the heap.
pub(crate) const INLINE_VARS: usize = 4;

/// Past this many local variables a scope also keeps a hash index.
pub(crate) const INDEX_THRESHOLD: usize = 16;

/// The most entries a table may hold for a lookup by text to compare the
/// text with each entry's name instead of hashing it into a symbol first.
pub(crate) const TEXT_SCAN_MAX: usize = 8;

/// What a lookup by text in one scope's table found.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum TextFind {
    /// The variable of that name.
    Found(VarKey),
    /// The scope holds no variable of that name.
    Absent,
    /// The table is too long to scan: look the name up by symbol.
    Unscanned,
}

/// A value a variable can hold: any `Send + Sync + 'static` type. Blanket
/// implemented; it only adds the type's name, for messages and dumps.
pub(crate) trait Payload: Any + Send + Sync {
    fn type_name(&self) -> &'static str;
}

impl<T: Any + Send + Sync> Payload for T {
    fn type_name(&self) -> &'static str {
        type_name::<T>()
    }
}

/// One local variable of a scope: its interned name and its slot.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) sym: Sym,
    pub(crate) var: VarKey,
}

impl Entry {
    /// The place of a removed entry in an indexed table, until the next
    /// compaction. Its symbol is one no name can have (the interner would
    /// need 2^32 names), so a scan for a name never stops at a hole, and
    /// its key is null.
    fn hole() -> Entry {
        Entry {
            sym: Sym::MAX,
            var: VarKey::null(),
        }
    }

    /// Whether this is the place of a removed entry.
    #[inline]
    pub(crate) fn is_hole(&self) -> bool {
        self.sym == Sym::MAX
    }
}

/// The bit a symbol sets in a scope's name signature.
#[inline]
pub(crate) fn sig_bit(sym: Sym) -> u64 {
    1u64 << (sym & 63)
}

/// Whether two names are equal: for names of up to 16 bytes by two
/// overlapping fixed-size compares, without a call to `memcmp`. O(len).
#[inline]
fn same_text(a: &[u8], b: &[u8]) -> bool {
    fn chunk<const N: usize>(s: &[u8], at: usize) -> Option<[u8; N]> {
        s.get(at..at + N)?.try_into().ok()
    }
    fn ends_equal<const N: usize>(a: &[u8], b: &[u8]) -> bool {
        let last = a.len() - N;
        chunk::<N>(a, 0) == chunk::<N>(b, 0) && chunk::<N>(a, last) == chunk::<N>(b, last)
    }
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        1..=3 => a.first() == b.first() && a.get(n / 2) == b.get(n / 2) && a.last() == b.last(),
        4..=7 => ends_equal::<4>(a, b),
        8..=16 => ends_equal::<8>(a, b),
        _ => a == b,
    }
}

/// A scope's local variables, in creation order.
///
/// Up to [`INLINE_VARS`] entries live inline in the scope slot; past
/// [`INDEX_THRESHOLD`] a hash index from symbol to position is kept
/// alongside, so a local lookup is O(1) in a wide scope and a short scan in a
/// small one.
///
/// Removing from an indexed table leaves a hole ([`Entry::hole`]) instead of shifting
/// the entries after it; the holes are squeezed out, in one pass that keeps
/// the order, once they outnumber the live entries. Removal and rename are
/// therefore O(1) amortised at any width, and listings keep creation order.
/// A table without an index never holds a hole: it is short, so a removal
/// shifts at most [`INDEX_THRESHOLD`] entries.
#[derive(Default)]
pub(crate) struct VarTable {
    entries: SmallVec<[Entry; INLINE_VARS]>,
    /// Symbol to position in `entries`, past [`INDEX_THRESHOLD`] entries; it
    /// holds one key per live entry, so its length is the table's.
    index: Option<Box<FxHashMap<Sym, usize>>>,
}

impl VarTable {
    /// The variable named `sym`. O(1).
    #[inline]
    pub(crate) fn find(&self, sym: Sym) -> Option<VarKey> {
        match &self.index {
            Some(ix) => self.entry(*ix.get(&sym)?).map(|e| e.var),
            // A short scan; no hole can match a name.
            None => self.entries.iter().find(|e| e.sym == sym).map(|e| e.var),
        }
    }

    /// The variable named `text`, found by comparing `text` with the name of
    /// each entry, in a table of at most [`TEXT_SCAN_MAX`] entries: no
    /// hashing and no interning, which in such a table cost more than the
    /// scan. [`TextFind::Unscanned`] for a longer table. O(1): at most
    /// [`TEXT_SCAN_MAX`] compares, each O(len) only when the lengths agree.
    #[inline]
    pub(crate) fn find_text(&self, text: &[u8], names: &Interner) -> TextFind {
        if self.index.is_some() || self.entries.len() > TEXT_SCAN_MAX {
            return TextFind::Unscanned;
        }
        // No name is empty, and a table without an index holds no hole.
        if text.is_empty() {
            return TextFind::Absent;
        }
        match self
            .entries
            .iter()
            .find(|e| same_text(names.text(e.sym).as_bytes(), text))
        {
            Some(e) => TextFind::Found(e.var),
            None => TextFind::Absent,
        }
    }

    /// The entry at `pos`, if it is not a hole.
    #[inline]
    pub(crate) fn entry(&self, pos: usize) -> Option<Entry> {
        self.entries.get(pos).filter(|e| !e.is_hole()).copied()
    }

    /// The position of `sym` in the table. O(1).
    #[inline]
    pub(crate) fn position(&self, sym: Sym) -> Option<usize> {
        match &self.index {
            Some(ix) => ix.get(&sym).copied(),
            None => self.entries.iter().position(|e| e.sym == sym),
        }
    }

    /// How many variables the table holds. O(1).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.index
            .as_ref()
            .map_or(self.entries.len(), |ix| ix.len())
    }

    /// The entries and holes in creation order (for iterators that keep
    /// their own count of live entries and skip [holes](Entry::is_hole)).
    pub(crate) fn slots(&self) -> &[Entry] {
        &self.entries
    }

    /// The entries in creation order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = Entry> + Clone + '_ {
        self.entries.iter().filter(|e| !e.is_hole()).copied()
    }

    /// Appends an entry, taking a spare heap buffer when the inline space is
    /// full so that steady-state churn does not allocate.
    #[inline]
    pub(super) fn push(&mut self, e: Entry, spares: &mut Vec<Vec<Entry>>) {
        if !self.entries.spilled() && self.entries.len() == INLINE_VARS {
            if let Some(mut buf) = spares.pop() {
                buf.extend(self.entries.drain(..));
                self.entries = SmallVec::from_vec(buf);
            }
        }
        self.entries.push(e);
        let pos = self.entries.len() - 1;
        if let Some(ix) = &mut self.index {
            ix.insert(e.sym, pos);
        } else if self.entries.len() > INDEX_THRESHOLD {
            self.reindex();
        }
    }

    /// Removes `sym`'s entry, keeping the order of the others. O(1)
    /// amortised.
    pub(super) fn remove(&mut self, sym: Sym) -> Option<Entry> {
        let pos = self.position(sym)?;
        let e = match &mut self.index {
            None => self.entries.remove(pos),
            Some(ix) => {
                ix.remove(&sym);
                std::mem::replace(self.entries.get_mut(pos)?, Entry::hole())
            }
        };
        let live = self.len();
        if self.entries.len() - live > live.max(INDEX_THRESHOLD) {
            self.entries.retain(|e| !e.is_hole());
            self.reindex();
        }
        Some(e)
    }

    /// Removes every entry whose symbol `pred` accepts, in one pass, and
    /// returns them in order. O(entries).
    pub(super) fn remove_where(&mut self, mut pred: impl FnMut(Sym) -> bool) -> Vec<Entry> {
        let mut out = Vec::new();
        self.entries.retain(|e| {
            if e.is_hole() {
                false
            } else if pred(e.sym) {
                out.push(*e);
                false
            } else {
                true
            }
        });
        if self.index.is_some() {
            self.reindex();
        }
        out
    }

    /// Renames the entry at `pos` in place. O(1).
    pub(super) fn rename_at(&mut self, pos: usize, sym: Sym) {
        let Some(e) = self.entries.get_mut(pos).filter(|e| !e.is_hole()) else {
            return;
        };
        if let Some(ix) = &mut self.index {
            ix.remove(&e.sym);
            ix.insert(sym, pos);
        }
        e.sym = sym;
    }

    /// Rebuilds the index from the entries, or drops it once the table is
    /// short and has no hole. O(entries).
    fn reindex(&mut self) {
        if self.entries.len() <= INDEX_THRESHOLD && !self.entries.iter().any(Entry::is_hole) {
            self.index = None;
            return;
        }
        let ix = self.index.get_or_insert_with(Default::default);
        ix.clear();
        for (pos, e) in self.entries.iter().enumerate() {
            if !e.is_hole() {
                ix.insert(e.sym, pos);
            }
        }
    }

    /// Empties the table, handing back its buffer.
    pub(super) fn take_entries(&mut self) -> SmallVec<[Entry; INLINE_VARS]> {
        self.index = None;
        mem::take(&mut self.entries)
    }

    /// Heap bytes of the spilled buffer and the index.
    pub(super) fn heap_bytes(&self) -> usize {
        let spilled = if self.entries.spilled() {
            self.entries.capacity() * mem::size_of::<Entry>()
        } else {
            0
        };
        let index = self.index.as_ref().map_or(0, |ix| {
            mem::size_of::<FxHashMap<Sym, usize>>() + hash_table_bytes::<Sym, usize>(ix.capacity())
        });
        spilled + index
    }

    /// The name signature of the current entries.
    pub(super) fn signature(&self) -> u64 {
        self.iter().fold(0, |s, e| s | sig_bit(e.sym))
    }
}

/// The name of a scope: a symbol, or none (unnamed scopes and the root).
/// Four bytes, so that a scope slot stays within its budget.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) struct ScopeName(u32);

impl ScopeName {
    pub(crate) const NONE: ScopeName = ScopeName(u32::MAX);

    pub(crate) fn new(sym: Option<Sym>) -> Self {
        sym.map_or(Self::NONE, ScopeName)
    }

    #[inline]
    pub(crate) fn get(self) -> Option<Sym> {
        (self != Self::NONE).then_some(self.0)
    }
}

/// Whether a scope slot is live, at which depth and whether it is *wide*
/// (its named kids are in the arena's index; see `Arena::kid_by_sym`), or
/// retired (its version reached the end and the slot is never reused; see
/// `Arena::free_scope`). Four bytes: the top bit is the wide flag, the rest
/// the depth, capped below `2^31 − 1` (a tree that deep would need 256 GiB
/// of slots), and all ones is the retired state.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) struct ScopeState(u32);

impl ScopeState {
    pub(crate) const RETIRED: ScopeState = ScopeState(u32::MAX);
    const WIDE: u32 = 1 << 31;
    const MAX_DEPTH: u32 = Self::WIDE - 2;

    /// A live, narrow scope at `depth` (capped at `2^31 − 2`).
    pub(crate) fn live(depth: u32) -> Self {
        ScopeState(depth.min(Self::MAX_DEPTH))
    }

    #[inline]
    pub(crate) fn depth(self) -> Option<u32> {
        (self != Self::RETIRED).then_some(self.0 & !Self::WIDE)
    }

    /// Whether a live scope is wide.
    #[inline]
    pub(crate) fn is_wide(self) -> bool {
        self != Self::RETIRED && self.0 & Self::WIDE != 0
    }

    /// The same live scope, wide or narrow.
    #[inline]
    pub(crate) fn with_wide(self, wide: bool) -> Self {
        debug_assert!(self != Self::RETIRED);
        ScopeState(if wide {
            self.0 | Self::WIDE
        } else {
            self.0 & !Self::WIDE
        })
    }
}

/// Kids a lookup scans before a scope's named kids move to the index.
/// Scanning a few kids costs less than hashing, and most scopes have few
/// kids; keeping them out of the index keeps a scope's creation off a table
/// that grows with the whole tree.
pub(crate) const KID_SCAN: usize = 8;

/// A scope in the arena.
///
/// The two fields a lookup reads at every level, the parent and the name
/// signature, are not here: they live in the arena's dense `up` and `sigs`
/// arrays, indexed by slot index, so that a walk up the tree is one 8-byte
/// load per level. `repr(C)` keeps the table, which a lookup reads when a
/// signature matches, at the front of the slot.
#[repr(C)]
pub(crate) struct ScopeSlot {
    pub(super) vars: VarTable,
    pub(super) first_kid: ScopeKey,
    pub(super) last_kid: ScopeKey,
    pub(super) prev_sib: ScopeKey,
    pub(super) next_sib: ScopeKey,
    pub(super) name: ScopeName,
    pub(super) state: ScopeState,
}

impl ScopeSlot {
    pub(super) fn new(name: ScopeName, state: ScopeState) -> Self {
        ScopeSlot {
            vars: VarTable::default(),
            first_kid: ScopeKey::default(),
            last_kid: ScopeKey::default(),
            prev_sib: ScopeKey::default(),
            next_sib: ScopeKey::default(),
            name,
            state,
        }
    }

    /// The scope's local variables.
    #[inline]
    pub(crate) fn vars(&self) -> &VarTable {
        &self.vars
    }

    /// The scope's name, if it has one.
    #[inline]
    pub(crate) fn name(&self) -> Option<Sym> {
        self.name.get()
    }

    /// The scope's depth (the root is 0); `None` for a retired slot.
    #[inline]
    pub(crate) fn depth(&self) -> Option<u32> {
        self.state.depth()
    }

    #[inline]
    pub(super) fn is_retired(&self) -> bool {
        self.state == ScopeState::RETIRED
    }

    /// Whether the scope's named kids are in the arena's index.
    #[inline]
    pub(super) fn is_wide(&self) -> bool {
        self.state.is_wide()
    }
}

/// A variable in the arena. A retired slot has no owner.
pub(crate) struct VarSlot {
    /// The value; any layer may read and write it through the arena's typed
    /// access (`value.rs`), which never touches the structural fields.
    pub(crate) value: Option<Box<dyn Payload>>,
    pub(super) owner: Option<ScopeKey>,
    pub(super) name: Sym,
}

impl VarSlot {
    /// The scope holding the variable; `None` for a retired slot.
    #[inline]
    pub(crate) fn owner(&self) -> Option<ScopeKey> {
        self.owner
    }

    /// The variable's name.
    #[inline]
    pub(crate) fn name(&self) -> Sym {
        self.name
    }

    #[inline]
    pub(super) fn is_retired(&self) -> bool {
        self.owner.is_none()
    }
}

/// Approximate heap bytes of a `HashMap<K, V>` of capacity `cap` (hashbrown:
/// one entry and one control byte per bucket).
pub(crate) fn hash_table_bytes<K, V>(cap: usize) -> usize {
    cap * (mem::size_of::<(K, V)>() + 1)
}

#[cfg(test)]
mod tests {
    use super::same_text;

    /// Every length up to 24 bytes (each branch of the chunked compare and
    /// the fallback), with equal texts, with one byte changed at every
    /// position, and with lengths that differ.
    #[test]
    fn same_text_agrees_with_byte_equality() {
        for n in 0..=24_usize {
            let a: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(same_text(&a, &a.clone()), "len {n}");
            for at in 0..n {
                let mut b = a.clone();
                b[at] = b'#';
                assert!(!same_text(&a, &b), "len {n}, differs at {at}");
                assert!(!same_text(&b, &a), "len {n}, differs at {at}");
            }
            let mut longer = a.clone();
            longer.push(b'z');
            assert!(!same_text(&a, &longer), "len {n} against {}", n + 1);
        }
    }
}
