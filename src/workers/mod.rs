//! Parallel workers on one tree: [`ScopeTree::split_workers`] splits the
//! borrow of the tree's variables between worker scopes, with no lock and no
//! `unsafe`.
//!
//! # The rules of a split
//!
//! While a split lives, every live variable of the tree is on exactly one
//! side:
//!
//! - **a worker's own side**: the variables of its worker scope and of every
//!   scope below it. Only that worker reads and writes them
//!   ([`get`](WorkerScope::get), [`get_mut`](WorkerScope::get_mut),
//!   [`set`](WorkerScope::set), [`get_disjoint_mut`](WorkerScope::get_disjoint_mut));
//! - **the shared side**: every other variable (the ancestors' parameters, and
//!   anything outside all worker subtrees). Every worker reads them
//!   ([`get`](WorkerScope::get), [`shared`](WorkerScope::shared)); nobody
//!   writes them.
//!
//! The structure (scopes, names) is frozen: the split holds the tree's `&mut`
//! borrow, so no scope or variable can be created or deleted until every
//! [`WorkerScope`] is dropped. Then write the shared side on the tree again,
//! for example to reduce the workers' gradients into the parameters.
//!
//! The borrow checker enforces all of this: the split hands each worker the
//! `&mut` borrows of its own variable slots (a partition of the arena's
//! `iter_mut`) and a shared `&` view of the rest, so workers on different
//! threads can never race.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::thread;

use rustc_hash::FxHashMap;

use crate::arena::{ScopeId, ScopeKey, Structure, VarId, VarKey, VarSlot};
use crate::error::Error;

mod error;
use crate::arena::Sym;
use crate::tree::ScopeTree;
use crate::value::ValueError;
pub use error::{WorkerAccessReason, WorkerError};

/// One variable of a worker's side, as the shared index records it (for
/// error messages about another worker's variable).
struct Owned {
    key: VarKey,
    worker: u32,
    name: Sym,
    owner: ScopeKey,
}

/// What every worker of a split reads: the frozen structure and the shared
/// side's variables.
struct Shared<'t> {
    view: Structure<'t>,
    /// The shared side, sorted by key.
    vars: Vec<(VarKey, &'t VarSlot)>,
    /// Every worker-side variable, sorted by key.
    owned: Vec<Owned>,
    workers: Vec<ScopeKey>,
}

/// One worker's part of a split tree: mutable access to the variables of its
/// scope and the scopes below it, read access to the shared variables (see the
/// [module rules](crate::ScopeTree::split_workers)).
///
/// `Send`: move it to the worker's thread (for example with
/// [`std::thread::scope`], or use [`ScopeTree::run_workers`]). A lookup by
/// handle is a binary search over the worker's own (or the shared) variables:
/// O(log n), no string, no lock.
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "W")?;
/// tree.set(w, 2.0_f32)?;
/// let a = tree.new_scope(tree.root())?;
/// let y = tree.var(a, "y")?;
/// let mut workers = tree.split_workers(&[a])?;
/// let wa = &mut workers[0];
/// let w_val = *wa.get::<f32>(w)?;
/// wa.set(y, w_val * 3.0)?;
/// assert!(wa.set(w, 0.0_f32).is_err()); // shared: read-only
/// drop(workers);
/// assert_eq!(*tree.get::<f32>(y)?, 6.0);
/// # Ok::<(), scopetree::WorkerError>(())
/// ```
pub struct WorkerScope<'t> {
    index: usize,
    scope: ScopeKey,
    /// The worker's own side, sorted by key.
    own: Vec<(VarKey, &'t mut VarSlot)>,
    shared: Arc<Shared<'t>>,
}

const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<WorkerScope<'static>>();
};

impl std::fmt::Debug for WorkerScope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerScope")
            .field("index", &self.index)
            .field("scope", &self.scope())
            .field("own_vars", &self.own.len())
            .field("shared_vars", &self.shared.vars.len())
            .finish()
    }
}

