//! ZeRO stage 1 over a candle store (feature `candle`): `CandlePlan`'s
//! `reduce_scatter` and `all_gather` with `ranks::ZeroAdamW` end
//! bit-identical to the replicated step (`all_reduce` and scopetree's
//! AdamW) at 1 to 4 ranks run as threads, whose sums add in rank order as
//! the all-reduce's do; each rank keeps the moments of its slice only; and
//! bad gradients change nothing; the optimizer's state saved by every rank
//! is scopetree's AdamW's whole state, and loads at any number of ranks;
//! and (release mode) a ZeRO step costs
//! O(variables), in buckets that cut the slice into many rounds. The same
//! over MPI, at 2 ranks, is in `tests/ranks_mpi_candle.rs`.

#[path = "support/thread_world.rs"]
mod thread_world;
#[path = "support/timing.rs"]
mod timing;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, ParamsAdamW};
use scopetree::candle::{AdamW, CandleStore};
use scopetree::ranks::{
    CandlePlan, CheckpointManager, Collective, Error, OPTIMIZER_DIR, PlanOptions, Reduce,
    ShardedSave, Training, ZeroAdamW,
};

type R = Result<(), Box<dyn std::error::Error>>;

const CPU: Device = Device::Cpu;

fn params() -> ParamsAdamW {
    ParamsAdamW {
        lr: 0.05,
        weight_decay: 0.1,
        ..ParamsAdamW::default()
    }
}

/// A store of five variables of odd sizes (`f32` and `f64`), so that the
/// ranks' slices split variables, with values that differ per element.
fn store() -> candle_core::Result<CandleStore> {
    let store = CandleStore::new();
    let shapes: [(&str, &[usize], DType); 5] = [
        ("a.w", &[3, 5], DType::F32),
        ("b.bias", &[7], DType::F32),
        ("c.v", &[2, 3], DType::F64),
        ("d.unused", &[4], DType::F32),
        ("e.head", &[11], DType::F32),
    ];
    for (i, (name, shape, dtype)) in shapes.into_iter().enumerate() {
        store
            .get(shape, name, Init::Const(0.0), dtype, &CPU)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let var = store
            .var(name)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?
            .ok_or_else(|| candle_core::Error::Msg(format!("{name} missing")))?;
        let n = var.elem_count();
        let values: Vec<f64> = (0..n)
            .map(|k| ((i * 31 + k * 7) % 13) as f64 / 13.0 - 0.4)
            .collect();
        var.set(&Tensor::from_vec(values, shape, &CPU)?.to_dtype(dtype)?)?;
    }
    Ok(store)
}

/// `rank`'s gradients at `step`: every variable but `d.unused` (which none
/// has) and `b.bias` (which only rank 1 has) takes part in the loss.
fn grads(store: &CandleStore, rank: usize, step: usize) -> candle_core::Result<GradStore> {
    let get = |n: &str| {
        store
            .var(n)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?
            .ok_or_else(|| candle_core::Error::Msg(format!("{n} missing")))
    };
    let r = (rank * 3 + step) as f64;
    let mut loss = Tensor::new(0.0_f32, &CPU)?;
    for n in ["a.w", "e.head"] {
        let v = get(n)?;
        let c = (v.as_tensor().ones_like()? * (1.0 + r))?;
        loss = (loss + (v.as_tensor().sqr()? * c)?.sum_all()?)?;
    }
    let cv = get("c.v")?;
    loss = (loss
        + (cv.as_tensor() * (0.5 - r))?
            .sum_all()?
            .to_dtype(DType::F32)?)?;
    if rank == 1 {
        loss = (loss + (get("b.bias")?.as_tensor() * 2.0)?.sum_all()?)?;
    }
    loss.backward()
}

/// Every variable's bits, in name order.
fn bits(store: &CandleStore) -> Result<Vec<(String, Vec<u64>)>, String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let mut out = Vec::new();
    for (k, v) in store.named_vars().map_err(|x| e(&x))? {
        let vals: Vec<f64> = v
            .flatten_all()
            .and_then(|t| t.to_dtype(DType::F64))
            .and_then(|t| t.to_vec1())
            .map_err(|x| e(&x))?;
        out.push((k, vals.iter().map(|x| x.to_bits()).collect()));
    }
    Ok(out)
}

