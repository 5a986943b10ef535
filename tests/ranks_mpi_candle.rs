//! `ranks::CandlePlan` across real MPI ranks (features `candle` and `mpi`).
//! A test binary without the libtest harness (MPI is initialised once per
//! process): run it under `mpirun`,
//!
//! ```text
//! cargo build --release --features candle,mpi --test ranks_mpi_candle
//! mpirun -np 2 target/release/deps/ranks_mpi_candle-<hash>
//! ```
//!
//! or alone, a world of one rank (Open MPI's singleton). As root, Open MPI
//! wants `OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`.
//!
//! As in `tests/ranks_mpi.rs`: every check runs on every rank, collectives
//! first and assertions last; the ranks then exchange their outcomes, and
//! every rank exits 0, or 1 when any rank failed a check. A watchdog ends
//! the process with status 3 after 5 minutes, so a hang fails the run.

use std::hash::{DefaultHasher, Hasher};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use candle_nn::Init;
use mpi::topology::SimpleCommunicator;
use scopetree::candle::CandleStore;
use scopetree::checkpoint::SaveOptions;
use scopetree::ranks::{CandlePlan, Collective, DIGEST_BYTES, Error, PlanOptions, Reduce};

type World = SimpleCommunicator;
type Check = Result<(), String>;

const CPU: Device = Device::Cpu;

/// Fails the check with a message naming the rank.
macro_rules! ensure {
    ($world:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!("rank {}: {}", $world.rank(), format!($($fmt)+)));
        }
    };
}

