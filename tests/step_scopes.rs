//! Step scopes: linking, keeping for the backward pass, recycling (stale
//! handles, kept values), windows and ping-pong, dropping, and misuse.

use std::num::NonZeroUsize;

use scopetree::{Error, ScopeTree, StepError, StepScopes};

#[test]
fn step_t_reads_step_t_minus_1_and_the_parameters() -> Result<(), StepError> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "W")?;
    tree.set(w, 2.0_f64)?;
    let mut steps = StepScopes::new(&tree, root)?;
    let h = steps.declare(&mut tree, "h")?;
    // Resolved once: the parameter through a step scope's parent chain.
    let t0 = steps.push(&mut tree)?;
    let w_seen = tree.get_var(steps.scope(t0)?, "W")?;
    assert_eq!(w_seen, w);
    tree.set(steps.var(h, 0)?, 1.0_f64)?;
    for _ in 1..10 {
        let t = steps.push(&mut tree)?;
        let prev = *tree.get::<f64>(steps.var(h, t - 1)?)?;
        let wv = *tree.get::<f64>(w_seen)?;
        tree.set(steps.var(h, t)?, prev * wv)?;
    }
    // Every step is kept for the backward pass.
    assert_eq!(steps.len(), 10);
    for t in 0..10 {
        assert_eq!(*tree.get::<f64>(steps.var(h, t)?)?, 2f64.powi(t as i32));
        assert_eq!(tree.parent(steps.scope(t)?)?, Some(root));
    }
    Ok(())
}

#[test]
fn recycled_handles_are_stale_and_never_alias_the_new_step() -> Result<(), StepError> {
    let mut tree = ScopeTree::new();
    let mut steps = StepScopes::new(&tree, tree.root())?;
    let h = steps.declare(&mut tree, "h")?;
    let mut old = Vec::new();
    for seq in 0..200_u32 {
        for _ in 0..4 {
            let t = steps.push(&mut tree)?;
            tree.set(steps.var(h, t)?, seq * 10 + t as u32)?;
        }
        for t in 0..4 {
            old.push((steps.scope(t)?, steps.var(h, t)?));
        }
        steps.recycle(&mut tree)?;
        for &(s, v) in &old {
            assert!(matches!(tree.get::<u32>(v), Err(Error::StaleVar { .. })));
            assert!(matches!(tree.parent(s), Err(Error::StaleScope { .. })));
            assert!(!tree.has_kid(tree.root(), s).unwrap_or(false));
        }
    }
    // 200 sequences of 4 steps ran on 4 scope slots.
    assert_eq!(steps.scope_count(), 4);
    assert_eq!(tree.scope_count(), 1 + 4);
    Ok(())
}

#[test]
fn recycling_moves_each_value_to_the_same_step_of_the_next_sequence() -> Result<(), StepError> {
    let mut tree = ScopeTree::new();
    let mut steps = StepScopes::new(&tree, tree.root())?;
    let h = steps.declare(&mut tree, "h")?;
    let c = steps.declare(&mut tree, "c")?;
    for _ in 0..3 {
        let t = steps.push(&mut tree)?;
        tree.set(steps.var(h, t)?, vec![t as f32; 16])?;
    }
    let ptr0 = tree.get::<Vec<f32>>(steps.var(h, 0)?)?.as_ptr();
    steps.recycle(&mut tree)?;
    assert!(steps.is_empty());
    for t in 0..3 {
        assert_eq!(steps.push(&mut tree)?, t);
        assert_eq!(tree.get::<Vec<f32>>(steps.var(h, t)?)?, &vec![t as f32; 16]);
        assert!(!tree.is_initialized(steps.var(c, t)?)?);
    }
    // The very same buffer: nothing was reallocated.
    assert_eq!(tree.get::<Vec<f32>>(steps.var(h, 0)?)?.as_ptr(), ptr0);
    Ok(())
}

#[test]
fn ping_pong_keeps_two_steps_and_stales_the_older_ones() -> Result<(), StepError> {
    let mut tree = ScopeTree::new();
    let mut steps = StepScopes::ping_pong(&tree, tree.root())?;
    let h = steps.declare(&mut tree, "h")?;
    let mut seen = Vec::new();
    for _ in 0..50 {
        let t = steps.push(&mut tree)?;
        let prev = if t == 0 {
            0_u64
        } else {
            *tree.get::<u64>(steps.var(h, t - 1)?)?
        };
        let v = steps.var(h, t)?;
        tree.set(v, prev + 1)?;
        seen.push(v);
        assert_eq!(steps.len(), (t + 1).min(2));
        if t >= 2 {
            assert!(matches!(
                tree.get::<u64>(seen[t - 2]),
                Err(Error::StaleVar { .. })
            ));
            assert!(matches!(
                steps.var(h, t - 2),
                Err(StepError::NoSuchStep { .. })
            ));
        }
    }
    assert_eq!(*tree.get::<u64>(steps.var(h, 49)?)?, 50);
    assert_eq!(tree.scope_count(), 1 + 2);
    Ok(())
}

