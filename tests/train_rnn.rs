//! The training example, short: it learns, and no step-scope handle survives
//! its step. The model is the example's own (`examples/train_rnn/model.rs`).

#[path = "../examples/train_rnn/model.rs"]
#[allow(dead_code)]
mod model;

use model::Error;
use model::{Config, Task, Trainer};
use scopetree::{ScopeId, VarId};

/// A short run that still has to learn: a debug build does it in seconds.
fn short_config(workers: usize) -> Config {
    Config {
        seq_len: 8,
        hidden: 24,
        task: Task::Echo { delay: 2 },
        tokens: 4,
        epochs: 1,
        updates_per_epoch: 1,
        batch: 8,
        workers,
        lr: 0.02,
        seed: 11,
        eval_seqs: 128,
        zero: false,
        timeout: Some(scopetree::ranks::DEFAULT_TIMEOUT),
    }
}

#[test]
fn loss_falls_and_accuracy_beats_chance() -> Result<(), Error> {
    let cfg = short_config(2);
    let chance = 1.0 / cfg.tokens as f64;
    let mut trainer = Trainer::new(cfg)?;
    let before = trainer.evaluate()?;
    let mut first = None;
    let mut last = model::Stats::default();
    for _ in 0..150 {
        last = trainer.train_update()?;
        first.get_or_insert(last);
    }
    let first = first.unwrap_or_default();
    let after = trainer.evaluate()?;
    assert!(
        after.mean_loss() < 0.5 * before.mean_loss(),
        "held-out loss {} -> {}",
        before.mean_loss(),
        after.mean_loss()
    );
    assert!(
        last.mean_loss() < 0.5 * first.mean_loss(),
        "training loss {} -> {}",
        first.mean_loss(),
        last.mean_loss()
    );
    assert!(
        after.accuracy() > chance + 0.4,
        "held-out accuracy {} vs chance {chance}",
        after.accuracy()
    );
    Ok(())
}

#[test]
fn training_is_deterministic_given_a_seed() -> Result<(), Error> {
    let run = || -> Result<Vec<model::Stats>, Error> {
        let mut t = Trainer::new(short_config(2))?;
        (0..5).map(|_| t.train_update()).collect()
    };
    assert_eq!(run()?, run()?);
    Ok(())
}

#[test]
fn one_and_two_workers_train_alike() -> Result<(), Error> {
    let mut one = Trainer::new(short_config(1))?;
    let mut two = Trainer::new(short_config(2))?;
    for _ in 0..5 {
        let (a, b) = (one.train_update()?, two.train_update()?);
        assert_eq!((a.correct, a.tokens), (b.correct, b.tokens));
        assert!((a.loss - b.loss).abs() < 1e-3 * a.loss.abs().max(1.0));
    }
    Ok(())
}

/// Every handle a step hands out, as seen right after an update.
fn step_handles(t: &Trainer) -> Result<(Vec<ScopeId>, Vec<VarId>), Error> {
    let (mut scopes, mut vars) = (Vec::new(), Vec::new());
    for w in &t.workers {
        for (step, scope) in w.steps.scopes() {
            scopes.push(scope);
            for sv in [w.names.x, w.names.y, w.names.h, w.names.p] {
                vars.push(w.steps.var(sv, step)?);
            }
        }
    }
    Ok((scopes, vars))
}

#[test]
fn no_step_scope_handle_survives_its_step() -> Result<(), Error> {
    let mut trainer = Trainer::new(short_config(2))?;
    trainer.train_update()?;
    let (scopes, vars) = step_handles(&trainer)?;
    assert_eq!(scopes.len(), 2 * 8);
    for &v in &vars {
        assert!(trainer.tree.get::<Vec<f32>>(v).is_ok());
    }
    let params_before = trainer.params;
    for _ in 0..3 {
        trainer.train_update()?;
        // The old handles stay stale however often the slots are reused...
        for &s in &scopes {
            assert!(matches!(
                trainer.tree.parent(s),
                Err(scopetree::Error::StaleScope { .. })
            ));
        }
        for &v in &vars {
            assert!(matches!(
                trainer.tree.get::<Vec<f32>>(v),
                Err(scopetree::Error::StaleVar { .. })
            ));
            assert!(!trainer.tree.contains_var(v));
        }
        // ...and never resolve to the new step's variables.
        let (new_scopes, new_vars) = step_handles(&trainer)?;
        assert!(new_scopes.iter().all(|s| !scopes.contains(s)));
        assert!(new_vars.iter().all(|v| !vars.contains(v)));
    }
    // The parameters' handles, resolved once, are still good.
    assert_eq!(trainer.params, params_before);
    for p in trainer.params {
        assert!(trainer.tree.get::<Vec<f32>>(p).is_ok());
    }
    Ok(())
}

#[test]
fn evaluation_ping_pongs_two_step_scopes() -> Result<(), Error> {
    let mut trainer = Trainer::new(short_config(1))?;
    let scopes_before = trainer.tree.scope_count();
    trainer.evaluate()?;
    // The evaluation keeps two step scopes, whatever the sequence length.
    assert_eq!(trainer.tree.scope_count(), scopes_before + 2);
    assert_eq!(trainer.eval.steps.len(), 2);
    let last = trainer.eval.steps.end() - 1;
    let h = trainer.eval.steps.var(trainer.eval.names.h, last)?;
    trainer.evaluate()?;
    assert!(matches!(
        trainer.tree.get::<Vec<f32>>(h),
        Err(scopetree::Error::StaleVar { .. })
    ));
    Ok(())
}

/// `--zero` on one process: the rank owns every slice, so it is the
/// replicated mode, bit for bit, and its checkpoints resume exactly.
#[test]
fn zero_mode_on_one_process_is_the_replicated_mode() -> Result<(), Error> {
    let zero_cfg = Config {
        zero: true,
        ..short_config(2)
    };
    let mut rep = Trainer::new(short_config(2))?;
    let mut zero = Trainer::new(zero_cfg.clone())?;
    for _ in 0..5 {
        rep.train_update()?;
        zero.train_update()?;
    }
    assert_eq!(rep.params_digest()?, zero.params_digest()?);
    assert_eq!(rep.moments_digest()?, zero.moments_digest()?);
    assert_eq!(rep.moment_bytes()?, zero.moment_bytes()?);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("zero.safetensors");
    zero.save(&path)?;
    let mut back = Trainer::new(zero_cfg)?;
    back.resume(&path)?;
    assert_eq!(back.updates(), 5);
    back.train_update()?;
    zero.train_update()?;
    assert_eq!(back.params_digest()?, zero.params_digest()?);
    assert_eq!(back.moments_digest()?, zero.moments_digest()?);
    Ok(())
}
