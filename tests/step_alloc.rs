//! Heap allocations of step-scope loops in steady state, counted by a global
//! allocator (per thread, so parallel tests do not disturb each other).
//!
//! The claim in `docs/runtime.md`: a loop with a fixed number of steps that
//! recycles its step scopes and writes its values in place does no heap
//! allocation after its first sequence; deleting and re-creating the step
//! scopes by hand allocates one box per variable per step.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use scopetree::{ScopeTree, StepError as Error, StepScopes, StepVar};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY (for the reader; this test crate may use `unsafe`, the library may
// not): every call forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap allocations made by `f` on this thread.
fn allocs_in<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = ALLOCS.with(Cell::get);
    let r = f();
    (r, ALLOCS.with(Cell::get) - before)
}

const T: usize = 16;
/// More than `INLINE_VARS`, so the step scopes' variable tables spill to the
/// heap and recycling has to reuse those buffers too.
const NAMES: [&str; 6] = ["x", "y", "h", "c", "p", "dh"];

fn declare_all(steps: &mut StepScopes, tree: &mut ScopeTree) -> Result<Vec<StepVar>, Error> {
    NAMES.iter().map(|n| steps.declare(tree, *n)).collect()
}

/// One sequence: write every step variable in place (sizing it the first time).
fn run_sequence(
    tree: &mut ScopeTree,
    steps: &mut StepScopes,
    svs: &[StepVar],
) -> Result<(), Error> {
    steps.recycle(tree)?;
    for _ in 0..T {
        let t = steps.push(tree)?;
        for &sv in svs {
            let v = steps.var(sv, t)?;
            let buf = tree.get_or_insert_with(v, || vec![0.0_f32; 64])?;
            buf.fill(t as f32);
        }
    }
    Ok(())
}

#[test]
fn recycled_training_loop_allocates_nothing_after_warm_up() -> Result<(), Error> {
    let mut tree = ScopeTree::new();
    let w = tree.var(tree.root(), "W")?;
    tree.set(w, vec![0.5_f32; 64])?;
    let mut steps = StepScopes::new(&tree, tree.root())?;
    let svs = declare_all(&mut steps, &mut tree)?;
    // Warm-up: the first sequence creates the scopes, variables and buffers;
    // the first recycle sizes the tree's pool of spilled variable tables.
    let (r, warm) = allocs_in(|| -> Result<(), Error> {
        run_sequence(&mut tree, &mut steps, &svs)?;
        run_sequence(&mut tree, &mut steps, &svs)
    });
    r?;
    assert!(warm > 0);
    let (r, steady) = allocs_in(|| -> Result<(), Error> {
        for _ in 0..100 {
            run_sequence(&mut tree, &mut steps, &svs)?;
        }
        Ok(())
    });
    r?;
    assert_eq!(
        steady,
        0,
        "100 recycled sequences of {T} steps x {} vars",
        NAMES.len()
    );
    Ok(())
}

#[test]
fn ping_pong_inference_allocates_nothing_after_three_steps() -> Result<(), Error> {
    let mut tree = ScopeTree::new();
    let mut steps = StepScopes::ping_pong(&tree, tree.root())?;
    let svs = declare_all(&mut steps, &mut tree)?;
    let mut step = |tree: &mut ScopeTree| -> Result<(), Error> {
        let t = steps.push(tree)?;
        for &sv in &svs {
            tree.get_or_insert_with(steps.var(sv, t)?, || vec![0.0_f32; 64])?[0] = t as f32;
        }
        Ok(())
    };
    // Warm-up: two steps create the two scopes, the third recycles one.
    for _ in 0..3 {
        step(&mut tree)?;
    }
    let (r, steady) = allocs_in(|| -> Result<(), Error> {
        for _ in 0..1000 {
            step(&mut tree)?;
        }
        Ok(())
    });
    r?;
    assert_eq!(steady, 0, "1000 ping-pong steps");
    Ok(())
}

/// The alternative `StepScopes` does not take: delete the step scopes and
/// create new ones. The arena's slots and table buffers are reused, but every
/// fresh variable starts empty, so its first `set` boxes the value: one
/// allocation (here two: the box and the `Vec`) per variable per step.
#[test]
fn delete_and_recreate_by_hand_allocates_per_variable() -> Result<(), Error> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let syms: Vec<_> = NAMES
        .iter()
        .map(|n| tree.intern(n))
        .collect::<Result<_, _>>()?;
    let sequence = |tree: &mut ScopeTree| -> Result<(), Error> {
        tree.drop_kids(root)?;
        for t in 0..T {
            let s = tree.new_scope(root)?;
            for &sym in &syms {
                let v = tree.var(s, sym)?;
                tree.set(v, vec![t as f32; 64])?;
            }
        }
        Ok(())
    };
    sequence(&mut tree)?;
    sequence(&mut tree)?;
    let (r, steady) = allocs_in(|| sequence(&mut tree));
    r?;
    let per_var = (T * NAMES.len()) as u64;
    assert_eq!(
        steady,
        2 * per_var,
        "box + Vec for each of {per_var} variables"
    );
    // The structure itself (scopes, variables, spilled tables) allocates
    // nothing: only the values do.
    let (r, structure) = allocs_in(|| -> Result<(), Error> {
        tree.drop_kids(root)?;
        for _ in 0..T {
            let s = tree.new_scope(root)?;
            for &sym in &syms {
                tree.var(s, sym)?;
            }
        }
        Ok(())
    });
    r?;
    assert_eq!(structure, 0);
    Ok(())
}
