//! The ranks layer across real MPI ranks. A test binary without the libtest
//! harness (MPI is initialised once per process): run it under `mpirun`,
//!
//! ```text
//! cargo build --release --features mpi --tests
//! mpirun -np 2 target/release/deps/ranks_mpi-<hash>
//! mpirun -np 4 --oversubscribe target/release/deps/ranks_mpi-<hash>
//! ```
//!
//! or `cargo test --features mpi --test ranks_mpi`, a world of one rank
//! (Open MPI's singleton). As root, Open MPI wants
//! `OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`.
//!
//! Every check runs on every rank; its collectives come first and its
//! assertions last, so a failed assertion on one rank cannot leave the
//! others waiting in a collective. After each check the ranks exchange their
//! outcomes, and every rank prints and exits alike: `N passed, 0 failed`
//! (rank 0 prints the closing line) and status 0, or status 1 on every rank
//! when any rank failed a check. A watchdog ends the process with status 3
//! if the whole run takes over 5 minutes, so a hang fails the run instead of
//! blocking it.

use std::hash::{DefaultHasher, Hasher};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use mpi::Threading;
use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator as _;
use scopetree::checkpoint::{self, SaveOptions, Tensor};
use scopetree::ranks::{
    Collective, DIGEST_BYTES, Error, Manifest, Partition, PlanOptions, Reduce, SyncPlan,
};
use scopetree::{ScopeId, ScopeTree, VarId};

#[path = "../examples/train_rnn/model.rs"]
#[allow(dead_code)]
mod model;

#[path = "support/count_alloc.rs"]
mod count_alloc;

// ----- helpers ---------------------------------------------------------------

type World = SimpleCommunicator;
type Check = Result<(), String>;

/// A named check.
type Named = (&'static str, fn(&World) -> Check);

/// Fails the check with a message naming the rank.
macro_rules! ensure {
    ($world:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!("rank {}: {}", rank($world), format!($($fmt)+)));
        }
    };
}

fn rank(world: &World) -> usize {
    Collective::rank(world)
}

fn size(world: &World) -> usize {
    Collective::size(world)
}

/// Whether `text` is the same on every rank (compared by a hash; the binary
/// is the same on every rank, so `DefaultHasher::new` is too).
fn same_everywhere(world: &World, text: &str) -> Result<bool, Error> {
    let mut h = DefaultHasher::new();
    h.write(text.as_bytes());
    let mut mine = [0_u8; DIGEST_BYTES];
    mine[..8].copy_from_slice(&h.finish().to_le_bytes());
    mine[8..].copy_from_slice(&(text.len() as u64).to_le_bytes());
    let mut all = vec![[0_u8; DIGEST_BYTES]; size(world)];
    world.all_gather_digest(&mine, &mut all)?;
    Ok(all.iter().all(|d| *d == mine))
}

/// The ranks that hold `flag`, ascending, as every rank learns them.
fn ranks_where(world: &World, flag: bool) -> Result<Vec<usize>, Error> {
    let mut mine = [0_u8; DIGEST_BYTES];
    mine[0] = u8::from(flag);
    let mut all = vec![[0_u8; DIGEST_BYTES]; size(world)];
    world.all_gather_digest(&mine, &mut all)?;
    Ok((0..all.len()).filter(|&r| all[r][0] != 0).collect())
}

/// A model scope with `enc/w` (Tensor<f32> [2, 3]), `enc/b` (Vec<f32>
/// [3]), `dec/w` (Vec<f64> [4]), `dec/box` (Box<[f32]> [2]) and `dec/steps`
/// (Vec<i64> [2]), every element `fill(i)` for its index `i`.
struct Model {
    tree: ScopeTree,
    scope: ScopeId,
    vars: Vec<VarId>,
}

impl Model {
    fn new(fill: impl Fn(usize) -> f64, w_shape: [usize; 2], w_name: &str) -> Self {
        let mut tree = ScopeTree::new();
        let scope = tree.new_named_scope(tree.root(), "model").unwrap();
        let enc = tree.new_named_scope(scope, "enc").unwrap();
        let dec = tree.new_named_scope(scope, "dec").unwrap();
        let f32s = |n: usize| (0..n).map(|i| fill(i) as f32).collect::<Vec<f32>>();
        let w = tree.var(enc, w_name).unwrap();
        tree.set(w, Tensor::new(w_shape.to_vec(), f32s(6)).unwrap())
            .unwrap();
        let b = tree.var(enc, "b").unwrap();
        tree.set(b, f32s(3)).unwrap();
        let dw = tree.var(dec, "w").unwrap();
        tree.set(dw, (0..4).map(&fill).collect::<Vec<f64>>())
            .unwrap();
        let bx = tree.var(dec, "box").unwrap();
        tree.set(bx, f32s(2).into_boxed_slice()).unwrap();
        let st = tree.var(dec, "steps").unwrap();
        tree.set(st, (0..2).map(|i| fill(i) as i64).collect::<Vec<i64>>())
            .unwrap();
        Self {
            tree,
            scope,
            vars: vec![w, b, dw, bx, st],
        }
    }

    fn standard(fill: impl Fn(usize) -> f64) -> Self {
        Self::new(fill, [2, 3], "w")
    }

    /// Every value, as f64, in variable order.
    fn values(&self) -> Vec<f64> {
        let t = &self.tree;
        let mut out: Vec<f64> = Vec::new();
        out.extend(
            t.get::<Tensor<f32>>(self.vars[0])
                .unwrap()
                .data()
                .iter()
                .map(|&x| f64::from(x)),
        );
        out.extend(
            t.get::<Vec<f32>>(self.vars[1])
                .unwrap()
                .iter()
                .map(|&x| f64::from(x)),
        );
        out.extend(t.get::<Vec<f64>>(self.vars[2]).unwrap().iter().copied());
        out.extend(
            t.get::<Box<[f32]>>(self.vars[3])
                .unwrap()
                .iter()
                .map(|&x| f64::from(x)),
        );
        out.extend(
            t.get::<Vec<i64>>(self.vars[4])
                .unwrap()
                .iter()
                .map(|&x| x as f64),
        );
        out
    }
}

/// A gradient scope: `n_small` variables of 1–3 elements and a few larger
/// than the buckets used, `f32` and `f64`, Vec, Box and Tensor; element `i`
/// of variable `v` on rank `r` is `(r + 1) * ((v + i) % 7)`.
struct Grads {
    tree: ScopeTree,
    scope: ScopeId,
    vars: Vec<(VarId, usize)>,
}

impl Grads {
    fn new(rank: usize, n_small: usize) -> Self {
        let mut tree = ScopeTree::new();
        let scope = tree.new_named_scope(tree.root(), "grads").unwrap();
        let mut vars = Vec::new();
        let val = |v: usize, i: usize| ((rank + 1) * ((v + i) % 7)) as f64;
        for v in 0..n_small + 4 {
            let layer = tree.new_named_scope(scope, format!("l{v:04}")).unwrap();
            let len = if v < n_small {
                1 + v % 3
            } else {
                1000 + 333 * (v - n_small)
            };
            let g = tree.var(layer, "g").unwrap();
            match v % 4 {
                0 => tree.set(g, (0..len).map(|i| val(v, i) as f32).collect::<Vec<f32>>()),
                1 => tree.set(g, (0..len).map(|i| val(v, i)).collect::<Vec<f64>>()),
                2 => tree.set(
                    g,
                    Tensor::new(vec![len], (0..len).map(|i| val(v, i) as f32).collect()).unwrap(),
                ),
                _ => tree.set(
                    g,
                    (0..len)
                        .map(|i| val(v, i) as f32)
                        .collect::<Vec<f32>>()
                        .into_boxed_slice(),
                ),
            }
            .unwrap();
            vars.push((g, v % 4));
        }
        Self { tree, scope, vars }
    }

