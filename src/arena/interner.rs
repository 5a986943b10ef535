//! The per-tree name table: interning, use counts, idle sweeps, and the
//! per-name variable epochs that the [`Resolver`](crate::Resolver) reads.

use std::sync::Arc;

use rustc_hash::FxHashMap;

/// A name's interned index inside one tree (the raw half of a
/// [`Symbol`](crate::Symbol)). Valid while a scope or variable of the tree
/// uses the name or the name was pinned with
/// [`ScopeTree::intern`](crate::ScopeTree::intern); layers must not keep one
/// across calls that may free names.
pub(crate) type Sym = u32;

/// One interned name: its text while some scope or variable uses it (or it
/// is pinned), and the counters that outlive it.
struct NameSlot {
    /// `None` once the name is freed; the index then waits on the free list.
    text: Option<Arc<str>>,
    /// How many scopes and variables carry the name.
    uses: u32,
    /// Pinned names were handed out as a [`Symbol`](crate::Symbol) by `intern` and live as
    /// long as the tree.
    pinned: bool,
    /// Listed in `idle` since the last sweep (so a name that a loop drops
    /// and re-makes is listed once, not once per drop).
    queued: bool,
    /// Bumped each time the index is freed, so a [`Symbol`](crate::Symbol) of a freed name
    /// never reads the name that reuses its index.
    generation: u32,
    /// The variable epoch (see [`Interner`]); never reset, not even when the
    /// index is reused, so a cached answer can never look valid again.
    epoch: u64,
}

/// Idle names are freed in a sweep once at least this many distinct names
/// are idle (and at least half the table).
const IDLE_SWEEP_MIN: usize = 1024;

/// The per-tree string interner, with names freed when nothing uses them.
///
/// A name is *used* by every scope and variable that carries it, and *pinned*
/// once [`ScopeTree::intern`](crate::ScopeTree::intern) hands it out as a
/// [`Symbol`](crate::Symbol). An unpinned name whose last use goes becomes *idle*: it stays
/// interned, so a name that a step loop drops and makes again costs no
/// allocation, until the idle names are at least [`IDLE_SWEEP_MIN`] and at
/// least half the table. Then one sweep frees every name still idle, and each
/// freed index is reused by a later new name; the index's generation is
/// bumped, so a [`Symbol`](crate::Symbol) of a freed name reports
/// [`Error::StaleSymbol`](crate::Error::StaleSymbol). The table is therefore
/// bounded by about twice the names in use plus the pinned ones, not by every
/// name ever seen: a loop of `unique_var` and `remove_var` does not grow it.
/// Each sweep costs O(idle names) and follows at least as many releases, so
/// it is O(1) amortised per release.
///
/// It also holds each symbol's *variable epoch*, a counter the tree bumps
/// whenever a variable of that name is created, freed or renamed (from or
/// to it); a [`Resolver`](crate::Resolver) entry for that name is valid while
/// the counter is unchanged.
#[derive(Default)]
pub(crate) struct Interner {
    map: FxHashMap<Arc<str>, Sym>,
    slots: Vec<NameSlot>,
    free: Vec<Sym>,
    /// Names whose uses fell to 0 since the last sweep, each listed once
    /// (some may be in use again: the sweep checks).
    idle: Vec<Sym>,
}

impl Interner {
    /// The symbol index of `name`, if it is interned. O(len(name)).
    #[inline]
    pub(crate) fn get(&self, name: &str) -> Option<Sym> {
        self.map.get(name).copied()
    }

    /// Interns `name` (which must be valid) and returns its index; the caller
    /// then records a use with [`acquire`](Self::acquire) or pins it.
    /// O(len(name)); allocates only when the name is new.
    pub(crate) fn intern(&mut self, name: &str) -> Sym {
        if let Some(&i) = self.map.get(name) {
            return i;
        }
        let text: Arc<str> = Arc::from(name);
        let i = match self.free.pop() {
            Some(i) => {
                if let Some(slot) = self.slots.get_mut(i as usize) {
                    slot.text = Some(Arc::clone(&text));
                }
                i
            }
            None => {
                let i = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(NameSlot {
                    text: Some(Arc::clone(&text)),
                    uses: 0,
                    pinned: false,
                    queued: false,
                    generation: 0,
                    epoch: 0,
                });
                i
            }
        };
        self.map.insert(text, i);
        i
    }

