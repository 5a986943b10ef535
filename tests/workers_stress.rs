//! Stress test of the worker split (`split_workers`, `run_workers`,
//! `WorkerScope`): threads hammer their own subtrees, read the shared
//! parameters and try every forbidden access, while between rounds the main
//! thread reshapes the tree. A plain model (handle -> scope, name, value)
//! predicts the outcome of every worker call and the whole tree after every
//! round: nothing lost, nothing written to the wrong variable, no handle that
//! resolves after its variable died.
//!
//! Deterministic: every choice comes from a seeded generator, and the workers
//! touch disjoint variables, so the outcomes do not depend on thread
//! interleaving. `SCOPETREE_STRESS_ROUNDS` raises the number of rounds.

use std::collections::{HashMap, HashSet};

use scopetree::{Error, ScopeId, ScopeTree, VarId, WorkerAccessReason, WorkerError, WorkerScope};

/// splitmix64: small, seedable, good enough to pick test moves.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> Option<T> {
        if xs.is_empty() {
            None
        } else {
            Some(xs[self.below(xs.len())])
        }
    }
}

/// What a worker call returned, in a comparable form.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Val(u64),
    Done,
    Err(Kind),
    /// End of a worker's run: how many split-long shared borrows it held and
    /// whether they all still read what they read when taken.
    Held(usize, bool),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Stale,
    Foreign,
    ReadOnly,
    OtherWorker,
    NotShared,
    Aliased,
    Uninit,
    TypeMismatch,
    Unexpected(String),
}

fn kind(e: &WorkerError) -> Kind {
    match e {
        WorkerError::Tree(Error::StaleVar { .. }) => Kind::Stale,
        WorkerError::Tree(Error::ForeignVar { .. }) => Kind::Foreign,
        WorkerError::WorkerAccess { reason, .. } => match reason {
            WorkerAccessReason::ReadOnly => Kind::ReadOnly,
            WorkerAccessReason::OtherWorker => Kind::OtherWorker,
            WorkerAccessReason::NotShared => Kind::NotShared,
            other => Kind::Unexpected(format!("{other:?}")),
        },
        WorkerError::Tree(Error::AliasedVar { .. }) => Kind::Aliased,
        WorkerError::Tree(Error::Uninitialized { .. }) => Kind::Uninit,
        WorkerError::Tree(Error::TypeMismatch { .. }) => Kind::TypeMismatch,
        other => Kind::Unexpected(other.to_string()),
    }
}

/// One call a worker makes.
#[derive(Copy, Clone, Debug)]
enum WOp {
    /// `*get_mut::<u64>(v) += k`.
    Add(VarId, u64),
    /// `set(v, k)`.
    Set(VarId, u64),
    /// `get_disjoint_mut::<u64, 3>`: `(a, b, c) = (b, c, a + 1)`, returns the sum.
    Rotate([VarId; 3]),
    /// `get_or_insert_with(v, || k)`, then `v = 3v + 1`.
    InitOr(VarId, u64),
    /// `get::<u64>(v)`.
    Read(VarId),
    /// `shared::<u64>(v)`, the borrow held to the end of the run.
    Shared(VarId),
    /// `get::<f32>(v)` of a `u64`.
    WrongType(VarId),
    /// `owns(v)`.
    Owns(VarId),
}