    /// Every element as f64, with its variable and index.
    fn each(&self) -> Vec<(usize, usize, f64)> {
        let t = &self.tree;
        let mut out = Vec::new();
        for (v, &(g, kind)) in self.vars.iter().enumerate() {
            let xs: Vec<f64> = match kind {
                0 => t
                    .get::<Vec<f32>>(g)
                    .unwrap()
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect(),
                1 => t.get::<Vec<f64>>(g).unwrap().clone(),
                2 => t
                    .get::<Tensor<f32>>(g)
                    .unwrap()
                    .data()
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect(),
                _ => t
                    .get::<Box<[f32]>>(g)
                    .unwrap()
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect(),
            };
            out.extend(xs.into_iter().enumerate().map(|(i, x)| (v, i, x)));
        }
        out
    }
}

// ----- the checks ------------------------------------------------------------

fn agreement_succeeds_on_identical_models(world: &World) -> Check {
    let m = Model::standard(|i| i as f64);
    let plan =
        SyncPlan::new(world, &m.tree, m.scope, &PlanOptions::new()).map_err(|e| e.to_string())?;
    let same = same_everywhere(world, &format!("{:?}", plan.manifest().entries()))
        .map_err(|e| e.to_string())?;
    ensure!(world, same, "the agreed manifests differ");
    ensure!(
        world,
        plan.manifest().entries().len() == 5,
        "{:?}",
        plan.manifest().entries()
    );
    Ok(())
}

/// Builds a plan where the last rank's model differs as `odd` makes it,
/// and checks that every rank gets the same `Disagree` about `key`.
fn disagreement(world: &World, odd: impl Fn() -> Model, key: &str, expect: &[&str]) -> Check {
    let last = size(world) - 1;
    let m = if rank(world) == last {
        odd()
    } else {
        Model::standard(|i| i as f64)
    };
    let before = m.values();
    let got = SyncPlan::new(world, &m.tree, m.scope, &PlanOptions::new());
    let msg = match &got {
        Ok(_) => "Ok".to_owned(),
        Err(e) => e.to_string(),
    };
    let same = same_everywhere(world, &msg).map_err(|e| e.to_string())?;
    if size(world) == 1 {
        ensure!(world, got.is_ok(), "one rank always agrees: {msg}");
        return Ok(());
    }
    let Err(Error::Disagree { key: k, sides, .. }) = &got else {
        return Err(format!(
            "rank {}: expected Disagree, got {msg}",
            rank(world)
        ));
    };
    ensure!(
        world,
        k == key,
        "first difference at {k}, expected {key}: {msg}"
    );
    ensure!(
        world,
        sides.iter().any(|(_, r)| r == &[last]),
        "the last rank is not alone: {msg}"
    );
    ensure!(world, same, "the error differs between ranks: {msg}");
    for part in expect {
        ensure!(world, msg.contains(part), "{msg:?} lacks {part:?}");
    }
    ensure!(
        world,
        m.values() == before,
        "a failed agreement changed values"
    );
    Ok(())
}

fn agreement_names_a_differing_shape_on_every_rank(world: &World) -> Check {
    disagreement(
        world,
        || Model::new(|i| i as f64, [3, 2], "w"),
        "enc/w",
        &[
            "first difference at `enc/w`: F32 [2, 3] on rank",
            "F32 [3, 2] on rank",
        ],
    )
}

fn agreement_names_a_differing_name_on_every_rank(world: &World) -> Check {
    // `enc/a` sorts before `enc/b`: the first difference is the odd name.
    disagreement(
        world,
        || Model::new(|i| i as f64, [2, 3], "a"),
        "enc/a",
        &[
            "first difference at `enc/a`: absent on rank",
            "F32 [2, 3] on rank",
        ],
    )
}

fn a_rank_that_cannot_build_its_manifest_stops_every_rank(world: &World) -> Check {
    let mut m = Model::standard(|i| i as f64);
    if rank(world) == 0 {
        let v = m.tree.var(m.scope, "note").unwrap();
        m.tree.set(v, String::from("not a tensor")).unwrap();
    }
    let got = SyncPlan::new(world, &m.tree, m.scope, &PlanOptions::new());
    match (rank(world), got) {
        (0, Err(Error::Unsupported { key, .. })) => {
            ensure!(world, key == "note", "{key}");
        }
        (_, Err(Error::PeerFailed { ranks, .. })) => {
            ensure!(world, ranks == [0], "{ranks:?}");
        }
        (_, other) => return Err(format!("rank {}: {other:?}", rank(world))),
    }
    Ok(())
}

fn broadcast_makes_every_rank_hold_the_roots_values(world: &World) -> Check {
    let root = size(world) - 1;
    let r = rank(world) as f64;
    let mut wrong = Vec::new();
    for bucket in [1, 7, 25 << 20] {
        let mut m = Model::standard(|i| 100.0 * r + i as f64);
        let mut plan = SyncPlan::new(
            world,
            &m.tree,
            m.scope,
            &PlanOptions::new().bucket_bytes(bucket),
        )
        .map_err(|e| e.to_string())?;
        plan.broadcast(world, &mut m.tree, root)
            .map_err(|e| e.to_string())?;
        let want = Model::standard(|i| 100.0 * root as f64 + i as f64).values();
        if m.values() != want {
            wrong.push(format!("bucket {bucket}: {:?} != {want:?}", m.values()));
        }
        plan.check_consistency(world, &m.tree)
            .map_err(|e| e.to_string())?;
    }
    ensure!(world, wrong.is_empty(), "{wrong:?}");
    let mut m = Model::standard(|i| i as f64);
    let mut plan =
        SyncPlan::new(world, &m.tree, m.scope, &PlanOptions::new()).map_err(|e| e.to_string())?;
    let bad = plan.broadcast(world, &mut m.tree, size(world));
    ensure!(world, matches!(bad, Err(Error::BadRank { .. })), "{bad:?}");
    Ok(())
}

/// Sums and means of small integers are exact: they must equal the
/// expected values bit for bit.
fn reduce_is_exact(world: &World, n_small: usize, bucket: usize) -> Check {
    reduce_is_exact_with(world, n_small, PlanOptions::new().bucket_bytes(bucket))
}

fn reduce_is_exact_with(world: &World, n_small: usize, opts: PlanOptions) -> Check {
    let bucket = opts.bucket_bytes_value();
    let n = size(world);
    let tri = (n * (n + 1) / 2) as f64;
    let mut wrong = Vec::new();
    for op in [Reduce::Sum, Reduce::Mean] {
        let mut g = Grads::new(rank(world), n_small);
        let mut plan = SyncPlan::new(world, &g.tree, g.scope, &opts).map_err(|e| e.to_string())?;
        plan.all_reduce(world, &mut g.tree, op)
            .map_err(|e| e.to_string())?;
        for (v, i, x) in g.each() {
            let sum = tri * ((v + i) % 7) as f64;
            let want = if op == Reduce::Sum {
                sum
            } else {
                sum / n as f64
            };
            if x != want {
                wrong.push(format!(
                    "{op:?}, bucket {bucket} B, var {v}[{i}]: {x} != {want}"
                ));
            }
        }
        plan.check_consistency(world, &g.tree)
            .map_err(|e| e.to_string())?;
    }
    ensure!(
        world,
        wrong.is_empty(),
        "{} wrong elements, first {:?}",
        wrong.len(),
        wrong.first()
    );
    Ok(())
}