impl ScopeTree {
    /// Splits the tree between workers, one per scope of `scopes`: worker `i`
    /// may read and write the variables of `scopes[i]` and of every scope
    /// below it, and read every variable outside all the workers' subtrees
    /// (the parameters in the ancestors). See the module rules in
    /// `docs/runtime.md`: while the returned workers live, the tree is
    /// borrowed and nothing else can touch it.
    ///
    /// O(variable arena slots (live, freed and retired) + scopes in the
    /// workers' subtrees): every slot is visited and each variable sorted to
    /// its side once per split. It allocates one index
    /// per worker, one shared index and one map of the workers' scopes, so
    /// split once per batch, not once per step.
    ///
    /// # Errors
    /// [`WorkerError::OverlappingWorkers`] if two scopes are the same or one is
    /// inside the other; [`WorkerError::Tree`] with [`Error::StaleScope`] or
    /// [`Error::ForeignScope`] for a bad scope.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let (a, b) = (tree.new_scope(root)?, tree.new_scope(root)?);
    /// let (ya, yb) = (tree.var(a, "y")?, tree.var(b, "y")?);
    /// std::thread::scope(|s| -> Result<(), scopetree::WorkerError> {
    ///     for mut w in tree.split_workers(&[a, b])? {
    ///         s.spawn(move || {
    ///             let y = if w.index() == 0 { ya } else { yb };
    ///             w.set(y, w.index() as u32)
    ///         });
    ///     }
    ///     Ok(())
    /// })?;
    /// assert_eq!(*tree.get::<u32>(yb)?, 1);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    pub fn split_workers(
        &mut self,
        scopes: &[ScopeId],
    ) -> Result<Vec<WorkerScope<'_>>, WorkerError> {
        let mut keys = Vec::with_capacity(scopes.len());
        for &s in scopes {
            keys.push(self.check_scope(s)?);
        }
        // Map every scope of every worker's subtree to its worker.
        let mut side_of: FxHashMap<ScopeKey, u32> = FxHashMap::default();
        let mut stack = Vec::new();
        let view = self.arena().structure();
        for (i, &top) in keys.iter().enumerate() {
            stack.push(top);
            while let Some(k) = stack.pop() {
                if let Some(j) = side_of.insert(k, i as u32) {
                    return Err(WorkerError::OverlappingWorkers {
                        scope: view.error_path(keys[j as usize]),
                        other: view.error_path(top),
                    });
                }
                stack.extend(view.kids(k));
            }
        }
        let (view, slots) = self.arena_mut().split_values();
        let mut own: Vec<Vec<(VarKey, &mut VarSlot)>> = keys.iter().map(|_| Vec::new()).collect();
        let mut shared_vars = Vec::new();
        let mut owned = Vec::new();
        for (key, slot) in slots {
            let owner = slot.owner().unwrap_or_default();
            match side_of.get(&owner) {
                Some(&w) => {
                    owned.push(Owned {
                        key,
                        worker: w,
                        name: slot.name(),
                        owner,
                    });
                    own[w as usize].push((key, slot));
                }
                None => shared_vars.push((key, &*slot)),
            }
        }
        // The arena hands out slots in key order, so every list is sorted by
        // key, as the binary searches need.
        debug_assert!(shared_vars.windows(2).all(|w| w[0].0 < w[1].0));
        debug_assert!(owned.windows(2).all(|w| w[0].key < w[1].key));
        debug_assert!(own.iter().all(|o| o.windows(2).all(|w| w[0].0 < w[1].0)));
        let shared = Arc::new(Shared {
            view,
            vars: shared_vars,
            owned,
            workers: keys.clone(),
        });
        Ok(own
            .into_iter()
            .zip(keys)
            .enumerate()
            .map(|(index, (own, scope))| WorkerScope {
                index,
                scope,
                own,
                shared: Arc::clone(&shared),
            })
            .collect())
    }

    /// Runs `f` once per scope of `scopes`, in parallel, each call on its own
    /// [`WorkerScope`] (see [`split_workers`](Self::split_workers)), and
    /// returns the results in the order of `scopes`. Worker 0 runs on the
    /// calling thread, the others on scoped threads spawned for this call.
    /// A worker whose thread the system refuses (out of threads or memory)
    /// runs on the calling thread too, after worker 0: the call still
    /// completes, only with less parallelism.
    ///
    /// O(the split) plus one thread spawn per worker after the first (tens of
    /// microseconds each): call it once per batch.
    ///
    /// # Errors
    /// The errors of [`split_workers`](Self::split_workers); `f`'s own errors
    /// come back inside the results.
    ///
    /// # Panics
    /// If `f` panics in a worker, the panic (the first in the order of
    /// `scopes`) is resumed on the calling thread once every worker has
    /// finished.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let scale = tree.var(root, "scale")?;
    /// tree.set(scale, 10_u64)?;
    /// let workers: Vec<_> = (0..2).map(|_| tree.new_scope(root)).collect::<Result<_, _>>()?;
    /// let outs: Vec<_> = workers.iter().map(|&w| tree.var(w, "out")).collect::<Result<_, _>>()?;
    /// let results = tree.run_workers(&workers, |mut w| -> Result<u64, scopetree::WorkerError> {
    ///     let v = *w.get::<u64>(scale)? * (w.index() as u64 + 1);
    ///     w.set(outs[w.index()], v)?;
    ///     Ok(v)
    /// })?;
    /// assert_eq!(results, [Ok(10), Ok(20)]);
    /// assert_eq!(*tree.get::<u64>(outs[1])?, 20);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    pub fn run_workers<R, F>(&mut self, scopes: &[ScopeId], f: F) -> Result<Vec<R>, WorkerError>
    where
        R: Send,
        F: Fn(WorkerScope<'_>) -> R + Sync,
    {
        let workers = self.split_workers(scopes)?;
        let mut rest = workers.into_iter();
        let first = rest.next();
        let f = &f;
        let mut out = Vec::with_capacity(scopes.len());
        thread::scope(|s| {
            // A worker the system refuses a thread runs here, after the
            // first, in its place in the results.
            let runs: Vec<_> = rest
                .map(|w| crate::threads::spawn_scoped(s, "scopetree-worker", w, f))
                .collect();
            let run_here = |w| std::panic::catch_unwind(AssertUnwindSafe(|| f(w)));
            let mut panic = None;
            let outcomes = first
                .map(run_here)
                .into_iter()
                .chain(runs.into_iter().map(|run| match run {
                    Ok(h) => h.join(),
                    Err(w) => run_here(w),
                }));
            for outcome in outcomes {
                match outcome {
                    Ok(r) => out.push(r),
                    Err(p) => panic = panic.or(Some(p)),
                }
            }
            if let Some(p) = panic {
                std::panic::resume_unwind(p);
            }
        });
        Ok(out)
    }
}