/// `steps` steps at `n` ranks, replicated and ZeRO, with `opts`: each
/// rank's variables' bits after both, and the moments' elements ZeRO kept.
fn run(n: usize, steps: usize, opts: &PlanOptions, op: Reduce) -> Vec<Result<Ranked, String>> {
    thread_world::run(n, |world| -> Result<Ranked, String> {
        let e = |x: &dyn std::fmt::Display| x.to_string();
        let me = world.rank();
        // Replicated: the all-reduce, then scopetree's AdamW everywhere.
        let rep = store().map_err(|x| e(&x))?;
        let mut plan = CandlePlan::new(world, &rep, opts).map_err(|x| e(&x))?;
        let mut opt = AdamW::for_store(&rep, "", params()).map_err(|x| e(&x))?;
        for step in 0..steps {
            let mut g = grads(&rep, me, step).map_err(|x| e(&x))?;
            plan.all_reduce(world, &mut g, op).map_err(|x| e(&x))?;
            candle_nn::Optimizer::step(&mut opt, &g).map_err(|x| e(&x))?;
        }
        // ZeRO: the reduce-scatter, this rank's slice, the all-gather.
        let zero = store().map_err(|x| e(&x))?;
        let mut plan = CandlePlan::new(world, &zero, opts).map_err(|x| e(&x))?;
        let mut zopt = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
        for step in 0..steps {
            let mut g = grads(&zero, me, step).map_err(|x| e(&x))?;
            plan.reduce_scatter(world, &mut g, op).map_err(|x| e(&x))?;
            zopt.step(&g).map_err(|x| e(&x))?;
            plan.all_gather(world).map_err(|x| e(&x))?;
        }
        let moments: usize = (zopt.state().all_vars().map_err(|x| e(&x))?.iter())
            .map(|v| v.elem_count())
            .sum::<usize>()
            - 1; // the step count
        Ok(Ranked {
            replicated: bits(&rep)?,
            zero: bits(&zero)?,
            moments,
            steps: zopt.step_count().map_err(|x| e(&x))?,
        })
    })
}

struct Ranked {
    replicated: Vec<(String, Vec<u64>)>,
    zero: Vec<(String, Vec<u64>)>,
    moments: usize,
    steps: u64,
}

#[test]
fn zero_steps_end_bit_identical_to_replicated_ones_at_1_to_4_ranks() -> R {
    let elems = 15 + 7 + 6 + 4 + 11;
    for n in 1..=4 {
        for (opts, op) in [
            (PlanOptions::new(), Reduce::Mean),
            // Buckets of 12 bytes: every slice in several rounds.
            (PlanOptions::new().bucket_bytes(12), Reduce::Sum),
        ] {
            let out = run(n, 3, &opts, op);
            let mut moments = 0;
            let mut first: Option<Vec<(String, Vec<u64>)>> = None;
            for (rank, got) in out.into_iter().enumerate() {
                let got = got?;
                let what = format!("{n} ranks, rank {rank}, {op:?}, {opts:?}");
                assert_eq!(got.zero, got.replicated, "{what}");
                // Every rank holds the same values, and they moved.
                let reference = first.get_or_insert_with(|| got.zero.clone());
                assert_eq!(&got.zero, reference, "{what}");
                assert_eq!(got.steps, 3, "{what}");
                moments += got.moments;
            }
            // The ranks' moments together: two per element, once.
            assert_eq!(moments, 2 * elems, "{n} ranks");
            let fresh = store()?;
            let start = bits(&fresh)?;
            let end = first.expect("ranks");
            let moved: Vec<&str> = (start.iter().zip(&end))
                .filter(|(a, b)| a.1 != b.1)
                .map(|(a, _)| a.0.as_str())
                .collect();
            // `b.bias` has a gradient on rank 1 only, `d.unused` on none.
            let want: &[&str] = if n > 1 {
                &["a.w", "b.bias", "c.v", "e.head"]
            } else {
                &["a.w", "c.v", "e.head"]
            };
            assert_eq!(moved, want, "{n} ranks");
        }
    }
    Ok(())
}

#[test]
fn each_rank_keeps_the_moments_of_its_own_slice_on_the_variables_device() -> R {
    let out = thread_world::run(3, |world| -> Result<Vec<(String, Vec<usize>)>, String> {
        let e = |x: &dyn std::fmt::Display| x.to_string();
        let s = store().map_err(|x| e(&x))?;
        let plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
        let opt = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
        let mut held = Vec::new();
        for p in plan.partition().pieces(world.rank()) {
            let key = &plan.manifest().entries()[p.var].key;
            let m = opt.state().var(&format!("{key}.m")).map_err(|x| e(&x))?;
            let m = m.ok_or_else(|| format!("{key}.m missing"))?;
            if !m.device().is_cpu() || m.dtype() != plan.vars()[p.var].dtype() {
                return Err(format!("{key}.m: {:?} {:?}", m.device(), m.dtype()));
            }
            held.push((key.clone(), m.dims().to_vec()));
        }
        Ok(held)
    });
    let mut per_var = std::collections::BTreeMap::<String, usize>::new();
    for got in out {
        for (k, dims) in got? {
            *per_var.entry(k).or_default() += dims.iter().product::<usize>();
        }
    }
    let want: std::collections::BTreeMap<String, usize> = [
        ("a.w", 15),
        ("b.bias", 7),
        ("c.v", 6),
        ("d.unused", 4),
        ("e.head", 11),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_owned(), n))
    .collect();
    assert_eq!(per_var, want);
    Ok(())
}

