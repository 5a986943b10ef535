//! `shards_bench --zero`: checkpoints of a ZeRO state, whose Adam moments
//! each rank holds only its pieces of.
//!
//! - The state: 100 replicated `f32` parameters `model/t000`..`t099` of
//!   sizes growing as i², a third of `MIB`, and their moments
//!   `model/optim/<key>@M` and `@V`, two thirds of it, of which each rank
//!   holds the pieces that the plan's
//!   [`state_partition`](SyncPlan::state_partition) gives it (300 tensors
//!   when whole). One plan over `model`: the parameters, with the moments
//!   as [`SlicedState`].
//! - `save_shards` and `load_shards`: the plan's, the moments moving as
//!   whole tensors under `optimizer.safetensors.index.json`. Their bytes
//!   are `ShardedSave::bytes + state_bytes` (`ShardedLoad`'s alike).
//! - `save_on_root` and `load_on_all`: what a ZeRO user does without the
//!   sliced state (as `examples/train_rnn/model.rs`' `with_whole_moments`).
//!   A save makes every moment whole on every rank (its piece copied in
//!   place), all-gathers them (one plan per suffix over `optim`,
//!   [`SyncPlan::all_gather`]), builds a plan over the whole state and
//!   calls `save_on_root`, then cuts the moments back to the pieces; a load
//!   makes whole moments, builds that plan, calls `load_on_all` and cuts
//!   them back. All of it is the call's time; the part before the library's
//!   call (`gather_ms`, `whole_ms`) and the cut after it (`cut_ms`) are
//!   reported apart.
//! - Before each load every rank overwrites its parameters and pieces with
//!   `-1`; after it, every rank checks its parameters (the plan's digest
//!   before the first call) and every element of its pieces, and that it
//!   holds no variable for a tensor it has no piece of. A wrong value ends
//!   the run (`MPI_Abort`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator;
use scopetree::checkpoint::{SaveOptions, Tensor};
use scopetree::ranks::{Digest, Partition, PlanOptions, SlicedState, SyncPlan};
use scopetree::{ScopeId, ScopeTree};

use super::{Calls, Sample, flush, measure, state};

/// The moments' suffixes, Adam's.
const SUFFIXES: [&str; 2] = ["@M", "@V"];

/// Element `e` of moment `s` (an index into [`SUFFIXES`]) of the plan's
/// variable `var`: exact in `f32`, different between tensors and elements.
fn moment(var: usize, s: usize, e: usize) -> f32 {
    let x = (var * 13 + e % 997) as f32 * 0.5 + 1.0;
    if s == 0 { x } else { -x }
}

/// The ZeRO state of one rank and its four calls.
pub(super) struct Zero {
    tree: ScopeTree,
    model: ScopeId,
    optim: ScopeId,
    /// The parameters, with the moments as sliced state.
    plan: SyncPlan,
    /// The moments' partition, the plan's `state_partition`.
    part: Partition,
    /// The plan's variables' keys and element counts, in manifest order.
    keys: Vec<String>,
    lens: Vec<usize>,
    rank: usize,
    param_bytes: u64,
    largest: u64,
    /// The plan's digest (the parameters) before the first call.
    params: Digest,
}

impl Zero {
    /// The state of `mib` MiB in all, each rank's pieces of the moments
    /// created.
    pub(super) fn new(world: &SimpleCommunicator, mib: usize) -> Self {
        let (mut tree, model, sizes) = state(mib * (1 << 20) / 4 / 3, 100);
        let optim = tree.new_named_scope(model, "optim").unwrap();
        let opts = PlanOptions::new()
            .filter(|key| !key.starts_with("optim/"))
            .sliced_state(SlicedState::new(optim, SUFFIXES));
        let mut plan = SyncPlan::new(world, &tree, model, &opts).unwrap();
        let part = plan.state_partition().expect("sliced state").clone();
        let entries = plan.manifest().entries();
        let keys: Vec<String> = entries.iter().map(|e| e.key.clone()).collect();
        let lens = entries.iter().map(|e| e.shape.iter().product()).collect();
        let rank = world.rank() as usize;
        for p in part.pieces(rank) {
            for (s, suffix) in SUFFIXES.iter().enumerate() {
                let v = tree.var(optim, format!("{}{suffix}", keys[p.var])).unwrap();
                let values: Vec<f32> = p.elems().map(|e| moment(p.var, s, e)).collect();
                tree.set(v, values).unwrap();
            }
        }
        let params = plan.digest(&tree).unwrap();
        Self {
            tree,
            model,
            optim,
            plan,
            part,
            keys,
            lens,
            rank,
            param_bytes: sizes.iter().sum(),
            largest: sizes.iter().copied().max().unwrap_or(0),
            params,
        }
    }