fn all_reduce_sum_and_mean_are_exact_with_the_default_bucket(world: &World) -> Check {
    reduce_is_exact(world, 20, scopetree::ranks::DEFAULT_BUCKET_BYTES)
}

fn every_pipeline_and_direct_path_is_exact(world: &World) -> Check {
    // Buckets of 100 f32 over 500 small variables and four large ones:
    // every number of bucket buffer pairs (windows of 1 to 4 transfers in
    // flight, the last window short), and the large variables sent from
    // their own buffers, in one call or in bucket-sized calls.
    for pairs in [1, 2, 3, 4, 5, 8] {
        for direct in [usize::MAX, 1, 4000] {
            let opts = PlanOptions::new()
                .bucket_bytes(400)
                .bucket_buffers(pairs)
                .direct_bytes(direct);
            reduce_is_exact_with(world, 500, opts)
                .map_err(|e| format!("{pairs} pairs, direct from {direct} B: {e}"))?;
        }
    }
    Ok(())
}

fn buckets_of_one_element(world: &World) -> Check {
    // 4 bytes: one f32 per call; an f64 (8 bytes) is still one per call.
    reduce_is_exact(world, 10, 4)?;
    reduce_is_exact(world, 10, 1)
}

fn tensors_larger_than_a_bucket_and_many_small_ones(world: &World) -> Check {
    // Buckets of 100 f32: the last four variables span 10 to 23 buckets
    // each; 500 variables of 1-3 elements share buckets.
    reduce_is_exact(world, 500, 400)?;
    let g = Grads::new(rank(world), 500);
    let plan = SyncPlan::new(
        world,
        &g.tree,
        g.scope,
        &PlanOptions::new().bucket_bytes(400),
    )
    .map_err(|e| e.to_string())?;
    ensure!(
        world,
        plan.reduce_buckets() > 50,
        "{} buckets",
        plan.reduce_buckets()
    );
    Ok(())
}

fn the_digest_names_a_diverged_rank(world: &World) -> Check {
    let mut g = Grads::new(0, 10); // the same values on every rank
    let mut plan =
        SyncPlan::new(world, &g.tree, g.scope, &PlanOptions::new()).map_err(|e| e.to_string())?;
    plan.check_consistency(world, &g.tree)
        .map_err(|e| e.to_string())?;
    let last = size(world) - 1;
    if rank(world) == last {
        let (v, _) = g.vars[6]; // grads/l0006/g, a Tensor<f32>
        let x = &mut g.tree.get_mut::<Tensor<f32>>(v).unwrap().data_mut()[0];
        *x = f32::from_bits(x.to_bits() ^ 1);
    }
    let got = plan.check_consistency(world, &g.tree);
    let msg = got
        .as_ref()
        .err()
        .map(ToString::to_string)
        .unwrap_or_default();
    let same = same_everywhere(world, &msg).map_err(|e| e.to_string())?;
    if size(world) == 1 {
        ensure!(world, got.is_ok(), "{msg}");
        return Ok(());
    }
    let Err(Error::Diverged { key, sides, .. }) = &got else {
        return Err(format!(
            "rank {}: expected Diverged, got {got:?}",
            rank(world)
        ));
    };
    ensure!(world, key == "l0006/g", "{msg}");
    let others: Vec<usize> = (0..last).collect();
    ensure!(
        world,
        sides.len() == 2 && sides[0].1 == others && sides[1].1 == [last],
        "{msg}"
    );
    ensure!(world, same, "the error differs between ranks: {msg}");
    ensure!(
        world,
        msg.contains("diverged across ranks: first difference at `l0006/g`"),
        "{msg}"
    );
    Ok(())
}

fn a_rank_whose_tree_changed_stops_every_rank_unchanged(world: &World) -> Check {
    let mut g = Grads::new(rank(world), 5);
    let mut plan =
        SyncPlan::new(world, &g.tree, g.scope, &PlanOptions::new()).map_err(|e| e.to_string())?;
    if rank(world) == 0 {
        let (v, _) = g.vars[0];
        g.tree.get_mut::<Vec<f32>>(v).unwrap().push(1.0);
    }
    let before = g.each();
    let got = plan.all_reduce(world, &mut g.tree, Reduce::Sum);
    match (rank(world), &got) {
        (0, Err(Error::Changed { key, .. })) => ensure!(world, key == "l0000/g", "{key}"),
        (r, Err(Error::PeerFailed { ranks, .. })) if r > 0 => {
            ensure!(world, ranks == &[0], "{ranks:?}");
        }
        _ => return Err(format!("rank {}: {got:?}", rank(world))),
    }
    ensure!(
        world,
        g.each() == before,
        "a failed all-reduce changed values"
    );
    Ok(())
}

/// Arguments every rank must pass alike, passed differently by the last
/// rank: every rank gets the same `ArgumentsDiffer`, nothing hangs and
/// nothing changes. A bucket of 0 bytes on one rank stops every rank.
fn arguments_that_differ_stop_every_rank(world: &World) -> Check {
    let (me, last, n) = (rank(world), size(world) - 1, size(world));
    let odd = me == last && n > 1;
    let mut failures = Vec::new();
    let mut expect_differ =
        |what: &str, got: Result<(), Error>, world: &World| -> Result<(), Error> {
            let msg = got
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default();
            let same = same_everywhere(world, &msg)?;
            if n == 1 {
                if got.is_err() {
                    failures.push(format!("{what}: one rank: {msg}"));
                }
            } else if !matches!(got, Err(Error::ArgumentsDiffer { .. })) || !same {
                failures.push(format!("{what}: {msg} (same on every rank: {same})"));
            } else if !msg.contains(&format!("on rank {last}")) {
                failures.push(format!("{what}: {msg} does not name rank {last}"));
            }
            Ok(())
        };
    let e = |x: Error| x.to_string();

    // Bucket sizes.
    let g = Grads::new(me, 5);
    let bucket = if odd { 8 } else { 25 << 20 };
    let got = SyncPlan::new(
        world,
        &g.tree,
        g.scope,
        &PlanOptions::new().bucket_bytes(bucket),
    )
    .map(drop);
    expect_differ("bucket sizes", got, world).map_err(e)?;

    // A broadcast's roots, and an all-reduce's reductions: nothing changes.
    let mut m = Model::standard(|i| 10.0 * me as f64 + i as f64);
    let before = m.values();
    let mut plan = SyncPlan::new(world, &m.tree, m.scope, &PlanOptions::new()).map_err(e)?;
    let root = if odd { 1 } else { 0 };
    let got = plan.broadcast(world, &mut m.tree, root);
    expect_differ("roots", got, world).map_err(e)?;
    let mut g = Grads::new(me, 5);
    let g_before = g.each();
    let mut gplan = SyncPlan::new(world, &g.tree, g.scope, &PlanOptions::new()).map_err(e)?;
    let op = if odd { Reduce::Mean } else { Reduce::Sum };
    let got = gplan.all_reduce(world, &mut g.tree, op);
    expect_differ("reductions", got, world).map_err(e)?;

    // A save's roots: nobody saves.
    let dir = shared_dir(world).map_err(e)?;
    let path = dir.join("differ.safetensors");
    let got = plan
        .save_on_root(world, &m.tree, &path, root, &SaveOptions::new())
        .map(drop);
    expect_differ("save roots", got, world).map_err(e)?;
    world.barrier().map_err(e)?;
    let saved = path.exists();
    world.barrier().map_err(e)?;
    if me == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }

    // A bucket of 0 bytes on one rank.
    let zero = if odd { 0 } else { 25 << 20 };
    let got = SyncPlan::new(
        world,
        &g.tree,
        g.scope,
        &PlanOptions::new().bucket_bytes(zero),
    );
    let zero_ok = match (&got, odd) {
        (Err(Error::BadOption { .. }), true) => true,
        (Err(Error::PeerFailed { ranks, .. }), false) => n > 1 && ranks == &[last],
        (Ok(_), false) => n == 1,
        _ => false,
    };

    ensure!(world, failures.is_empty(), "{failures:?}");
    ensure!(
        world,
        m.values() == before,
        "a refused broadcast changed values"
    );
    ensure!(
        world,
        g.each() == g_before,
        "a refused all-reduce changed values"
    );
    ensure!(
        world,
        n == 1 || !saved,
        "a refused save wrote {}",
        path.display()
    );
    ensure!(
        world,
        zero_ok,
        "a bucket of 0 bytes on rank {last}: {got:?}"
    );
    Ok(())
}

