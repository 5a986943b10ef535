//! Step scopes: one scope per time step of a recurrent net or a training loop
//! (seed 000's `StepNet`), with per-step variable names resolved once.
//!
//! A [`StepScopes`] keeps the scopes of the live steps of one sequence, all
//! kids of one parent scope, in step order: step `t` reads step `t - 1`'s
//! state through [`var`](StepScopes::var)`(h, t - 1)`. Recycling them for the
//! next sequence makes every handle into them stale and, in steady state, does
//! no heap allocation: the scope and variable slots are freed and re-taken
//! from the arena's free lists (so their versions move on), and each value box
//! is moved from the old variable to its successor.

use std::num::NonZeroUsize;

use crate::arena::{Payload, VarSlot};
use crate::arena::{ScopeId, TreeTag, VarId};
use crate::error::Error;

mod error;
use crate::names::Name;
use crate::tree::ScopeTree;
pub use error::StepError;

/// A per-step variable name declared on a [`StepScopes`]: resolve it once with
/// [`declare`](StepScopes::declare), then get step `t`'s variable with
/// [`var`](StepScopes::var)`(sv, t)`, an array index with no string lookup.
///
/// `Copy`, 16 bytes. It stays valid across [`recycle`](StepScopes::recycle);
/// the [`VarId`]s it yields do not.
///
/// ```
/// use scopetree::{ScopeTree, StepScopes};
/// let mut tree = ScopeTree::new();
/// let mut steps = StepScopes::new(&tree, tree.root())?;
/// let h = steps.declare(&mut tree, "h")?;
/// assert_eq!(steps.step_var(&tree, "h")?, Some(h));
/// # Ok::<(), scopetree::StepError>(())
/// ```
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct StepVar {
    owner: u64,
    col: u32,
    sym: u32,
}

/// The scopes of the steps of one sequence, kids of one parent scope, with a
/// fixed set of per-step variables.
///
/// - [`push`](Self::push) opens the next step `t`: a scope under the parent
///   holding one variable per declared [`StepVar`] (uninitialised the first
///   time). Step `t` reads step `t - 1` through `var(sv, t - 1)`.
/// - All pushed steps stay live for the backward pass, unless the step scopes
///   keep a window ([`ping_pong`](Self::ping_pong),
///   [`with_window`](Self::with_window)): then pushing step `t` recycles step
///   `t - window`, as Paddle's inference `While` ping-pongs two step scopes.
/// - [`recycle`](Self::recycle) ends the sequence: every handle into the steps
///   reports stale from then on, and the next sequence's steps reuse the
///   scopes' arena slots and the values' heap boxes, so a loop with a fixed
///   number of steps does no heap allocation after its first sequence.
/// - [`drop_all`](Self::drop_all) deletes all the step scopes at once.
///
/// Recycling keeps values: step `t` of the new sequence starts with the value
/// step `t` held in the previous one (that is what saves the allocation), so
/// overwrite before you read, or [`clear`](ScopeTree::clear) it. Variables
/// created in a step scope outside the declared [`StepVar`]s are deleted with
/// it and not recreated. See `docs/runtime.md`.
///
/// ```
/// use scopetree::{Error, ScopeTree, StepScopes};
/// let mut tree = ScopeTree::new();
/// let mut steps = StepScopes::new(&tree, tree.root())?;
/// let h = steps.declare(&mut tree, "h")?;
/// for _ in 0..3 {
///     let t = steps.push(&mut tree)?;
///     let prev = if t == 0 { 0.0 } else { *tree.get::<f32>(steps.var(h, t - 1)?)? };
///     tree.set(steps.var(h, t)?, prev + 1.0)?;
/// }
/// let old = steps.var(h, 2)?;
/// assert_eq!(*tree.get::<f32>(old)?, 3.0);
/// steps.recycle(&mut tree)?;
/// assert!(matches!(tree.get::<f32>(old), Err(Error::StaleVar { .. })));
/// # Ok::<(), scopetree::StepError>(())
/// ```
pub struct StepScopes {
    id: u64,
    parent: ScopeId,
    /// The parent's path as messages show it (cut when long).
    parent_path: String,
    window: Option<NonZeroUsize>,
    /// Interned names of the declared step variables (the columns).
    syms: Vec<u32>,
    /// One scope per slot (live or parked for reuse).
    scopes: Vec<ScopeId>,
    /// Slot-major: `vars[slot * syms.len() + col]`.
    vars: Vec<VarId>,
    /// Live steps are `first..end`.
    first: usize,
    end: usize,
    /// Values moved from a recycled scope to its successor.
    moved: Vec<Option<Box<dyn Payload>>>,
}

