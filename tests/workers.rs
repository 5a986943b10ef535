//! The worker split: who may read and write what, misuse errors, and real
//! threads working on one tree at once.

use scopetree::{Error as TreeError, ScopeTree, WorkerAccessReason, WorkerError as Error};

/// `<root>` with a parameter `W`, two worker scopes with a step scope each.
struct Fixture {
    tree: ScopeTree,
    w: scopetree::VarId,
    workers: [scopetree::ScopeId; 2],
    grad: [scopetree::VarId; 2],
    step_h: [scopetree::VarId; 2],
}

fn fixture() -> Result<Fixture, Error> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "W")?;
    tree.set(w, vec![1.0_f32, 2.0, 3.0])?;
    let mut workers = [root; 2];
    let mut grad = [w; 2];
    let mut step_h = [w; 2];
    for i in 0..2 {
        workers[i] = tree.new_named_scope(root, format!("worker_{i}"))?;
        grad[i] = tree.var(workers[i], "W@GRAD")?;
        tree.set(grad[i], vec![0.0_f32; 3])?;
        let step = tree.new_scope(workers[i])?;
        step_h[i] = tree.var(step, "h")?;
        tree.set(step_h[i], vec![0.0_f32; 3])?;
    }
    Ok(Fixture {
        tree,
        w,
        workers,
        grad,
        step_h,
    })
}

#[test]
fn each_worker_writes_its_subtree_and_reads_the_parameters() -> Result<(), Error> {
    let mut f = fixture()?;
    let (w, grad, step_h) = (f.w, f.grad, f.step_h);
    let mut ws = f.tree.split_workers(&f.workers)?;
    for (i, wk) in ws.iter_mut().enumerate() {
        assert_eq!(wk.index(), i);
        assert_eq!(wk.own_var_count(), 2); // its gradient and its step's `h`
        assert_eq!(wk.shared_var_count(), 1); // `W`
        assert!(wk.owns(step_h[i]) && !wk.owns(w));
        let params = wk.shared::<Vec<f32>>(w)?;
        let [h, g] = wk.get_disjoint_mut::<Vec<f32>, 2>([step_h[i], grad[i]])?;
        for ((h, g), p) in h.iter_mut().zip(g.iter_mut()).zip(params) {
            *h = p * (i + 1) as f32;
            *g += *h;
        }
    }
    drop(ws);
    assert_eq!(f.tree.get::<Vec<f32>>(f.grad[1])?, &[2.0, 4.0, 6.0]);
    assert_eq!(f.tree.get::<Vec<f32>>(f.step_h[0])?, &[1.0, 2.0, 3.0]);
    Ok(())
}

#[test]
fn access_outside_the_rules_is_an_error_naming_the_variable() -> Result<(), Error> {
    let mut f = fixture()?;
    let (w, grad) = (f.w, f.grad);
    let mut ws = f.tree.split_workers(&f.workers)?;
    let w0 = &mut ws[0];

    // Writing a parameter while the tree is split.
    let err = w0.set(w, vec![0.0_f32]).unwrap_err();
    assert!(matches!(
        err,
        Error::WorkerAccess {
            reason: WorkerAccessReason::ReadOnly,
            ..
        }
    ));
    let msg = err.to_string();
    assert!(
        msg.contains("`W`") && msg.contains("<root>") && msg.contains("worker_0"),
        "{msg}"
    );
    assert!(w0.get_mut::<Vec<f32>>(w).is_err());

    // Touching the other worker's variables, even to read.
    for res in [
        w0.get::<Vec<f32>>(grad[1]).map(|_| ()),
        w0.get_mut::<Vec<f32>>(grad[1]).map(|_| ()),
        w0.shared::<Vec<f32>>(grad[1]).map(|_| ()),
    ] {
        let err = res.unwrap_err();
        assert!(matches!(
            err,
            Error::WorkerAccess {
                reason: WorkerAccessReason::OtherWorker,
                ..
            }
        ));
        let msg = err.to_string();
        assert!(msg.contains("`W@GRAD` in scope `worker_1`"), "{msg}");
    }

    // A split-long borrow of its own variable.
    assert!(matches!(
        w0.shared::<Vec<f32>>(grad[0]),
        Err(Error::WorkerAccess {
            reason: WorkerAccessReason::NotShared,
            ..
        })
    ));

    // Types and aliasing are checked as on the tree.
    assert!(matches!(
        w0.get::<f64>(w),
        Err(Error::Tree(TreeError::TypeMismatch { .. }))
    ));
    assert!(matches!(
        w0.get_disjoint_mut::<Vec<f32>, 2>([grad[0], grad[0]]),
        Err(Error::Tree(TreeError::AliasedVar { .. }))
    ));
    Ok(())
}