/// A path every rank uses: rank 0 makes a directory and broadcasts its
/// name.
fn shared_dir(world: &World) -> Result<PathBuf, Error> {
    let mut name = if rank(world) == 0 {
        let dir = std::env::temp_dir().join(format!("scopetree-ranks-mpi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        dir.to_string_lossy().into_owned().into_bytes()
    } else {
        Vec::new()
    };
    let mut len = (name.len() as u64).to_le_bytes();
    world.broadcast_bytes(0, &mut len)?;
    name.resize(u64::from_le_bytes(len) as usize, 0);
    world.broadcast_bytes(0, &mut name)?;
    Ok(PathBuf::from(
        String::from_utf8(name).expect("a UTF-8 path"),
    ))
}

fn one_rank_saves_and_every_rank_loads(world: &World) -> Check {
    let dir = shared_dir(world).map_err(|e| e.to_string())?;
    let path = dir.join("model.safetensors");
    let r = rank(world) as f64;
    let mut m = Model::standard(|i| 10.0 * r + i as f64);
    let mut plan =
        SyncPlan::new(world, &m.tree, m.scope, &PlanOptions::new()).map_err(|e| e.to_string())?;
    let saved = plan
        .save_on_root(world, &m.tree, &path, 0, &SaveOptions::new())
        .map_err(|e| e.to_string())?;
    // When save_on_root returns, the file is there for every rank.
    let there = path.exists();
    let loaded = plan
        .load_on_all(world, &mut m.tree, &path)
        .map_err(|e| e.to_string())?;
    ensure!(world, there, "no file after save_on_root");
    ensure!(world, saved.is_some() == (rank(world) == 0), "{saved:?}");
    ensure!(world, loaded.loaded.len() == 5, "{:?}", loaded.loaded);
    let want = Model::standard(|i| i as f64).values();
    ensure!(world, m.values() == want, "{:?} != {want:?}", m.values());

    // Files that differ between ranks (hosts without a shared filesystem):
    // every rank loads, and the check says they diverged.
    let own = dir.join(format!("rank-{}.safetensors", rank(world)));
    let mine = Model::standard(|i| 10.0 * r + i as f64);
    // A failed save here makes this rank's load fail, and every rank with it.
    let own_saved = checkpoint::save(&mine.tree, mine.scope, &own, &SaveOptions::new());
    let got = plan.load_on_all(world, &mut m.tree, &own);
    world.barrier().map_err(|e| e.to_string())?;
    if rank(world) == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
    ensure!(world, own_saved.is_ok(), "{own_saved:?}");
    if size(world) > 1 {
        ensure!(world, matches!(got, Err(Error::Diverged { .. })), "{got:?}");
    } else {
        ensure!(world, got.is_ok(), "{got:?}");
    }
    Ok(())
}

/// Every rank writes one shard of a Hugging Face checkpoint; the checkpoint
/// then loads on 1, 2, … and all the ranks (sub-communicators of the
/// world), each rank of a load reading a share, the shares adding up to the
/// checkpoint's bytes once; a deleted shard is the same error on every
/// rank, every tree unchanged.
fn every_rank_writes_a_shard_and_any_number_of_ranks_loads(world: &World) -> Check {
    use mpi::topology::Color;
    let s = |e: Error| e.to_string();
    let dir = shared_dir(world).map_err(s)?.join("shards");
    let (me, n) = (rank(world), size(world));
    let m = Model::standard(|i| 1.5 * i as f64);
    let want = m.values();
    let mut plan = SyncPlan::new(world, &m.tree, m.scope, &PlanOptions::new()).map_err(s)?;
    let saved = plan
        .save_shards(world, &m.tree, &dir, &SaveOptions::new())
        .map_err(s)?;
    let writers = ranks_where(world, saved.mine.is_some()).map_err(s)?;
    let there = dir.join("model.safetensors.index.json").exists();
    let mut failures = Vec::new();
    for m_ranks in 1..=n {
        let color = if me < m_ranks {
            Color::with_value(0)
        } else {
            Color::undefined()
        };
        if let Some(sub) = world.split_by_color(color) {
            let mut t = Model::standard(|i| 100.0 * (me + 1) as f64 + i as f64);
            let got = SyncPlan::new(&sub, &t.tree, t.scope, &PlanOptions::new())
                .and_then(|mut p| p.load_shards(&sub, &mut t.tree, &dir));
            let bytes = got.as_ref().map_or(0, |l| l.bytes);
            let mut all = vec![0_u8; 8 * m_ranks];
            Collective::all_gather_bytes(&sub, &bytes.to_le_bytes(), &mut all).map_err(s)?;
            let total: u64 = all
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .sum();
            if got.is_err() || t.values() != want || total != 92 {
                failures.push(format!(
                    "at {m_ranks} rank(s): {got:?}, {:?}, {total} bytes read in all",
                    t.values()
                ));
            }
        }
        world.barrier().map_err(s)?;
    }

    // A shard whose last data byte changed after the save: the rank that
    // reads it finds the checksum wrong, every rank returns an error, and
    // no tree changes.
    let last = dir.join(&saved.shards[saved.shards.len() - 1]);
    if me == 0 {
        let mut bytes = std::fs::read(&last).expect("the last shard");
        let end = bytes.len() - 1;
        bytes[end] ^= 0x40;
        std::fs::write(&last, &bytes).expect("a writable shard");
    }
    world.barrier().map_err(s)?;
    let mut c = Model::standard(|i| 3.0 + i as f64);
    let c_before = c.values();
    let corrupted = SyncPlan::new(world, &c.tree, c.scope, &PlanOptions::new())
        .and_then(|mut p| p.load_shards(world, &mut c.tree, &dir));
    let found = ranks_where(world, matches!(corrupted, Err(Error::Corrupted { .. }))).map_err(s)?;
    let failed = ranks_where(world, corrupted.is_err()).map_err(s)?;
    let corrupt_seen = format!("found by ranks {found:?}, failed on {failed:?}: {corrupted:?}");
    let corrupt_ok = found.len() == 1 && failed.len() == n && c.values() == c_before;

    // A deleted shard: every rank reports it, no tree changes.
    if me == 0 {
        let _ = std::fs::remove_file(dir.join(&saved.shards[saved.shards.len() - 1]));
    }
    world.barrier().map_err(s)?;
    let mut t = Model::standard(|i| 7.0 + i as f64);
    let before = t.values();
    let got = SyncPlan::new(world, &t.tree, t.scope, &PlanOptions::new())
        .and_then(|mut p| p.load_shards(world, &mut t.tree, &dir));
    let message = got
        .as_ref()
        .err()
        .map(ToString::to_string)
        .unwrap_or_default();
    let same = same_everywhere(world, &message).map_err(s)?;
    world.barrier().map_err(s)?;
    if me == 0 {
        let _ = std::fs::remove_dir_all(dir.parent().unwrap_or(&dir));
    }
    ensure!(world, there, "no index after save_shards");
    ensure!(
        world,
        writers.len() == saved.shards.len() && writers == (0..writers.len()).collect::<Vec<_>>(),
        "shards {:?} written by ranks {writers:?}",
        saved.shards
    );
    ensure!(world, saved.shards.len() == n.min(5), "{:?}", saved.shards);
    ensure!(world, failures.is_empty(), "{failures:?}");
    ensure!(world, got.is_err() && same, "deleted shard: {got:?}");
    ensure!(
        world,
        message.contains(&saved.shards[saved.shards.len() - 1]),
        "{message}"
    );
    ensure!(world, t.values() == before, "a refused load changed values");
    ensure!(world, corrupt_ok, "a corrupted shard: {corrupt_seen}");
    Ok(())
}

/// A scope `model` of parameters `a` (f32 [40]), `b` (f64 [9]), `c` (f32
/// [3]) and, under `model/optim`, this rank's pieces of their `@M` and `@V`
/// (by the plan's `state_partition`), set from `value(param, suffix,
/// element)`. Returns the tree, the plan and the pieces' values read back.
fn sliced_model<C: Collective>(
    comm: &C,
    bucket: usize,
    param: f64,
    value: &dyn Fn(usize, usize, usize) -> f64,
) -> Result<(ScopeTree, SyncPlan), Error> {
    use scopetree::ranks::SlicedState;
    const PARAMS: [(&str, usize, bool); 3] = [("a", 40, false), ("b", 9, true), ("c", 3, false)];
    let mut tree = ScopeTree::new();
    let model = tree.new_named_scope(tree.root(), "model")?;
    let optim = tree.new_named_scope(model, "optim")?;
    for (p, &(key, n, wide)) in PARAMS.iter().enumerate() {
        let v = tree.var(model, key)?;
        let xs = (0..n).map(|e| param + p as f64 + e as f64);
        if wide {
            tree.set(v, xs.collect::<Vec<f64>>())?;
        } else {
            tree.set(v, xs.map(|x| x as f32).collect::<Vec<f32>>())?;
        }
    }
    let opts = PlanOptions::new()
        .bucket_bytes(bucket)
        .filter(|k| !k.starts_with("optim/"))
        .sliced_state(SlicedState::new(optim, ["@M", "@V"]));
    let plan = SyncPlan::new(comm, &tree, model, &opts)?;
    let part = plan
        .state_partition()
        .cloned()
        .unwrap_or_else(|| unreachable!());
    for piece in part.pieces(comm.rank()) {
        let (key, _, wide) = PARAMS[piece.var];
        for (s, suffix) in ["@M", "@V"].iter().enumerate() {
            let v = tree.var(optim, format!("{key}{suffix}"))?;
            let xs = piece.elems().map(|e| value(piece.var, s, e));
            if wide {
                tree.set(v, xs.collect::<Vec<f64>>())?;
            } else {
                tree.set(v, xs.map(|x| x as f32).collect::<Vec<f32>>())?;
            }
        }
    }
    Ok((tree, plan))
}

/// Every value of `model/optim` (each piece's elements, as f64) and of the
/// parameters, in key order.
fn all_values(tree: &ScopeTree) -> Vec<(String, Vec<f64>)> {
    let mut out = Vec::new();
    let model = tree.kid(tree.root(), "model").ok().flatten();
    let optim = model.and_then(|m| tree.kid(m, "optim").ok().flatten());
    for scope in [model, optim].into_iter().flatten() {
        for (name, v) in tree.local_vars(scope).into_iter().flatten() {
            let xs = match tree.get::<Vec<f32>>(v) {
                Ok(x) => x.iter().map(|&x| f64::from(x)).collect(),
                Err(_) => tree.get::<Vec<f64>>(v).cloned().unwrap_or_default(),
            };
            out.push((name.to_string(), xs));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn zero_state_saved_at_n_ranks_loads_at_any_number(world: &World) -> Check {
    use mpi::topology::Color;
    let s = |e: Error| e.to_string();
    let dir = shared_dir(world).map_err(s)?.join("sliced");
    let (me, n) = (rank(world), size(world));
    let truth = |p: usize, sfx: usize, e: usize| (p * 1000 + sfx * 100 + e) as f64 + 0.5;
    // Saved with buckets of 12 bytes: the split tensors' pieces move in
    // several broadcasts.
    let (tree, mut plan) = sliced_model(world, 12, 1.0, &truth).map_err(s)?;
    let saved = plan
        .save_shards(world, &tree, &dir, &SaveOptions::new())
        .map_err(s)?;
    let mut all = [0_u8; 8];
    let mut every = vec![0_u8; 8 * n];
    all.copy_from_slice(&saved.state_bytes.to_le_bytes());
    Collective::all_gather_bytes(world, &all, &mut every).map_err(s)?;
    let written: u64 = every
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .sum();
    let mut failures = Vec::new();
    for m_ranks in 1..=n {
        let color = if me < m_ranks {
            Color::with_value(0)
        } else {
            Color::undefined()
        };
        if let Some(sub) = world.split_by_color(color) {
            let got = sliced_model(&sub, 20, -5.0, &|_, _, _| 7.0).and_then(|(mut t, mut p)| {
                p.load_shards(&sub, &mut t, &dir)?;
                Ok(t)
            });
            let want = sliced_model(&sub, 20, 1.0, &truth).map(|(t, _)| all_values(&t));
            match (got, want) {
                (Ok(t), Ok(want)) if all_values(&t) == want => {}
                (got, want) => failures.push(format!(
                    "at {m_ranks} rank(s): {:?} against {:?}",
                    got.map(|t| all_values(&t)),
                    want
                )),
            }
        }
        world.barrier().map_err(s)?;
    }
    world.barrier().map_err(s)?;
    if me == 0 {
        let _ = std::fs::remove_dir_all(dir.parent().unwrap_or(&dir));
    }
    // (40 + 3) f32 and 9 f64, twice.
    ensure!(
        world,
        written == 2 * (43 * 4 + 9 * 8),
        "{written} state bytes written in all"
    );
    ensure!(world, failures.is_empty(), "{failures:?}");
    Ok(())
}

fn the_steady_state_allocates_nothing_under_mpi(world: &World) -> Check {
    let mut g = Grads::new(rank(world), 100);
    let mut plan = SyncPlan::new(
        world,
        &g.tree,
        g.scope,
        &PlanOptions::new().bucket_bytes(1 << 12),
    )
    .map_err(|e| e.to_string())?;
    plan.all_reduce(world, &mut g.tree, Reduce::Mean)
        .map_err(|e| e.to_string())?;
    let mut p = Grads::new(0, 100);
    let mut pplan =
        SyncPlan::new(world, &p.tree, p.scope, &PlanOptions::new()).map_err(|e| e.to_string())?;
    pplan
        .check_consistency(world, &p.tree)
        .map_err(|e| e.to_string())?;
    let before = count_alloc::count();
    let mut failed = None;
    for _ in 0..20 {
        if let Err(e) = plan.all_reduce(world, &mut g.tree, Reduce::Mean) {
            failed = Some(e);
            break;
        }
        if let Err(e) = pplan.check_consistency(world, &p.tree) {
            failed = Some(e);
            break;
        }
    }
    let n = count_alloc::count() - before;
    if let Some(e) = failed {
        return Err(e.to_string());
    }
    ensure!(world, n == 0, "{n} allocations in 20 steps");
    // Keep `p` alive and used until here.
    ensure!(world, !p.each().is_empty(), "no parameters");
    p.tree.clear(p.vars[0].0).map_err(|e| e.to_string())?;
    Ok(())
}

fn the_manifest_digest_is_the_same_on_every_rank(world: &World) -> Check {
    let m = Model::standard(|i| rank(world) as f64 + i as f64);
    let d = Manifest::of_tree(&m.tree, m.scope)
        .map_err(|e| e.to_string())?
        .digest();
    let mut all = vec![[0_u8; DIGEST_BYTES]; size(world)];
    world
        .all_gather_digest(&d, &mut all)
        .map_err(|e| e.to_string())?;
    ensure!(
        world,
        all.iter().all(|x| *x == d),
        "digests differ: {all:?}"
    );
    Ok(())
}

/// `examples/train_rnn` with one worker per rank against one process with
/// as many workers: the same sequences, the gradients summed over the
/// ranks. With 1 or 2 ranks the sums are the same additions, so the
/// parameters and optimiser state must be bit-identical; with more, MPI
/// groups the additions its own way, and the ranks must still agree.
fn train_rnn_across_ranks_matches_one_process(world: &World) -> Check {
    let n = size(world);
    let cfg = |workers| model::Config {
        seq_len: 8,
        hidden: 16,
        task: model::Task::Echo { delay: 2 },
        tokens: 5,
        epochs: 1,
        updates_per_epoch: 1,
        batch: 8,
        workers,
        lr: 0.02,
        seed: 5,
        eval_seqs: 16,
        zero: false,
        timeout: Some(scopetree::ranks::DEFAULT_TIMEOUT),
    };
    let e = |e: model::Error| e.to_string();
    let mut ranked = model::Trainer::with_world(cfg(1), Box::new(world.duplicate())).map_err(e)?;
    let mut alone = model::Trainer::new(cfg(n)).map_err(e)?;
    let (mut ranked_correct, mut alone_correct) = (0, 0);
    for _ in 0..12 {
        let s = ranked.train_update().map_err(e)?;
        ranked_correct += ranked.global_stats(s).map_err(|x| x.to_string())?.correct;
        alone_correct += alone.train_update().map_err(e)?.correct;
    }
    ranked.check_consistency().map_err(|x| x.to_string())?;
    let (a, b) = (
        ranked.state_digest().map_err(|x| x.to_string())?,
        alone.state_digest().map_err(|x| x.to_string())?,
    );
    if n <= 2 {
        ensure!(
            world,
            a == b,
            "{n} ranks x 1 worker: digest {a}, one process x {n} workers: {b}"
        );
        ensure!(
            world,
            ranked_correct == alone_correct,
            "{ranked_correct} != {alone_correct}"
        );
    }
    ensure!(world, ranked_correct > 0, "nothing predicted right");
    Ok(())
}

// ----- ZeRO stage 1: the partition, reduce-scatter and all-gather ----------

/// Checks that `part` cuts `manifest` into contiguous slices in rank order
/// that cover every element once, each within one element of an equal share.
fn partition_fits(part: &Partition, manifest: &Manifest, n: usize) -> Result<(), String> {
    let vars: Vec<(usize, usize)> = manifest
        .entries()
        .iter()
        .map(|e| (e.dtype.bitsize() / 8, e.shape.iter().product()))
        .collect();
    let total: usize = vars.iter().map(|(s, l)| s * l).sum();
    if part.ranks() != n {
        return Err(format!(
            "{} ranks in the partition, {n} in the world",
            part.ranks()
        ));
    }
    let (mut var, mut elem) = (0, 0);
    for r in 0..n {
        let mut bytes = 0;
        for p in part.pieces(r) {
            while var < vars.len() && elem == vars[var].1 {
                (var, elem) = (var + 1, 0);
            }
            if (p.var, p.start) != (var, elem) || p.len == 0 || p.start + p.len > vars[var].1 {
                return Err(format!(
                    "rank {r}: piece {p:?} where ({var}, {elem}) was next"
                ));
            }
            elem += p.len;
            bytes += p.len * vars[var].0;
        }
        if bytes != part.bytes(r) || bytes.abs_diff(total / n) > 8 {
            return Err(format!("rank {r}: {bytes} bytes of {total} over {n} ranks"));
        }
    }
    while var < vars.len() && elem == vars[var].1 {
        (var, elem) = (var + 1, 0);
    }
    if var != vars.len() {
        return Err(format!("element {elem} of variable {var} has no owner"));
    }
    Ok(())
}

fn the_partition_is_contiguous_complete_and_balanced(world: &World) -> Check {
    let g = Grads::new(rank(world), 30);
    let plan =
        SyncPlan::new(world, &g.tree, g.scope, &PlanOptions::new()).map_err(|e| e.to_string())?;
    let same =
        same_everywhere(world, &format!("{:?}", plan.partition())).map_err(|e| e.to_string())?;
    ensure!(world, same, "the ranks computed different partitions");
    partition_fits(plan.partition(), plan.manifest(), size(world))
        .map_err(|e| format!("rank {}: {e}", rank(world)))
}

/// Which rank owns element `i` of variable `v`, by variable.
fn owners(part: &Partition, vars: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); vars];
    for r in 0..part.ranks() {
        for p in part.pieces(r) {
            out[p.var].resize(p.start + p.len, r);
        }
    }
    out
}

/// Reduce-scatter then all-gather, against the all-reduce of the same
/// gradients, with every piece through the padded buffers, every piece
/// reduced to its owner from its own buffer (`MPI_Reduce`, in one call or
/// in chunks of 12 bytes) and broadcast back in place, and a mix: the
/// owned elements equal the all-reduce's exactly (small integers), the
/// others keep the rank's own values; the all-gather gives every rank each
/// owner's values; and the steady state allocates nothing.
fn reduce_scatter_and_all_gather_match_the_all_reduce(world: &World) -> Check {
    let ways = [
        ("direct off", PlanOptions::new().direct_bytes(usize::MAX)),
        ("all direct", PlanOptions::new().direct_bytes(1)),
        (
            "all direct, 12-byte buckets",
            PlanOptions::new().direct_bytes(1).bucket_bytes(12),
        ),
        (
            "direct from 2000 bytes",
            PlanOptions::new().direct_bytes(2000),
        ),
        ("default", PlanOptions::new()),
    ];
    for (name, opts) in &ways {
        zero_exchange_is_exact(world, opts).map_err(|x| format!("{name}: {x}"))?;
    }
    zero_rounding_info(world)
}

/// The exchange of [`reduce_scatter_and_all_gather_match_the_all_reduce`]
/// with the plans built with `opts`.
fn zero_exchange_is_exact(world: &World, opts: &PlanOptions) -> Check {
    let (me, n) = (rank(world), size(world));
    let e = |x: Error| x.to_string();
    let mut wrong = Vec::new();
    for op in [Reduce::Sum, Reduce::Mean] {
        let mut a = Grads::new(me, 30);
        let mut b = Grads::new(me, 30);
        let mut pa = SyncPlan::new(world, &a.tree, a.scope, &PlanOptions::new()).map_err(e)?;
        let mut pb = SyncPlan::new(world, &b.tree, b.scope, opts).map_err(e)?;
        pa.all_reduce(world, &mut a.tree, op).map_err(e)?;
        pb.reduce_scatter(world, &mut b.tree, op).map_err(e)?;
        let own = owners(pb.partition(), b.vars.len());
        let mine = Grads::new(me, 30).each();
        for ((&(v, i, x), &(_, _, y)), &(_, _, local)) in a.each().iter().zip(&b.each()).zip(&mine)
        {
            let want = if own[v][i] == me { x } else { local };
            if y != want {
                wrong.push(format!("{op:?} var {v}[{i}]: {y} != {want}"));
            }
        }
    }
    // All-gather: each element comes from its owner.
    let mut c = Grads::new(me, 30);
    let mut pc = SyncPlan::new(world, &c.tree, c.scope, opts).map_err(e)?;
    pc.all_gather(world, &mut c.tree).map_err(e)?;
    let own = owners(pc.partition(), c.vars.len());
    let from: Vec<Vec<(usize, usize, f64)>> = (0..n).map(|r| Grads::new(r, 30).each()).collect();
    for (k, &(v, i, x)) in c.each().iter().enumerate() {
        if x != from[own[v][i]][k].2 {
            wrong.push(format!(
                "all-gather var {v}[{i}]: {x} from rank {}",
                own[v][i]
            ));
        }
    }
    // The steady state: after the first calls, nothing allocates.
    pc.reduce_scatter(world, &mut c.tree, Reduce::Mean)
        .map_err(e)?;
    let before = count_alloc::count();
    let mut failed = None;
    for _ in 0..20 {
        let step = pc
            .reduce_scatter(world, &mut c.tree, Reduce::Mean)
            .and_then(|()| pc.all_gather(world, &mut c.tree));
        if let Err(x) = step {
            failed = Some(x);
            break;
        }
    }
    let allocs = count_alloc::count() - before;
    if let Some(x) = failed {
        return Err(x.to_string());
    }
    ensure!(
        world,
        wrong.is_empty(),
        "{} wrong, first {:?}",
        wrong.len(),
        wrong.first()
    );
    ensure!(world, allocs == 0, "{allocs} allocations in 20 steps");
    Ok(())
}

/// Non-integer values: does the reduce-scatter round as the all-reduce
/// does? Information only (MPI promises neither the same grouping).
fn zero_rounding_info(world: &World) -> Check {
    let (me, n) = (rank(world), size(world));
    let e = |x: Error| x.to_string();
    let mut f = Grads::new(me, 30);
    let mut g = Grads::new(me, 30);
    for t in [&mut f, &mut g] {
        for &(v, _) in &t.vars {
            if let Ok(x) = t.tree.get_mut::<Vec<f32>>(v) {
                for (i, y) in x.iter_mut().enumerate() {
                    *y = 1.0 / (1.0 + (i + 3 * me) as f32).sqrt();
                }
            }
        }
    }
    let mut pf = SyncPlan::new(world, &f.tree, f.scope, &PlanOptions::new()).map_err(e)?;
    let mut pg = SyncPlan::new(world, &g.tree, g.scope, &PlanOptions::new()).map_err(e)?;
    pf.all_reduce(world, &mut f.tree, Reduce::Sum).map_err(e)?;
    pg.reduce_scatter(world, &mut g.tree, Reduce::Sum)
        .map_err(e)?;
    let own = owners(pg.partition(), g.vars.len());
    let differ = f
        .each()
        .iter()
        .zip(&g.each())
        .filter(|((v, i, x), (_, _, y))| own[*v][*i] == me && x != y)
        .count();
    if me == 0 {
        println!(
            "info: {n} ranks: {differ} of rank 0's reduce-scattered f32 sums differ from the all-reduce's"
        );
    }
    Ok(())
}

/// `train_rnn` with the Adam moments partitioned (`zero`) against the
/// replicated mode, on the same world: each rank holds about 1/N of the
/// moments (their bytes add up to the replicated mode's, each within 16
/// bytes of 1/N); the parameters and the owned moments are bit-identical at
/// 1 and 2 ranks, and within a relative 1e-3 at more, where MPI may group
/// a reduce-scatter's additions unlike an all-reduce's (docs/ranks/zero.md); a ZeRO
/// checkpoint resumes in both modes to the same parameters and moments.
fn train_rnn_zero_matches_the_replicated_mode(world: &World) -> Check {
    let (me, n) = (rank(world), size(world));
    let cfg = |zero| model::Config {
        seq_len: 8,
        hidden: 16,
        task: model::Task::Echo { delay: 2 },
        tokens: 5,
        epochs: 1,
        updates_per_epoch: 1,
        batch: 8,
        workers: 1,
        lr: 0.02,
        seed: 5,
        eval_seqs: 16,
        zero,
        timeout: Some(scopetree::ranks::DEFAULT_TIMEOUT),
    };
    let e = |e: model::Error| e.to_string();
    let mut rep = model::Trainer::with_world(cfg(false), Box::new(world.duplicate())).map_err(e)?;
    let mut zero = model::Trainer::with_world(cfg(true), Box::new(world.duplicate())).map_err(e)?;
    for _ in 0..12 {
        rep.train_update().map_err(e)?;
        zero.train_update().map_err(e)?;
    }
    zero.check_consistency().map_err(|x| x.to_string())?;
    // Memory: the moments' bytes on every rank.
    let whole = rep.moment_bytes().map_err(e)?;
    let per_rank = zero.moment_bytes_per_rank().map_err(e)?;
    // Parameters and owned moments against the replicated ones.
    let (mut max_abs, mut max_rel) = (0.0_f32, 0.0_f32);
    for (&p, &q) in rep.params.iter().zip(&zero.params) {
        let (a, b) = (
            rep.tree.get::<Vec<f32>>(p).map_err(|x| x.to_string())?,
            zero.tree.get::<Vec<f32>>(q).map_err(|x| x.to_string())?,
        );
        for (x, y) in a.iter().zip(b) {
            max_abs = max_abs.max((x - y).abs());
            max_rel = max_rel.max((x - y).abs() / x.abs().max(1e-30));
        }
    }
    let mut moments_differ = 0;
    for ((_, m, v), (s, zm, zv)) in rep
        .moment_pieces()
        .map_err(e)?
        .iter()
        .zip(zero.moment_pieces().map_err(e)?)
    {
        let len = zm.len();
        moments_differ += usize::from(m[s..s + len] != zm[..] || v[s..s + len] != zv[..]);
    }
    let (pd, zd) = (
        rep.params_digest().map_err(|x| x.to_string())?,
        zero.params_digest().map_err(|x| x.to_string())?,
    );
    let (rm, zm) = (
        rep.moments_digest().map_err(e)?,
        zero.moments_digest().map_err(e)?,
    );
    // A ZeRO checkpoint, resumed in the replicated mode and in ZeRO.
    let dir = shared_dir(world).map_err(|x| x.to_string())?;
    let path = dir.join("zero.safetensors");
    zero.save(&path).map_err(e)?;
    let mut back_rep =
        model::Trainer::with_world(cfg(false), Box::new(world.duplicate())).map_err(e)?;
    back_rep.resume(&path).map_err(e)?;
    let mut back_zero =
        model::Trainer::with_world(cfg(true), Box::new(world.duplicate())).map_err(e)?;
    back_zero.resume(&path).map_err(e)?;
    let resumed = [
        back_rep.params_digest().map_err(|x| x.to_string())?,
        back_rep.moments_digest().map_err(e)?,
        back_zero.params_digest().map_err(|x| x.to_string())?,
        back_zero.moments_digest().map_err(e)?,
    ];
    let back_bytes = back_zero.moment_bytes().map_err(e)?;
    world.barrier().map_err(|x| x.to_string())?;
    if me == 0 {
        let _ = std::fs::remove_dir_all(&dir);
        println!(
            "info: {n} ranks: moments {whole} bytes replicated, {per_rank:?} with zero; \
             parameters: largest difference {max_abs:e} (relative {max_rel:e}); \
             {moments_differ} of 5 owned moment pieces differ"
        );
    }
    ensure!(
        world,
        per_rank.iter().sum::<usize>() == whole,
        "{per_rank:?} do not add up to {whole}"
    );
    ensure!(
        world,
        per_rank.iter().all(|&b| b.abs_diff(whole / n) <= 16),
        "{per_rank:?} are not about {whole} / {n}"
    );
    ensure!(
        world,
        back_bytes == per_rank[me],
        "resumed: {back_bytes} bytes of moments"
    );
    ensure!(
        world,
        resumed == [zd.clone(), zm.clone(), zd.clone(), zm.clone()],
        "resumed {resumed:?}, saved {zd} {zm}"
    );
    if n <= 2 {
        ensure!(
            world,
            pd == zd && rm == zm,
            "params {pd} vs {zd}, moments {rm} vs {zm}"
        );
        ensure!(
            world,
            max_abs == 0.0 && moments_differ == 0,
            "{max_abs:e}, {moments_differ}"
        );
    } else {
        ensure!(
            world,
            max_rel.total_cmp(&1e-3).is_lt(),
            "parameters differ by {max_rel:e} (relative)"
        );
    }
    Ok(())
}

/// Misuse of the partitioned exchange stops every rank with the same kind
/// of error, changes nothing and never hangs: reductions that differ
/// between ranks, and a rank whose tree changed before an all-gather.
fn zero_misuse_stops_every_rank_unchanged(world: &World) -> Check {
    let (me, last, n) = (rank(world), size(world) - 1, size(world));
    let e = |x: Error| x.to_string();
    let mut g = Grads::new(me, 10);
    let before = g.each();
    let mut plan = SyncPlan::new(world, &g.tree, g.scope, &PlanOptions::new()).map_err(e)?;
    let op = if me == last && n > 1 {
        Reduce::Mean
    } else {
        Reduce::Sum
    };
    let got = plan.reduce_scatter(world, &mut g.tree, op);
    let msg = got
        .as_ref()
        .err()
        .map(ToString::to_string)
        .unwrap_or_default();
    let same = same_everywhere(world, &msg).map_err(e)?;
    let unchanged = g.each() == before;
    if me == 0 {
        let (v, _) = g.vars[0];
        g.tree
            .get_mut::<Vec<f32>>(v)
            .map_err(|x| x.to_string())?
            .push(1.0);
    }
    let changed_before = g.each();
    let gathered = plan.all_gather(world, &mut g.tree);
    let gather_ok = match (me, &gathered) {
        (0, Err(Error::Changed { key, .. })) => key == "l0000/g",
        (_, Err(Error::PeerFailed { ranks, .. })) => me > 0 && ranks == &[0],
        _ => false,
    };
    ensure!(world, same, "the error differs between ranks: {msg}");
    if n > 1 {
        ensure!(
            world,
            matches!(got, Err(Error::ArgumentsDiffer { .. }))
                && msg.contains(&format!("on rank {last}")),
            "{msg}"
        );
    } else {
        ensure!(world, got.is_ok(), "{msg}");
    }
    ensure!(
        world,
        n == 1 || unchanged,
        "a refused reduce-scatter changed values"
    );
    ensure!(world, gather_ok, "{gathered:?}");
    ensure!(
        world,
        g.each() == changed_before,
        "a refused all-gather changed values"
    );
    Ok(())
}

fn main() -> ExitCode {
    let Some((universe, _)) = mpi::initialize_with_threading(Threading::Funneled) else {
        eprintln!("MPI was already initialised");
        return ExitCode::FAILURE;
    };
    let world = universe.world();
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(300));
        eprintln!("ranks_mpi: still running after 5 minutes; a collective hangs");
        std::process::exit(3);
    });
    let checks: &[Named] = &[
        (
            "agreement_succeeds_on_identical_models",
            agreement_succeeds_on_identical_models,
        ),
        (
            "the_manifest_digest_is_the_same_on_every_rank",
            the_manifest_digest_is_the_same_on_every_rank,
        ),
        (
            "agreement_names_a_differing_shape_on_every_rank",
            agreement_names_a_differing_shape_on_every_rank,
        ),
        (
            "agreement_names_a_differing_name_on_every_rank",
            agreement_names_a_differing_name_on_every_rank,
        ),
        (
            "a_rank_that_cannot_build_its_manifest_stops_every_rank",
            a_rank_that_cannot_build_its_manifest_stops_every_rank,
        ),
        (
            "broadcast_makes_every_rank_hold_the_roots_values",
            broadcast_makes_every_rank_hold_the_roots_values,
        ),
        (
            "all_reduce_sum_and_mean_are_exact_with_the_default_bucket",
            all_reduce_sum_and_mean_are_exact_with_the_default_bucket,
        ),
        ("buckets_of_one_element", buckets_of_one_element),
        (
            "every_pipeline_and_direct_path_is_exact",
            every_pipeline_and_direct_path_is_exact,
        ),
        (
            "tensors_larger_than_a_bucket_and_many_small_ones",
            tensors_larger_than_a_bucket_and_many_small_ones,
        ),
        (
            "the_digest_names_a_diverged_rank",
            the_digest_names_a_diverged_rank,
        ),
        (
            "a_rank_whose_tree_changed_stops_every_rank_unchanged",
            a_rank_whose_tree_changed_stops_every_rank_unchanged,
        ),
        (
            "one_rank_saves_and_every_rank_loads",
            one_rank_saves_and_every_rank_loads,
        ),
        (
            "every_rank_writes_a_shard_and_any_number_of_ranks_loads",
            every_rank_writes_a_shard_and_any_number_of_ranks_loads,
        ),
        (
            "zero_state_saved_at_n_ranks_loads_at_any_number",
            zero_state_saved_at_n_ranks_loads_at_any_number,
        ),
        (
            "the_steady_state_allocates_nothing_under_mpi",
            the_steady_state_allocates_nothing_under_mpi,
        ),
        (
            "train_rnn_across_ranks_matches_one_process",
            train_rnn_across_ranks_matches_one_process,
        ),
        (
            "arguments_that_differ_stop_every_rank",
            arguments_that_differ_stop_every_rank,
        ),
        (
            "the_partition_is_contiguous_complete_and_balanced",
            the_partition_is_contiguous_complete_and_balanced,
        ),
        (
            "reduce_scatter_and_all_gather_match_the_all_reduce",
            reduce_scatter_and_all_gather_match_the_all_reduce,
        ),
        (
            "train_rnn_zero_matches_the_replicated_mode",
            train_rnn_zero_matches_the_replicated_mode,
        ),
        (
            "zero_misuse_stops_every_rank_unchanged",
            zero_misuse_stops_every_rank_unchanged,
        ),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (name, check) in checks {
        let outcome = check(&world);
        if let Err(e) = &outcome {
            eprintln!("FAILED {name}: {e}");
        }
        let failing = match ranks_where(&world, outcome.is_err()) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cannot exchange outcomes: {e}");
                return ExitCode::FAILURE;
            }
        };
        if failing.is_empty() {
            passed += 1;
            if rank(&world) == 0 {
                println!("ok {name} ({} ranks)", size(&world));
            }
        } else {
            failed += 1;
            if rank(&world) == 0 {
                println!("FAILED {name} on ranks {failing:?}");
            }
        }
    }
    if rank(&world) == 0 {
        println!(
            "ranks_mpi, {} ranks: {passed} passed, {failed} failed",
            size(&world)
        );
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