impl std::fmt::Debug for StepScopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepScopes")
            .field("parent", &self.parent)
            .field("window", &self.window)
            .field("step_vars", &self.syms.len())
            .field("live", &(self.first..self.end))
            .field("scopes", &self.scopes.len())
            .finish()
    }
}

impl StepScopes {
    /// Step scopes under `parent` that keep every pushed step until
    /// [`recycle`](Self::recycle) (training with backpropagation through
    /// time). No scope is created yet. O(depth of `parent`), for its path.
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for `parent`.
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let tree = ScopeTree::new();
    /// let steps = StepScopes::new(&tree, tree.root())?;
    /// assert!(steps.is_empty());
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn new(tree: &ScopeTree, parent: ScopeId) -> Result<Self, StepError> {
        Self::build(tree, parent, None)
    }

    /// Step scopes under `parent` that keep only the last `window` steps:
    /// pushing step `t` recycles step `t - window`. O(depth of `parent`).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for `parent`.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::with_window(&tree, tree.root(), NonZeroUsize::new(3).unwrap())?;
    /// for _ in 0..5 {
    ///     steps.push(&mut tree)?;
    /// }
    /// assert_eq!((steps.first(), steps.end()), (2, 5));
    /// assert_eq!(steps.scope_count(), 3);
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn with_window(
        tree: &ScopeTree,
        parent: ScopeId,
        window: NonZeroUsize,
    ) -> Result<Self, StepError> {
        Self::build(tree, parent, Some(window))
    }

    /// Step scopes under `parent` that keep two steps, the current one and the
    /// one before (Paddle's inference ping-pong): for forward-only loops of any
    /// length on two scopes. Same as [`with_window`](Self::with_window) with 2.
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for `parent`.
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::ping_pong(&tree, tree.root())?;
    /// for _ in 0..100 {
    ///     steps.push(&mut tree)?;
    /// }
    /// assert_eq!(tree.scope_count(), 1 + 2);
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn ping_pong(tree: &ScopeTree, parent: ScopeId) -> Result<Self, StepError> {
        Self::build(tree, parent, NonZeroUsize::new(2))
    }

    fn build(
        tree: &ScopeTree,
        parent: ScopeId,
        window: Option<NonZeroUsize>,
    ) -> Result<Self, StepError> {
        // Kept for messages, cut as errors cut paths.
        let parent_path = crate::short::path(&tree.path(parent)?);
        Ok(StepScopes {
            // Tags come from a process-wide counter: no two step scopes share
            // an id, as no two trees share a tag.
            id: TreeTag::fresh().get(),
            parent,
            parent_path,
            window,
            syms: Vec::new(),
            scopes: Vec::new(),
            vars: Vec::new(),
            first: 0,
            end: 0,
            moved: Vec::new(),
        })
    }