#[test]
fn a_gradient_that_does_not_fit_changes_nothing() -> R {
    let out = thread_world::run(2, |world| -> Result<(), String> {
        let e = |x: &dyn std::fmt::Display| x.to_string();
        let s = store().map_err(|x| e(&x))?;
        let before = bits(&s)?;
        let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
        let mut opt = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
        let mut g = grads(&s, world.rank(), 0).map_err(|x| e(&x))?;
        let head = s.var("e.head").map_err(|x| e(&x))?.ok_or("e.head")?;
        let kept = g.get(head.as_tensor()).cloned();
        if world.rank() == 1 {
            let wrong = Tensor::zeros(5, DType::F32, &CPU).map_err(|x| e(&x))?;
            g.insert(head.as_tensor(), wrong);
        }
        match plan.reduce_scatter(world, &mut g, Reduce::Mean) {
            Err(Error::Changed { key, .. }) if world.rank() == 1 && key == "e.head" => {}
            Err(Error::PeerFailed { .. }) if world.rank() == 0 => {}
            other => return Err(format!("rank {}: {other:?}", world.rank())),
        }
        // The gradients and the variables are as they were.
        if world.rank() == 0 {
            let now = g.get(head.as_tensor()).cloned();
            let same = match (kept, now) {
                (Some(a), Some(b)) => {
                    a.to_vec1::<f32>().map_err(|x| e(&x))?
                        == b.to_vec1::<f32>().map_err(|x| e(&x))?
                }
                _ => false,
            };
            if !same {
                return Err("rank 0's gradient changed".into());
            }
        }
        // The optimizer checks before it steps.
        if world.rank() == 1 {
            match opt.step(&g) {
                Err(Error::Changed { key, .. }) if key == "e.head" => {}
                other => return Err(format!("step: {other:?}")),
            }
            if opt.step_count().map_err(|x| e(&x))? != 0 {
                return Err("the step count moved".into());
            }
        }
        if bits(&s)? != before {
            return Err(format!("rank {}: a variable changed", world.rank()));
        }
        Ok(())
    });
    for got in out {
        got?;
    }
    Ok(())
}

#[test]
fn an_optimizer_of_another_world_is_refused() -> R {
    let s = store()?;
    let plan = thread_world::run(2, |world| {
        CandlePlan::new(world, &s, &PlanOptions::new()).map(|p| p.partition().clone())
    });
    let two = plan.into_iter().next().expect("a rank")?;
    assert_eq!(two.ranks(), 2);
    let one = CandlePlan::new(&scopetree::ranks::SingleProcess, &s, &PlanOptions::new())?;
    let out = thread_world::run(2, |world| ZeroAdamW::new(world, &one, params()).map(|_| ()));
    for got in out {
        let err = got.expect_err("a world of 2 with a plan cut for 1");
        assert!(matches!(err, Error::BadOption { .. }), "{err:?}");
        assert!(err.to_string().contains("cut for 1 rank(s)"), "{err}");
    }
    Ok(())
}

/// Every piece of `opt`'s slice: the moment's key, where the piece starts
/// and its bits (as `f64`s), and the step count.
fn pieces_of(opt: &ZeroAdamW, plan: &CandlePlan, rank: usize) -> Result<Pieces, String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let mut out = Vec::new();
    for p in plan.partition().pieces(rank) {
        let key = &plan.manifest().entries()[p.var].key;
        for which in ["m", "v"] {
            let name = format!("{key}.{which}");
            let var = (opt.state().var(&name).map_err(|x| e(&x))?)
                .ok_or_else(|| format!("{name} missing"))?;
            let vals: Vec<f64> = (var.flatten_all())
                .and_then(|t| t.to_dtype(DType::F64))
                .and_then(|t| t.to_vec1())
                .map_err(|x| e(&x))?;
            out.push((name, p.start, vals.iter().map(|x| x.to_bits()).collect()));
        }
    }
    Ok((out, opt.step_count().map_err(|x| e(&x))?))
}

type Pieces = (Vec<(String, usize, Vec<u64>)>, u64);

/// Checks `pieces` (a rank's, of [`pieces_of`]) against the whole state
/// `whole` ([`bits`] of an `AdamW`'s state store) after `steps` steps.
fn assert_pieces_of(whole: &[(String, Vec<u64>)], pieces: &Pieces, steps: u64, what: &str) {
    let (list, count) = pieces;
    assert_eq!(*count, steps, "{what}: the step count");
    for (name, start, got) in list {
        let (_, all) = whole
            .iter()
            .find(|(k, _)| k == name)
            .unwrap_or_else(|| panic!("{what}: {name} not in the whole state"));
        assert_eq!(
            got.as_slice(),
            &all[*start..*start + got.len()],
            "{what}: {name} from {start}"
        );
    }
}