fn run_ops(mut wk: WorkerScope<'_>, ops: &[WOp]) -> Vec<Outcome> {
    let mut out = Vec::with_capacity(ops.len() + 1);
    let mut held: Vec<(&u64, u64)> = Vec::new();
    let res = |r: Result<u64, WorkerError>| match r {
        Ok(v) => Outcome::Val(v),
        Err(e) => Outcome::Err(kind(&e)),
    };
    for op in ops {
        let o = match *op {
            WOp::Add(v, k) => res(wk.get_mut::<u64>(v).map(|x| {
                *x = x.wrapping_add(k);
                *x
            })),
            WOp::Set(v, k) => match wk.set(v, k) {
                Ok(()) => Outcome::Done,
                Err(e) => Outcome::Err(kind(&e)),
            },
            WOp::Rotate(vs) => res(wk.get_disjoint_mut::<u64, 3>(vs).map(|[a, b, c]| {
                let (x, y, z) = (*a, *b, *c);
                (*a, *b, *c) = (y, z, x.wrapping_add(1));
                x.wrapping_add(y).wrapping_add(z).wrapping_add(1)
            })),
            WOp::InitOr(v, k) => res(wk.get_or_insert_with(v, || k).map(|x| {
                *x = x.wrapping_mul(3).wrapping_add(1);
                *x
            })),
            WOp::Read(v) => res(wk.get::<u64>(v).copied()),
            WOp::Shared(v) => res(wk.shared::<u64>(v).map(|r| {
                held.push((r, *r));
                *r
            })),
            WOp::WrongType(v) => res(wk.get::<f32>(v).map(|_| 0)),
            WOp::Owns(v) => Outcome::Val(u64::from(wk.owns(v))),
        };
        out.push(o);
    }
    out.push(Outcome::Held(
        held.len(),
        held.iter().all(|&(r, v)| *r == v),
    ));
    out
}

struct VarInfo {
    scope: ScopeId,
    name: String,
    value: Option<u64>,
}

/// Where a variable lies for one worker of a split.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Side {
    Own,
    Other,
    Shared,
    Stale,
    Foreign,
}

/// The tree and the model of what it must hold.
struct World {
    tree: ScopeTree,
    /// A variable of another tree, for foreign handles.
    foreign: VarId,
    foreign_scope: ScopeId,
    model_scope: ScopeId,
    /// Live scopes and their parents (`None` for the root).
    scopes: HashMap<ScopeId, Option<ScopeId>>,
    vars: HashMap<VarId, VarInfo>,
    /// Worker top scopes: kids of `model_scope`, never nested.
    tops: Vec<ScopeId>,
    dead_vars: Vec<VarId>,
    dead_scopes: Vec<ScopeId>,
    names: u64,
    rng: Rng,
}

impl World {
    fn new(seed: u64, workers: usize) -> Result<Self, Error> {
        let mut other = ScopeTree::new();
        let foreign = other.var(other.root(), "w")?;
        other.set(foreign, 1_u64)?;
        let foreign_scope = other.new_scope(other.root())?;
        let mut tree = ScopeTree::new();
        let root = tree.root();
        let model_scope = tree.new_named_scope(root, "model")?;
        let mut w = World {
            tree,
            foreign,
            foreign_scope,
            model_scope,
            scopes: HashMap::from([(root, None), (model_scope, Some(root))]),
            vars: HashMap::new(),
            tops: Vec::new(),
            dead_vars: Vec::new(),
            dead_scopes: Vec::new(),
            names: 0,
            rng: Rng(seed),
        };
        for _ in 0..6 {
            w.new_var(root, true)?;
            w.new_var(model_scope, true)?;
        }
        w.new_var(root, false)?; // a shared variable that stays uninitialised
        for _ in 0..workers {
            w.new_worker()?;
        }
        Ok(w)
    }

    fn fresh_name(&mut self, prefix: &str) -> String {
        self.names += 1;
        format!("{prefix}{}", self.names)
    }

    fn new_var(&mut self, scope: ScopeId, init: bool) -> Result<VarId, Error> {
        let name = self.fresh_name("v");
        let v = self.tree.create_var(scope, name.as_str())?;
        let value = init.then(|| self.rng.next() % 1000);
        if let Some(x) = value {
            self.tree.set(v, x)?;
        }
        self.vars.insert(v, VarInfo { scope, name, value });
        Ok(v)
    }

    fn new_scope(&mut self, parent: ScopeId) -> Result<ScopeId, Error> {
        let s = if self.rng.chance(50) {
            let name = self.fresh_name("s");
            self.tree.new_named_scope(parent, name)?
        } else {
            self.tree.new_scope(parent)?
        };
        self.scopes.insert(s, Some(parent));
        Ok(s)
    }

