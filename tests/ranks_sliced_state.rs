//! Optimizer state held sliced across ranks (ZeRO stage 1,
//! `PlanOptions::sliced_state`) in sharded checkpoints, at 1 to 4 ranks run
//! as threads of this process: each save writes whole tensors under
//! `optimizer.safetensors.index.json`, only the pieces of split tensors
//! moving between ranks; a load at any number of ranks cuts them again;
//! loads stay strict and atomic; the replicated and the sliced layouts
//! load into each other; async saves write the state they started with.

#[path = "support/thread_world.rs"]
mod thread_world;

use std::path::Path;

use scopetree::checkpoint::{self, LoadOptions};
use scopetree::ranks::{AsyncSaver, Collective, Error, PlanOptions, SlicedState, SyncPlan};
use scopetree::{ScopeId, ScopeTree};
use thread_world::{ThreadRank, run};

type R = Result<(), Box<dyn std::error::Error>>;

/// The parameters: (key, elements, f64?) under scope `model`.
const PARAMS: [(&str, usize, bool); 4] = [
    ("a", 10, false),
    ("b", 3, false),
    ("c", 7, true),
    ("d", 1, false),
];
const SUFFIXES: [&str; 2] = ["@M", "@V"];

/// Element `e` of the state tensor of parameter `p` and suffix `s`.
fn state_value(p: usize, s: usize, e: usize) -> f64 {
    let sign = if s == 0 { 1.0 } else { -1.0 };
    sign * (p as f64 * 100.0 + e as f64 + 0.25)
}

/// Element `e` of parameter `p`.
fn param_value(p: usize, e: usize) -> f64 {
    p as f64 * 10.0 + e as f64 * 0.5
}

struct Model {
    tree: ScopeTree,
    model: ScopeId,
    optim: ScopeId,
}

/// The parameters set from `param`, and no state yet.
fn model(param: impl Fn(usize, usize) -> f64) -> Model {
    let mut tree = ScopeTree::new();
    let model = tree.new_named_scope(tree.root(), "model").expect("a scope");
    let optim = tree.new_named_scope(model, "optim").expect("a scope");
    for (p, &(key, n, wide)) in PARAMS.iter().enumerate() {
        let v = tree.var(model, key).expect("a variable");
        if wide {
            tree.set(v, (0..n).map(|e| param(p, e)).collect::<Vec<f64>>())
        } else {
            tree.set(v, (0..n).map(|e| param(p, e) as f32).collect::<Vec<f32>>())
        }
        .expect("a value");
    }
    Model { tree, model, optim }
}

fn opts(m: &Model) -> PlanOptions {
    PlanOptions::new()
        .filter(|key| !key.starts_with("optim/"))
        .sliced_state(SlicedState::new(m.optim, SUFFIXES))
}

/// Creates this rank's pieces of the state, set from `value`.
fn pieces(m: &mut Model, plan: &SyncPlan, rank: usize, value: impl Fn(usize, usize, usize) -> f64) {
    let part = plan.state_partition().expect("sliced state").clone();
    for piece in part.pieces(rank) {
        let (key, _, wide) = PARAMS[piece.var];
        for (s, suffix) in SUFFIXES.iter().enumerate() {
            let v = m
                .tree
                .var(m.optim, format!("{key}{suffix}"))
                .expect("a variable");
            let elems = piece.elems().map(|e| value(piece.var, s, e));
            if wide {
                m.tree.set(v, elems.collect::<Vec<f64>>())
            } else {
                m.tree.set(v, elems.map(|x| x as f32).collect::<Vec<f32>>())
            }
            .expect("a value");
        }
    }
}

/// Every value this rank holds: the parameters, then its pieces (by
/// parameter, suffix and element), as (what, value).
fn held(m: &Model, plan: &SyncPlan, rank: usize) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    let read = |v| -> Vec<f64> {
        match m.tree.get::<Vec<f32>>(v) {
            Ok(x) => x.iter().map(|&x| f64::from(x)).collect(),
            Err(_) => m.tree.get::<Vec<f64>>(v).expect("f32 or f64").clone(),
        }
    };
    for &(key, ..) in &PARAMS {
        let v = m
            .tree
            .find_local_var(m.model, key)
            .expect("live")
            .expect("a parameter");
        for (e, x) in read(v).into_iter().enumerate() {
            out.push((format!("{key}[{e}]"), x));
        }
    }
    for piece in plan.state_partition().expect("sliced state").pieces(rank) {
        let (key, ..) = PARAMS[piece.var];
        for suffix in SUFFIXES {
            let name = format!("{key}{suffix}");
            let v = m
                .tree
                .find_local_var(m.optim, &name)
                .expect("live")
                .expect("a piece");
            for (e, x) in piece.elems().zip(read(v)) {
                out.push((format!("{name}[{e}]"), x));
            }
        }
    }
    out
}