/// AdamW's state saved by one process resumes in ZeRO at 1 to 4 ranks
/// (each rank reading its slice), the next step ends bit-identical to the
/// process's own; the ZeRO state saved at those ranks is AdamW's whole
/// state again, which one process loads strictly and ZeRO loads at another
/// number of ranks.
#[test]
fn adamw_and_zero_states_resume_each_other_at_1_to_4_ranks() -> R {
    let dir = tempfile::tempdir()?;
    let root = dir.path().to_owned();
    // One process: two steps, saved, and a third.
    let one = store()?;
    let mut opt = AdamW::for_store(&one, "", params())?;
    for step in 0..2 {
        candle_nn::Optimizer::step(&mut opt, &grads(&one, 0, step)?)?;
    }
    one.save_sharded(root.join("params"), &Default::default())?;
    opt.state()
        .save_sharded(root.join("adamw"), &Default::default())?;
    candle_nn::Optimizer::step(&mut opt, &grads(&one, 0, 2)?)?;
    let (params3, state3) = (bits(&one)?, bits(opt.state())?);

    for n in 1..=4 {
        let zdir = root.join(format!("zero-{n}"));
        let out = thread_world::run(n, |world| -> Result<_, String> {
            let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", world.rank());
            let s = store().map_err(|x| e(&x))?;
            let mut plan = CandlePlan::new(world, &s, &PlanOptions::new().bucket_bytes(12))
                .map_err(|x| e(&x))?;
            plan.load_shards(world, &s, root.join("params"))
                .map_err(|x| e(&x))?;
            let mut z = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
            let loaded = z
                .load_shards(world, &mut plan, root.join("adamw"))
                .map_err(|x| e(&x))?;
            let resumed = z.step_count().map_err(|x| e(&x))?;
            // Every rank the same gradient: no reduction needed.
            z.step(&grads(&s, 0, 2).map_err(|x| e(&x))?)
                .map_err(|x| e(&x))?;
            plan.all_gather(world).map_err(|x| e(&x))?;
            let saved = z.save_shards(world, &mut plan, &zdir).map_err(|x| e(&x))?;
            Ok((resumed, bits(&s)?, loaded.keys.len(), saved.mine.is_some()))
        });
        let mut writers = 0;
        for (rank, got) in out.into_iter().enumerate() {
            let (resumed, after, keys, wrote) = got?;
            let what = format!("{n} ranks, rank {rank}");
            assert_eq!(resumed, 2, "{what}");
            assert_eq!(after, params3, "{what}: the resumed step");
            assert!(keys >= 1, "{what}: the step count at least");
            writers += usize::from(wrote);
        }
        assert!((1..=n).contains(&writers), "{n} ranks: {writers} shards");

        // One process loads the ZeRO save strictly: AdamW's whole state.
        let fresh = AdamW::for_store(&store()?, "", params())?;
        fresh
            .state()
            .load(&zdir, &scopetree::checkpoint::LoadOptions::new())?;
        assert_eq!(
            bits(fresh.state())?,
            state3,
            "{n} ranks' save, loaded whole"
        );

        // ZeRO loads it at another number of ranks.
        let m = n % 4 + 1;
        let out = thread_world::run(m, |world| -> Result<_, String> {
            let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", world.rank());
            let s = store().map_err(|x| e(&x))?;
            let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
            let mut z = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
            z.load_shards(world, &mut plan, &zdir).map_err(|x| e(&x))?;
            pieces_of(&z, &plan, world.rank())
        });
        for (rank, got) in out.into_iter().enumerate() {
            let what = format!("saved at {n}, loaded at {m}, rank {rank}");
            assert_pieces_of(&state3, &got?, 3, &what);
        }
    }
    Ok(())
}