    /// A new worker top under the model scope, with variables and sub-scopes.
    fn new_worker(&mut self) -> Result<ScopeId, Error> {
        let top = self.new_scope(self.model_scope)?;
        self.tops.push(top);
        let mut here = vec![top];
        for _ in 0..3 {
            let parent = self.rng.pick(&here).unwrap_or(top);
            here.push(self.new_scope(parent)?);
        }
        for _ in 0..12 {
            let s = self.rng.pick(&here).unwrap_or(top);
            let init = self.rng.chance(85);
            self.new_var(s, init)?;
        }
        Ok(top)
    }

    /// The subtree of `top` in the model (itself included).
    fn subtree(&self, top: ScopeId) -> HashSet<ScopeId> {
        let mut out = HashSet::from([top]);
        loop {
            let before = out.len();
            for (&s, &p) in &self.scopes {
                if p.is_some_and(|p| out.contains(&p)) {
                    out.insert(s);
                }
            }
            if out.len() == before {
                return out;
            }
        }
    }

    fn is_under(&self, mut s: ScopeId, top: ScopeId) -> bool {
        loop {
            if s == top {
                return true;
            }
            match self.scopes.get(&s).copied().flatten() {
                Some(p) => s = p,
                None => return false,
            }
        }
    }

    /// Deletes `s` in the tree and the model.
    fn delete(&mut self, s: ScopeId) -> Result<(), Error> {
        let doomed = self.subtree(s);
        self.tree.delete_scope(s)?;
        for d in &doomed {
            self.scopes.remove(d);
            self.dead_scopes.push(*d);
        }
        let dead: Vec<VarId> = self
            .vars
            .iter()
            .filter(|(_, i)| doomed.contains(&i.scope))
            .map(|(&v, _)| v)
            .collect();
        for v in dead {
            self.vars.remove(&v);
            self.dead_vars.push(v);
        }
        self.tops.retain(|t| !doomed.contains(t));
        Ok(())
    }

    fn live_vars(&self) -> Vec<VarId> {
        let mut v: Vec<VarId> = self.vars.keys().copied().collect();
        v.sort();
        v
    }

    fn live_scopes(&self) -> Vec<ScopeId> {
        let mut s: Vec<ScopeId> = self.scopes.keys().copied().collect();
        s.sort();
        s
    }