    /// Declares the per-step variable `name` (or returns it if already
    /// declared) and creates it in every step scope held, live or parked; a
    /// step scope that already holds `name` locally keeps that variable.
    /// Declare before the loop: O(step scopes held × step variables).
    ///
    /// # Errors
    /// [`Error::InvalidName`] or [`Error::ForeignSymbol`] for `name`;
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] if the parent scope (or
    /// a held step scope) was deleted, or `tree` is not the tree of the parent.
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// steps.push(&mut tree)?;
    /// let h = steps.declare(&mut tree, "h")?; // also created in step 0
    /// assert_eq!(tree.var_name(steps.var(h, 0)?)?, "h");
    /// assert_eq!(steps.declare(&mut tree, "h")?, h);
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn declare(&mut self, tree: &mut ScopeTree, name: impl Name) -> Result<StepVar, StepError> {
        tree.check_scope(self.parent)?;
        let sym = tree.intern_pinned(name.as_name_ref())?;
        if let Some(col) = self.syms.iter().position(|&s| s == sym) {
            return Ok(self.step_var_at(col));
        }
        let stride = self.syms.len();
        let mut vars = Vec::with_capacity(self.scopes.len() * (stride + 1));
        for (slot, &scope) in self.scopes.iter().enumerate() {
            vars.extend_from_slice(&self.vars[slot * stride..(slot + 1) * stride]);
            vars.push(tree.var(scope, tree.symbol_of(sym))?);
        }
        self.vars = vars;
        self.syms.push(sym);
        self.moved.reserve(self.syms.len());
        Ok(self.step_var_at(stride))
    }

    fn step_var_at(&self, col: usize) -> StepVar {
        StepVar {
            owner: self.id,
            col: col as u32,
            sym: self.syms[col],
        }
    }

    /// The declared step variable `name`, if any. O(step variables).
    ///
    /// # Errors
    /// [`Error::InvalidName`] or [`Error::ForeignSymbol`] for `name`.
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// steps.declare(&mut tree, "h")?;
    /// assert!(steps.step_var(&tree, "c")?.is_none());
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn step_var(
        &self,
        tree: &ScopeTree,
        name: impl Name,
    ) -> Result<Option<StepVar>, StepError> {
        let Some(sym) = tree.lookup_name(name.as_name_ref())? else {
            return Ok(None);
        };
        Ok(self
            .syms
            .iter()
            .position(|&s| s == sym)
            .map(|col| self.step_var_at(col)))
    }

    /// Opens the next step and returns its number `t` (0 for the first step
    /// after [`new`](Self::new) or [`recycle`](Self::recycle)). Its scope holds
    /// one variable per declared [`StepVar`].
    ///
    /// The scope is a parked one if the step scopes hold one (after a
    /// `recycle`; no arena work at all), else a new kid of the parent. A
    /// parked scope deleted meanwhile (say by `drop_kids` on the parent) is
    /// replaced by a new one. With a
    /// window full, step `t - window` is recycled into step `t`: its handles
    /// go stale and its values move to step `t`'s variables. O(step
    /// variables), plus, with a full window, the size of the recycled step's
    /// subtree (any sub-scopes or extra variables added to it); no heap
    /// allocation once the arena has room.
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] if the parent was
    /// deleted or `tree` is not its tree.
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// assert_eq!(steps.push(&mut tree)?, 0);
    /// assert_eq!(steps.push(&mut tree)?, 1);
    /// assert_eq!(tree.parent(steps.scope(1)?)?, Some(tree.root()));
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn push(&mut self, tree: &mut ScopeTree) -> Result<usize, StepError> {
        tree.check_scope(self.parent)?;
        let t = self.end;
        let slot = self.slot_of(t);
        if let Some(w) = self.window {
            if self.end - self.first == w.get() {
                self.renew_slot(tree, slot)?;
                self.first += 1;
            }
        }
        if slot == self.scopes.len() {
            let scope = tree.new_scope(self.parent)?;
            self.scopes.push(scope);
            for &sym in &self.syms {
                self.vars.push(tree.insert_var(scope.key, sym));
            }
        } else if !tree.contains_scope(self.scopes[slot]) {
            // A parked scope deleted behind our back (`drop_kids` on the
            // parent): replace it rather than open a stale step.
            self.renew_slot(tree, slot)?;
        }
        self.end += 1;
        Ok(t)
    }

    /// Ends the sequence: every live step's scope and variables are replaced
    /// by fresh ones in the same arena slots (so every handle into a live
    /// step reports stale from now on, and never resolves to the new step),
    /// each value moving to its successor. The new scopes are parked: the next
    /// [`push`](Self::push)es reuse them, starting again at step 0.
    ///
    /// O(live steps × step variables); no heap allocation in steady state
    /// (freed arena slots are re-taken, value boxes are moved).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] if the parent was
    /// deleted or `tree` is not its tree.
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// let h = steps.declare(&mut tree, "h")?;
    /// steps.push(&mut tree)?;
    /// let old = steps.var(h, 0)?;
    /// tree.set(old, vec![1.0_f32; 8])?;
    /// steps.recycle(&mut tree)?;
    /// assert!(!tree.contains_var(old));
    /// steps.push(&mut tree)?;
    /// let new = steps.var(h, 0)?;
    /// assert_ne!(new, old);
    /// assert_eq!(tree.get::<Vec<f32>>(new)?.len(), 8); // the buffer was kept
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn recycle(&mut self, tree: &mut ScopeTree) -> Result<(), StepError> {
        tree.check_scope(self.parent)?;
        for t in self.first..self.end {
            let slot = self.slot_of(t);
            self.renew_slot(tree, slot)?;
        }
        self.first = 0;
        self.end = 0;
        Ok(())
    }

    /// Deletes every step scope held, live or parked, with its variables and
    /// values; every handle into them reports stale. The step variables stay
    /// declared and the next [`push`](Self::push) creates step 0 afresh.
    /// O(step scopes × step variables).
    ///
    /// # Errors
    /// [`Error::ForeignScope`] if `tree` is not the tree of the parent. Step
    /// scopes already deleted by other means are skipped.
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// for _ in 0..4 {
    ///     steps.push(&mut tree)?;
    /// }
    /// steps.drop_all(&mut tree)?;
    /// assert_eq!(tree.scope_count(), 1);
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn drop_all(&mut self, tree: &mut ScopeTree) -> Result<(), StepError> {
        if self.parent.tree() != tree.tag() {
            return Err(Error::ForeignScope {
                scope: self.parent,
                tree: tree.tag(),
            }
            .into());
        }
        for &scope in &self.scopes {
            match tree.delete_scope(scope) {
                Ok(()) | Err(Error::StaleScope { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.scopes.clear();
        self.vars.clear();
        self.first = 0;
        self.end = 0;
        Ok(())
    }

    /// Frees slot `slot`'s scope and variables and takes fresh ones, moving
    /// the values over. A scope deleted behind our back is simply replaced.
    fn renew_slot(&mut self, tree: &mut ScopeTree, slot: usize) -> Result<(), StepError> {
        let stride = self.syms.len();
        let cols = slot * stride..(slot + 1) * stride;
        self.moved.clear();
        for v in &self.vars[cols.clone()] {
            let value = tree.arena_mut().var_mut(v.key).and_then(VarSlot::take_box);
            self.moved.push(value);
        }
        match tree.delete_scope(self.scopes[slot]) {
            Ok(()) | Err(Error::StaleScope { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let scope = tree.new_scope(self.parent)?;
        self.scopes[slot] = scope;
        for ((v, &sym), value) in self.vars[cols]
            .iter_mut()
            .zip(&self.syms)
            .zip(self.moved.drain(..))
        {
            *v = tree.insert_var(scope.key, sym);
            if let Some(s) = tree.arena_mut().var_mut(v.key) {
                s.put_box(value);
            }
        }
        Ok(())
    }

    #[inline]
    fn slot_of(&self, t: usize) -> usize {
        match self.window {
            Some(w) => t % w.get(),
            None => t,
        }
    }

    #[cold]
    fn no_step(&self, step: usize) -> StepError {
        StepError::NoSuchStep {
            step,
            first: self.first,
            end: self.end,
            scope: self.parent_path.clone(),
        }
    }

    /// The scope of live step `t`. O(1).
    ///
    /// # Errors
    /// [`StepError::NoSuchStep`] if step `t` is not live (not pushed yet,
    /// recycled, or out of the window).
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// steps.push(&mut tree)?;
    /// assert!(tree.contains_scope(steps.scope(0)?));
    /// assert!(steps.scope(1).is_err());
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    #[inline]
    pub fn scope(&self, t: usize) -> Result<ScopeId, StepError> {
        if t < self.first || t >= self.end {
            return Err(self.no_step(t));
        }
        Ok(self.scopes[self.slot_of(t)])
    }

    /// The variable `sv` of live step `t`: bounds and owner checks, a modulo
    /// for a windowed set, and an array index; no string lookup. O(1).
    ///
    /// # Errors
    /// [`StepError::NoSuchStep`] if step `t` is not live;
    /// [`StepError::ForeignStepVar`] if `sv` was declared by other step scopes.
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// let h = steps.declare(&mut tree, "h")?;
    /// let t = steps.push(&mut tree)?;
    /// assert_eq!(tree.owner(steps.var(h, t)?)?, steps.scope(t)?);
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    #[inline]
    pub fn var(&self, sv: StepVar, t: usize) -> Result<VarId, StepError> {
        if sv.owner != self.id {
            return Err(self.foreign_step_var(sv));
        }
        if t < self.first || t >= self.end {
            return Err(self.no_step(t));
        }
        Ok(self.vars[self.slot_of(t) * self.syms.len() + sv.col as usize])
    }

    #[cold]
    fn foreign_step_var(&self, sv: StepVar) -> StepError {
        StepError::ForeignStepVar {
            name: format!("#{} (symbol {})", sv.col, sv.sym),
            scope: self.parent_path.clone(),
        }
    }

    /// The parent scope of the step scopes. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let tree = ScopeTree::new();
    /// let steps = StepScopes::new(&tree, tree.root())?;
    /// assert_eq!(steps.parent(), tree.root());
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn parent(&self) -> ScopeId {
        self.parent
    }

    /// Number of live steps. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// steps.push(&mut tree)?;
    /// assert_eq!(steps.len(), 1);
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn len(&self) -> usize {
        self.end - self.first
    }

    /// Whether no step is live. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let tree = ScopeTree::new();
    /// assert!(StepScopes::new(&tree, tree.root())?.is_empty());
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.end == self.first
    }

    /// The oldest live step (0 unless a window dropped older ones). O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::ping_pong(&tree, tree.root())?;
    /// for _ in 0..3 {
    ///     steps.push(&mut tree)?;
    /// }
    /// assert_eq!(steps.first(), 1);
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn first(&self) -> usize {
        self.first
    }

    /// One past the newest live step: the number the next
    /// [`push`](Self::push) returns. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// steps.push(&mut tree)?;
    /// assert_eq!(steps.end(), 1);
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn end(&self) -> usize {
        self.end
    }

    /// The window (`None`: every step is kept until `recycle`). O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let tree = ScopeTree::new();
    /// let pp = StepScopes::ping_pong(&tree, tree.root())?;
    /// assert_eq!(pp.window().map(|w| w.get()), Some(2));
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn window(&self) -> Option<NonZeroUsize> {
        self.window
    }

    /// Number of step scopes held in the tree, live and parked. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// steps.push(&mut tree)?;
    /// steps.recycle(&mut tree)?;
    /// assert_eq!((steps.len(), steps.scope_count()), (0, 1));
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn scope_count(&self) -> usize {
        self.scopes.len()
    }

    /// Number of declared step variables. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// steps.declare(&mut tree, "h")?;
    /// steps.declare(&mut tree, "c")?;
    /// assert_eq!(steps.step_var_count(), 2);
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn step_var_count(&self) -> usize {
        self.syms.len()
    }

    /// The live steps and their scopes, oldest first. O(1) per item.
    ///
    /// ```
    /// use scopetree::{ScopeTree, StepScopes};
    /// let mut tree = ScopeTree::new();
    /// let mut steps = StepScopes::new(&tree, tree.root())?;
    /// steps.push(&mut tree)?;
    /// steps.push(&mut tree)?;
    /// let ts: Vec<usize> = steps.scopes().map(|(t, _)| t).collect();
    /// assert_eq!(ts, [0, 1]);
    /// # Ok::<(), scopetree::StepError>(())
    /// ```
    pub fn scopes(&self) -> impl Iterator<Item = (usize, ScopeId)> + '_ {
        (self.first..self.end).map(|t| (t, self.scopes[self.slot_of(t)]))
    }
}