/// What `held` must be when the checkpoint's values are loaded.
fn expected(plan: &SyncPlan, rank: usize) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for (p, &(key, n, wide)) in PARAMS.iter().enumerate() {
        for e in 0..n {
            let x = param_value(p, e);
            out.push((
                format!("{key}[{e}]"),
                if wide { x } else { f64::from(x as f32) },
            ));
        }
    }
    for piece in plan.state_partition().expect("sliced state").pieces(rank) {
        let (key, _, wide) = PARAMS[piece.var];
        for (s, suffix) in SUFFIXES.iter().enumerate() {
            for e in piece.elems() {
                let x = state_value(piece.var, s, e);
                let x = if wide { x } else { f64::from(x as f32) };
                out.push((format!("{key}{suffix}[{e}]"), x));
            }
        }
    }
    out
}

/// Saves the standard state at `n` ranks into `dir` with `save_shards`.
fn save_at(n: usize, dir: &Path) -> Vec<Result<scopetree::ranks::ShardedSave, Error>> {
    run(n, |w: &ThreadRank| {
        let mut m = model(param_value);
        let mut plan = SyncPlan::new(w, &m.tree, m.model, &opts(&m))?;
        pieces(&mut m, &plan, w.rank(), state_value);
        plan.save_shards(w, &m.tree, dir, &Default::default())
    })
}

/// Loads `dir` at `n` ranks into trees whose values differ from the
/// checkpoint's; returns each rank's outcome, values after and values
/// expected.
#[allow(clippy::type_complexity)]
fn load_at(
    n: usize,
    dir: &Path,
) -> Vec<(
    Result<scopetree::ranks::ShardedLoad, Error>,
    Vec<(String, f64)>,
    Vec<(String, f64)>,
)> {
    run(n, |w: &ThreadRank| {
        let mut m = model(|p, e| -1.0 - param_value(p, e));
        let mut plan = SyncPlan::new(w, &m.tree, m.model, &opts(&m)).expect("a plan");
        pieces(&mut m, &plan, w.rank(), |_, _, _| 9.0);
        let got = plan.load_shards(w, &mut m.tree, dir);
        (got, held(&m, &plan, w.rank()), expected(&plan, w.rank()))
    })
}

#[test]
fn state_saved_at_n_ranks_loads_at_any_number_of_ranks() -> R {
    let all_state: u64 = PARAMS
        .iter()
        .map(|&(_, n, wide)| (n * if wide { 8 } else { 4 } * 2) as u64)
        .sum();
    for n in 1..=4 {
        let dir = tempfile::tempdir()?;
        let saved = save_at(n, dir.path());
        let saved: Vec<_> = saved.into_iter().collect::<Result<_, _>>()?;
        // Every state tensor written once, whole, by one rank.
        let written: u64 = saved.iter().map(|s| s.state_bytes).sum();
        assert_eq!(written, all_state, "at {n} ranks");
        let mut keys: Vec<String> = saved.iter().flat_map(|s| s.state_keys.clone()).collect();
        keys.sort();
        assert_eq!(keys.len(), 8);
        // A plain Hugging Face index of whole tensors beside the parameters'.
        let index = dir.path().join("optimizer.safetensors.index.json");
        let mut fresh = ScopeTree::new();
        let root = fresh.root();
        let report = checkpoint::load(&mut fresh, root, &index, &LoadOptions::new().create(true))?;
        assert_eq!(report.created, keys);
        let a_m = fresh.find_var(root, "model")?;
        assert!(
            a_m.is_none(),
            "the index keys are relative to the plan's scope"
        );
        let optim = fresh.kid(root, "optim")?.ok_or("optim")?;
        let c_v = fresh.find_local_var(optim, "c@V")?.ok_or("c@V")?;
        let want: Vec<f64> = (0..7).map(|e| state_value(2, 1, e)).collect();
        assert_eq!(fresh.get::<Vec<f64>>(c_v)?, &want);
        let params = checkpoint::inspect(dir.path())?;
        assert_eq!(
            params.len(),
            4,
            "the parameters' index holds the parameters only"
        );

        for m in 1..=4 {
            let loaded = load_at(m, dir.path());
            let mut read = 0;
            for (rank, (got, after, want)) in loaded.into_iter().enumerate() {
                let got =
                    got.map_err(|e| format!("saved at {n}, loaded at {m}, rank {rank}: {e}"))?;
                read += got.state_bytes;
                assert_eq!(after, want, "saved at {n}, loaded at {m}, rank {rank}");
            }
            assert_eq!(
                read, all_state,
                "each state tensor read once, saved at {n}, loaded at {m}"
            );
        }
    }
    Ok(())
}