    /// The main thread's turn: reshape the tree and write anything.
    fn mutate(&mut self) -> Result<(), Error> {
        let root = self.tree.root();
        for _ in 0..4 + self.rng.below(12) {
            let scopes = self.live_scopes();
            let vars = self.live_vars();
            match self.rng.below(10) {
                0 | 1 => {
                    let parent = self.rng.pick(&scopes).unwrap_or(root);
                    let s = self.new_scope(parent)?;
                    for _ in 0..self.rng.below(4) {
                        let init = self.rng.chance(80);
                        self.new_var(s, init)?;
                    }
                }
                2 => {
                    // Any scope but the root, the model scope and the tops'
                    // ancestors (the root and the model scope).
                    let cands: Vec<ScopeId> = scopes
                        .iter()
                        .copied()
                        .filter(|&s| s != root && s != self.model_scope)
                        .collect();
                    if let Some(s) = self.rng.pick(&cands) {
                        self.delete(s)?;
                    }
                }
                3 => {
                    if self.tops.len() > 1 && self.rng.chance(40) {
                        let tops = self.tops.clone();
                        let t = self.rng.pick(&tops).unwrap_or(root);
                        self.delete(t)?;
                    }
                    if self.tops.len() < 6 {
                        self.new_worker()?;
                    }
                }
                4 | 5 => {
                    let s = self.rng.pick(&scopes).unwrap_or(root);
                    let init = self.rng.chance(80);
                    self.new_var(s, init)?;
                }
                6 => {
                    if let Some(v) = self.rng.pick(&vars) {
                        self.tree.remove_var(v)?;
                        self.vars.remove(&v);
                        self.dead_vars.push(v);
                    }
                }
                7 => {
                    if let Some(v) = self.rng.pick(&vars) {
                        let x = self.rng.next() % 1000;
                        self.tree.set(v, x)?;
                        if let Some(i) = self.vars.get_mut(&v) {
                            i.value = Some(x);
                        }
                    }
                }
                8 => {
                    if let Some(v) = self.rng.pick(&vars) {
                        let new = self.fresh_name("r");
                        let Some(info) = self.vars.get_mut(&v) else {
                            continue;
                        };
                        let same =
                            self.tree
                                .rename(info.scope, info.name.as_str(), new.as_str())?;
                        assert_eq!(same, v, "rename keeps the handle");
                        info.name = new;
                    }
                }
                _ => {
                    if let Some(v) = self.rng.pick(&vars) {
                        self.tree.clear(v)?;
                        if let Some(i) = self.vars.get_mut(&v) {
                            i.value = None;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The whole tree against the model.
    fn check(&self, when: &str) -> Result<(), Error> {
        let t = &self.tree;
        assert_eq!(t.scope_count(), self.scopes.len(), "{when}: scope count");
        assert_eq!(t.var_count(), self.vars.len(), "{when}: variable count");
        for (&v, info) in &self.vars {
            assert_eq!(t.owner(v)?, info.scope, "{when}: owner of {v:?}");
            assert_eq!(t.var_name(v)?, info.name, "{when}: name of {v:?}");
            match (info.value, t.get::<u64>(v)) {
                (Some(x), Ok(&y)) => assert_eq!(x, y, "{when}: value of {}", info.name),
                (None, Err(Error::Uninitialized { .. })) => {}
                (want, got) => panic!("{when}: {} should be {want:?}, is {got:?}", info.name),
            }
        }
        let mut seen = 0;
        for (s, _) in t.descendants(t.root())? {
            assert!(self.scopes.contains_key(&s), "{when}: unknown scope {s:?}");
            assert_eq!(t.parent(s)?, self.scopes[&s], "{when}: parent of {s:?}");
            for (name, v) in t.local_vars(s)? {
                let info = self.vars.get(&v).unwrap_or_else(|| {
                    panic!("{when}: variable {name} ({v:?}) is not in the model")
                });
                assert_eq!((info.scope, info.name.as_str()), (s, name), "{when}");
                seen += 1;
            }
        }
        assert_eq!(
            seen,
            self.vars.len(),
            "{when}: variables reachable from the root"
        );
        for &d in &self.dead_vars {
            assert!(!t.contains_var(d), "{when}: dead {d:?} resolves");
            assert!(
                matches!(t.get::<u64>(d), Err(Error::StaleVar { var }) if var == d),
                "{when}: dead {d:?} not reported stale"
            );
        }
        for &d in &self.dead_scopes {
            assert!(
                matches!(t.parent(d), Err(Error::StaleScope { scope }) if scope == d),
                "{when}: dead scope {d:?} not reported stale"
            );
        }
        Ok(())
    }

    /// The worker scopes of one split: each top, or one scope inside it,
    /// for a random subset of the tops, in random order.
    fn choose_split(&mut self) -> Vec<ScopeId> {
        let mut out = Vec::new();
        for top in self.tops.clone() {
            if self.rng.chance(15) {
                continue; // this worker sits out: its variables are shared
            }
            let inside: Vec<ScopeId> = self.subtree(top).into_iter().collect();
            let mut inside = inside;
            inside.sort();
            let s = if self.rng.chance(25) {
                self.rng.pick(&inside).unwrap_or(top)
            } else {
                top
            };
            out.push(s);
        }
        if out.is_empty() {
            out.extend(self.tops.first());
        }
        for i in (1..out.len()).rev() {
            let j = self.rng.below(i + 1);
            out.swap(i, j);
        }
        out
    }

    fn side(&self, split: &[ScopeId], me: usize, v: VarId) -> Side {
        if v.tree() != self.tree.tag() {
            return Side::Foreign;
        }
        let Some(info) = self.vars.get(&v) else {
            return Side::Stale;
        };
        match split.iter().position(|&w| self.is_under(info.scope, w)) {
            Some(i) if i == me => Side::Own,
            Some(_) => Side::Other,
            None => Side::Shared,
        }
    }

    /// Random calls for worker `me` of `split`, mostly on its own variables.
    fn plan(&mut self, split: &[ScopeId], me: usize, len: usize) -> Vec<WOp> {
        let mut own = Vec::new();
        let mut other = Vec::new();
        let mut shared = Vec::new();
        for v in self.live_vars() {
            match self.side(split, me, v) {
                Side::Own => own.push(v),
                Side::Other => other.push(v),
                _ => shared.push(v),
            }
        }
        let dead_from = self.dead_vars.len().saturating_sub(64);
        let dead = self.dead_vars[dead_from..].to_vec();
        let foreign = self.foreign;
        let mut ops = Vec::with_capacity(len);
        while ops.len() < len {
            let any = |rng: &mut Rng| -> Option<VarId> {
                match rng.below(20) {
                    0..=11 => rng.pick(&own),
                    12..=14 => rng.pick(&shared),
                    15..=17 => rng.pick(&other),
                    18 => rng.pick(&dead),
                    _ => Some(foreign),
                }
            };
            let Some(v) = any(&mut self.rng) else {
                continue;
            };
            let k = self.rng.next() % 1000;
            let op = match self.rng.below(16) {
                0..=3 => WOp::Add(v, k),
                4 | 5 => WOp::Set(v, k),
                6..=8 => {
                    // Mostly three own variables; sometimes repeated or foreign.
                    let mut three = [v; 3];
                    for x in &mut three {
                        *x = if self.rng.chance(90) {
                            self.rng.pick(&own).unwrap_or(v)
                        } else {
                            any(&mut self.rng).unwrap_or(v)
                        };
                    }
                    WOp::Rotate(three)
                }
                9 => WOp::InitOr(v, k),
                10 | 11 => WOp::Read(v),
                12 | 13 => WOp::Shared(v),
                14 => WOp::WrongType(v),
                _ => WOp::Owns(v),
            };
            ops.push(op);
        }
        ops
    }

    /// What worker `me` must see for `ops`; applies its writes to the model.
    fn simulate(&mut self, split: &[ScopeId], me: usize, ops: &[WOp]) -> Vec<Outcome> {
        let mut out = Vec::with_capacity(ops.len() + 1);
        let mut held = 0;
        let err = |side: Side, write: bool| -> Option<Kind> {
            match side {
                Side::Own => None,
                Side::Stale => Some(Kind::Stale),
                Side::Foreign => Some(Kind::Foreign),
                Side::Other => Some(Kind::OtherWorker),
                Side::Shared if write => Some(Kind::ReadOnly),
                Side::Shared => None,
            }
        };
        for op in ops {
            let o = match *op {
                WOp::Add(v, k) => match err(self.side(split, me, v), true) {
                    Some(e) => Outcome::Err(e),
                    None => match self.value_mut(v) {
                        Some(x) => {
                            *x = x.wrapping_add(k);
                            Outcome::Val(*x)
                        }
                        None => Outcome::Err(Kind::Uninit),
                    },
                },
                WOp::Set(v, k) => match err(self.side(split, me, v), true) {
                    Some(e) => Outcome::Err(e),
                    None => {
                        if let Some(i) = self.vars.get_mut(&v) {
                            i.value = Some(k);
                        }
                        Outcome::Done
                    }
                },
                WOp::Rotate(vs) => {
                    let mut fail = None;
                    for (i, &v) in vs.iter().enumerate() {
                        fail = err(self.side(split, me, v), true);
                        if fail.is_none() && self.vars[&v].value.is_none() {
                            fail = Some(Kind::Uninit);
                        }
                        if fail.is_none() && vs[..i].contains(&v) {
                            fail = Some(Kind::Aliased);
                        }
                        if fail.is_some() {
                            break;
                        }
                    }
                    match fail {
                        Some(e) => Outcome::Err(e),
                        None => {
                            let [a, b, c] = vs.map(|v| self.vars[&v].value.unwrap_or(0));
                            for (v, x) in vs.iter().zip([b, c, a.wrapping_add(1)]) {
                                if let Some(i) = self.vars.get_mut(v) {
                                    i.value = Some(x);
                                }
                            }
                            Outcome::Val(a.wrapping_add(b).wrapping_add(c).wrapping_add(1))
                        }
                    }
                }
                WOp::InitOr(v, k) => match err(self.side(split, me, v), true) {
                    Some(e) => Outcome::Err(e),
                    None => {
                        let x = self.value_or_insert(v, k);
                        *x = x.wrapping_mul(3).wrapping_add(1);
                        Outcome::Val(*x)
                    }
                },
                WOp::Read(v) | WOp::WrongType(v) => match err(self.side(split, me, v), false) {
                    Some(e) => Outcome::Err(e),
                    None => match (self.vars[&v].value, op) {
                        (None, _) => Outcome::Err(Kind::Uninit),
                        (Some(_), WOp::WrongType(_)) => Outcome::Err(Kind::TypeMismatch),
                        (Some(x), _) => Outcome::Val(x),
                    },
                },
                WOp::Shared(v) => match self.side(split, me, v) {
                    Side::Own => Outcome::Err(Kind::NotShared),
                    side => match err(side, false) {
                        Some(e) => Outcome::Err(e),
                        None => match self.vars[&v].value {
                            Some(x) => {
                                held += 1;
                                Outcome::Val(x)
                            }
                            None => Outcome::Err(Kind::Uninit),
                        },
                    },
                },
                WOp::Owns(v) => Outcome::Val(u64::from(self.side(split, me, v) == Side::Own)),
            };
            out.push(o);
        }
        out.push(Outcome::Held(held, true));
        out
    }

    fn value_mut(&mut self, v: VarId) -> Option<&mut u64> {
        self.vars.get_mut(&v).and_then(|i| i.value.as_mut())
    }

    fn value_or_insert(&mut self, v: VarId, k: u64) -> &mut u64 {
        let info = self
            .vars
            .get_mut(&v)
            .unwrap_or_else(|| panic!("{v:?} is own"));
        info.value.get_or_insert(k)
    }

    /// Splits that must be refused, and must leave the tree untouched.
    fn try_bad_splits(&mut self, split: &[ScopeId]) -> Result<(), Error> {
        let path = |w: &World, s: ScopeId| w.tree.path(s);
        let Some(a) = self.rng.pick(split) else {
            return Ok(());
        };
        let mut inside: Vec<ScopeId> = self.subtree(a).into_iter().collect();
        inside.sort();
        let d = self.rng.pick(&inside).unwrap_or(a);
        let (pa, pd) = (path(self, a)?, path(self, d)?);
        let model = self.model_scope;
        let pm = path(self, model)?;
        let root_path = String::new();
        // (scopes, the two paths the overlap names, whether the other legal
        // scopes of the split come along: not with an ancestor of them all).
        let cases: Vec<(Vec<ScopeId>, [&String; 2], bool)> = vec![
            (vec![a, a], [&pa, &pa], true),
            (vec![a, d], [&pa, &pd], true),
            (vec![d, a], [&pd, &pa], true),
            (vec![model, a], [&pm, &pa], false),
            (vec![a, self.tree.root()], [&pa, &root_path], false),
        ];
        for (mut pair_scopes, pair, with_rest) in cases {
            // Put the pair among the other legal scopes, keeping its order.
            let mut scopes: Vec<ScopeId> = if with_rest {
                split.iter().copied().filter(|&s| s != a).collect()
            } else {
                Vec::new()
            };
            let at = self.rng.below(scopes.len() + 1);
            let tail = scopes.split_off(at);
            scopes.append(&mut pair_scopes);
            scopes.extend(tail);
            match self.tree.split_workers(&scopes) {
                Err(WorkerError::OverlappingWorkers { scope, other }) => {
                    let mut got = [scope, other];
                    let mut want = pair.map(String::clone);
                    got.sort();
                    want.sort();
                    assert_eq!(got, want, "overlap reported between the wrong scopes");
                }
                Err(e) => panic!("split {scopes:?} failed with {e}, not an overlap"),
                Ok(ws) => panic!(
                    "overlapping split {scopes:?} accepted ({} workers)",
                    ws.len()
                ),
            }
        }
        if let Some(dead) = self.rng.pick(&self.dead_scopes.clone()) {
            let mut scopes = split.to_vec();
            scopes.insert(self.rng.below(scopes.len() + 1), dead);
            assert!(matches!(
                self.tree.split_workers(&scopes),
                Err(WorkerError::Tree(Error::StaleScope { scope })) if scope == dead
            ));
        }
        let mut scopes = split.to_vec();
        scopes.push(self.foreign_scope);
        assert!(matches!(
            self.tree.split_workers(&scopes),
            Err(WorkerError::Tree(Error::ForeignScope { .. }))
        ));
        Ok(())
    }
}

fn rounds(default: usize) -> usize {
    std::env::var("SCOPETREE_STRESS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// One seeded run: `rounds` rounds of mutate / check / split / run / check.
fn stress(seed: u64, rounds: usize, workers: usize, ops: usize) -> Result<(), WorkerError> {
    let mut w = World::new(seed, workers)?;
    w.check("start")?;
    for round in 0..rounds {
        w.mutate()?;
        w.check(&format!("round {round} after mutate"))?;
        let split = w.choose_split();
        w.try_bad_splits(&split)?;
        w.check(&format!("round {round} after refused splits"))?;
        let plans: Vec<Vec<WOp>> = (0..split.len()).map(|i| w.plan(&split, i, ops)).collect();
        let expected: Vec<Vec<Outcome>> = (0..split.len())
            .map(|i| w.simulate(&split, i, &plans[i]))
            .collect();
        // Counts as the split must see them.
        let own_counts: Vec<usize> = (0..split.len())
            .map(|i| {
                w.live_vars()
                    .into_iter()
                    .filter(|&v| w.side(&split, i, v) == Side::Own)
                    .count()
            })
            .collect();
        let owned_total: usize = own_counts.iter().sum();
        let shared_count = w.vars.len() - owned_total;
        let got: Vec<Vec<Outcome>> = if round % 2 == 0 {
            w.tree.run_workers(&split, |wk| {
                assert_eq!(wk.own_var_count(), own_counts[wk.index()]);
                assert_eq!(wk.shared_var_count(), shared_count);
                assert_eq!(wk.scope(), split[wk.index()]);
                let i = wk.index();
                run_ops(wk, &plans[i])
            })?
        } else {
            let workers = w.tree.split_workers(&split)?;
            assert_eq!(workers.len(), split.len());
            std::thread::scope(|s| {
                let handles: Vec<_> = workers
                    .into_iter()
                    .map(|wk| {
                        let plan = &plans[wk.index()];
                        assert_eq!(wk.worker_scopes().collect::<Vec<_>>(), split);
                        s.spawn(move || run_ops(wk, plan))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| panic!("a worker panicked")))
                    .collect()
            })
        };
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            if let Some(at) = (0..g.len().max(e.len())).find(|&k| g.get(k) != e.get(k)) {
                panic!(
                    "seed {seed} round {round} worker {i}: call {at} ({:?}) gave {:?}, model says {:?}",
                    plans[i].get(at),
                    g.get(at),
                    e.get(at)
                );
            }
        }
        w.check(&format!("round {round} after the workers"))?;
    }
    Ok(())
}

#[test]
fn threads_hammer_disjoint_subtrees_and_nothing_is_lost() -> Result<(), WorkerError> {
    for seed in [1, 0x5eed_0002] {
        stress(seed, rounds(30), 4, 4000)?;
    }
    Ok(())
}

#[test]
fn many_small_workers_and_heavy_reshaping() -> Result<(), WorkerError> {
    stress(77, rounds(30) * 2, 8, 300)
}