/// Any error as a check's failure.
fn fail(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The flags of every rank, as every rank learns them.
fn gather_flags(world: &World, flag: bool) -> Vec<bool> {
    let mut mine = [0_u8; DIGEST_BYTES];
    mine[0] = u8::from(flag);
    let mut all = vec![[0_u8; DIGEST_BYTES]; world.size()];
    world
        .all_gather_digest(&mine, &mut all)
        .expect("an all-gather");
    all.iter().map(|d| d[0] != 0).collect()
}

/// Whether `text` is the same on every rank (by a hash of one build).
fn same_text(world: &World, text: &str) -> bool {
    let mut h = DefaultHasher::new();
    h.write(text.as_bytes());
    let mut mine = [0_u8; DIGEST_BYTES];
    mine[..8].copy_from_slice(&h.finish().to_le_bytes());
    mine[8..].copy_from_slice(&(text.len() as u64).to_le_bytes());
    let mut all = vec![[0_u8; DIGEST_BYTES]; world.size()];
    world
        .all_gather_digest(&mine, &mut all)
        .expect("an all-gather");
    all.iter().all(|d| *d == mine)
}

/// The error's message (empty for none), and whether it is the same on
/// every rank. A collective call.
fn message_everywhere<T>(world: &World, got: &Result<T, Error>) -> (String, bool) {
    let msg = got.as_ref().err().map(ToString::to_string);
    let msg = msg.unwrap_or_default();
    let same = same_text(world, &msg);
    (msg, same)
}

/// A store with `a.w` (F32 [2, 3]), `b.v` (F64 [5]), `c.some` (F32 [4],
/// used by rank 0 only) and `d.none` (F32 [2], used by no rank), every
/// element `fill`.
struct Model {
    store: CandleStore,
    w: Tensor,
    v: Tensor,
    some: Tensor,
}

impl Model {
    fn new(fill: f64, w_shape: (usize, usize)) -> Self {
        let store = CandleStore::new();
        let get = |shape: &[usize], name: &str, dtype| {
            store
                .get(shape, name, Init::Const(fill), dtype, &CPU)
                .expect("a variable")
        };
        let w = get(&[w_shape.0, w_shape.1], "a.w", DType::F32);
        let v = get(&[5], "b.v", DType::F64);
        let some = get(&[4], "c.some", DType::F32);
        get(&[2], "d.none", DType::F32);
        Model { store, w, v, some }
    }

    /// Gradients of small integers: `(r + 1) · (i + 1)` for element `i` of
    /// `a.w` and `b.v` on rank `r`, `10 · (i + 1)` for `c.some` on rank 0.
    fn grads(&self, r: usize) -> candle_core::Result<GradStore> {
        let c = |n: usize, k: f64, dtype| {
            let v: Vec<f64> = (0..n).map(|i| k * (i + 1) as f64).collect();
            Tensor::new(v, &CPU)?.to_dtype(dtype)
        };
        let k = (r + 1) as f64;
        let cw = c(self.w.elem_count(), k, DType::F32)?.reshape(self.w.dims())?;
        let mut loss = (self.w.mul(&cw)?.sum_all()?
            + self
                .v
                .mul(&c(5, k, DType::F64)?)?
                .sum_all()?
                .to_dtype(DType::F32)?)?;
        if r == 0 {
            loss = (loss + self.some.mul(&c(4, 10.0, DType::F32)?)?.sum_all()?)?;
        }
        loss.backward()
    }
}

fn agreement_mismatch_gives_every_rank_the_same_error(world: &World) -> Check {
    let last = world.size() - 1;
    let shape = if world.rank() == last { (3, 3) } else { (2, 3) };
    let m = Model::new(0.5, shape);
    let got = CandlePlan::new(world, &m.store, &PlanOptions::new());
    let (msg, same) = message_everywhere(world, &got);
    if world.size() == 1 {
        ensure!(world, got.is_ok(), "{msg}");
        return Ok(());
    }
    ensure!(world, matches!(got, Err(Error::Disagree { .. })), "{msg}");
    ensure!(world, same, "the error differs between ranks: {msg}");
    let others = if last == 1 {
        "rank 0".to_owned()
    } else {
        format!("ranks 0-{}", last - 1)
    };
    let want =
        format!("first difference at `a.w`: F32 [2, 3] on {others}; F32 [3, 3] on rank {last}");
    ensure!(world, msg.contains(&want), "{msg}");
    Ok(())
}

fn reduce_is_exact(world: &World, bucket: usize) -> Check {
    reduce_is_exact_with(world, PlanOptions::new().bucket_bytes(bucket), false)
}

/// The exactness check of the plan built with `opts`, through
/// `all_reduce_in_place` when `in_place`.
fn reduce_is_exact_with(world: &World, opts: PlanOptions, in_place: bool) -> Check {
    let bucket = opts.bucket_bytes_value();
    let m = Model::new(1.0, (2, 3));
    let mut plan = CandlePlan::new(world, &m.store, &opts).map_err(fail)?;
    let n = world.size();
    // Σ_r (r + 1) = n (n + 1) / 2.
    let total = (n * (n + 1) / 2) as f64;
    let mut reduced = Vec::new();
    for op in [Reduce::Sum, Reduce::Mean] {
        let mut grads = m.grads(world.rank()).map_err(fail)?;
        let done = if in_place {
            plan.all_reduce_in_place(world, &mut grads, op)
        } else {
            plan.all_reduce(world, &mut grads, op)
        };
        reduced.push((op, grads, done));
    }
    for (op, grads, done) in reduced {
        done.map_err(fail)?;
        let f32_of = |x: f64| match op {
            Reduce::Sum => x as f32,
            Reduce::Mean => x as f32 / n as f32,
        };
        let f64_of = |x: f64| match op {
            Reduce::Sum => x,
            Reduce::Mean => x / n as f64,
        };
        let gw = grads.get(&m.w).ok_or("no gradient of a.w")?;
        let gw = gw
            .flatten_all()
            .and_then(|g| g.to_vec1::<f32>())
            .map_err(fail)?;
        let want: Vec<f32> = (0..6).map(|i| f32_of(total * (i + 1) as f64)).collect();
        ensure!(
            world,
            gw == want,
            "{op:?}, bucket {bucket}: a.w {gw:?}, want {want:?}"
        );
        let gv = grads.get(&m.v).ok_or("no gradient of b.v")?;
        let gv = gv.to_vec1::<f64>().map_err(fail)?;
        let want: Vec<f64> = (0..5).map(|i| f64_of(total * (i + 1) as f64)).collect();
        ensure!(
            world,
            gv == want,
            "{op:?}, bucket {bucket}: b.v {gv:?}, want {want:?}"
        );
        // Rank 0's gradient of c.some, zeros elsewhere: on every rank now.
        let gs = grads.get(&m.some).ok_or("no gradient of c.some")?;
        let gs = gs.to_vec1::<f32>().map_err(fail)?;
        let want: Vec<f32> = (0..4).map(|i| f32_of(10.0 * (i + 1) as f64)).collect();
        ensure!(
            world,
            gs == want,
            "{op:?}, bucket {bucket}: c.some {gs:?}, want {want:?}"
        );
        let none = plan.vars()[3].as_tensor();
        ensure!(world, grads.get(none).is_none(), "d.none got a gradient");
    }
    Ok(())
}

fn all_reduce_sum_and_mean_are_exact_with_the_default_bucket(world: &World) -> Check {
    reduce_is_exact(world, scopetree::ranks::DEFAULT_BUCKET_BYTES)
}

fn all_reduce_is_exact_with_buckets_that_split_variables(world: &World) -> Check {
    reduce_is_exact(world, 8)
}

/// In place, every gradient from its own storage (direct from 1 byte), in
/// buckets that split the variables and in the default ones; rank 0's
/// gradient of `c.some` is written in place there, the others' made anew.
fn all_reduce_in_place_is_exact(world: &World) -> Check {
    for bucket in [8, scopetree::ranks::DEFAULT_BUCKET_BYTES] {
        let opts = PlanOptions::new().bucket_bytes(bucket).direct_bytes(1);
        reduce_is_exact_with(world, opts, true)?;
    }
    Ok(())
}

/// ZeRO over MPI: three steps of `reduce_scatter`, `ZeroAdamW` and
/// `all_gather` end with the values of three replicated steps
/// (`all_reduce`, scopetree's AdamW), bit for bit, on every rank, in the
/// default buckets and in buckets of 8 bytes that split the slices; the
/// gradients are small integers, so the sums are exact in any order. The
/// optimizer's state saved by every rank loads back, alone and with the
/// model in a managed checkpoint (`Training`).
fn zero_steps_match_replicated_ones(world: &World) -> Check {
    let params = candle_nn::ParamsAdamW {
        lr: 0.05,
        weight_decay: 0.1,
        ..candle_nn::ParamsAdamW::default()
    };
    let mut outcomes = Vec::new();
    for bucket in [scopetree::ranks::DEFAULT_BUCKET_BYTES, 8] {
        let opts = PlanOptions::new().bucket_bytes(bucket);
        let rep = Model::new(0.5, (3, 5));
        let mut plan = CandlePlan::new(world, &rep.store, &opts).map_err(fail)?;
        let mut opt =
            scopetree::candle::AdamW::for_store(&rep.store, "", params.clone()).map_err(fail)?;
        let zero = Model::new(0.5, (3, 5));
        let mut zplan = CandlePlan::new(world, &zero.store, &opts).map_err(fail)?;
        let mut zopt =
            scopetree::ranks::ZeroAdamW::new(world, &zplan, params.clone()).map_err(fail)?;
        for _ in 0..3 {
            let mut g = rep.grads(world.rank()).map_err(fail)?;
            plan.all_reduce(world, &mut g, Reduce::Mean).map_err(fail)?;
            candle_nn::Optimizer::step(&mut opt, &g).map_err(fail)?;
            let mut g = zero.grads(world.rank()).map_err(fail)?;
            zplan
                .reduce_scatter(world, &mut g, Reduce::Mean)
                .map_err(fail)?;
            zopt.step(&g).map_err(fail)?;
            zplan.all_gather(world).map_err(fail)?;
        }
        let (a, b) = (held(&rep.store)?, held(&zero.store)?);
        let same = same_text(world, &format!("{b:?}"));
        // The optimizer's state saved by every rank comes back whole.
        let dir = shared_dir(world).join(format!("zero-state-{bucket}"));
        zopt.save_shards(world, &mut zplan, &dir).map_err(fail)?;
        let mut back =
            scopetree::ranks::ZeroAdamW::new(world, &zplan, params.clone()).map_err(fail)?;
        back.load_shards(world, &mut zplan, &dir).map_err(fail)?;
        let resumed =
            held(back.state())? == held(zopt.state())? && back.step_count().map_err(fail)? == 3;
        // The model with its optimizer in one managed checkpoint: a fresh
        // model and optimizer load both.
        use scopetree::ranks::{CheckpointManager, Training};
        let manager =
            CheckpointManager::new(shared_dir(world).join(format!("zero-managed-{bucket}")), 1)
                .map_err(fail)?;
        let state = Training::new(&zero.store, &mut zopt);
        (manager.save(world, &mut zplan, &state, 3, &SaveOptions::new())).map_err(fail)?;
        let fresh = Model::new(0.5, (3, 5));
        let mut fplan = CandlePlan::new(world, &fresh.store, &opts).map_err(fail)?;
        let mut fopt =
            scopetree::ranks::ZeroAdamW::new(world, &fplan, params.clone()).map_err(fail)?;
        let step = (manager.load_latest(
            world,
            &mut fplan,
            &mut Training::new(&fresh.store, &mut fopt),
        ))
        .map_err(fail)?
        .map(|(step, _)| step);
        let managed = step == Some(3)
            && held(&fresh.store)? == b
            && held(fopt.state())? == held(zopt.state())?
            && fopt.step_count().map_err(fail)? == 3;
        outcomes.push((bucket, a, b, same && resumed && managed));
    }
    // Collectives first (above), assertions last.
    let initial = held(&Model::new(0.5, (3, 5)).store)?;
    for (bucket, a, b, same) in outcomes {
        ensure!(
            world,
            a == b,
            "bucket {bucket}: ZeRO's values differ from the replicated ones"
        );
        ensure!(
            world,
            same,
            "bucket {bucket}: the ranks' values differ, or the saved state (alone, or \
             managed with the model) did not come back"
        );
        ensure!(world, a != initial, "bucket {bucket}: nothing moved");
    }
    Ok(())
}

fn broadcast_makes_every_rank_hold_the_roots_values(world: &World) -> Check {
    let r = world.rank() as f64;
    let m = Model::new(10.0 * r + 1.0, (2, 3));
    let mut plan =
        CandlePlan::new(world, &m.store, &PlanOptions::new().bucket_bytes(12)).map_err(fail)?;
    let root = world.size() - 1;
    let before = plan.check_consistency(world);
    plan.broadcast(world, root).map_err(fail)?;
    plan.check_consistency(world).map_err(fail)?;
    let want = 10.0 * root as f64 + 1.0;
    for (var, e) in plan.vars().iter().zip(plan.manifest().entries()) {
        let vals = var
            .flatten_all()
            .and_then(|t| t.to_dtype(DType::F64))
            .and_then(|t| t.to_vec1::<f64>())
            .map_err(fail)?;
        ensure!(
            world,
            vals.iter().all(|&x| x == want),
            "{}: {vals:?}",
            e.key
        );
    }
    ensure!(
        world,
        (world.size() == 1) == before.is_ok(),
        "values differed before the broadcast: {before:?}"
    );
    Ok(())
}

fn divergence_names_the_variable_on_every_rank(world: &World) -> Check {
    let m = Model::new(0.25, (2, 3));
    let mut plan = CandlePlan::new(world, &m.store, &PlanOptions::new()).map_err(fail)?;
    plan.check_consistency(world).map_err(fail)?;
    let last = world.size() - 1;
    if world.rank() == last {
        let v = &plan.vars()[1]; // b.v
        let t = Tensor::new(&[0.25_f64, 0.25, 0.25, 0.25 + 1e-12, 0.25], &CPU).map_err(fail)?;
        v.set(&t).map_err(fail)?;
    }
    let got = plan.check_consistency(world);
    let (msg, same) = message_everywhere(world, &got);
    if world.size() == 1 {
        ensure!(world, got.is_ok(), "{msg}");
        return Ok(());
    }
    ensure!(world, matches!(got, Err(Error::Diverged { .. })), "{msg}");
    ensure!(world, same, "the error differs between ranks: {msg}");
    ensure!(world, msg.contains("first difference at `b.v`"), "{msg}");
    Ok(())
}

fn differing_reductions_and_a_bad_gradient_stop_every_rank(world: &World) -> Check {
    let m = Model::new(1.0, (2, 3));
    let mut plan = CandlePlan::new(world, &m.store, &PlanOptions::new()).map_err(fail)?;
    let last = world.size() - 1;
    let mut grads = m.grads(world.rank()).map_err(fail)?;
    let gw = grads.get(&m.w).ok_or("no gradient")?.clone();
    // Another reduction on the last rank (with more than one rank).
    let differ = if world.size() > 1 {
        let op = if world.rank() == last {
            Reduce::Sum
        } else {
            Reduce::Mean
        };
        Some(plan.all_reduce(world, &mut grads, op))
    } else {
        None
    };
    let kept = grads.get(&m.w).map(|g| g.id()) == Some(gw.id());
    // A gradient of another shape on the last rank.
    if world.rank() == last {
        grads.insert(&m.v, Tensor::zeros(4, DType::F64, &CPU).map_err(fail)?);
    }
    let bad = plan.all_reduce(world, &mut grads, Reduce::Mean);
    let kept_too = grads.get(&m.w).map(|g| g.id()) == Some(gw.id());
    ensure!(
        world,
        kept && kept_too,
        "a failed all-reduce changed the gradients"
    );
    if let Some(differ) = differ {
        ensure!(
            world,
            matches!(differ, Err(Error::ArgumentsDiffer { .. })),
            "{differ:?}"
        );
    }
    if world.rank() == last {
        ensure!(
            world,
            matches!(&bad, Err(Error::Changed { key, .. }) if key == "b.v"),
            "{bad:?}"
        );
    } else {
        ensure!(
            world,
            matches!(bad, Err(Error::PeerFailed { .. })),
            "{bad:?}"
        );
    }
    Ok(())
}

/// A directory every rank sees: rank 0's temporary directory.
fn shared_dir(world: &World) -> PathBuf {
    let mut name = if world.rank() == 0 {
        let dir = std::env::temp_dir().join(format!("scopetree-mpi-candle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        dir.to_string_lossy().into_owned().into_bytes()
    } else {
        Vec::new()
    };
    let mut len = (name.len() as u64).to_le_bytes();
    world.broadcast_bytes(0, &mut len).expect("a broadcast");
    name.resize(u64::from_le_bytes(len) as usize, 0);
    world.broadcast_bytes(0, &mut name).expect("a broadcast");
    PathBuf::from(String::from_utf8(name).expect("a UTF-8 path"))
}

fn one_rank_saves_and_every_rank_loads(world: &World) -> Check {
    let path = shared_dir(world).join("model.safetensors");
    let m = Model::new(3.0 + world.rank() as f64, (2, 3));
    let mut plan = CandlePlan::new(world, &m.store, &PlanOptions::new()).map_err(fail)?;
    let saved = plan.save_on_root(world, &m.store, &path, 0).map_err(fail)?;
    ensure!(world, saved.is_some() == (world.rank() == 0), "{saved:?}");
    plan.load_on_all(world, &m.store, &path).map_err(fail)?;
    let w =
        m.w.flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(fail)?;
    ensure!(world, w.iter().all(|&x| x == 3.0), "a.w {w:?}");
    Ok(())
}

/// `Model`'s variables and a frozen `e.frozen` (BF16 [3]), every element
/// `base + i` for element `i`: five variables of 94 bytes in all.
fn sharded_model(base: f64) -> Result<CandleStore, String> {
    let m = Model::new(0.0, (2, 3));
    m.store
        .get(3, "e.frozen", Init::Const(0.0), DType::BF16, &CPU)
        .map_err(fail)?;
    m.store.freeze("e").map_err(fail)?;
    for (_, v) in m.store.named_vars().map_err(fail)? {
        let t = Tensor::arange(0.0, v.elem_count() as f64, &CPU)
            .and_then(|t| t.affine(1.0, base))
            .and_then(|t| t.to_dtype(v.as_tensor().dtype()))
            .and_then(|t| t.reshape(v.dims()))
            .and_then(|t| v.set(&t));
        t.map_err(fail)?;
    }
    Ok(m.store)
}

/// Every variable's bytes as held, in name order.
fn held(store: &CandleStore) -> Result<Vec<(String, Vec<u8>)>, String> {
    use scopetree::checkpoint::Checkpointable;
    let mut out = Vec::new();
    for (k, v) in store.named_vars().map_err(fail)? {
        let bytes = Checkpointable::try_le_bytes(&v).map_err(fail)?;
        out.push((k, bytes.into_owned()));
    }
    Ok(out)
}

/// The ranks of `world` below `m` as a communicator of their own (`None`
/// on the others). A collective call.
fn first_ranks(world: &World, m: usize) -> Option<World> {
    use mpi::topology::Color;
    use mpi::traits::Communicator;
    let color = if Collective::rank(world) < m {
        Color::with_value(0)
    } else {
        Color::undefined()
    };
    world.split_by_color(color)
}

/// Whether candle's own `VarBuilder::from_mmaped_safetensors`, over the
/// shards of `dir`, reads every variable of `store` with its dtype and
/// bytes.
fn candle_reads(dir: &std::path::Path, shards: &[String], store: &CandleStore) -> Check {
    let paths: Vec<PathBuf> = shards.iter().map(|f| dir.join(f)).collect();
    // SAFETY: the shards are not written while they are mapped.
    let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&paths, DType::F32, &CPU) }
        .map_err(fail)?;
    for (key, v) in store.named_vars().map_err(fail)? {
        let t = v.as_tensor();
        let got = vb
            .get_with_hints_dtype(t.dims(), &key, Init::Const(0.0), t.dtype())
            .map_err(fail)?;
        let bits = |x: &Tensor| {
            x.flatten_all()
                .and_then(|x| x.to_dtype(DType::F64))
                .and_then(|x| x.to_vec1::<f64>())
                .map_err(fail)
        };
        if got.dtype() != t.dtype() || bits(&got)? != bits(t)? {
            return Err(format!("candle reads {key} as {got}, held {t}"));
        }
    }
    Ok(())
}

/// Every rank writes one shard of a Hugging Face checkpoint of the store
/// (frozen variables too), which candle reads as it is; the checkpoint then
/// loads on 1, 2, … and all the ranks (sub-communicators of the world),
/// each rank of a load reading a share, the shares adding up to the
/// checkpoint's bytes once; a deleted shard is the same error on every
/// rank, every store unchanged.
fn every_rank_writes_a_shard_and_any_number_of_ranks_loads(world: &World) -> Check {
    let dir = shared_dir(world).join("shards");
    let (me, n) = (world.rank(), world.size());
    let store = sharded_model(1.5)?;
    let want = held(&store)?;
    let opts = PlanOptions::new().bucket_bytes(16);
    let mut plan = CandlePlan::new(world, &store, &opts).map_err(fail)?;
    let saved = plan
        .save_shards(world, &store, &dir, &SaveOptions::new())
        .map_err(fail)?;
    let flags = gather_flags(world, saved.mine.is_some());
    let writers: Vec<usize> = (0..n).filter(|&r| flags[r]).collect();
    let there = dir.join("model.safetensors.index.json").exists();
    let read = candle_reads(&dir, &saved.shards, &store);

    let mut failures = Vec::new();
    for m_ranks in 1..=n {
        if let Some(sub) = first_ranks(world, m_ranks) {
            let t = sharded_model(100.0 * (me + 1) as f64)?;
            let got =
                CandlePlan::new(&sub, &t, &opts).and_then(|mut p| p.load_shards(&sub, &t, &dir));
            let bytes = got.as_ref().map_or(0, |l| l.bytes);
            let mut all = vec![0_u8; 8 * m_ranks];
            Collective::all_gather_bytes(&sub, &bytes.to_le_bytes(), &mut all).map_err(fail)?;
            let total: u64 = all
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .sum();
            if got.is_err() || held(&t)? != want || total != 94 {
                failures.push(format!(
                    "at {m_ranks} rank(s): {got:?}, {total} bytes read in all"
                ));
            }
        }
        world.barrier().map_err(fail)?;
    }

    // A deleted shard: every rank reports it, no store changes.
    let last = &saved.shards[saved.shards.len() - 1];
    if me == 0 {
        let _ = std::fs::remove_file(dir.join(last));
    }
    world.barrier().map_err(fail)?;
    let t = sharded_model(7.0)?;
    let before = held(&t)?;
    let got = CandlePlan::new(world, &t, &opts).and_then(|mut p| p.load_shards(world, &t, &dir));
    let (message, same) = message_everywhere(world, &got);
    world.barrier().map_err(fail)?;
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
    ensure!(world, !saved.shards.is_empty(), "no shards");
    read?;
    ensure!(world, failures.is_empty(), "{failures:?}");
    ensure!(world, got.is_err() && same, "deleted shard: {got:?}");
    ensure!(world, message.contains(last.as_str()), "{message}");
    ensure!(world, held(&t)? == before, "a refused load changed values");
    Ok(())
}

/// A manager keeps the store's checkpoints across the ranks, written
/// beside training by an async saver (each rank stages its own shard and a
/// background thread writes it) and in the caller's time: each save holds
/// the values of its call, the last two complete steps stay, and the
/// latest loads back on every rank.
fn a_manager_and_an_async_saver_keep_the_store(world: &World) -> Check {
    use scopetree::ranks::{AsyncSaver, CheckpointManager};
    let dir = shared_dir(world).join("managed");
    let mut store = sharded_model(0.0)?;
    let mut plan = CandlePlan::new(world, &store, &PlanOptions::new()).map_err(fail)?;
    let manager = CheckpointManager::new(&dir, 2).map_err(fail)?;
    let mut saver = AsyncSaver::new();
    let mut want = Vec::new();
    for step in 1..=3_u64 {
        let now = sharded_model(step as f64)?;
        for ((_, v), (_, n)) in store
            .named_vars()
            .map_err(fail)?
            .iter()
            .zip(now.named_vars().map_err(fail)?)
        {
            v.set(n.as_tensor()).map_err(fail)?;
        }
        want.push(held(&store)?);
        saver
            .save_managed(
                world,
                &manager,
                &mut plan,
                &store,
                step,
                &SaveOptions::new(),
            )
            .map_err(fail)?;
        // Training goes on: the save holds the values of its call.
        for (_, v) in store.named_vars().map_err(fail)? {
            v.set(&v.ones_like().map_err(fail)?).map_err(fail)?;
        }
    }
    let done = saver.wait(world).map_err(fail)?;
    let latest = manager
        .load_latest(world, &mut plan, &mut store)
        .map_err(fail)?
        .map(|(step, _)| step);
    let loaded = held(&store)?;
    manager
        .save(world, &mut plan, &store, 4, &SaveOptions::new())
        .map_err(fail)?;
    world.barrier().map_err(fail)?;
    let steps = manager.steps().map_err(fail)?;
    let shards = done.as_ref().map(|d| d.shards.clone()).unwrap_or_default();
    let read = candle_reads(&manager.step_dir(3), &shards, &store);
    world.barrier().map_err(fail)?;
    if world.rank() == 0 {
        let _ = std::fs::remove_dir_all(dir.parent().unwrap_or(&dir));
    }
    ensure!(world, done.is_some(), "no save under way");
    ensure!(world, latest == Some(3), "latest {latest:?}");
    ensure!(world, loaded == want[2], "step 3 did not load as saved");
    ensure!(world, steps == [3, 4], "steps kept {steps:?}");
    // One shard per rank at 1 and 2 ranks; at more, some ranks may write
    // none (the cut keeps tensors whole, by bytes: 3 shards at 4 ranks).
    let n = shards.len();
    let named: Vec<String> = (1..=n)
        .map(|k| format!("model-{k:05}-of-{n:05}.safetensors"))
        .collect();
    ensure!(
        world,
        shards == named && n <= world.size() && (world.size() > 2 || n == world.size()),
        "shards {shards:?}"
    );
    read
}

fn main() -> ExitCode {
    let Some(universe) = mpi::initialize() else {
        eprintln!("MPI was already initialised");
        return ExitCode::FAILURE;
    };
    let world = universe.world();
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(300));
        eprintln!("ranks_mpi_candle: still running after 5 minutes; a collective hangs");
        std::process::exit(3);
    });
    type Named = (&'static str, fn(&World) -> Check);
    let checks: &[Named] = &[
        (
            "agreement_mismatch_gives_every_rank_the_same_error",
            agreement_mismatch_gives_every_rank_the_same_error,
        ),
        (
            "all_reduce_sum_and_mean_are_exact_with_the_default_bucket",
            all_reduce_sum_and_mean_are_exact_with_the_default_bucket,
        ),
        ("all_reduce_in_place_is_exact", all_reduce_in_place_is_exact),
        (
            "all_reduce_is_exact_with_buckets_that_split_variables",
            all_reduce_is_exact_with_buckets_that_split_variables,
        ),
        (
            "broadcast_makes_every_rank_hold_the_roots_values",
            broadcast_makes_every_rank_hold_the_roots_values,
        ),
        (
            "zero_steps_match_replicated_ones",
            zero_steps_match_replicated_ones,
        ),
        (
            "divergence_names_the_variable_on_every_rank",
            divergence_names_the_variable_on_every_rank,
        ),
        (
            "differing_reductions_and_a_bad_gradient_stop_every_rank",
            differing_reductions_and_a_bad_gradient_stop_every_rank,
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
            "a_manager_and_an_async_saver_keep_the_store",
            a_manager_and_an_async_saver_keep_the_store,
        ),
    ];
    let mut failed = 0;
    for (name, check) in checks {
        let outcome = check(&world);
        if let Err(e) = &outcome {
            eprintln!("FAILED {name}: {e}");
        }
        let flags = gather_flags(&world, outcome.is_err());
        let failing: Vec<usize> = (0..flags.len()).filter(|&r| flags[r]).collect();
        if !failing.is_empty() {
            failed += 1;
        }
        if world.rank() == 0 {
            if failing.is_empty() {
                println!("ok {name} ({} ranks)", world.size());
            } else {
                println!("FAILED {name} on ranks {failing:?}");
            }
        }
    }
    if world.rank() == 0 {
        println!(
            "ranks_mpi_candle, {} ranks: {} passed, {failed} failed",
            world.size(),
            checks.len() - failed
        );
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