#[test]
fn a_corrupted_state_shard_fails_on_every_rank_and_changes_nothing() -> R {
    let dir = tempfile::tempdir()?;
    save_at(3, dir.path())
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let shard = dir.path().join("optimizer-00002-of-00003.safetensors");
    let mut bytes = std::fs::read(&shard)?;
    let end = bytes.len() - 1;
    bytes[end] ^= 0x10;
    std::fs::write(&shard, bytes)?;
    let outcomes = run(2, |w: &ThreadRank| {
        let mut m = model(|p, e| -1.0 - param_value(p, e));
        let mut plan = SyncPlan::new(w, &m.tree, m.model, &opts(&m)).expect("a plan");
        pieces(&mut m, &plan, w.rank(), |_, _, _| 9.0);
        let before = held(&m, &plan, w.rank());
        let got = plan.load_shards(w, &mut m.tree, dir.path());
        (got.map(|_| ()), before == held(&m, &plan, w.rank()))
    });
    let corrupted = outcomes
        .iter()
        .filter(|(got, _)| matches!(got, Err(Error::Corrupted { .. })))
        .count();
    assert_eq!(
        corrupted,
        1,
        "{:?}",
        outcomes.iter().map(|o| &o.0).collect::<Vec<_>>()
    );
    for (got, unchanged) in &outcomes {
        assert!(got.is_err() && *unchanged, "{got:?}");
    }
    Ok(())
}

#[test]
fn a_rank_missing_a_piece_stops_every_rank_and_writes_no_index() -> R {
    let dir = tempfile::tempdir()?;
    let outcomes = run(3, |w: &ThreadRank| {
        let mut m = model(param_value);
        let plan = SyncPlan::new(w, &m.tree, m.model, &opts(&m));
        let mut plan = plan.expect("a plan");
        pieces(&mut m, &plan, w.rank(), state_value);
        if w.rank() == 1 {
            let piece = plan.state_partition().expect("sliced").pieces(1)[0];
            let name = format!("{}@V", PARAMS[piece.var].0);
            let v = m
                .tree
                .find_local_var(m.optim, &name)
                .expect("live")
                .expect("a piece");
            m.tree.remove_var(v).expect("removed");
        }
        let saved = plan.save_shards(w, &m.tree, dir.path(), &Default::default());
        saved.map(|_| ()).map_err(|e| e.to_string())
    });
    let message = outcomes[1].as_ref().expect_err("rank 1 lacks a piece");
    assert!(
        message.contains("sliced state") && message.contains("missing"),
        "{message}"
    );
    for o in &outcomes {
        assert!(o.is_err(), "{o:?}");
    }
    assert!(!dir.path().join("model.safetensors.index.json").exists());
    assert!(!dir.path().join("optimizer.safetensors.index.json").exists());

    // A load where one rank holds a piece of the wrong length: the same.
    save_at(2, dir.path())
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let outcomes = run(2, |w: &ThreadRank| {
        let mut m = model(|_, _| 5.0);
        let mut plan = SyncPlan::new(w, &m.tree, m.model, &opts(&m)).expect("a plan");
        pieces(&mut m, &plan, w.rank(), |_, _, _| 9.0);
        if w.rank() == 0 {
            let piece = plan.state_partition().expect("sliced").pieces(0)[0];
            let name = format!("{}@M", PARAMS[piece.var].0);
            let v = m
                .tree
                .find_local_var(m.optim, &name)
                .expect("live")
                .expect("a piece");
            m.tree.set(v, vec![0.0_f32; piece.len + 1]).expect("set");
        }
        let before = held_params(&m);
        let got = plan.load_shards(w, &mut m.tree, dir.path());
        (
            got.map(|_| ()).map_err(|e| e.to_string()),
            before == held_params(&m),
        )
    });
    assert!(
        matches!(&outcomes[0].0, Err(m) if m.contains("sliced state")),
        "{outcomes:?}"
    );
    for (got, unchanged) in &outcomes {
        assert!(got.is_err() && *unchanged, "{got:?}");
    }
    Ok(())
}

