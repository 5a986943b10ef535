//! ZeRO stage 1's exchange (`SyncPlan::reduce_scatter`, then
//! `SyncPlan::all_gather`) at 1 to 4 ranks run as threads of this process,
//! with every piece through the padded buffers (`direct_bytes` off), every
//! piece from its variable's own buffer (reduced to its owner, broadcast
//! back in place), and a mix, in buckets that cut the pieces in chunks:
//! each way gives exactly the sums (small integers) on the owner, keeps
//! the other elements, and gathers each element from its owner. A whole
//! variable reduced to its owner takes the spare buffer, without a copy.

#[path = "support/thread_world.rs"]
mod thread_world;

use scopetree::checkpoint::Tensor;
use scopetree::ranks::{Collective, PlanOptions, Reduce, SyncPlan};
use scopetree::{ScopeId, ScopeTree, VarId};
use thread_world::run;

/// The variables' lengths: small ones, and large ones that the partition
/// splits between ranks.
const LENS: [usize; 9] = [3, 40, 1, 300, 17, 2, 520, 64, 9];

/// Element `i` of variable `v` on `rank`: a small integer, so that every
/// grouping of the sums is exact.
fn value(rank: usize, v: usize, i: usize) -> f64 {
    ((rank + 1) * ((v * 3 + i) % 11)) as f64
}

struct Grads {
    tree: ScopeTree,
    scope: ScopeId,
    vars: Vec<VarId>,
}

/// The gradients of `rank`, in every reduced type: `Vec<f32>`,
/// `Vec<f64>`, `Tensor<f32>`, `Box<[f32]>`.
fn grads(rank: usize) -> Grads {
    let mut tree = ScopeTree::new();
    let scope = tree.new_named_scope(tree.root(), "grads").expect("a scope");
    let mut vars = Vec::new();
    for (v, &len) in LENS.iter().enumerate() {
        let g = tree.var(scope, format!("g{v}")).expect("a variable");
        let xs = (0..len).map(|i| value(rank, v, i));
        match v % 4 {
            0 => tree.set(g, xs.map(|x| x as f32).collect::<Vec<f32>>()),
            1 => tree.set(g, xs.collect::<Vec<f64>>()),
            2 => tree.set(
                g,
                Tensor::new(vec![len], xs.map(|x| x as f32).collect()).expect("a tensor"),
            ),
            _ => tree.set(g, xs.map(|x| x as f32).collect::<Box<[f32]>>()),
        }
        .expect("a value");
        vars.push(g);
    }
    Grads { tree, scope, vars }
}

/// Every element of `g`, by variable, as `f64`.
fn elems(g: &Grads) -> Vec<Vec<f64>> {
    g.vars
        .iter()
        .map(|&v| {
            let t = &g.tree;
            if let Ok(x) = t.get::<Vec<f32>>(v) {
                x.iter().map(|&y| f64::from(y)).collect()
            } else if let Ok(x) = t.get::<Vec<f64>>(v) {
                x.clone()
            } else if let Ok(x) = t.get::<Tensor<f32>>(v) {
                x.data().iter().map(|&y| f64::from(y)).collect()
            } else {
                let x = t.get::<Box<[f32]>>(v).expect("a reduced type");
                x.iter().map(|&y| f64::from(y)).collect()
            }
        })
        .collect()
}

/// The option sets the exchange must agree across: all through buffers,
/// all direct in one-bucket calls, all direct in chunks of 12 bytes, and
/// the large pieces direct with the small ones buffered.
fn option_sets() -> Vec<(&'static str, PlanOptions)> {
    vec![
        ("direct off", PlanOptions::new().direct_bytes(usize::MAX)),
        ("all direct", PlanOptions::new().direct_bytes(1)),
        (
            "all direct, 12-byte buckets",
            PlanOptions::new().direct_bytes(1).bucket_bytes(12),
        ),
        (
            "direct from 256 bytes, 40-byte buckets",
            PlanOptions::new().direct_bytes(256).bucket_bytes(40),
        ),
        ("default", PlanOptions::new()),
    ]
}

/// Which rank owns each element, by variable.
fn owners(plan: &SyncPlan) -> Vec<Vec<usize>> {
    let part = plan.partition();
    let mut out = vec![Vec::new(); LENS.len()];
    for r in 0..part.ranks() {
        for p in part.pieces(r) {
            out[p.var].resize(p.start + p.len, r);
        }
    }
    out
}

/// What the owner of element `i` of variable `v` holds before the
/// all-gather: distinct per owner, exact in `f32`.
fn marker(owner: usize, v: usize, i: usize) -> f64 {
    (owner * 10_000 + v * 1000 + i) as f64
}