/// A ZeRO state whose files do not fit the plan, or hold a corrupted
/// tensor in the last rank's part, changes no rank's state; a plan that is
/// not the optimizer's is refused.
#[test]
fn a_zero_state_that_does_not_fit_or_is_corrupted_changes_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let root = dir.path().to_owned();
    let saved = thread_world::run(3, |world| -> Result<_, String> {
        let e = |x: &dyn std::fmt::Display| x.to_string();
        let s = store().map_err(|x| e(&x))?;
        let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
        let mut z = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
        z.step(&grads(&s, 0, 0).map_err(|x| e(&x))?)
            .map_err(|x| e(&x))?;
        let saved = z.save_shards(world, &mut plan, &root).map_err(|x| e(&x))?;
        Ok(saved.shards)
    });
    let shards = saved.into_iter().next().expect("rank 0")?;
    let last = root.join(shards.last().expect("a shard"));
    let mut bytes = std::fs::read(&last)?;
    let end = bytes.len() - 1;
    bytes[end] ^= 0x40;
    std::fs::write(&last, &bytes)?;

    // Corrupted: one rank finds it, every state stays as made.
    let out = thread_world::run(3, |world| -> Result<_, String> {
        let e = |x: &dyn std::fmt::Display| x.to_string();
        let s = store().map_err(|x| e(&x))?;
        let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
        let mut z = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
        let before = pieces_of(&z, &plan, world.rank())?;
        let err = z.load_shards(world, &mut plan, &root).err();
        Ok((before, pieces_of(&z, &plan, world.rank())?, err))
    });
    let mut corrupted = 0;
    for (rank, got) in out.into_iter().enumerate() {
        let (before, after, err) = got?;
        assert_eq!(
            after, before,
            "rank {rank}: a refused load changed the state"
        );
        match err {
            Some(Error::Corrupted { .. }) => corrupted += 1,
            Some(Error::PeerFailed { .. }) => {}
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    assert_eq!(corrupted, 1, "the rank that verifies the last tensor");
    std::fs::write(&last, {
        bytes[end] ^= 0x40;
        &bytes
    })?;

    // A variable the files lack: every rank names its moments.
    let out = thread_world::run(2, |world| -> Result<_, String> {
        let e = |x: &dyn std::fmt::Display| x.to_string();
        let s = store().map_err(|x| e(&x))?;
        s.get(3, "f.extra", Init::Const(1.0), DType::F32, &CPU)
            .map_err(|x| e(&x))?;
        let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
        let mut z = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
        let before = pieces_of(&z, &plan, world.rank())?;
        let err = z.load_shards(world, &mut plan, &root).err();
        Ok((before, pieces_of(&z, &plan, world.rank())?, err))
    });
    for (rank, got) in out.into_iter().enumerate() {
        let (before, after, err) = got?;
        assert_eq!(after, before, "rank {rank}");
        let err = err.expect("a refused load");
        assert!(matches!(err, Error::Checkpoint(_)), "rank {rank}: {err}");
        assert!(err.to_string().contains("f.extra.m"), "rank {rank}: {err}");
    }

    // The plan of another store: refused before anything is read.
    let out = thread_world::run(2, |world| -> Result<_, String> {
        let e = |x: &dyn std::fmt::Display| x.to_string();
        let s = store().map_err(|x| e(&x))?;
        let plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
        let mut z = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
        let other = CandleStore::new();
        other
            .get(40, "w", Init::Const(1.0), DType::F32, &CPU)
            .map_err(|x| e(&x))?;
        let mut wrong = CandlePlan::new(world, &other, &PlanOptions::new()).map_err(|x| e(&x))?;
        let load = z.load_shards(world, &mut wrong, &root).err();
        let save = z.save_shards(world, &mut wrong, root.join("x")).err();
        Ok((load, save))
    });
    for (rank, got) in out.into_iter().enumerate() {
        let (load, save) = got?;
        for err in [load, save] {
            let err = err.expect("refused");
            assert!(matches!(err, Error::BadOption { .. }), "rank {rank}: {err}");
        }
    }
    Ok(())
}

/// A ZeRO step's state for the scaling test: `n` variables of 4 `f32`s,
/// their gradients, the plan (buckets of 64 bytes: 4 variables a round)
/// and the optimizer.
struct Step {
    store: CandleStore,
    plan: CandlePlan,
    opt: ZeroAdamW,
    grads: Vec<(candle_core::Var, Tensor)>,
}

fn step_state(n: usize) -> Step {
    let store = CandleStore::new();
    let mut grads = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("layer{i}.w");
        store
            .get(4, &name, Init::Const(0.5), DType::F32, &CPU)
            .expect("a variable");
        let var = store.var(&name).expect("read").expect("made");
        let g = Tensor::new(&[0.25_f32, -0.5, 1.0, 2.0], &CPU).expect("a gradient");
        grads.push((var, g));
    }
    let world = scopetree::ranks::SingleProcess;
    let plan =
        CandlePlan::new(&world, &store, &PlanOptions::new().bucket_bytes(64)).expect("a plan");
    let opt = ZeroAdamW::new(&world, &plan, params()).expect("an optimizer");
    Step {
        store,
        plan,
        opt,
        grads,
    }
}

/// A scaling test of `what` per variable, at 10^3 and 10^5 variables, each
/// operation on a fresh copy of the state.
fn per_variable(what: &str) -> timing::Scaling {
    timing::Scaling::new(what, "variable", 1_000, 100_000)
        .once_per_copy()
        .units_per_op(|n| n as f64)
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a scaling test: run with cargo test --release"
)]
fn a_zero_step_costs_o_variables() {
    let world = scopetree::ranks::SingleProcess;
    per_variable(
        "reduce_scatter + ZeroAdamW::step + all_gather, 4 f32 per variable, 64-byte buckets",
    )
    .check(step_state, |s, _| {
        let mut g = GradStore::default();
        for (v, t) in &s.grads {
            g.insert(v.as_tensor(), t.clone());
        }
        s.plan
            .reduce_scatter(&world, &mut g, Reduce::Mean)
            .expect("reduce-scatter");
        s.opt.step(&g).expect("a step");
        s.plan.all_gather(&world).expect("all-gather");
    });
}

/// The state of the checkpoint scaling tests: `n` variables of 4 `f32`s
/// in a store, the plan, an optimizer after one step, and a directory.
struct Saved {
    store: CandleStore,
    plan: CandlePlan,
    opt: ZeroAdamW,
    dir: tempfile::TempDir,
}

fn saved_state(n: usize) -> Saved {
    let mut s = step_state(n);
    let mut g = GradStore::default();
    for (v, t) in &s.grads {
        g.insert(v.as_tensor(), t.clone());
    }
    s.opt.step(&g).expect("a step");
    Saved {
        store: s.store,
        plan: s.plan,
        opt: s.opt,
        dir: tempfile::tempdir().expect("a directory"),
    }
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a scaling test: run with cargo test --release"
)]
fn a_zero_state_save_and_load_cost_o_variables() {
    let world = scopetree::ranks::SingleProcess;
    per_variable("ZeroAdamW::save_shards + load_shards, 4 f32 per variable").check(
        saved_state,
        |s, _| {
            s.opt
                .save_shards(&world, &mut s.plan, s.dir.path())
                .expect("a save");
            s.opt
                .load_shards(&world, &mut s.plan, s.dir.path())
                .expect("a load");
        },
    );
}