fn held_params(m: &Model) -> Vec<f64> {
    let mut out = Vec::new();
    for &(key, _, wide) in &PARAMS {
        let v = m
            .tree
            .find_local_var(m.model, key)
            .expect("live")
            .expect("a parameter");
        if wide {
            out.extend(m.tree.get::<Vec<f64>>(v).expect("f64"));
        } else {
            out.extend(
                m.tree
                    .get::<Vec<f32>>(v)
                    .expect("f32")
                    .iter()
                    .map(|&x| f64::from(x)),
            );
        }
    }
    out
}

/// The plan of the replicated mode: the parameters and the whole state
/// tensors as ordinary variables.
fn replicated(m: &mut Model, value: impl Fn(usize, usize, usize) -> f64) {
    for (p, &(key, n, wide)) in PARAMS.iter().enumerate() {
        for (s, suffix) in SUFFIXES.iter().enumerate() {
            let v = m
                .tree
                .var(m.optim, format!("{key}{suffix}"))
                .expect("a variable");
            let elems = (0..n).map(|e| value(p, s, e));
            if wide {
                m.tree.set(v, elems.collect::<Vec<f64>>())
            } else {
                m.tree.set(v, elems.map(|x| x as f32).collect::<Vec<f32>>())
            }
            .expect("a value");
        }
    }
}

#[test]
fn the_replicated_and_the_sliced_layouts_load_into_each_other() -> R {
    // Saved replicated (the state among the parameters' shards) at 2
    // ranks, loaded sliced at 3.
    let dir = tempfile::tempdir()?;
    run(2, |w: &ThreadRank| {
        let mut m = model(param_value);
        replicated(&mut m, state_value);
        let mut plan = SyncPlan::new(w, &m.tree, m.model, &PlanOptions::new())?;
        plan.save_shards(w, &m.tree, dir.path(), &Default::default())
    })
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    assert!(!dir.path().join("optimizer.safetensors.index.json").exists());
    for (rank, (got, after, want)) in load_at(3, dir.path()).into_iter().enumerate() {
        got.map_err(|e| format!("rank {rank}: {e}"))?;
        assert_eq!(after, want, "rank {rank}");
    }

    // Saved sliced at 3 ranks, loaded replicated at 2.
    let dir = tempfile::tempdir()?;
    save_at(3, dir.path())
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let outcomes = run(2, |w: &ThreadRank| {
        let mut m = model(|_, _| 0.0);
        replicated(&mut m, |_, _, _| 0.0);
        let mut plan = SyncPlan::new(w, &m.tree, m.model, &PlanOptions::new()).expect("a plan");
        let got = plan.load_shards(w, &mut m.tree, dir.path()).map(|_| ());
        let mut whole = Vec::new();
        for &(key, _, wide) in &PARAMS {
            for suffix in SUFFIXES {
                let v = m.tree.find_local_var(m.optim, format!("{key}{suffix}"));
                let v = v.expect("live").expect("whole");
                if wide {
                    whole.extend(m.tree.get::<Vec<f64>>(v).expect("f64").clone());
                } else {
                    whole.extend(
                        m.tree
                            .get::<Vec<f32>>(v)
                            .expect("f32")
                            .iter()
                            .map(|&x| f64::from(x)),
                    );
                }
            }
        }
        (got, whole, held_params(&m))
    });
    let mut want = Vec::new();
    for (p, &(_, n, wide)) in PARAMS.iter().enumerate() {
        for s in 0..2 {
            want.extend((0..n).map(|e| {
                let x = state_value(p, s, e);
                if wide { x } else { f64::from(x as f32) }
            }));
        }
    }
    for (got, whole, _) in &outcomes {
        assert!(got.is_ok(), "{got:?}");
        assert_eq!(whole, &want);
    }
    Ok(())
}