    /// Keeps `idx` for the tree's lifetime. O(1).
    pub(crate) fn pin(&mut self, idx: Sym) {
        if let Some(slot) = self.slots.get_mut(idx as usize) {
            slot.pinned = true;
        }
    }

    /// Records one more scope or variable carrying `idx`. O(1).
    #[inline]
    pub(crate) fn acquire(&mut self, idx: Sym) {
        if let Some(slot) = self.slots.get_mut(idx as usize) {
            slot.uses += 1;
        }
    }

    /// Records one scope or variable less carrying `idx`; the name becomes
    /// idle when that was its last use and it is not pinned. O(1) amortised.
    #[inline]
    pub(crate) fn release(&mut self, idx: Sym) {
        if let Some(slot) = self.slots.get_mut(idx as usize) {
            slot.uses = slot.uses.saturating_sub(1);
            if slot.uses == 0 && !slot.pinned && !slot.queued {
                self.idle_if_unused(idx);
            }
        }
    }

    /// A variable named `idx` was created: one more use, and a new epoch.
    /// One slot access. O(1).
    #[inline]
    pub(crate) fn acquire_var(&mut self, idx: Sym) {
        if let Some(slot) = self.slots.get_mut(idx as usize) {
            slot.uses += 1;
            slot.epoch = slot.epoch.wrapping_add(1);
        }
    }

    /// A variable named `idx` was freed: one use less, and a new epoch.
    /// O(1) amortised.
    #[inline]
    pub(crate) fn release_var(&mut self, idx: Sym) {
        if let Some(slot) = self.slots.get_mut(idx as usize) {
            slot.epoch = slot.epoch.wrapping_add(1);
            slot.uses = slot.uses.saturating_sub(1);
            if slot.uses == 0 && !slot.pinned && !slot.queued {
                self.idle_if_unused(idx);
            }
        }
    }

    /// Marks `idx` idle if nothing uses it and it is not pinned (also for a
    /// name interned for a create that then failed). O(1) amortised.
    #[cold]
    pub(crate) fn idle_if_unused(&mut self, idx: Sym) {
        let Some(slot) = self.slots.get_mut(idx as usize) else {
            return;
        };
        if slot.uses > 0 || slot.pinned || slot.queued || slot.text.is_none() {
            return;
        }
        slot.queued = true;
        self.idle.push(idx);
        if self.idle.len() >= IDLE_SWEEP_MIN.max(self.map.len() / 2) {
            self.sweep();
        }
    }

    /// Frees every idle name that is still unused and unpinned, then
    /// rebuilds the map with room for the names left plus one more round of
    /// idle ones, which clears the tombstones that removals leave, so the
    /// table's size repeats from one sweep to the next instead of creeping
    /// up. O(idle + names), which the sweep threshold keeps O(1) amortised
    /// per release.
    fn sweep(&mut self) {
        for idx in std::mem::take(&mut self.idle) {
            let Some(slot) = self.slots.get_mut(idx as usize) else {
                continue;
            };
            slot.queued = false;
            if slot.uses > 0 || slot.pinned {
                continue;
            }
            if let Some(text) = slot.text.take() {
                slot.generation = slot.generation.wrapping_add(1);
                self.map.remove(&text);
                self.free.push(idx);
            }
        }
        self.map.shrink_to_fit();
        self.map.reserve(IDLE_SWEEP_MIN);
    }

    /// The generation of `idx`, which a [`Symbol`](crate::Symbol) carries. O(1).
    #[inline]
    pub(crate) fn generation(&self, idx: Sym) -> u32 {
        self.slots.get(idx as usize).map_or(0, |s| s.generation)
    }

