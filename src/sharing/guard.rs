//! The journal frames of [`VariableStore`]: every call that runs a closure
//! of the caller (a scope body, a custom getter) runs it inside a frame, and
//! if the closure panics the store undoes what the call did (counters, the
//! scopes and variables it created, their metadata and collection entries)
//! and resumes the panic.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use crate::arena::{ScopeKey, VarKey};
use crate::sharing::journal::{Saved, Undo};
use crate::sharing::store::VariableStore;

impl VariableStore {
    /// Runs `f` in a journal frame: if it panics, everything recorded in the
    /// frame is undone and the panic resumed. O(1) plus `f`, plus
    /// O(changes recorded) when the frame ends.
    pub(crate) fn guarded<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        self.journal.begin(Some(Saved {
            next_seq: self.next_seq,
            collections: self.collections.len(),
        }));
        let depth = self.journal.depth();
        match catch_unwind(AssertUnwindSafe(|| f(self))) {
            Ok(out) => {
                while self.journal.depth() >= depth {
                    self.journal.commit();
                }
                out
            }
            Err(payload) => {
                self.rollback(depth);
                resume_unwind(payload)
            }
        }
    }

    /// Undoes the frames from the `depth`-th on, newest change first.
    fn rollback(&mut self, depth: usize) {
        let (undo, saved) = self.journal.rollback(depth);
        for u in undo {
            match u {
                Undo::Count(k, old) => self.counts.restore(&self.tree, k, old),
                Undo::NewVar(v) => self.unmake_var(v),
                Undo::NewScope(k) => self.unmake_scope(k),
            }
        }
        if let Some(saved) = saved {
            self.next_seq = saved.next_seq;
            self.collections.truncate(saved.collections);
        }
    }

    fn unmake_var(&mut self, v: VarKey) {
        if let Some(entries) = self.forget_var(v) {
            self.collections.pop(v, entries);
        }
        if self.tree.var_is_live(v) {
            let id = self.tree.var_id(v);
            // A panicking `Drop` of the value: the tree has finished its
            // bookkeeping; the first panic is the one resumed.
            let _ = catch_unwind(AssertUnwindSafe(|| self.tree.remove_var(id)));
        }
    }

    fn unmake_scope(&mut self, k: ScopeKey) {
        if !self.tree.scope_is_live(k) {
            return;
        }
        self.counts.kids_changed(&self.tree, k);
        self.counts.forget(k);
        let id = self.tree.scope_id(k);
        let _ = catch_unwind(AssertUnwindSafe(|| self.tree.delete_scope(id)));
    }
}
