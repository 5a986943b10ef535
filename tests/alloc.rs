//! Allocation counts and memory per slot, measured with a counting global
//! allocator (this file's own: it counts the allocations of the thread that
//! makes them, so the tests of this file can run in parallel).
//!
//! The allocator is the only `unsafe` in the repository: `GlobalAlloc` is an
//! unsafe trait. It forwards every call to `System` unchanged and only counts.
//!
//! Print the measured figures with
//! `cargo test --release --test alloc -- --nocapture`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use scopetree::diagnostics::{INLINE_VARS, scope_slot_bytes, var_slot_bytes};
use scopetree::{Resolver, ScopeId, ScopeTree, Symbol, VarId};

struct Counting;

thread_local! {
    /// Calls to `alloc`, `alloc_zeroed` and `realloc` on this thread.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    /// Bytes allocated minus bytes freed on this thread.
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

fn note(allocs: u64, bytes: i64) {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + allocs));
    let _ = LIVE.try_with(|c| c.set(c.get() + bytes));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees carry over; the counting touches only
// `const`-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(1, layout.size() as i64);
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(1, layout.size() as i64);
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(0, -(layout.size() as i64));
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(1, new_size as i64 - layout.size() as i64);
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations made and net bytes kept by `f`, on this thread.
fn measure<R>(f: impl FnOnce() -> R) -> (R, u64, i64) {
    let (a0, b0) = (ALLOCS.with(Cell::get), LIVE.with(Cell::get));
    let r = f();
    let (a1, b1) = (ALLOCS.with(Cell::get), LIVE.with(Cell::get));
    (r, a1 - a0, b1 - b0)
}

#[test]
fn the_counter_counts() {
    let (v, allocs, bytes) = measure(|| vec![0u64; 16]);
    assert_eq!(allocs, 1);
    assert_eq!(bytes, 128);
    drop(v);
}

/// A chain of `depth` scopes under the root, 4 variables per level, names
/// differing from level to level.
fn chain(depth: usize) -> (ScopeTree, Vec<ScopeId>) {
    let mut tree = ScopeTree::new();
    let mut scopes = vec![tree.root()];
    for level in 0..=depth {
        for j in 0..4 {
            let v = tree.var(scopes[level], format!("v{level}_{j}")).unwrap();
            tree.set(v, level as f32).unwrap();
        }
        if level < depth {
            scopes.push(tree.new_scope(scopes[level]).unwrap());
        }
    }
    (tree, scopes)
}

#[test]
fn lookups_allocate_nothing() {
    let (mut tree, scopes) = chain(64);
    let deep = scopes[64];
    let missing = tree.intern("missing").unwrap();
    let root_sym = tree.intern("v0_0").unwrap();
    let (found, allocs, _) = measure(|| {
        let mut found = 0;
        for _ in 0..100 {
            found += usize::from(tree.find_var(deep, "v0_0").unwrap().is_some());
            found += usize::from(tree.find_var(deep, root_sym).unwrap().is_some());
            found += usize::from(tree.find_var(deep, "v64_3").unwrap().is_some());
            found += usize::from(tree.find_var(deep, "v31_2").unwrap().is_some());
            found += usize::from(tree.find_var(deep, missing).unwrap().is_some());
            found += usize::from(tree.find_var(deep, "never_seen").unwrap().is_some());
            found += usize::from(tree.find_local_var(deep, "v64_0").unwrap().is_some());
            found += usize::from(tree.find_scope(deep, "v0_1").unwrap().is_some());
        }
        found
    });
    assert_eq!(found, 600);
    assert_eq!(allocs, 0, "lookups allocated {allocs} times");
}