    /// Overwrites this rank's parameters and pieces with `-1`, so that a
    /// load that leaves them shows.
    fn scramble(&mut self) {
        for key in &self.keys {
            let v = self.tree.find_local_var(self.model, key).unwrap().unwrap();
            let t = self.tree.get_mut::<Tensor<f32>>(v).unwrap();
            t.data_mut().fill(-1.0);
        }
        for p in self.part.pieces(self.rank) {
            for suffix in SUFFIXES {
                let name = format!("{}{suffix}", self.keys[p.var]);
                let v = self
                    .tree
                    .find_local_var(self.optim, &name)
                    .unwrap()
                    .unwrap();
                self.tree.get_mut::<Vec<f32>>(v).unwrap().fill(-1.0);
            }
        }
    }

    /// Checks this rank's values against the state's (see the module's
    /// comment); ends the run on every rank at the first wrong one.
    fn check(&mut self, world: &SimpleCommunicator, after: &str) {
        let fail = |what: String| -> ! {
            eprintln!(
                "shards_bench --zero: rank {} after {after}: {what}",
                self.rank
            );
            world.abort(3)
        };
        if self.plan.digest(&self.tree).unwrap() != self.params {
            fail("the parameters differ from the state's".to_owned());
        }
        for (j, key) in self.keys.iter().enumerate() {
            let piece = self.part.piece_of(self.rank, j);
            for (s, suffix) in SUFFIXES.iter().enumerate() {
                let name = format!("{key}{suffix}");
                let v = self.tree.find_local_var(self.optim, &name).unwrap();
                let (Some(p), Some(v)) = (piece, v) else {
                    if piece.is_some() || v.is_some() {
                        fail(format!("`{name}`: a piece {piece:?}, a variable {v:?}"));
                    }
                    continue;
                };
                let got = self.tree.get::<Vec<f32>>(v).unwrap();
                if got.len() != p.len {
                    fail(format!(
                        "`{name}` holds {} elements, not {}",
                        got.len(),
                        p.len
                    ));
                }
                if let Some((e, x)) = p
                    .elems()
                    .zip(got)
                    .find(|&(e, &x)| x.to_bits() != moment(j, s, e).to_bits())
                {
                    fail(format!("`{name}`[{e}] = {x}, not {}", moment(j, s, e)));
                }
            }
        }
    }

    /// Makes every moment whole on this rank: this rank's piece copied in
    /// place and the rest zero, then, with `gather`, every rank's pieces
    /// all-gathered (one plan per suffix, partitioned as the pieces).
    fn make_whole(&mut self, world: &SimpleCommunicator, gather: bool) {
        for (j, key) in self.keys.iter().enumerate() {
            let piece = self.part.piece_of(self.rank, j);
            for suffix in SUFFIXES {
                let name = format!("{key}{suffix}");
                let mut whole = vec![0.0_f32; self.lens[j]];
                let v = match piece {
                    Some(p) => {
                        let v = self.tree.find_local_var(self.optim, &name).unwrap();
                        let v = v.expect("this rank's piece");
                        if gather {
                            whole[p.elems()].copy_from_slice(self.tree.get::<Vec<f32>>(v).unwrap());
                        }
                        v
                    }
                    None => self.tree.create_var(self.optim, &name).unwrap(),
                };
                self.tree.set(v, whole).unwrap();
            }
        }
        if gather {
            for suffix in SUFFIXES {
                let opts = PlanOptions::new().filter(move |key| key.ends_with(suffix));
                let mut plan = SyncPlan::new(world, &self.tree, self.optim, &opts).unwrap();
                assert!(
                    plan.partition() == &self.part,
                    "the whole moments are partitioned unlike the pieces"
                );
                plan.all_gather(world, &mut self.tree).unwrap();
            }
        }
    }