#[test]
fn a_window_keeps_the_last_steps() -> Result<(), StepError> {
    let mut tree = ScopeTree::new();
    let w = NonZeroUsize::new(3).ok_or(Error::RootScope)?; // 3 is not 0
    let mut steps = StepScopes::with_window(&tree, tree.root(), w)?;
    let x = steps.declare(&mut tree, "x")?;
    for _ in 0..7 {
        let t = steps.push(&mut tree)?;
        tree.set(steps.var(x, t)?, t)?;
    }
    assert_eq!((steps.first(), steps.end()), (4, 7));
    let live: Vec<usize> = steps.scopes().map(|(t, _)| t).collect();
    assert_eq!(live, [4, 5, 6]);
    for t in 4..7 {
        assert_eq!(*tree.get::<usize>(steps.var(x, t)?)?, t);
    }
    steps.recycle(&mut tree)?;
    assert_eq!((steps.first(), steps.end()), (0, 0));
    assert_eq!(steps.push(&mut tree)?, 0);
    Ok(())
}

#[test]
fn drop_all_deletes_every_step_scope() -> Result<(), StepError> {
    let mut tree = ScopeTree::new();
    let mut steps = StepScopes::new(&tree, tree.root())?;
    let h = steps.declare(&mut tree, "h")?;
    for _ in 0..5 {
        steps.push(&mut tree)?;
    }
    let v = steps.var(h, 4)?;
    steps.drop_all(&mut tree)?;
    assert_eq!((tree.scope_count(), tree.var_count()), (1, 0));
    assert!(!tree.contains_var(v));
    assert_eq!(steps.scope_count(), 0);
    // Still usable, and still declaring `h`.
    let t = steps.push(&mut tree)?;
    assert_eq!(tree.var_name(steps.var(h, t)?)?, "h");
    Ok(())
}

#[test]
fn declaring_late_adds_the_variable_to_every_held_scope() -> Result<(), StepError> {
    let mut tree = ScopeTree::new();
    let mut steps = StepScopes::new(&tree, tree.root())?;
    let a = steps.declare(&mut tree, "a")?;
    for _ in 0..3 {
        steps.push(&mut tree)?;
    }
    // A variable the user made by hand is adopted, not duplicated.
    let hand = tree.var(steps.scope(1)?, "b")?;
    let b = steps.declare(&mut tree, "b")?;
    assert_eq!(steps.var(b, 1)?, hand);
    for t in 0..3 {
        assert_eq!(tree.local_var_count(steps.scope(t)?)?, 2);
        assert_eq!(tree.var_name(steps.var(a, t)?)?, "a");
        assert_eq!(tree.var_name(steps.var(b, t)?)?, "b");
    }
    assert_eq!(steps.step_var(&tree, "b")?, Some(b));
    assert_eq!(steps.step_var(&tree, "nope")?, None);
    Ok(())
}

#[test]
fn misuse_is_an_error_never_a_panic() -> Result<(), StepError> {
    let mut tree = ScopeTree::new();
    let mut steps = StepScopes::new(&tree, tree.root())?;
    let h = steps.declare(&mut tree, "h")?;
    assert!(matches!(
        steps.var(h, 0),
        Err(StepError::NoSuchStep { step: 0, .. })
    ));
    assert!(matches!(steps.scope(7), Err(StepError::NoSuchStep { .. })));
    assert!(matches!(
        steps.declare(&mut tree, ""),
        Err(StepError::Tree(Error::InvalidName { .. }))
    ));

    // A step variable of other step scopes.
    let mut other = StepScopes::new(&tree, tree.root())?;
    let oh = other.declare(&mut tree, "h")?;
    steps.push(&mut tree)?;
    let err = steps.var(oh, 0).unwrap_err();
    assert!(matches!(err, StepError::ForeignStepVar { .. }));
    assert!(err.to_string().contains("<root>"));

    // Another tree.
    let mut tree2 = ScopeTree::new();
    assert!(matches!(
        steps.push(&mut tree2),
        Err(StepError::Tree(Error::ForeignScope { .. }))
    ));
    assert!(matches!(
        steps.recycle(&mut tree2),
        Err(StepError::Tree(Error::ForeignScope { .. }))
    ));
    assert!(matches!(
        steps.drop_all(&mut tree2),
        Err(StepError::Tree(Error::ForeignScope { .. }))
    ));

    // A step scope deleted behind the step scopes' back is replaced.
    tree.delete_scope(steps.scope(0)?)?;
    steps.recycle(&mut tree)?;
    let t = steps.push(&mut tree)?;
    assert!(tree.contains_var(steps.var(h, t)?));

    // The parent deleted: every structural call reports it.
    let parent = tree.new_scope(tree.root())?;
    let mut orphan = StepScopes::new(&tree, parent)?;
    orphan.push(&mut tree)?;
    tree.delete_scope(parent)?;
    assert!(matches!(
        orphan.push(&mut tree),
        Err(StepError::Tree(Error::StaleScope { .. }))
    ));
    assert!(matches!(
        orphan.recycle(&mut tree),
        Err(StepError::Tree(Error::StaleScope { .. }))
    ));
    assert!(matches!(
        orphan.declare(&mut tree, "x"),
        Err(StepError::Tree(Error::StaleScope { .. }))
    ));
    orphan.drop_all(&mut tree)?;
    assert!(StepScopes::new(&tree, parent).is_err());
    Ok(())
}

#[test]
fn no_such_step_names_the_live_range_and_the_parent() -> Result<(), StepError> {
    let mut tree = ScopeTree::new();
    let rnn = tree.new_named_scope(tree.root(), "rnn")?;
    let mut steps = StepScopes::ping_pong(&tree, rnn)?;
    for _ in 0..5 {
        steps.push(&mut tree)?;
    }
    let msg = steps.scope(1).unwrap_err().to_string();
    assert!(msg.contains("step 1"), "{msg}");
    assert!(msg.contains("3..5"), "{msg}");
    assert!(msg.contains("`rnn`"), "{msg}");
    Ok(())
}