#[test]
fn resolver_hits_and_warm_misses_allocate_nothing() {
    let (mut tree, scopes) = chain(64);
    let deep = scopes[64];
    let root_sym = tree.intern("v0_0").unwrap();
    let missing = tree.intern("missing").unwrap();
    let mut r = Resolver::new();
    // The first miss allocates the resolver's table, once.
    for name in ["v0_0", "v64_3", "v31_2"] {
        assert!(r.find_var(&tree, deep, name).unwrap().is_some());
    }
    assert_eq!(r.find_var(&tree, deep, missing).unwrap(), None);
    assert_eq!(
        r.find_var(&tree, deep, root_sym).unwrap(),
        r.find_var(&tree, deep, "v0_0").unwrap()
    );
    let (before_hits, before_misses) = r.hits_and_misses();
    let (found, allocs, _) = measure(|| {
        let mut found = 0;
        for _ in 0..100 {
            found += usize::from(r.find_var(&tree, deep, "v0_0").unwrap().is_some());
            found += usize::from(r.find_var(&tree, deep, root_sym).unwrap().is_some());
            found += usize::from(r.find_var(&tree, deep, "v64_3").unwrap().is_some());
            found += usize::from(r.find_var(&tree, deep, "v31_2").unwrap().is_some());
            found += usize::from(r.find_var(&tree, deep, missing).unwrap().is_some());
        }
        found
    });
    assert_eq!(found, 400);
    assert_eq!(allocs, 0, "resolver hits allocated {allocs} times");
    let (hits, misses) = r.hits_and_misses();
    assert_eq!((hits - before_hits, misses - before_misses), (500, 0));

    // A miss after a change (the table exists) walks without allocating,
    // and so does the change itself (a rename between interned names).
    let shadow = tree.var(deep, root_sym).unwrap();
    let parked = tree.intern("parked").unwrap();
    let root_var = tree.find_var(scopes[0], root_sym).unwrap();
    let (_, allocs, _) = measure(|| {
        for _ in 0..100 {
            assert_eq!(r.find_var(&tree, deep, root_sym).unwrap(), Some(shadow));
            tree.rename(deep, root_sym, parked).unwrap();
            assert_eq!(r.find_var(&tree, deep, root_sym).unwrap(), root_var);
            tree.rename(deep, parked, root_sym).unwrap();
        }
    });
    assert_eq!(allocs, 0, "warm resolver misses allocated {allocs} times");
}

#[test]
fn handle_reads_and_in_place_writes_allocate_nothing() {
    let (mut tree, scopes) = chain(4);
    let w = tree.find_var(scopes[4], "v0_0").unwrap().unwrap();
    let ((), allocs, _) = measure(|| {
        for i in 0..100 {
            let x = *tree.get::<f32>(w).unwrap();
            tree.set(w, x + i as f32).unwrap();
            *tree.get_mut::<f32>(w).unwrap() += 1.0;
        }
    });
    assert_eq!(allocs, 0);
}

#[test]
fn var_within_the_inline_table_allocates_nothing() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let names: Vec<String> = (0..INLINE_VARS).map(|i| format!("x{i}")).collect();
    // Warm up: intern the names and leave free slots in both arenas.
    let warm = tree.new_scope(root).unwrap();
    for n in &names {
        tree.var(warm, n.as_str()).unwrap();
    }
    tree.delete_scope(warm).unwrap();

    let scope = tree.new_scope(root).unwrap();
    let (ids, allocs, _) = measure(|| {
        let mut ids: [Option<VarId>; INLINE_VARS] = [None; INLINE_VARS];
        for (slot, n) in ids.iter_mut().zip(&names) {
            *slot = Some(tree.var(scope, n.as_str()).unwrap());
        }
        // Get-or-create of an existing name returns it, also without allocating.
        for n in &names {
            tree.var(scope, n.as_str()).unwrap();
        }
        ids
    });
    assert_eq!(allocs, 0, "var allocated {allocs} times");
    assert_eq!(tree.local_var_count(scope).unwrap(), INLINE_VARS);
    assert!(ids.iter().all(Option::is_some));
}

const STEP_VARS: [&str; 8] = ["x", "h", "c", "i", "f", "o", "g", "loss"];

struct Model {
    tree: ScopeTree,
    root: ScopeId,
    params: Vec<VarId>,
    syms: Vec<Symbol>,
}