#[test]
fn an_async_save_writes_the_sliced_state_it_started_with() -> R {
    let dir = tempfile::tempdir()?;
    run(3, |w: &ThreadRank| -> Result<(), Error> {
        let mut m = model(param_value);
        let mut plan = SyncPlan::new(w, &m.tree, m.model, &opts(&m))?;
        pieces(&mut m, &plan, w.rank(), state_value);
        let mut saver = AsyncSaver::new();
        saver.save(w, &mut plan, &m.tree, dir.path(), &Default::default())?;
        // Training goes on: the pieces change before the write is done.
        for piece in plan
            .state_partition()
            .expect("sliced")
            .pieces(w.rank())
            .to_vec()
        {
            let name = format!("{}@M", PARAMS[piece.var].0);
            let v = m.tree.find_local_var(m.optim, &name)?.expect("a piece");
            if PARAMS[piece.var].2 {
                m.tree.get_mut::<Vec<f64>>(v)?.fill(-7.0);
            } else {
                m.tree.get_mut::<Vec<f32>>(v)?.fill(-7.0);
            }
        }
        let done = saver.wait(w)?.expect("a save under way");
        assert_eq!(done.state_shard.is_some(), !done.state_keys.is_empty());
        assert!(saver.staging_bytes() > 0 || done.state_keys.is_empty());
        Ok(())
    })
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    for (rank, (got, after, want)) in load_at(2, dir.path()).into_iter().enumerate() {
        got.map_err(|e| format!("rank {rank}: {e}"))?;
        assert_eq!(after, want, "rank {rank}");
    }
    Ok(())
}

/// A rank whose shards exceed the saver's budget writes them in the call
/// (from its tree) and the wait publishes the save: with every rank over
/// it, and with only the even ranks over it (the ranks' collectives stay
/// in step whatever each decides), the checkpoint loads the state of the
/// call, and a rank over the budget keeps no staging.
#[test]
fn a_save_over_the_budget_is_written_in_the_call_and_published_by_the_wait() -> R {
    for mixed in [false, true] {
        let dir = tempfile::tempdir()?;
        run(3, |w: &ThreadRank| -> Result<(), Error> {
            let mut m = model(param_value);
            let mut plan = SyncPlan::new(w, &m.tree, m.model, &opts(&m))?;
            pieces(&mut m, &plan, w.rank(), state_value);
            let over = !mixed || w.rank() % 2 == 0;
            let mut saver = AsyncSaver::with_budget(if over { 0 } else { u64::MAX });
            let started = saver.save(w, &mut plan, &m.tree, dir.path(), &Default::default())?;
            assert_eq!(
                started.in_background,
                !over || started.bytes == 0,
                "rank {}: {started:?}",
                w.rank()
            );
            assert!(started.bytes > 0, "rank {} writes a shard", w.rank());
            if over {
                assert_eq!(saver.staging_bytes(), 0, "rank {}", w.rank());
            }
            // Not published before the wait, whoever wrote what.
            assert!(!dir.path().join("model.safetensors.index.json").exists());
            let done = saver.wait(w)?.expect("a save under way");
            assert_eq!(done.state_shard.is_some(), !done.state_keys.is_empty());
            Ok(())
        })
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        for (rank, (got, after, want)) in load_at(2, dir.path()).into_iter().enumerate() {
            got.map_err(|e| format!("mixed {mixed}, rank {rank}: {e}"))?;
            assert_eq!(after, want, "mixed {mixed}, rank {rank}");
        }
    }
    Ok(())
}

#[test]
fn pieces_move_in_chunks_of_a_bucket() -> R {
    // Buckets of 8 and 12 bytes: every split tensor's pieces move in
    // several broadcasts, at the save and at the load.
    let dir = tempfile::tempdir()?;
    run(3, |w: &ThreadRank| {
        let mut m = model(param_value);
        let o = opts(&m).bucket_bytes(8);
        let mut plan = SyncPlan::new(w, &m.tree, m.model, &o)?;
        pieces(&mut m, &plan, w.rank(), state_value);
        plan.save_shards(w, &m.tree, dir.path(), &Default::default())
    })
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    let outcomes = run(2, |w: &ThreadRank| {
        let mut m = model(|_, _| 0.0);
        let o = opts(&m).bucket_bytes(12);
        let mut plan = SyncPlan::new(w, &m.tree, m.model, &o).expect("a plan");
        pieces(&mut m, &plan, w.rank(), |_, _, _| 9.0);
        let got = plan.load_shards(w, &mut m.tree, dir.path()).map(|_| ());
        (got, held(&m, &plan, w.rank()), expected(&plan, w.rank()))
    });
    for (rank, (got, after, want)) in outcomes.into_iter().enumerate() {
        got.map_err(|e| format!("rank {rank}: {e}"))?;
        assert_eq!(after, want, "rank {rank}");
    }
    Ok(())
}
