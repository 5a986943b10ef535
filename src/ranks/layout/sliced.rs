//! [`SlicedState`]: optimizer state that the ranks hold sliced (ZeRO
//! stage 1), each rank the piece of each tensor that a partition of the
//! plan's variables gives it; what a plan keeps of it ([`StateLayout`]);
//! and a rank's pieces bound to its tree's variables ([`BoundState`]).

use std::any::Any;

use super::partition::{Partition, Piece};
use crate::checkpoint::Filter;
use crate::ranks::error::Error;
use crate::ranks::vars::access::Types;
use crate::ranks::vars::manifest::Manifest;
use crate::ranks::vars::values::Slot;
use crate::{ScopeId, ScopeTree, VarId};

/// Optimizer state that the ranks hold sliced, as ZeRO stage 1 does: for
/// each variable of a plan (those [`of`](Self::of) keeps), one tensor of
/// the same dtype and element count per suffix (Adam's `@M` and `@V`, say),
/// of which each rank holds only its piece: the elements that the plan's
/// [`state_partition`](crate::ranks::SyncPlan::state_partition) gives it, as a
/// flat variable (`Vec`, `Box<[_]>` or a 1-D
/// [`Tensor`](crate::checkpoint::Tensor)) named `<key><suffix>` under the
/// state's `scope` (`optim/w@M` for the plan's variable `w`). A rank holds
/// no variable for a tensor it has no piece of.
///
/// Given to a plan with [`PlanOptions::sliced_state`](crate::ranks::PlanOptions::sliced_state),
/// its [`save_shards`](crate::ranks::SyncPlan::save_shards) writes the state as
/// whole tensors, each by one rank, in shards of its own beside the
/// parameters (`optimizer-0000k-of-0000N.safetensors` and
/// `optimizer.safetensors.index.json`): only the pieces of the tensors
/// that two ranks' slices split move between ranks. Its
/// [`load_shards`](crate::ranks::SyncPlan::load_shards) cuts the tensors again for
/// any number of ranks.
///
/// ```
/// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SlicedState, SyncPlan}};
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// tree.set(w, vec![1.0_f32; 6])?;
/// let optim = tree.new_named_scope(tree.root(), "optim")?;
/// let state = SlicedState::new(optim, ["@M"]).of(|key| key == "w");
/// let opts = PlanOptions::new().filter(|key| key == "w").sliced_state(state);
/// let plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &opts)?;
/// // One rank holds every element: optim/w@M of 6 elements.
/// let piece = plan.state_partition().expect("sliced state").pieces(0)[0];
/// let m = tree.var(optim, "w@M")?;
/// tree.set(m, vec![0.0_f32; piece.len])?;
/// assert_eq!(piece.len, 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct SlicedState {
    scope: ScopeId,
    suffixes: Vec<String>,
    of: Option<Filter>,
}

impl std::fmt::Debug for SlicedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlicedState")
            .field("scope", &self.scope)
            .field("suffixes", &self.suffixes)
            .field("of", &self.of.is_some())
            .finish()
    }
}

impl SlicedState {
    /// State under `scope`, one tensor per suffix for every variable of the
    /// plan. O(suffixes).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::SlicedState};
    /// let tree = ScopeTree::new();
    /// let s = SlicedState::new(tree.root(), ["@M", "@V"]);
    /// assert_eq!(s.suffixes(), ["@M", "@V"]);
    /// ```
    pub fn new(scope: ScopeId, suffixes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            scope,
            suffixes: suffixes.into_iter().map(Into::into).collect(),
            of: None,
        }
    }

    /// Only the plan's variables whose keys `keep` keeps carry state (by
    /// default, all of them). O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::SlicedState};
    /// let tree = ScopeTree::new();
    /// let _ = SlicedState::new(tree.root(), ["@M"]).of(|key| !key.contains('/'));
    /// ```
    #[must_use]
    pub fn of(mut self, keep: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.of = Some(std::sync::Arc::new(keep));
        self
    }

    /// The scope the state's variables live under. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::SlicedState};
    /// let tree = ScopeTree::new();
    /// assert_eq!(SlicedState::new(tree.root(), ["@M"]).scope(), tree.root());
    /// ```
    pub fn scope(&self) -> ScopeId {
        self.scope
    }

    /// The suffixes, one tensor each per variable. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::SlicedState};
    /// let tree = ScopeTree::new();
    /// assert_eq!(SlicedState::new(tree.root(), ["@M"]).suffixes(), ["@M"]);
    /// ```
    pub fn suffixes(&self) -> &[String] {
        &self.suffixes
    }
}