fn model() -> Model {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let params = ["W_ih", "W_hh", "b_ih", "b_hh"]
        .iter()
        .map(|p| {
            let v = tree.var(root, *p).unwrap();
            tree.set(v, 0.5_f32).unwrap();
            v
        })
        .collect();
    let syms = STEP_VARS.iter().map(|n| tree.intern(n).unwrap()).collect();
    Model {
        tree,
        root,
        params,
        syms,
    }
}

/// One training step: a step scope, 8 variables (set to a value when
/// `values`), reads of the 4 parameters through handles, delete.
fn step(m: &mut Model, by_symbol: bool, values: bool) -> f32 {
    let s = m.tree.new_scope(m.root).unwrap();
    for (i, (&sym, name)) in m.syms.iter().zip(STEP_VARS).enumerate() {
        let v = if by_symbol {
            m.tree.var(s, sym).unwrap()
        } else {
            m.tree.var(s, name).unwrap()
        };
        if values {
            m.tree.set(v, i as f32).unwrap();
        }
    }
    let sum = m
        .params
        .iter()
        .map(|&p| *m.tree.get::<f32>(p).unwrap())
        .sum();
    m.tree.delete_scope(s).unwrap();
    sum
}

#[test]
fn structural_step_churn_allocates_nothing_in_steady_state() {
    for by_symbol in [true, false] {
        let mut m = model();
        for _ in 0..4 {
            step(&mut m, by_symbol, false);
        }
        let (sum, allocs, bytes) = measure(|| {
            (0..1000)
                .map(|_| step(&mut m, by_symbol, false))
                .sum::<f32>()
        });
        assert_eq!(sum, 2000.0);
        assert_eq!(
            allocs, 0,
            "1000 steps (by_symbol = {by_symbol}) allocated {allocs} times"
        );
        assert_eq!(bytes, 0);
        assert_eq!(m.tree.scope_count(), 1);
    }
}

/// Setting a fresh variable boxes its value: one allocation per variable per
/// step, freed when the step scope is deleted (never kept past its scope).
#[test]
fn value_step_churn_allocates_one_box_per_fresh_variable() {
    let mut m = model();
    for _ in 0..4 {
        step(&mut m, true, true);
    }
    let steps = 1000;
    let (_, allocs, bytes) = measure(|| (0..steps).map(|_| step(&mut m, true, true)).sum::<f32>());
    eprintln!(
        "value churn: {} allocations per step",
        allocs as f64 / steps as f64
    );
    assert_eq!(allocs, steps * STEP_VARS.len() as u64);
    assert_eq!(bytes, 0, "every boxed value is freed with its step scope");
}

#[test]
fn slots_fit_the_brief() {
    // The brief: at most 128 B per scope and 64 B per variable slot, value
    // payload excluded.
    eprintln!(
        "scope slot: {} B, variable slot: {} B, handles: {} B",
        scope_slot_bytes(),
        var_slot_bytes(),
        std::mem::size_of::<VarId>()
    );
    assert!(scope_slot_bytes() <= 128);
    assert!(var_slot_bytes() <= 64);
}

const KIDS: usize = 1_000;
const GRANDKIDS: usize = 99;
const SCOPES: usize = 1 + KIDS * (1 + GRANDKIDS);
const VARS_PER_SCOPE: usize = 10;
const VARS: usize = (SCOPES - 1) * VARS_PER_SCOPE;

/// The benches' big tree in `tree`: 100,000 scopes under the root,
/// 1,000,000 variables (unset). Returns the net bytes the build kept.
fn big_build(tree: &mut ScopeTree) -> i64 {
    let syms: Vec<Symbol> = (0..VARS_PER_SCOPE)
        .map(|i| tree.intern(format!("v{i}").as_str()).unwrap())
        .collect();
    let root = tree.root();
    let ((), _, bytes) = measure(|| {
        for _ in 0..KIDS {
            let kid = tree.new_scope(root).unwrap();
            for &sym in &syms {
                tree.var(kid, sym).unwrap();
            }
            for _ in 0..GRANDKIDS {
                let g = tree.new_scope(kid).unwrap();
                for &sym in &syms {
                    tree.var(g, sym).unwrap();
                }
            }
        }
    });
    assert_eq!(tree.scope_count(), SCOPES);
    assert_eq!(tree.var_count(), VARS);
    bytes
}