#[test]
fn every_way_a_piece_moves_gives_the_exact_sums_and_gathers_from_the_owner() {
    for n in 1..=4 {
        for (name, opts) in option_sets() {
            for op in [Reduce::Sum, Reduce::Mean] {
                let wrong = run(n, |world| {
                    let me = world.rank();
                    let mut g = grads(me);
                    let mut plan = SyncPlan::new(world, &g.tree, g.scope, &opts).expect("a plan");
                    let own = owners(&plan);
                    let mut wrong = Vec::new();
                    // Twice: the second reuses the first's buffers and spares.
                    for step in 0..2 {
                        let mine = elems(&grads(me));
                        for (v, xs) in mine.iter().enumerate() {
                            set(&mut g, v, xs);
                        }
                        plan.reduce_scatter(world, &mut g.tree, op)
                            .expect("a reduce-scatter");
                        for (v, xs) in elems(&g).iter().enumerate() {
                            for (i, &x) in xs.iter().enumerate() {
                                let sum: f64 = (0..n).map(|r| value(r, v, i)).sum();
                                let want = match (own[v][i] == me, op) {
                                    (false, _) => mine[v][i],
                                    (true, Reduce::Sum) => sum,
                                    (true, _) => (sum as f32 / n as f32).into(),
                                };
                                let want = if v % 4 == 1 && own[v][i] == me && op == Reduce::Mean {
                                    sum / n as f64 // f64 variables divide in f64
                                } else {
                                    want
                                };
                                if x != want {
                                    wrong
                                        .push(format!("step {step}: g{v}[{i}] = {x}, want {want}"));
                                }
                            }
                        }
                        // Each rank marks its own slice; the all-gather
                        // must give every rank each owner's marks.
                        for v in 0..LENS.len() {
                            let xs: Vec<f64> = (0..LENS[v])
                                .map(|i| {
                                    if own[v][i] == me {
                                        marker(me, v, i)
                                    } else {
                                        -1.0
                                    }
                                })
                                .collect();
                            set(&mut g, v, &xs);
                        }
                        plan.all_gather(world, &mut g.tree).expect("an all-gather");
                        for (v, xs) in elems(&g).iter().enumerate() {
                            for (i, &x) in xs.iter().enumerate() {
                                let want = marker(own[v][i], v, i);
                                if x != want {
                                    wrong.push(format!(
                                        "step {step}: gathered g{v}[{i}] = {x}, want {want}"
                                    ));
                                }
                            }
                        }
                    }
                    wrong
                });
                for (rank, w) in wrong.iter().enumerate() {
                    assert!(
                        w.is_empty(),
                        "{n} ranks, {name}, {op:?}, rank {rank}: {} wrong, first {:?}",
                        w.len(),
                        w.first()
                    );
                }
            }
        }
    }
}

/// Sets variable `v` of `g` to `xs`, in its own type.
fn set(g: &mut Grads, v: usize, xs: &[f64]) {
    let id = g.vars[v];
    let t = &mut g.tree;
    if let Ok(x) = t.get_mut::<Vec<f32>>(id) {
        for (y, &z) in x.iter_mut().zip(xs) {
            *y = z as f32;
        }
    } else if let Ok(x) = t.get_mut::<Vec<f64>>(id) {
        x.copy_from_slice(xs);
    } else if let Ok(x) = t.get_mut::<Tensor<f32>>(id) {
        for (y, &z) in x.data_mut().iter_mut().zip(xs) {
            *y = z as f32;
        }
    } else {
        let x = t.get_mut::<Box<[f32]>>(id).expect("a reduced type");
        for (y, &z) in x.iter_mut().zip(xs) {
            *y = z as f32;
        }
    }
}

#[test]
fn a_whole_variable_reduced_to_its_owner_takes_the_spare_without_a_copy() {
    // At 2 ranks with every piece direct, rank 0 owns `g0` whole (3
    // elements at the start of the manifest).
    let moved = run(2, |world| {
        let mut g = grads(Collective::rank(world));
        let opts = PlanOptions::new().direct_bytes(1);
        let mut plan = SyncPlan::new(world, &g.tree, g.scope, &opts).expect("a plan");
        let whole = plan.partition().piece_of(0, 0);
        let ptr = |g: &Grads| g.tree.get::<Vec<f32>>(g.vars[0]).expect("g0").as_ptr() as usize;
        let first = ptr(&g);
        plan.reduce_scatter(world, &mut g.tree, Reduce::Sum)
            .expect("a reduce-scatter");
        let second = ptr(&g);
        plan.reduce_scatter(world, &mut g.tree, Reduce::Sum)
            .expect("a reduce-scatter");
        let third = ptr(&g);
        (whole, first, second, third)
    });
    let (whole, first, second, third) = moved[0];
    assert_eq!(
        whole.map(|p| (p.start, p.len)),
        Some((0, LENS[0])),
        "rank 0 owns g0 whole"
    );
    assert_ne!(first, second, "rank 0's g0 took the spare's buffer");
    assert_eq!(first, third, "and its old buffer came back as the spare");
    let (_, first1, second1, _) = moved[1];
    assert_eq!(
        first1, second1,
        "rank 1 does not own g0: it keeps its buffer"
    );
}