/// The model and its ZeRO optimizer, kept by a `CheckpointManager` after
/// every step at 3 ranks (the last one kept), resume at 1, 2 and 4 ranks:
/// each rank finds the latest step, its slice of the moments as one
/// process's AdamW had them, and the next step ends bit-identical to that
/// process's.
#[test]
fn a_managed_zero_training_checkpoint_resumes_at_other_numbers_of_ranks() -> R {
    let dir = tempfile::tempdir()?;
    let manager = CheckpointManager::new(dir.path(), 1)?;
    // One process: AdamW's state after two steps, its parameters after 3.
    let one = store()?;
    let mut opt = AdamW::for_store(&one, "", params())?;
    for step in 0..2 {
        candle_nn::Optimizer::step(&mut opt, &grads(&one, 0, step)?)?;
    }
    let state2 = bits(opt.state())?;
    candle_nn::Optimizer::step(&mut opt, &grads(&one, 0, 2)?)?;
    let params3 = bits(&one)?;

    // Every rank the same gradient: no reduction needed.
    let saved = thread_world::run(3, |world| -> Result<_, String> {
        let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", world.rank());
        let s = store().map_err(|x| e(&x))?;
        let mut plan =
            CandlePlan::new(world, &s, &PlanOptions::new().bucket_bytes(12)).map_err(|x| e(&x))?;
        let mut z = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
        let mut last = None;
        for step in 0..2 {
            z.step(&grads(&s, 0, step).map_err(|x| e(&x))?)
                .map_err(|x| e(&x))?;
            plan.all_gather(world).map_err(|x| e(&x))?;
            let state = Training::new(&s, &mut z);
            let opts = Default::default();
            last = Some(
                manager
                    .save(world, &mut plan, &state, step as u64 + 1, &opts)
                    .map_err(|x| e(&x))?,
            );
        }
        last.ok_or_else(|| "no save".to_owned())
    });
    let mut optimizer_shards = 0;
    for got in saved {
        let got = got?;
        assert!(
            got.state_keys
                .iter()
                .all(|k| k == "step" || k.ends_with(".m") || k.ends_with(".v"))
        );
        optimizer_shards += usize::from(got.state_shard.is_some());
    }
    assert!(optimizer_shards >= 1, "the optimizer's shards");
    assert_eq!(manager.steps()?, [2], "the last one kept");
    let step_dir = manager.step_dir(2);
    assert!(
        step_dir
            .join(OPTIMIZER_DIR)
            .join("model.safetensors.index.json")
            .is_file()
    );

    for m in [1, 2, 4] {
        let out = thread_world::run(m, |world| -> Result<_, String> {
            let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", world.rank());
            let s = store().map_err(|x| e(&x))?;
            let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
            let mut z = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
            let (step, loaded) = manager
                .load_latest(world, &mut plan, &mut Training::new(&s, &mut z))
                .map_err(|x| e(&x))?
                .ok_or_else(|| e(&"no checkpoint"))?;
            let pieces = pieces_of(&z, &plan, world.rank())?;
            z.step(&grads(&s, 0, 2).map_err(|x| e(&x))?)
                .map_err(|x| e(&x))?;
            plan.all_gather(world).map_err(|x| e(&x))?;
            Ok((step, loaded.state_keys.len(), pieces, bits(&s)?))
        });
        for (rank, got) in out.into_iter().enumerate() {
            let (step, state_keys, pieces, after) = got?;
            let what = format!("loaded at {m}, rank {rank}");
            assert_eq!(step, 2, "{what}");
            assert!(state_keys >= 1, "{what}: the step count at least");
            assert_pieces_of(&state2, &pieces, 2, &what);
            assert_eq!(after, params3, "{what}: the resumed step");
        }
    }
    Ok(())
}