/// Net bytes allocated by `ScopeTree::with_capacity(scopes, vars)`.
fn arena_bytes(scopes: usize, vars: usize) -> i64 {
    let (tree, _, bytes) = measure(|| ScopeTree::with_capacity(scopes, vars));
    drop(tree);
    bytes
}

#[test]
fn a_big_build_stays_within_the_brief_per_scope_and_per_variable() {
    // Arenas sized up front: the allocator's count of one scope slot and one
    // variable slot, then what the build adds (spilled variable tables: 10
    // variables per scope, 4 inline).
    let empty = arena_bytes(1, 0);
    let per_scope = (arena_bytes(SCOPES, 0) - empty) as f64 / (SCOPES - 1) as f64;
    let per_var_slot = (arena_bytes(1, VARS) - empty) as f64 / VARS as f64;
    let mut sized = ScopeTree::with_capacity(SCOPES, VARS);
    let built = big_build(&mut sized);
    let per_var_table = built as f64 / VARS as f64;
    let per_var = per_var_slot + per_var_table;
    eprintln!(
        "sized build: {per_scope:.1} B per scope; per variable {per_var_slot:.1} B slot \
         + {per_var_table:.1} B table entry = {per_var:.1} B; heap_bytes() = {}",
        sized.heap_bytes()
    );
    assert!(per_scope <= 128.0, "{per_scope} B per scope");
    assert!(per_var_slot <= 64.0, "{per_var_slot} B per variable slot");
    assert!(
        per_var <= 64.0,
        "{per_var} B per variable with its table entry"
    );
    // `heap_bytes()` accounts for what the allocator saw (the interner's
    // strings it only estimates).
    let counted = arena_bytes(SCOPES, VARS) + built;
    let reported = sized.heap_bytes() as i64;
    assert!(
        (reported - counted).abs() * 100 < counted,
        "{reported} vs {counted}"
    );
    drop(sized);

    // Arenas grown on demand: slotmap doubles its vectors, so up to half
    // of each arena can be spare capacity; the bound doubles the budget.
    let (mut grown, _, start) = measure(ScopeTree::new);
    let total = start + big_build(&mut grown);
    let budget = (SCOPES * 128 + VARS * 64) as i64;
    eprintln!(
        "grown build: {total} B = {:.2} x the budget of 128 B per scope + 64 B per variable \
         ({budget} B); heap_bytes() = {}",
        total as f64 / budget as f64,
        grown.heap_bytes()
    );
    assert!(total <= 2 * budget);
}

/// Names a step loop passes as text and never interns are dropped with each
/// step scope and made again by the next one: they go idle but are listed
/// once, so no sweep frees them and no step re-interns them (a sweep needs
/// 1,024 distinct idle names; 10,000 steps of 8 names would have reached it
/// many times over if each drop were counted).
#[test]
fn step_churn_with_names_never_interned_allocates_nothing_in_steady_state() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let step = |tree: &mut ScopeTree| {
        let s = tree.new_scope(root).unwrap();
        for n in STEP_VARS {
            tree.var(s, n).unwrap();
        }
        tree.delete_scope(s).unwrap();
    };
    for _ in 0..4 {
        step(&mut tree);
    }
    let ((), allocs, bytes) = measure(|| {
        for _ in 0..10_000 {
            step(&mut tree);
        }
    });
    assert_eq!(allocs, 0, "10,000 steps allocated {allocs} times");
    assert_eq!(bytes, 0);
    assert!(
        tree.symbol("loss").is_some(),
        "the idle names stay interned"
    );
}
