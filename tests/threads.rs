//! Threads: `ScopeTree` is `Send + Sync`; many threads find and read through
//! one `&ScopeTree` with every result checked; a tree moves between threads;
//! writers and readers share one behind a `RwLock`; `get_disjoint_mut` hands
//! variables of disjoint scopes to threads that mutate them in parallel; trees
//! made on many threads at once get distinct tags.
//!
//! The core crate has no parallel-mutation API of its own (mutation takes
//! `&mut ScopeTree`), so the parallel writers here go through the two ways a
//! runtime would use: a lock around the tree, and disjoint `&mut` borrows.

use std::collections::HashSet;
use std::sync::{Arc, Barrier, RwLock};
use std::thread;

use scopetree::{Error, ScopeId, ScopeTree, Symbol, TreeTag, VarId};

const THREADS: usize = 8;

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn tree_handles_and_errors_are_send_and_sync() {
    assert_send_sync::<ScopeTree>();
    assert_send_sync::<ScopeId>();
    assert_send_sync::<VarId>();
    assert_send_sync::<Symbol>();
    assert_send_sync::<TreeTag>();
    assert_send_sync::<Error>();
}

/// A model scope with 64 parameters, 64 step scopes under it that each hold
/// an `h` and shadow `w3`, and a stale step scope.
struct Built {
    tree: ScopeTree,
    params: Vec<VarId>,
    steps: Vec<(ScopeId, VarId, VarId)>,
    stale: (ScopeId, VarId),
    dump: String,
}

fn build() -> Built {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let params: Vec<VarId> = (0..64)
        .map(|i| {
            let v = tree.var(root, format!("w{i}").as_str()).unwrap();
            tree.set(v, vec![i as f32; 16]).unwrap();
            v
        })
        .collect();
    let steps = (0..64)
        .map(|j| {
            let s = tree.new_scope(root).unwrap();
            let h = tree.var(s, "h").unwrap();
            tree.set(h, j as u64).unwrap();
            let w3 = tree.var(s, "w3").unwrap();
            tree.set(w3, vec![-1.0_f32; 16]).unwrap();
            (s, h, w3)
        })
        .collect();
    let gone = tree.new_scope(root).unwrap();
    let gone_v = tree.var(gone, "h").unwrap();
    tree.delete_scope(gone).unwrap();
    let dump = tree.dump(root).unwrap().to_string();
    Built {
        tree,
        params,
        steps,
        stale: (gone, gone_v),
        dump,
    }
}