    /// Whether `idx` holds a name now, in generation `generation`. O(1).
    #[inline]
    pub(crate) fn is_current(&self, idx: Sym, generation: u32) -> bool {
        self.slots
            .get(idx as usize)
            .is_some_and(|s| s.generation == generation && s.text.is_some())
    }

    /// The text of an interned index ("" for a freed or unknown index, which
    /// no live scope or variable carries).
    #[inline]
    pub(crate) fn text(&self, idx: Sym) -> &str {
        self.slots
            .get(idx as usize)
            .and_then(|s| s.text.as_deref())
            .unwrap_or("")
    }

    /// The variable epoch of symbol `idx` (0 if out of range). O(1).
    #[inline]
    pub(crate) fn epoch(&self, idx: Sym) -> u64 {
        self.slots.get(idx as usize).map_or(0, |s| s.epoch)
    }

    /// Records that the set of variables named `idx` changed. O(1), never
    /// allocates. (A `u64` bumped once a nanosecond wraps after 584 years.)
    #[inline]
    pub(crate) fn bump(&mut self, idx: Sym) {
        if let Some(s) = self.slots.get_mut(idx as usize) {
            s.epoch = s.epoch.wrapping_add(1);
        }
    }

    /// How many names are interned now.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes held by the interner's tables and strings (approximate: each
    /// string's `Arc` header is counted as 16 bytes).
    pub(crate) fn heap_bytes(&self) -> usize {
        const ARC_HEADER: usize = 2 * std::mem::size_of::<usize>();
        let strings: usize = self
            .slots
            .iter()
            .filter_map(|s| s.text.as_ref())
            .map(|t| t.len() + ARC_HEADER)
            .sum();
        strings
            + self.slots.capacity() * std::mem::size_of::<NameSlot>()
            + (self.free.capacity() + self.idle.capacity()) * std::mem::size_of::<Sym>()
            + self.map.capacity() * (std::mem::size_of::<(Arc<str>, Sym)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interner_dedups_and_resolves() {
        let mut i = Interner::default();
        let a = i.intern("a");
        let b = i.intern("b");
        assert_ne!(a, b);
        assert_eq!(i.intern("a"), a);
        assert_eq!(i.text(b), "b");
        assert_eq!(i.get("c"), None);
        assert_eq!(i.len(), 2);
    }

    #[test]
    fn idle_names_are_swept_and_their_index_reused() {
        let mut i = Interner::default();
        let a = i.intern("a");
        i.acquire(a);
        let g = i.generation(a);
        i.release(a);
        assert_eq!(i.get("a"), Some(a), "one idle name is kept");
        i.sweep();
        assert_eq!(i.get("a"), None);
        assert!(!i.is_current(a, g));
        let b = i.intern("b");
        assert_eq!(b, a, "the freed index is reused");
        assert_eq!(i.text(b), "b");
        assert!(i.is_current(b, i.generation(b)));
        i.pin(b);
        i.idle_if_unused(b);
        i.sweep();
        assert_eq!(i.get("b"), Some(b), "pinned names stay");
    }

    #[test]
    fn names_a_loop_drops_and_remakes_are_never_swept() {
        let mut i = Interner::default();
        let names: Vec<Sym> = (0..8).map(|n| i.intern(&format!("h{n}"))).collect();
        for _ in 0..10 * IDLE_SWEEP_MIN {
            for &x in &names {
                i.acquire(x);
            }
            for &x in &names {
                i.release(x);
            }
        }
        assert_eq!(i.idle.len(), names.len(), "each idle name is listed once");
        for (n, &x) in names.iter().enumerate() {
            assert_eq!(i.get(&format!("h{n}")), Some(x), "never swept");
        }
    }

    #[test]
    fn a_sweep_runs_by_itself_once_idle_names_pile_up() {
        let mut i = Interner::default();
        for n in 0..10 * IDLE_SWEEP_MIN {
            let x = i.intern(&format!("u{n}"));
            i.acquire(x);
            i.release(x);
        }
        assert!(i.len() <= IDLE_SWEEP_MIN, "{} names kept", i.len());
        assert!(i.slots.len() <= IDLE_SWEEP_MIN + 1);
    }
}