impl<'t> WorkerScope<'t> {
    /// The position of this worker's scope in the slice given to
    /// [`ScopeTree::split_workers`]. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// assert_eq!(tree.split_workers(&[a])?[0].index(), 0);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    pub fn index(&self) -> usize {
        self.index
    }

    /// This worker's scope. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// assert_eq!(tree.split_workers(&[a])?[0].scope(), a);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    pub fn scope(&self) -> ScopeId {
        ScopeId::new(self.scope, self.shared.view.tag())
    }

    /// Number of variables this worker owns (its scope's and its
    /// descendants'). O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let b = tree.new_scope(a)?;
    /// tree.var(a, "x")?;
    /// tree.var(b, "y")?;
    /// assert_eq!(tree.split_workers(&[a])?[0].own_var_count(), 2);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    pub fn own_var_count(&self) -> usize {
        self.own.len()
    }

    /// Number of shared (read-only) variables. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// tree.var(tree.root(), "W")?;
    /// let a = tree.new_scope(tree.root())?;
    /// assert_eq!(tree.split_workers(&[a])?[0].shared_var_count(), 1);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    pub fn shared_var_count(&self) -> usize {
        self.shared.vars.len()
    }

    /// Whether this worker owns `var` (may write it). O(log n).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "W")?;
    /// let a = tree.new_scope(tree.root())?;
    /// let x = tree.var(a, "x")?;
    /// let workers = tree.split_workers(&[a])?;
    /// assert!(workers[0].owns(x) && !workers[0].owns(w));
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    pub fn owns(&self, var: VarId) -> bool {
        var.tree == self.shared.view.tag() && self.own_pos(var.key).is_some()
    }

    #[inline]
    fn own_pos(&self, key: VarKey) -> Option<usize> {
        self.own.binary_search_by(|(k, _)| k.cmp(&key)).ok()
    }

    #[inline]
    fn shared_slot(&self, key: VarKey) -> Option<&'t VarSlot> {
        let vars = &self.shared.vars;
        vars.binary_search_by(|(k, _)| k.cmp(&key))
            .ok()
            .map(|i| vars[i].1)
    }

    /// The error for a handle found on neither side this worker may use.
    #[cold]
    fn missing(&self, var: VarId) -> WorkerError {
        if var.tree != self.shared.view.tag() {
            return Error::ForeignVar {
                var,
                tree: self.shared.view.tag(),
            }
            .into();
        }
        let owned = &self.shared.owned;
        match owned.binary_search_by(|o| o.key.cmp(&var.key)) {
            Ok(i) => {
                let o = &owned[i];
                WorkerError::WorkerAccess {
                    name: crate::short::name(self.shared.view.name_text(o.name)),
                    scope: self.path(o.owner),
                    worker: self.path(self.scope),
                    reason: if o.worker as usize == self.index {
                        WorkerAccessReason::NotShared
                    } else {
                        WorkerAccessReason::OtherWorker
                    },
                }
            }
            Err(_) => Error::StaleVar { var }.into(),
        }
    }

    #[cold]
    fn access_error(&self, slot: &VarSlot, reason: WorkerAccessReason) -> WorkerError {
        WorkerError::WorkerAccess {
            name: crate::short::name(self.shared.view.name_text(slot.name())),
            scope: self.path(slot.owner().unwrap_or_default()),
            worker: self.path(self.scope),
            reason,
        }
    }

    /// The `T` value of a slot this worker may read, or why it cannot be read.
    #[inline]
    fn read<'s, T: Any>(&self, slot: &'s VarSlot) -> Result<&'s T, WorkerError> {
        slot.typed::<T>()
            .map_err(|e| self.value_error::<T>(slot, e).into())
    }

    #[cold]
    #[inline(never)]
    fn value_error<T: Any>(&self, slot: &VarSlot, e: ValueError) -> Error {
        let name = crate::short::name(self.shared.view.name_text(slot.name()));
        e.into_error::<T>(name, self.path(slot.owner().unwrap_or_default()))
    }

    fn path(&self, key: ScopeKey) -> String {
        self.shared.view.error_path(key)
    }

    /// Position of an own variable for a write; an error naming why not.
    #[inline]
    fn writable(&self, var: VarId) -> Result<usize, WorkerError> {
        if var.tree == self.shared.view.tag() {
            if let Some(i) = self.own_pos(var.key) {
                return Ok(i);
            }
            if let Some(slot) = self.shared_slot(var.key) {
                return Err(self.access_error(slot, WorkerAccessReason::ReadOnly));
            }
        }
        Err(self.missing(var))
    }

    /// Borrows the `T` value of `var`, which this worker owns or which is
    /// shared (Paddle's `Get<T>`, from a worker). O(log n): a binary search,
    /// no string and no lock.
    ///
    /// # Errors
    /// [`WorkerError::WorkerAccess`] for another worker's variable;
    /// [`Error::Uninitialized`], [`Error::TypeMismatch`];
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "W")?;
    /// tree.set(w, 1.5_f32)?;
    /// let a = tree.new_scope(tree.root())?;
    /// let workers = tree.split_workers(&[a])?;
    /// assert_eq!(*workers[0].get::<f32>(w)?, 1.5);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    #[inline]
    pub fn get<T: Any>(&self, var: VarId) -> Result<&T, WorkerError> {
        let slot: &VarSlot = if var.tree != self.shared.view.tag() {
            return Err(self.missing(var));
        } else if let Some(i) = self.own_pos(var.key) {
            self.own[i].1
        } else if let Some(slot) = self.shared_slot(var.key) {
            slot
        } else {
            return Err(self.missing(var));
        };
        self.read(slot)
    }

    /// Borrows the `T` value of a shared variable for as long as the split
    /// lives, so the borrow can be held while this worker writes its own
    /// variables (read the parameters, then write the activations). O(log n).
    ///
    /// # Errors
    /// [`WorkerError::WorkerAccess`] if this worker or another one owns `var`;
    /// [`Error::Uninitialized`], [`Error::TypeMismatch`];
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "W")?;
    /// tree.set(w, vec![2.0_f32, 3.0])?;
    /// let a = tree.new_scope(tree.root())?;
    /// let y = tree.var(a, "y")?;
    /// tree.set(y, vec![0.0_f32; 2])?;
    /// let mut workers = tree.split_workers(&[a])?;
    /// let wk = &mut workers[0];
    /// let w_val = wk.shared::<Vec<f32>>(w)?; // held across the write below
    /// wk.get_mut::<Vec<f32>>(y)?.copy_from_slice(w_val);
    /// assert_eq!(wk.get::<Vec<f32>>(y)?, &[2.0, 3.0]);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    #[inline]
    pub fn shared<T: Any>(&self, var: VarId) -> Result<&'t T, WorkerError> {
        let found = if var.tree == self.shared.view.tag() {
            self.shared_slot(var.key)
        } else {
            None
        };
        let Some(slot) = found else {
            return Err(self.missing(var));
        };
        self.read(slot)
    }

    /// Borrows the `T` value of an own variable mutably. O(log n).
    ///
    /// # Errors
    /// [`WorkerError::WorkerAccess`] for a shared variable (read-only) or another
    /// worker's; [`Error::Uninitialized`], [`Error::TypeMismatch`];
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let n = tree.var(a, "n")?;
    /// tree.set(n, 1_u32)?;
    /// let mut workers = tree.split_workers(&[a])?;
    /// *workers[0].get_mut::<u32>(n)? += 1;
    /// assert_eq!(*workers[0].get::<u32>(n)?, 2);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    #[inline]
    pub fn get_mut<T: Any>(&mut self, var: VarId) -> Result<&mut T, WorkerError> {
        let [v] = self.get_disjoint_mut::<T, 1>([var])?;
        Ok(v)
    }

    /// Borrows the `T` values of `N` distinct own variables mutably at once
    /// (for an op's inputs and outputs: step `t - 1`'s state, step `t`'s
    /// state, the gradients). O(N log n + N²).
    ///
    /// # Errors
    /// [`Error::AliasedVar`] if a handle is passed twice; otherwise the errors
    /// of [`get_mut`](Self::get_mut) for the first handle that fails.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let (x, y) = (tree.var(a, "x")?, tree.var(a, "y")?);
    /// tree.set(x, vec![1.0_f32, 2.0])?;
    /// tree.set(y, vec![0.0_f32; 2])?;
    /// let mut workers = tree.split_workers(&[a])?;
    /// let [xv, yv] = workers[0].get_disjoint_mut::<Vec<f32>, 2>([x, y])?;
    /// yv.copy_from_slice(xv);
    /// assert!(workers[0].get_disjoint_mut::<Vec<f32>, 2>([x, x]).is_err());
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    pub fn get_disjoint_mut<T: Any, const N: usize>(
        &mut self,
        vars: [VarId; N],
    ) -> Result<[&mut T; N], WorkerError> {
        let mut pos = [0usize; N];
        for (i, &var) in vars.iter().enumerate() {
            let p = self.writable(var)?;
            let slot: &VarSlot = self.own[p].1;
            if let Err(e) = slot.typed::<T>() {
                return Err(self.value_error::<T>(slot, e).into());
            }
            if pos[..i].contains(&p) {
                return Err(Error::AliasedVar {
                    name: crate::short::name(self.shared.view.name_text(slot.name())),
                    scope: self.path(slot.owner().unwrap_or_default()),
                }
                .into());
            }
            pos[i] = p;
        }
        let entries = self
            .own
            .get_disjoint_mut(pos)
            .map_err(|_| Error::StaleVar { var: vars[0] })?;
        let mut typed = entries.map(|e| e.1.typed_mut::<T>().ok());
        if typed.iter().any(Option::is_none) {
            return Err(Error::StaleVar { var: vars[0] }.into());
        }
        Ok(std::array::from_fn(|i| {
            typed[i]
                .take()
                .unwrap_or_else(|| unreachable!("checked above"))
        }))
    }

    /// Sets the value of an own variable. When it already holds a `T`, the
    /// value is overwritten in place without allocating; otherwise it is
    /// boxed. O(log n).
    ///
    /// # Errors
    /// [`WorkerError::WorkerAccess`] for a shared variable (read-only) or another
    /// worker's; [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let loss = tree.var(a, "loss")?;
    /// let mut workers = tree.split_workers(&[a])?;
    /// workers[0].set(loss, 0.25_f32)?;
    /// assert_eq!(*workers[0].get::<f32>(loss)?, 0.25);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    pub fn set<T: Any + Send + Sync>(&mut self, var: VarId, value: T) -> Result<(), WorkerError> {
        let p = self.writable(var)?;
        self.own[p].1.put(value);
        Ok(())
    }

    /// Borrows the `T` value of an own variable mutably, first setting it to
    /// `init()` if it is uninitialised (Paddle's `GetMutable<T>`): the way to
    /// size a step's buffers on the first sequence and reuse them afterwards.
    /// O(log n).
    ///
    /// # Errors
    /// [`Error::TypeMismatch`] if it holds another type (`init` is not
    /// called); the access errors of [`set`](Self::set).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let h = tree.var(a, "h")?;
    /// let mut workers = tree.split_workers(&[a])?;
    /// workers[0].get_or_insert_with(h, || vec![0.0_f32; 4])?[0] = 1.0;
    /// assert_eq!(workers[0].get::<Vec<f32>>(h)?.len(), 4);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    pub fn get_or_insert_with<T: Any + Send + Sync>(
        &mut self,
        var: VarId,
        init: impl FnOnce() -> T,
    ) -> Result<&mut T, WorkerError> {
        let p = self.writable(var)?;
        let slot = &mut *self.own[p].1;
        if slot.value.is_none() {
            slot.value = Some(Box::new(init()));
        }
        self.get_mut::<T>(var)
    }

    /// The scope of every worker of the split, in the order given. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let (a, b) = (tree.new_scope(tree.root())?, tree.new_scope(tree.root())?);
    /// let workers = tree.split_workers(&[a, b])?;
    /// assert_eq!(workers[0].worker_scopes().collect::<Vec<_>>(), [a, b]);
    /// # Ok::<(), scopetree::WorkerError>(())
    /// ```
    pub fn worker_scopes(&self) -> impl Iterator<Item = ScopeId> + '_ {
        let tag = self.shared.view.tag();
        self.shared
            .workers
            .iter()
            .map(move |&k| ScopeId::new(k, tag))
    }
}