    /// Cuts every whole moment back to this rank's piece, removing those it
    /// has no piece of.
    fn cut_to_pieces(&mut self) {
        for (j, key) in self.keys.iter().enumerate() {
            let piece = self.part.piece_of(self.rank, j);
            for suffix in SUFFIXES {
                let name = format!("{key}{suffix}");
                let v = self.tree.find_local_var(self.optim, &name).unwrap();
                let v = v.expect("a whole moment");
                match piece {
                    Some(p) => {
                        let mine = self.tree.get::<Vec<f32>>(v).unwrap()[p.elems()].to_vec();
                        self.tree.set(v, mine).unwrap();
                    }
                    None => self.tree.remove_var(v).unwrap(),
                }
            }
        }
    }

    /// A plan over the whole state (the parameters and whole moments).
    fn whole_plan(&self, world: &SimpleCommunicator) -> SyncPlan {
        SyncPlan::new(world, &self.tree, self.model, &PlanOptions::new()).unwrap()
    }
}

impl Calls for Zero {
    fn describe(&self) -> String {
        format!(
            "tensors={} param_tensors={} state_bytes={} param_bytes={} moment_bytes={} \
             largest_tensor_bytes={}",
            self.keys.len() * (1 + SUFFIXES.len()),
            self.keys.len(),
            self.total(),
            self.param_bytes,
            self.param_bytes * SUFFIXES.len() as u64,
            self.largest
        )
    }

    fn total(&self) -> u64 {
        self.param_bytes * (1 + SUFFIXES.len() as u64)
    }

    fn call(
        &mut self,
        world: &SimpleCommunicator,
        op: usize,
        shards: &Path,
        single: &Path,
    ) -> Sample {
        let total = self.total();
        let (mut before, mut after) = (0.0, 0.0);
        let mut s = match op {
            0 => {
                let mut saved = None;
                let mut s = measure(world, || {
                    let s = self
                        .plan
                        .save_shards(world, &self.tree, shards, &SaveOptions::new())
                        .unwrap();
                    let bytes = s.bytes + s.state_bytes;
                    saved = Some(s);
                    bytes
                });
                let saved = saved.expect("a save");
                s.state_bytes = saved.state_bytes as f64;
                let mine: Vec<PathBuf> = [saved.mine, saved.state_shard]
                    .into_iter()
                    .flatten()
                    .map(|m| shards.join(m))
                    .collect();
                s.fsync_secs = flush(world, &mine);
                s
            }
            1 => {
                self.scramble();
                let mut state_bytes = 0;
                let mut s = measure(world, || {
                    let l = self
                        .plan
                        .load_shards(world, &mut self.tree, shards)
                        .unwrap();
                    state_bytes = l.state_bytes;
                    l.bytes + l.state_bytes
                });
                s.state_bytes = state_bytes as f64;
                self.check(world, "load_shards");
                s
            }
            2 => {
                let mut s = measure(world, || {
                    let t = Instant::now();
                    self.make_whole(world, true);
                    let plan = self.whole_plan(world);
                    before = t.elapsed().as_secs_f64();
                    let report = plan
                        .save_on_root(world, &self.tree, single, 0, &SaveOptions::new())
                        .unwrap();
                    drop(plan);
                    let t = Instant::now();
                    self.cut_to_pieces();
                    after = t.elapsed().as_secs_f64();
                    report.map_or(0, |_| total)
                });
                let mine: Vec<PathBuf> = if world.rank() == 0 {
                    vec![single.to_owned()]
                } else {
                    vec![]
                };
                s.fsync_secs = flush(world, &mine);
                s.state_bytes = if world.rank() == 0 {
                    (total - self.param_bytes) as f64
                } else {
                    0.0
                };
                s
            }
            _ => {
                self.scramble();
                let mut s = measure(world, || {
                    let t = Instant::now();
                    self.make_whole(world, false);
                    let mut plan = self.whole_plan(world);
                    before = t.elapsed().as_secs_f64();
                    plan.load_on_all(world, &mut self.tree, single).unwrap();
                    drop(plan);
                    let t = Instant::now();
                    self.cut_to_pieces();
                    after = t.elapsed().as_secs_f64();
                    total
                });
                s.state_bytes = (total - self.param_bytes) as f64;
                self.check(world, "load_on_all");
                s
            }
        };
        s.before_secs = before;
        s.after_secs = after;
        s
    }

    fn finish(&mut self) {}

    fn mode(&self) -> &'static str {
        "mode=zero "
    }

    fn phases(&self, op: usize) -> Option<(&'static str, &'static str)> {
        match op {
            2 => Some(("gather", "cut")),
            3 => Some(("whole", "cut")),
            _ => None,
        }
    }
}
