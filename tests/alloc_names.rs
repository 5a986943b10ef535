//! Bounded names (issue 9 item 2): a tree that makes temporary names and
//! drops them again must not keep them. Live heap bytes are counted by a
//! global allocator of this file's own, per thread, so the tests of this file
//! can run in parallel. Each test churns one tree 10^6 times and compares its
//! live heap after 10^4 and after 10^6 cycles: it must stay within 1.1x.
//!
//! Release mode only (10^6 cycles): `cargo test --release --test alloc_names
//! -- --nocapture` prints the figures.
//!
//! The allocator is `unsafe` because `GlobalAlloc` is an unsafe trait; it
//! forwards every call to `System` unchanged and only counts.

#[path = "support/peak_alloc.rs"]
mod peak_alloc;

use std::fmt::Write;

use scopetree::{ScopeId, ScopeTree};

use peak_alloc::live;

/// Cycles counted before the first figure.
const EARLY: usize = 10_000;
/// Cycles counted before the second figure.
const LATE: usize = 1_000_000;
/// The most the live heap may grow from the first figure to the second.
const MAX_GROWTH: f64 = 1.1;

/// Runs `cycle(tree, i)` for `i` in `0..LATE` on a tree made by `setup`, and
/// checks that the bytes the tree holds (counted by the allocator, and as
/// `heap_bytes` reports them) after `LATE` cycles are within
/// [`MAX_GROWTH`] of those after `EARLY` cycles.
fn check_bounded(
    what: &str,
    setup: impl FnOnce(&mut ScopeTree) -> ScopeId,
    mut cycle: impl FnMut(&mut ScopeTree, ScopeId, usize),
) {
    let base = live();
    let mut tree = ScopeTree::new();
    let scope = setup(&mut tree);
    for i in 0..EARLY {
        cycle(&mut tree, scope, i);
    }
    let (early, early_reported) = (live() - base, tree.heap_bytes());
    for i in EARLY..LATE {
        cycle(&mut tree, scope, i);
    }
    let (late, late_reported) = (live() - base, tree.heap_bytes());
    let (vars, scopes) = (tree.var_count(), tree.scope_count());
    drop(tree);
    let leftover = live() - base;
    eprintln!(
        "{what}: live heap {early} B after {EARLY} cycles, {late} B after {LATE} \
         ({:.2}x); heap_bytes() {early_reported} B, then {late_reported} B ({:.2}x); \
         {leftover} B left after dropping the tree",
        late as f64 / early as f64,
        late_reported as f64 / early_reported as f64,
    );
    // The cycles leave the tree as they found it.
    assert_eq!(
        (vars, scopes),
        (1, 2),
        "{what}: the cycles must not keep anything"
    );
    assert!(
        late as f64 <= MAX_GROWTH * early as f64,
        "{what}: the tree holds {late} live heap bytes after {LATE} cycles against {early} \
         after {EARLY}: {:.1}x, more than {MAX_GROWTH}x. Names no scope or variable uses \
         any more must be freed (issue 9 item 2).",
        late as f64 / early as f64
    );
    assert!(
        late_reported as f64 <= MAX_GROWTH * early_reported as f64,
        "{what}: heap_bytes() is {late_reported} after {LATE} cycles against \
         {early_reported} after {EARLY}: {:.1}x, more than {MAX_GROWTH}x (issue 9 item 2)",
        late_reported as f64 / early_reported as f64
    );
    assert_eq!(
        leftover, 0,
        "{what}: dropping the tree must free everything"
    );
}

/// A scope named `step` under the root, holding one long-lived variable `h`.
fn step_scope(tree: &mut ScopeTree) -> ScopeId {
    let step = tree.new_named_scope(tree.root(), "step").unwrap();
    tree.var(step, "h").unwrap();
    step
}

/// A training loop's temporaries: a fresh unique name each cycle, freed at
/// once.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "10^6 cycles: run with cargo test --release"
)]
fn unique_var_then_remove_var_keeps_no_names() {
    check_bounded("unique_var + remove_var", step_scope, |tree, step, _| {
        let v = tree.unique_var(step, "tmp").unwrap();
        tree.set(v, 1.0_f32).unwrap();
        tree.remove_var(v).unwrap();
    });
}

/// A scope per cycle under a name never used before, deleted at once.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "10^6 cycles: run with cargo test --release"
)]
fn named_scope_with_unique_name_then_delete_keeps_no_names() {
    // Allocated before the count starts, and long enough for every name.
    let mut name = String::with_capacity(32);
    check_bounded(
        "new_named_scope(unique name) + delete_scope",
        step_scope,
        |tree, step, i| {
            name.clear();
            write!(name, "block_{i}").unwrap();
            let s = tree.new_named_scope(step, &name).unwrap();
            tree.var(s, "w").unwrap();
            tree.delete_scope(s).unwrap();
        },
    );
}

/// Variables made by name (not by `unique_var`) under names never used
/// before, erased at once.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "10^6 cycles: run with cargo test --release"
)]
fn var_with_fresh_name_then_erase_keeps_no_names() {
    // Allocated before the count starts, and long enough for every name.
    let mut name = String::with_capacity(32);
    check_bounded(
        "var(fresh name) + erase_vars",
        step_scope,
        |tree, step, i| {
            name.clear();
            write!(name, "grad_{i}").unwrap();
            tree.var(step, &name).unwrap();
            assert_eq!(tree.erase_vars(step, [&name]).unwrap(), 1);
        },
    );
}
