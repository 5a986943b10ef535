//! Memory at scale, measured with a counting global allocator (hence a test
//! file of its own): 1,000,000 variables in 100,000 scopes, and a
//! 1,000,000-deep chain, built, dumped to a count and torn down. Release mode
//! only (`cargo test --release --tests`).
//!
//! The counts are per thread (a `const` thread-local, which needs no
//! allocation and no destructor), so tests running in parallel and the test
//! harness do not disturb each other's figures.

#[path = "support/peak_alloc.rs"]
mod peak_alloc;

use std::fmt::{self, Write};

use scopetree::ScopeTree;

use peak_alloc::{live, peak, reset_peak};

/// Counts lines written, without keeping them.
#[derive(Default)]
struct Lines(usize);

impl Write for Lines {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0 += s.bytes().filter(|&b| b == b'\n').count();
        Ok(())
    }
}

const BLOCKS: usize = 1_000;
const PER_BLOCK: usize = 99;
const VARS_PER_SCOPE: usize = 10;
const SCOPES: usize = 1 + BLOCKS + BLOCKS * PER_BLOCK; // 100,001
const VARS: usize = (SCOPES - 1) * VARS_PER_SCOPE; // 1,000,000

/// Builds 1,000 named blocks under the root, each with 99 unnamed kids; ten
/// variables in every scope below the root, each holding a value (a `u64`,
/// or a `Vec<f32>` of 8 for every tenth, so payloads are freed too).
fn build(tree: &mut ScopeTree, names: &[String]) {
    let root = tree.root();
    for b in 0..BLOCKS {
        let block = tree
            .new_named_scope(root, format!("block{b}").as_str())
            .unwrap();
        let mut scopes = vec![block];
        for _ in 0..PER_BLOCK {
            scopes.push(tree.new_scope(block).unwrap());
        }
        for (j, s) in scopes.into_iter().enumerate() {
            for (k, n) in names.iter().enumerate() {
                let v = tree.var(s, n).unwrap();
                if k == 0 {
                    tree.set(v, vec![j as f32; 8]).unwrap();
                } else {
                    tree.set(v, (b * 1000 + j) as u64).unwrap();
                }
            }
        }
    }
}

/// One build, a dump to a line count, a spot check, and teardown.
fn cycle(tree: &mut ScopeTree, names: &[String]) -> (i64, i64) {
    let before = live();
    reset_peak();
    build(tree, names);
    let built = live() - before;
    assert_eq!(tree.scope_count(), SCOPES);
    assert_eq!(tree.var_count(), VARS);
    let mut lines = Lines::default();
    write!(lines, "{}", tree.dump(tree.root()).unwrap()).unwrap();
    assert_eq!(lines.0, SCOPES + VARS);
    let root = tree.root();
    let last = tree.kid(root, "block999").unwrap().unwrap();
    let deep = tree.kids(last).unwrap().last().unwrap();
    let v = tree.find_var(deep, "v3").unwrap().unwrap();
    assert_eq!(*tree.get::<u64>(v).unwrap(), 999_099);
    assert_eq!(tree.find_var(deep, "v0").map(|o| o.is_some()), Ok(true));
    tree.drop_kids(root).unwrap();
    assert_eq!((tree.scope_count(), tree.var_count()), (1, 0));
    assert!(!tree.contains_var(v) && !tree.contains_scope(deep));
    (built, peak() - before)
}

/// 1,000,000 variables in 100,000 scopes, built and torn down twice: the
/// second cycle allocates no more than the first left behind (slots, spare
/// tables and interned names are reused), and dropping the tree returns the
/// allocator's count for this thread exactly to where it started.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only: run with cargo test --release"
)]
fn million_variables_memory_returns() {
    let names: Vec<String> = (0..VARS_PER_SCOPE).map(|i| format!("v{i}")).collect();
    let start = live();
    let mut tree = ScopeTree::new();

    let (built, peak1) = cycle(&mut tree, &names);
    let after_first = live();
    let heap = tree.heap_bytes();
    let (_, peak2) = cycle(&mut tree, &names);
    let after_second = live();
    assert_eq!(
        after_second,
        after_first,
        "a second build and teardown left {} more bytes",
        after_second - after_first
    );
    assert!(
        peak2 <= peak1,
        "second cycle peaked higher: {peak2} > {peak1}"
    );

    drop(tree);
    let end = live();
    assert_eq!(
        end,
        start,
        "{} bytes not returned after dropping the tree",
        end - start
    );

    // Boxed payloads: a Vec<f32> header (24 B) plus 8 floats, or a u64.
    let payload = (VARS / VARS_PER_SCOPE) * (24 + 8 * 4) + (VARS - VARS / VARS_PER_SCOPE) * 8;
    eprintln!(
        "1M vars / 100k scopes: {built} bytes live when built ({:.1} B per variable, \
         {payload} of it value payload); peak {peak1}; {} bytes kept after teardown \
         (heap_bytes says {heap}); all returned on drop; slots {} B (scope), {} B (variable)",
        built as f64 / VARS as f64,
        after_first - start,
        scopetree::diagnostics::scope_slot_bytes(),
        scopetree::diagnostics::var_slot_bytes(),
    );
}

/// A 1,000,000-deep chain: built, searched from the bottom, dumped to a count
/// and deleted; memory returns on drop.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only: run with cargo test --release"
)]
fn million_deep_chain_memory_returns() {
    const DEPTH: usize = 1_000_000;
    let start = live();
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "W").unwrap();
    tree.set(w, 1.0_f64).unwrap();
    let mut s = root;
    for _ in 0..DEPTH {
        s = tree.new_scope(s).unwrap();
        tree.var(s, "h").unwrap();
    }
    let built = live() - start;
    assert_eq!(tree.find_var(s, "W").unwrap(), Some(w));
    let mut lines = Lines::default();
    write!(lines, "{}", tree.dump(root).unwrap()).unwrap();
    assert_eq!(lines.0, 2 * DEPTH + 2);
    let top = tree.kids(root).unwrap().next().unwrap();
    tree.delete_scope(top).unwrap();
    assert_eq!((tree.scope_count(), tree.var_count()), (1, 1));
    assert!(!tree.contains_scope(s));
    drop(tree);
    let end = live();
    assert_eq!(end, start, "{} bytes not returned", end - start);
    eprintln!(
        "million-deep chain with a variable per level: {built} bytes ({:.1} B per level)",
        built as f64 / DEPTH as f64
    );
}
