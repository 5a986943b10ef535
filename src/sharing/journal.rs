//! The undo journal that makes the sharing layer panic-safe: every change the
//! store makes while a closure of the caller runs (default-name counters,
//! scopes and variables it creates) is recorded, so that a panic in the
//! closure can be undone, and a re-entered scope can restore the counters on
//! exit (TensorFlow restores a snapshot of all counts there).
//!
//! Frames nest like the calls that open them. A counter change is recorded
//! once per frame (the first old value is all a rollback needs); when a frame
//! ends normally its entries merge into the enclosing frame, dropping those
//! the enclosing frame already holds. So the journal holds one entry per
//! counter touched and one per scope or variable created during the
//! outermost open call, however many times the same scopes are entered, and
//! it is emptied when that call returns.

use rustc_hash::FxHashSet;

use crate::arena::{ScopeKey, VarKey};
use crate::sharing::counts::ScopeMeta;

/// One change to undo.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Undo {
    /// The default-name counter of a scope had this value (`None`: unset).
    Count(ScopeKey, Option<ScopeMeta>),
    /// The store created this scope.
    NewScope(ScopeKey),
    /// The store created this variable.
    NewVar(VarKey),
}

/// What a guarded call saw when it started.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Saved {
    pub(crate) next_seq: u64,
    pub(crate) collections: usize,
}

#[derive(Debug)]
struct Frame {
    start: usize,
    /// Scopes whose counter has an entry in this frame.
    seen: FxHashSet<ScopeKey>,
    /// `Some` for a guarded call (undone on panic), `None` for a re-entry
    /// mark (its counter changes are undone when the re-entered scope exits).
    saved: Option<Saved>,
}

/// The undo journal. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    entries: Vec<Undo>,
    frames: Vec<Frame>,
    /// Cleared sets of finished frames, reused so that entering a scope
    /// allocates nothing once the journal is warm.
    spare: Vec<FxHashSet<ScopeKey>>,
}

impl Journal {
    /// Whether a frame is open (changes are recorded). O(1).
    #[inline]
    pub(crate) fn active(&self) -> bool {
        !self.frames.is_empty()
    }

    /// How many frames are open. O(1).
    pub(crate) fn depth(&self) -> usize {
        self.frames.len()
    }

    /// Opens a frame: a guarded call if `saved` is given, a re-entry mark
    /// otherwise. O(1).
    pub(crate) fn begin(&mut self, saved: Option<Saved>) {
        let seen = self.spare.pop().unwrap_or_default();
        self.frames.push(Frame {
            start: self.entries.len(),
            seen,
            saved,
        });
    }

    /// Records the old value of a counter about to change. O(1).
    pub(crate) fn count_changed(&mut self, key: ScopeKey, old: Option<ScopeMeta>) {
        if let Some(f) = self.frames.last_mut() {
            if f.seen.insert(key) {
                self.entries.push(Undo::Count(key, old));
            }
        }
    }

    /// Records a creation. O(1).
    pub(crate) fn created(&mut self, undo: Undo) {
        if self.active() {
            self.entries.push(undo);
        }
    }

    fn recycle(&mut self, mut seen: FxHashSet<ScopeKey>) {
        seen.clear();
        self.spare.push(seen);
    }

    /// Ends the innermost frame normally: its entries merge into the
    /// enclosing frame, or are dropped if it was the outermost. O(entries of
    /// the frame).
    pub(crate) fn commit(&mut self) {
        let Some(frame) = self.frames.pop() else {
            return;
        };
        match self.frames.last_mut() {
            Some(parent) => {
                let mut w = frame.start;
                for r in frame.start..self.entries.len() {
                    let keep = match self.entries[r] {
                        Undo::Count(k, _) => parent.seen.insert(k),
                        Undo::NewScope(_) | Undo::NewVar(_) => true,
                    };
                    if keep {
                        self.entries.swap(w, r);
                        w += 1;
                    }
                }
                self.entries.truncate(w);
            }
            None => self.entries.clear(),
        }
        self.recycle(frame.seen);
    }

    /// Ends the innermost frame (a re-entry mark): removes its counter
    /// entries and hands them to `restore`, newest first; creations stay for
    /// the enclosing frames. O(entries of the frame).
    pub(crate) fn end_mark(&mut self, mut restore: impl FnMut(ScopeKey, Option<ScopeMeta>)) {
        let Some(frame) = self.frames.pop() else {
            return;
        };
        for u in self.entries[frame.start..].iter().rev() {
            if let Undo::Count(k, old) = *u {
                restore(k, old);
            }
        }
        let mut w = frame.start;
        for r in frame.start..self.entries.len() {
            if !matches!(self.entries[r], Undo::Count(..)) {
                self.entries.swap(w, r);
                w += 1;
            }
        }
        self.entries.truncate(w);
        if self.frames.is_empty() {
            self.entries.clear();
        }
        self.recycle(frame.seen);
    }

    /// Closes every frame from the `depth`-th (1-based) on and gives back
    /// their entries, newest first, with what the `depth`-th frame saved.
    /// O(entries).
    pub(crate) fn rollback(&mut self, depth: usize) -> (Vec<Undo>, Option<Saved>) {
        let mut saved = None;
        let mut start = self.entries.len();
        while self.frames.len() >= depth {
            let Some(frame) = self.frames.pop() else {
                break;
            };
            start = frame.start;
            saved = frame.saved;
            self.recycle(frame.seen);
        }
        let mut undo: Vec<Undo> = self.entries.drain(start..).collect();
        undo.reverse();
        (undo, saved)
    }
}