/// Eight threads read one tree at once through `&ScopeTree`: lookups from
/// step scopes (hits in the root, shadowed names, misses), typed reads,
/// iterators, dumps, and stale handles, each checked against what was built.
#[test]
fn many_threads_find_and_read_concurrently() {
    let b = build();
    let start = Barrier::new(THREADS);
    let checked: usize = thread::scope(|sc| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (b, start) = (&b, &start);
                sc.spawn(move || {
                    let tree: &ScopeTree = &b.tree;
                    start.wait();
                    let mut n = 0;
                    for round in 0..2_000 {
                        let j = (round * 7 + t * 13) % b.steps.len();
                        let (s, h, w3) = b.steps[j];
                        let i = (round * 11 + t) % b.params.len();
                        let name = format!("w{i}");
                        let want = if i == 3 { w3 } else { b.params[i] };
                        assert_eq!(tree.find_var(s, name.as_str()).unwrap(), Some(want));
                        let val = tree.get::<Vec<f32>>(want).unwrap();
                        assert_eq!(val[0], if i == 3 { -1.0 } else { i as f32 });
                        assert_eq!(tree.find_var(s, "h").unwrap(), Some(h));
                        assert_eq!(*tree.get::<u64>(h).unwrap(), j as u64);
                        assert_eq!(tree.find_var(s, "absent").unwrap(), None);
                        assert_eq!(tree.find_local_var(tree.root(), "h").unwrap(), None);
                        assert_eq!(tree.owner(h).unwrap(), s);
                        assert_eq!(tree.local_var_count(s).unwrap(), 2);
                        assert!(matches!(
                            tree.find_var(b.stale.0, "h"),
                            Err(Error::StaleScope { .. })
                        ));
                        assert!(matches!(
                            tree.get::<u64>(b.stale.1),
                            Err(Error::StaleVar { .. })
                        ));
                        if round % 250 == 0 {
                            assert_eq!(tree.dump(tree.root()).unwrap().to_string(), b.dump);
                            assert_eq!(tree.descendants(tree.root()).unwrap().count(), 65);
                            assert_eq!(tree.kids(tree.root()).unwrap().nth(j), Some(s));
                        }
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(checked, THREADS * 2_000);
}

/// A tree moves to another thread, is changed there, and comes back; its
/// handles stay valid across the move.
#[test]
fn tree_moves_between_threads() {
    let mut tree = ScopeTree::new();
    let w = tree.var(tree.root(), "w").unwrap();
    tree.set(w, 1_u64).unwrap();
    let (tree, step, h) = thread::spawn(move || {
        let step = tree.new_scope(tree.root()).unwrap();
        let h = tree.var(step, "h").unwrap();
        tree.set(h, 2_u64).unwrap();
        *tree.get_mut::<u64>(w).unwrap() += 10;
        (tree, step, h)
    })
    .join()
    .unwrap();
    assert_eq!(*tree.get::<u64>(w).unwrap(), 11);
    assert_eq!(tree.find_var(step, "h").unwrap(), Some(h));
    assert_eq!(*tree.get::<u64>(h).unwrap(), 2);
}

/// Writers and readers share one tree behind a `RwLock`. Each writer runs
/// 1,000 steps: it creates a step scope with a variable, reads it back under
/// a read lock, bumps a counter in a scope of its own, and deletes the step
/// scope. Readers meanwhile check that the root's parameter is intact and
/// that every scope they see is consistent. At the end, nothing was lost:
/// each writer's counter is 1,000, every step handle is stale, and the counts
/// are exact.
#[test]
fn writers_and_readers_behind_a_lock_lose_nothing() {
    const STEPS: u64 = 1_000;
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "W").unwrap();
    tree.set(w, vec![0.25_f32; 8]).unwrap();
    let own: Vec<(ScopeId, VarId)> = (0..4)
        .map(|t| {
            let s = tree
                .new_named_scope(root, format!("writer{t}").as_str())
                .unwrap();
            let c = tree.var(s, "count").unwrap();
            tree.set(c, 0_u64).unwrap();
            (s, c)
        })
        .collect();
    let shared = Arc::new(RwLock::new(tree));

    let writers: Vec<_> = own
        .iter()
        .enumerate()
        .map(|(t, &(mine, count))| {
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                let mut stale = Vec::new();
                for i in 0..STEPS {
                    let (step, h) = {
                        let mut tree = shared.write().unwrap();
                        let step = tree.new_scope(mine).unwrap();
                        let h = tree.var(step, "h").unwrap();
                        tree.set(h, (t as u64) << 32 | i).unwrap();
                        (step, h)
                    };
                    {
                        let tree = shared.read().unwrap();
                        assert_eq!(*tree.get::<u64>(h).unwrap(), (t as u64) << 32 | i);
                        assert_eq!(tree.find_var(step, "W").unwrap(), Some(w));
                        assert_eq!(tree.find_var(step, "count").unwrap(), Some(count));
                    }
                    {
                        let mut tree = shared.write().unwrap();
                        *tree.get_mut::<u64>(count).unwrap() += 1;
                        tree.delete_kid(mine, step).unwrap();
                    }
                    if i % 100 == 0 {
                        stale.push((step, h));
                    }
                }
                stale
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                let mut seen_steps = 0usize;
                for _ in 0..2_000 {
                    let tree = shared.read().unwrap();
                    assert_eq!(tree.get::<Vec<f32>>(w).unwrap(), &[0.25; 8]);
                    for t in 0..4 {
                        let mine = tree
                            .kid(tree.root(), format!("writer{t}").as_str())
                            .unwrap()
                            .unwrap();
                        for step in tree.kids(mine).unwrap() {
                            let h = tree.find_local_var(step, "h").unwrap().unwrap();
                            assert_eq!(*tree.get::<u64>(h).unwrap() >> 32, t as u64);
                            seen_steps += 1;
                        }
                    }
                    // Every live scope's variables are live, and the counts add up.
                    let vars: usize = tree
                        .descendants(tree.root())
                        .unwrap()
                        .map(|(s, _)| tree.local_var_count(s).unwrap())
                        .sum();
                    assert_eq!(vars, tree.var_count());
                }
                seen_steps
            })
        })
        .collect();

    let stale: Vec<_> = writers
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    let tree = shared.read().unwrap();
    for &(_, c) in &own {
        assert_eq!(*tree.get::<u64>(c).unwrap(), STEPS);
    }
    for (s, h) in stale {
        assert!(!tree.contains_scope(s));
        assert!(matches!(tree.get::<u64>(h), Err(Error::StaleVar { .. })));
    }
    assert_eq!(tree.scope_count(), 1 + 4);
    assert_eq!(tree.var_count(), 1 + 4);
}

/// Variables in eight disjoint scopes are borrowed at once with
/// `get_disjoint_mut` and mutated by eight threads in parallel; the main
/// thread then checks that every update landed in the right variable and the
/// rest of the tree is untouched.
#[test]
fn disjoint_scopes_mutated_in_parallel() {
    const N: usize = 8;
    const ROUNDS: u64 = 200_000;
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let total = tree.var(root, "total").unwrap();
    tree.set(total, 0_u64).unwrap();
    let vars: [VarId; N] = std::array::from_fn(|i| {
        let s = tree
            .new_named_scope(root, format!("worker{i}").as_str())
            .unwrap();
        let v = tree.var(s, "acc").unwrap();
        tree.set(v, vec![0_u64; 4]).unwrap();
        v
    });
    for round in 0..3u64 {
        let accs = tree.get_disjoint_mut::<Vec<u64>, N>(vars).unwrap();
        thread::scope(|sc| {
            for (i, acc) in accs.into_iter().enumerate() {
                sc.spawn(move || {
                    for k in 0..ROUNDS {
                        acc[(k % 4) as usize] += i as u64 + 1;
                    }
                });
            }
        });
        for (i, v) in vars.iter().enumerate() {
            let want = (round + 1) * ROUNDS / 4 * (i as u64 + 1);
            assert_eq!(tree.get::<Vec<u64>>(*v).unwrap(), &[want; 4], "worker {i}");
            assert_eq!(tree.var_name(*v).unwrap(), "acc");
            assert_eq!(
                tree.path(tree.owner(*v).unwrap()).unwrap(),
                format!("worker{i}")
            );
        }
        let sum: u64 = vars
            .iter()
            .map(|v| tree.get::<Vec<u64>>(*v).unwrap().iter().sum::<u64>())
            .sum();
        *tree.get_mut::<u64>(total).unwrap() = sum;
    }
    let want: u64 = (1..=N as u64).map(|i| 3 * ROUNDS * i).sum();
    assert_eq!(*tree.get::<u64>(total).unwrap(), want);
    assert_eq!((tree.scope_count(), tree.var_count()), (1 + N, 1 + N));
}

/// Trees made on many threads at once get distinct tags, and each rejects
/// the others' handles as foreign.
#[test]
fn trees_made_concurrently_have_distinct_tags() {
    let trees: Vec<(ScopeTree, VarId)> = (0..THREADS)
        .map(|_| {
            thread::spawn(|| {
                (0..100)
                    .map(|_| {
                        let mut t = ScopeTree::new();
                        let v = t.var(t.root(), "w").unwrap();
                        (t, v)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let tags: HashSet<TreeTag> = trees.iter().map(|(t, _)| t.tag()).collect();
    assert_eq!(tags.len(), THREADS * 100);
    // Every tree's first variable has the same slot and version, so only the
    // tag tells them apart.
    for w in trees.windows(2) {
        let ((a, _), (_, vb)) = (&w[0], &w[1]);
        assert!(matches!(a.get::<u8>(*vb), Err(Error::ForeignVar { .. })));
        assert!(!a.contains_var(*vb));
    }
}