/// A replicated `AdamW`'s training, kept by a manager at 2 ranks, resumes
/// as ZeRO at 3 ranks (each rank's slice of the moments as one process
/// had them; the next step bit-identical to that process's), and that
/// ZeRO checkpoint resumes a replicated `AdamW` at 2 ranks whose models
/// start apart, whole: the two optimizers' checkpoints are one layout.
#[test]
fn a_managed_replicated_checkpoint_resumes_as_zero_and_back() -> R {
    let dir = tempfile::tempdir()?;
    let replicated = CheckpointManager::new(dir.path().join("replicated"), 2)?;
    let zero = CheckpointManager::new(dir.path().join("zero"), 2)?;
    // One process: AdamW's state after two and three steps, its
    // parameters after three.
    let one = store()?;
    let mut opt = AdamW::for_store(&one, "", params())?;
    for step in 0..2 {
        candle_nn::Optimizer::step(&mut opt, &grads(&one, 0, step)?)?;
    }
    let state2 = bits(opt.state())?;
    candle_nn::Optimizer::step(&mut opt, &grads(&one, 0, 2)?)?;
    let (params3, state3) = (bits(&one)?, bits(opt.state())?);

    // Replicated at 2 ranks: every rank the same gradient, every rank the
    // whole state; saved after each step.
    let saved = thread_world::run(2, |world| -> Result<_, String> {
        let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", world.rank());
        let s = store().map_err(|x| e(&x))?;
        let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
        let mut opt = AdamW::for_store(&s, "", params()).map_err(|x| e(&x))?;
        let mut last = None;
        for step in 0..2 {
            let g = grads(&s, 0, step).map_err(|x| e(&x))?;
            candle_nn::Optimizer::step(&mut opt, &g).map_err(|x| e(&x))?;
            let state = Training::new(&s, &mut opt);
            let opts = Default::default();
            last = Some(
                replicated
                    .save(world, &mut plan, &state, step as u64 + 1, &opts)
                    .map_err(|x| e(&x))?,
            );
        }
        last.ok_or_else(|| "no save".to_owned())
    });
    let keys: usize = saved
        .into_iter()
        .map(|got| got.map(|s| s.state_keys.len()))
        .sum::<Result<usize, String>>()?;
    assert_eq!(
        keys,
        state2.len(),
        "the ranks' optimizer shards: every tensor once"
    );
    assert_eq!(replicated.steps()?, [1, 2]);

    // ZeRO at 3 ranks from it, one more step, saved.
    let out = thread_world::run(3, |world| -> Result<_, String> {
        let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", world.rank());
        let s = store().map_err(|x| e(&x))?;
        let mut plan =
            CandlePlan::new(world, &s, &PlanOptions::new().bucket_bytes(12)).map_err(|x| e(&x))?;
        let mut z = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
        let (step, _) = replicated
            .load_latest(world, &mut plan, &mut Training::new(&s, &mut z))
            .map_err(|x| e(&x))?
            .ok_or_else(|| e(&"no checkpoint"))?;
        let pieces = pieces_of(&z, &plan, world.rank())?;
        z.step(&grads(&s, 0, 2).map_err(|x| e(&x))?)
            .map_err(|x| e(&x))?;
        plan.all_gather(world).map_err(|x| e(&x))?;
        let state = Training::new(&s, &mut z);
        (zero.save(world, &mut plan, &state, 3, &Default::default())).map_err(|x| e(&x))?;
        Ok((step, pieces, bits(&s)?))
    });
    for (rank, got) in out.into_iter().enumerate() {
        let (step, pieces, after) = got?;
        let what = format!("replicated, resumed as ZeRO, rank {rank}");
        assert_eq!(step, 2, "{what}");
        assert_pieces_of(&state2, &pieces, 2, &what);
        assert_eq!(after, params3, "{what}: the resumed step");
    }

    // Back to a replicated AdamW at 2 ranks, whose models start apart (as
    // models drawn at random per rank do): the whole state on each, and
    // the ranks agree once both parts are in.
    let out = thread_world::run(2, |world| -> Result<_, String> {
        let e = |x: &dyn std::fmt::Display| format!("rank {}: {x}", world.rank());
        let s = store().map_err(|x| e(&x))?;
        let w = (s.var("a.w").map_err(|x| e(&x))?).ok_or_else(|| e(&"a.w"))?;
        let apart = (w.ones_like()).and_then(|t| t * world.rank() as f64);
        (apart.and_then(|t| w.set(&t))).map_err(|x| e(&x))?;
        let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
        let mut opt = AdamW::for_store(&s, "", params()).map_err(|x| e(&x))?;
        let found = zero
            .load_latest(world, &mut plan, &mut Training::new(&s, &mut opt))
            .map_err(|x| e(&x))?;
        Ok((found.map(|(step, _)| step), bits(opt.state())?, bits(&s)?))
    });
    for (rank, got) in out.into_iter().enumerate() {
        let (step, state, params) = got?;
        let what = format!("ZeRO's save, resumed replicated, rank {rank}");
        assert_eq!(step, Some(3), "{what}");
        assert_eq!(state, state3, "{what}");
        assert_eq!(params, params3, "{what}");
    }
    Ok(())
}

/// What a rank held before and after a refused load (as text), and the
/// load's error.
type Refused = (String, String, Option<Error>);