/// What a plan keeps of its sliced state: which of its variables carry
/// state, their partition, and the rank that holds each tensor whole in a
/// save or a load.
pub(in crate::ranks) struct StateLayout {
    pub(in crate::ranks) spec: SlicedState,
    /// The plan's variables that carry state, as manifest indices.
    pub(in crate::ranks) vars: Vec<usize>,
    /// Their partition across the ranks (indices into `vars`).
    pub(in crate::ranks) partition: Partition,
    /// Per variable of `vars`: every rank's piece of it, in rank order.
    pub(in crate::ranks) owners: Vec<Vec<(usize, Piece)>>,
    /// Per variable of `vars`: the rank that holds its tensors whole in
    /// saves and loads, the owner of its middle element (rank 0 for an
    /// empty one), so that only the pieces of split tensors move.
    pub(in crate::ranks) holders: Vec<usize>,
}

impl StateLayout {
    /// The layout of `spec` over `manifest`'s variables, for `ranks` ranks.
    /// O(variables + ranks).
    ///
    /// # Errors
    /// As [`Partition::new`].
    pub(in crate::ranks) fn new(
        spec: SlicedState,
        manifest: &Manifest,
        ranks: usize,
    ) -> Result<Self, Error> {
        let keep = spec.of.clone();
        let (sub, vars) = manifest.subset(&|key| keep.as_ref().is_none_or(|k| k(key)));
        let partition = Partition::new(&sub, ranks)?;
        let mut owners = vec![Vec::new(); vars.len()];
        for r in 0..ranks {
            for p in partition.pieces(r) {
                owners[p.var].push((r, *p));
            }
        }
        let holders = owners
            .iter()
            .enumerate()
            .map(|(j, pieces)| {
                let n: usize = sub.entries()[j].shape.iter().product();
                pieces
                    .iter()
                    .find(|(_, p)| p.elems().contains(&(n / 2)))
                    .map_or(0, |&(r, _)| r)
            })
            .collect();
        Ok(Self {
            spec,
            vars,
            partition,
            owners,
            holders,
        })
    }
}

/// One tensor of the state: its key in the checkpoint, and the variable
/// of [`StateLayout::vars`] it belongs to.
pub(in crate::ranks) struct StateTensor {
    pub(in crate::ranks) key: String,
    pub(in crate::ranks) var: usize,
}

/// A rank's sliced state bound to its tree: every tensor of the state, in
/// key order, and this rank's pieces with their variables.
pub(in crate::ranks) struct BoundState {
    pub(in crate::ranks) tensors: Vec<StateTensor>,
    /// Per tensor (as `tensors`): this rank's piece and its variable.
    pub(in crate::ranks) mine: Vec<Option<(Piece, Slot)>>,
}

/// The variable at `rel` (a `/`-separated path) under `scope`, if any.
/// O(depth).
fn find(tree: &ScopeTree, scope: ScopeId, rel: &str) -> Result<Option<VarId>, Error> {
    let mut at = scope;
    let mut parts = rel.split('/').peekable();
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            return Ok(tree.find_local_var(at, part)?);
        }
        match tree.kid(at, part)? {
            Some(kid) => at = kid,
            None => return Ok(None),
        }
    }
    Ok(None)
}