#[cfg(test)]
mod tests {
    use crate::tree::ScopeTree;

    #[test]
    fn workers_refused_a_thread_run_on_the_calling_thread_in_their_places() {
        let mut tree = ScopeTree::new();
        let root = tree.root();
        let scopes: Vec<_> = (0..4).map(|_| tree.new_scope(root).unwrap()).collect();
        let outs: Vec<_> = scopes
            .iter()
            .map(|&s| tree.var(s, "out").unwrap())
            .collect();
        let here = std::thread::current().id();
        let results = crate::threads::refusing(|| {
            tree.run_workers(&scopes, |mut w| {
                w.set(outs[w.index()], w.index() as u64 * 10).unwrap();
                (w.index(), std::thread::current().id() == here)
            })
        })
        .unwrap();
        assert_eq!(results, [(0, true), (1, true), (2, true), (3, true)]);
        for (k, &o) in outs.iter().enumerate() {
            assert_eq!(*tree.get::<u64>(o).unwrap(), k as u64 * 10);
        }

        // A panic in the first worker is resumed once the others have run.
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::threads::refusing(|| {
                tree.run_workers(&scopes, |mut w| {
                    assert_ne!(w.index(), 0, "worker 0 fails");
                    w.set(outs[w.index()], 7_u64).unwrap();
                })
            })
        }));
        assert!(caught.is_err());
        let after: Vec<u64> = outs.iter().map(|&o| *tree.get::<u64>(o).unwrap()).collect();
        assert_eq!(after, [0, 7, 7, 7]);
    }
}