/// A `Training` checkpoint (saved by `save` at 2 ranks, step 1) with a
/// corrupted tensor in its optimizer's last shard changes neither the
/// variables nor the optimizer's state on any rank of 2 (`load`, which
/// reports what the rank held before and after), though the model's part
/// is whole: a load that wrote the model first would change it. One
/// corrupted in the model's last shard changes neither either: a load
/// that wrote the optimizer first would change its state.
fn corrupting_either_part_changes_neither(
    save: impl Fn(&thread_world::ThreadRank, &CheckpointManager) -> Result<ShardedSave, String> + Sync,
    load: impl Fn(&thread_world::ThreadRank, &CheckpointManager) -> Result<Refused, String> + Sync,
) -> R {
    let dir = tempfile::tempdir()?;
    let manager = CheckpointManager::new(dir.path(), 1)?;
    let saved = thread_world::run(2, |world| save(world, &manager));
    let saved = saved.into_iter().next().expect("rank 0")?;
    let step_dir = manager.step_dir(1);
    let last_of =
        |shards: &[String], sub: &std::path::Path| sub.join(shards.last().expect("a shard"));
    let optimizer_shards: Vec<String> = std::fs::read_dir(step_dir.join(OPTIMIZER_DIR))?
        .filter_map(|d| d.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".safetensors"))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for (part, path) in [
        (
            "optimizer",
            last_of(&optimizer_shards, &step_dir.join(OPTIMIZER_DIR)),
        ),
        ("model", last_of(&saved.shards, &step_dir)),
    ] {
        let mut bytes = std::fs::read(&path)?;
        let end = bytes.len() - 1;
        bytes[end] ^= 0x40;
        std::fs::write(&path, &bytes)?;
        let out = thread_world::run(2, |world| load(world, &manager));
        let mut corrupted = 0;
        for (rank, got) in out.into_iter().enumerate() {
            let (before, after, err) = got?;
            assert!(
                after == before,
                "{part} corrupted, rank {rank}: the state changed"
            );
            match err {
                Some(Error::Corrupted { .. }) => corrupted += 1,
                Some(Error::PeerFailed { .. }) => {}
                other => panic!("{part} corrupted, rank {rank}: {other:?}"),
            }
        }
        assert_eq!(
            corrupted, 1,
            "{part}: the rank that verifies the last tensor"
        );
        bytes[end] ^= 0x40;
        std::fs::write(&path, &bytes)?;
    }
    Ok(())
}

#[test]
fn a_zero_training_checkpoint_corrupted_in_either_part_changes_neither() -> R {
    corrupting_either_part_changes_neither(
        |world, manager| {
            let e = |x: &dyn std::fmt::Display| x.to_string();
            let s = store().map_err(|x| e(&x))?;
            let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
            let mut z = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
            z.step(&grads(&s, 0, 0).map_err(|x| e(&x))?)
                .map_err(|x| e(&x))?;
            plan.all_gather(world).map_err(|x| e(&x))?;
            let state = Training::new(&s, &mut z);
            (manager.save(world, &mut plan, &state, 1, &Default::default())).map_err(|x| e(&x))
        },
        |world, manager| {
            let e = |x: &dyn std::fmt::Display| x.to_string();
            let s = store().map_err(|x| e(&x))?;
            let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
            let mut z = ZeroAdamW::new(world, &plan, params()).map_err(|x| e(&x))?;
            let held = |z: &ZeroAdamW, plan: &CandlePlan| -> Result<String, String> {
                Ok(format!(
                    "{:?}",
                    (bits(&s)?, pieces_of(z, plan, world.rank())?)
                ))
            };
            let before = held(&z, &plan)?;
            let state = &mut Training::new(&s, &mut z);
            let err = manager.load_latest(world, &mut plan, state).err();
            Ok((before, held(&z, &plan)?, err))
        },
    )
}

#[test]
fn a_replicated_training_checkpoint_corrupted_in_either_part_changes_neither() -> R {
    corrupting_either_part_changes_neither(
        |world, manager| {
            let e = |x: &dyn std::fmt::Display| x.to_string();
            let s = store().map_err(|x| e(&x))?;
            let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
            let mut opt = AdamW::for_store(&s, "", params()).map_err(|x| e(&x))?;
            let g = grads(&s, 0, 0).map_err(|x| e(&x))?;
            candle_nn::Optimizer::step(&mut opt, &g).map_err(|x| e(&x))?;
            let state = Training::new(&s, &mut opt);
            (manager.save(world, &mut plan, &state, 1, &Default::default())).map_err(|x| e(&x))
        },
        |world, manager| {
            let e = |x: &dyn std::fmt::Display| x.to_string();
            let s = store().map_err(|x| e(&x))?;
            let mut plan = CandlePlan::new(world, &s, &PlanOptions::new()).map_err(|x| e(&x))?;
            let mut opt = AdamW::for_store(&s, "", params()).map_err(|x| e(&x))?;
            let held = |opt: &AdamW| -> Result<String, String> {
                Ok(format!("{:?}", (bits(&s)?, bits(opt.state())?)))
            };
            let before = held(&opt)?;
            let state = &mut Training::new(&s, &mut opt);
            let err = manager.load_latest(world, &mut plan, state).err();
            Ok((before, held(&opt)?, err))
        },
    )
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a scaling test: run with cargo test --release"
)]
fn a_managed_zero_training_save_and_load_cost_o_variables() {
    let world = scopetree::ranks::SingleProcess;
    per_variable("CheckpointManager::save + load_latest of a Training, 4 f32 per variable").check(
        saved_state,
        |s, _| {
            let manager = CheckpointManager::new(s.dir.path(), 1).expect("a manager");
            manager
                .save(
                    &world,
                    &mut s.plan,
                    &Training::new(&s.store, &mut s.opt),
                    1,
                    &Default::default(),
                )
                .expect("a save");
            manager
                .load_latest(
                    &world,
                    &mut s.plan,
                    &mut Training::new(&s.store, &mut s.opt),
                )
                .expect("a load")
                .expect("a checkpoint");
        },
    );
}