impl StateLayout {
    /// Binds this rank's pieces (`rank`'s, by the layout's partition) to
    /// the variables of `tree`, the plan's being `manifest` over the scope
    /// at `plan_path`. O(variables × suffixes × depth).
    ///
    /// # Errors
    /// [`Error::BadState`] for a piece whose variable is missing or holds
    /// another type or length, and for a variable of a piece the rank does
    /// not own; [`Error::BadOption`] when the state's scope lies outside the
    /// plan's; [`Error::Tree`] for a stale scope.
    pub(in crate::ranks) fn bind(
        &self,
        tree: &ScopeTree,
        manifest: &Manifest,
        rank: usize,
    ) -> Result<BoundState, Error> {
        let scope = self.spec.scope;
        let state_path = tree.path(scope)?;
        let plan_path = manifest.scope();
        let prefix = if plan_path.is_empty() {
            state_path.clone()
        } else if state_path == plan_path {
            String::new()
        } else if let Some(rest) = state_path
            .strip_prefix(plan_path)
            .and_then(|r| r.strip_prefix('/'))
        {
            rest.to_owned()
        } else {
            return Err(Error::BadOption {
                reason: format!(
                    "the sliced state's scope `{}` lies outside the plan's scope `{}`; \
                     put it under the plan's scope",
                    crate::short::path(&state_path),
                    crate::short::path(plan_path)
                ),
            });
        };
        let types = Types::new();
        let mut both = Vec::with_capacity(self.vars.len() * self.spec.suffixes.len());
        for (j, &i) in self.vars.iter().enumerate() {
            let entry = &manifest.entries()[i];
            let piece = self.owners[j]
                .iter()
                .find(|(r, _)| *r == rank)
                .map(|&(_, p)| p);
            for suffix in &self.spec.suffixes {
                let rel = format!("{}{suffix}", entry.key);
                let bad = |reason: String| Error::BadState {
                    key: rel.clone(),
                    scope: state_path.clone(),
                    reason,
                };
                let var = find(tree, scope, &rel)?;
                let access = var
                    .and_then(|v| tree.value_any(v))
                    .and_then(|v| Some((types.get(Any::type_id(v))?, v)));
                let slot = match (var, access) {
                    (None, _) if piece.is_none() => None,
                    (None, _) => {
                        let p = piece.unwrap_or(Piece {
                            var: j,
                            start: 0,
                            len: 0,
                        });
                        return Err(bad(format!(
                            "missing; this rank holds elements {}..{} of `{}`",
                            p.start,
                            p.start + p.len,
                            crate::short::name(&entry.key)
                        )));
                    }
                    (Some(id), None) => {
                        return Err(bad(format!(
                            "holds {}, not a flat value of {:?}",
                            tree.type_name(id)?.unwrap_or("no value"),
                            entry.dtype
                        )));
                    }
                    (Some(id), Some((access, value))) => {
                        let nbytes = (access.bytes)(tree, id)?.len();
                        let size = entry.dtype.bitsize() / 8;
                        let want = piece.map_or(0, |p| p.len);
                        let shape = access.shape(value).unwrap_or_default();
                        if access.dtype != entry.dtype || nbytes != want * size || shape.len() > 1 {
                            return Err(bad(format!(
                                "{:?} {shape:?}, where this rank's piece is {:?} [{want}]",
                                access.dtype, entry.dtype
                            )));
                        }
                        piece.map(|p| (p, Slot { id, access, nbytes }))
                    }
                };
                let key = if prefix.is_empty() {
                    rel.clone()
                } else {
                    format!("{prefix}/{rel}")
                };
                let tensor = StateTensor { key, var: j };
                both.push((tensor, slot));
            }
        }
        // Key order, as a save writes them and a load checks them.
        both.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        let (tensors, mine) = both.into_iter().unzip();
        Ok(BoundState { tensors, mine })
    }
}