#[test]
fn stale_and_foreign_handles_are_reported_as_such() -> Result<(), Error> {
    let mut f = fixture()?;
    let gone = f.tree.var(f.workers[0], "gone")?;
    f.tree.remove_var(gone)?;
    let reused = f.tree.var(f.workers[0], "reused")?; // likely takes the slot
    f.tree.set(reused, 1_u8)?;
    let mut other = ScopeTree::new();
    let foreign = other.var(other.root(), "W")?;
    let mut ws = f.tree.split_workers(&f.workers)?;
    assert!(matches!(
        ws[0].get::<u8>(gone),
        Err(Error::Tree(TreeError::StaleVar { .. }))
    ));
    assert!(matches!(
        ws[0].set(gone, 2_u8),
        Err(Error::Tree(TreeError::StaleVar { .. }))
    ));
    assert_eq!(*ws[0].get::<u8>(reused)?, 1);
    assert!(matches!(
        ws[0].get::<f32>(foreign),
        Err(Error::Tree(TreeError::ForeignVar { .. }))
    ));
    assert!(matches!(
        ws[1].set(foreign, 0.0_f32),
        Err(Error::Tree(TreeError::ForeignVar { .. }))
    ));
    Ok(())
}

#[test]
fn overlapping_or_bad_worker_scopes_are_refused() -> Result<(), Error> {
    let mut f = fixture()?;
    let [a, b] = f.workers;
    let inner = f.tree.new_scope(a)?;
    for scopes in [
        vec![a, a],
        vec![a, inner],
        vec![inner, a],
        vec![b, a, inner],
    ] {
        let err = f.tree.split_workers(&scopes).unwrap_err();
        assert!(matches!(err, Error::OverlappingWorkers { .. }), "{err}");
        assert!(err.to_string().contains("worker_0"));
    }
    f.tree.delete_scope(inner)?;
    assert!(matches!(
        f.tree.split_workers(&[a, inner]),
        Err(Error::Tree(TreeError::StaleScope { .. }))
    ));
    let other = ScopeTree::new();
    assert!(matches!(
        f.tree.split_workers(&[other.root()]),
        Err(Error::Tree(TreeError::ForeignScope { .. }))
    ));
    // No workers: a valid, empty split.
    assert!(f.tree.split_workers(&[])?.is_empty());
    Ok(())
}

#[test]
fn variables_outside_every_worker_are_shared_read_only() -> Result<(), Error> {
    let mut f = fixture()?;
    let data = f.tree.new_named_scope(f.tree.root(), "data")?;
    let batch = f.tree.var(data, "batch")?;
    f.tree.set(batch, 42_u32)?;
    let ws = f.tree.split_workers(&f.workers[..1])?;
    // The sibling data scope and the other worker's scope are both outside
    // the split's only worker: shared.
    assert_eq!(*ws[0].get::<u32>(batch)?, 42);
    assert_eq!(ws[0].get::<Vec<f32>>(f.grad[1])?.len(), 3);
    assert_eq!(ws[0].worker_scopes().count(), 1);
    Ok(())
}

#[test]
fn worker_threads_run_in_parallel_on_one_tree() -> Result<(), Error> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "W")?;
    tree.set(w, (0..1000).map(|i| i as f64).collect::<Vec<_>>())?;
    let n = 4;
    let mut scopes = Vec::new();
    let mut sums = Vec::new();
    let mut steps = Vec::new();
    for _ in 0..n {
        let s = tree.new_scope(root)?;
        scopes.push(s);
        sums.push(tree.var(s, "sum")?);
        let mut hs = Vec::new();
        for _ in 0..10 {
            let st = tree.new_scope(s)?;
            let h = tree.var(st, "h")?;
            tree.set(h, 0.0_f64)?;
            hs.push(h);
        }
        steps.push(hs);
    }
    let results = tree.run_workers(&scopes, |mut wk| -> Result<std::thread::ThreadId, Error> {
        let i = wk.index();
        let params = wk.shared::<Vec<f64>>(w)?;
        let mut acc = 0.0;
        for (t, &h) in steps[i].iter().enumerate() {
            let v: f64 = params.iter().map(|p| p * (t + i) as f64).sum();
            wk.set(h, v)?;
            acc += v;
        }
        wk.set(sums[i], acc)?;
        Ok(std::thread::current().id())
    })?;
    let ids: Vec<_> = results.into_iter().collect::<Result<_, _>>()?;
    // Worker 0 ran on this thread, the others elsewhere.
    assert_eq!(ids[0], std::thread::current().id());
    assert!(ids[1..].iter().all(|id| *id != ids[0]));
    let base: f64 = (0..1000).map(|i| i as f64).sum();
    for (i, &sum) in sums.iter().enumerate() {
        let expect: f64 = (0..10).map(|t| base * (t + i) as f64).sum();
        assert_eq!(*tree.get::<f64>(sum)?, expect);
    }
    // After the split the tree is whole again: reduce into the parameter.
    let total: f64 = sums
        .iter()
        .map(|&s| tree.get::<f64>(s).copied())
        .sum::<Result<_, _>>()?;
    tree.get_mut::<Vec<f64>>(w)?[0] = total;
    assert_eq!(tree.get::<Vec<f64>>(w)?[0], total);
    Ok(())
}

#[test]
#[should_panic(expected = "worker 1 failed")]
fn a_panicking_worker_panics_the_caller_after_the_others_finish() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let scopes: Vec<_> = (0..2).map(|_| tree.new_scope(root).unwrap()).collect();
    let _ = tree.run_workers(&scopes, |wk| {
        if wk.index() == 1 {
            panic!("worker 1 failed");
        }
    });
}
