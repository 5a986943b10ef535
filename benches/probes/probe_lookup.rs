//! Instruction-count probe for `docs/benchmarks.md`: `find_var` from depth 64
//! to a name only the root holds (4 variables per level), N times.
//!
//! `valgrind --tool=callgrind target/release/examples/probe_lookup N [str]`
//! at N = 0 and N = 100000; the difference divided by N is the cost of one
//! lookup, by `Symbol` (default) or by `&str` (`str`). Instruction counts do
//! not depend on what else the machine runs.

use scopetree::ScopeTree;

fn main() -> Result<(), scopetree::Error> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let by_str = args.next().is_some();
    let mut tree = ScopeTree::new();
    let mut s = tree.root();
    for level in 0..=64 {
        for j in 0..4 {
            tree.var(s, format!("v{level}_{j}").as_str())?;
        }
        if level < 64 {
            s = tree.new_scope(s)?;
        }
    }
    let sym = tree.intern("v0_0")?;
    let mut hits = 0_usize;
    for _ in 0..n {
        let found = if by_str {
            tree.find_var(std::hint::black_box(s), std::hint::black_box("v0_0"))?
        } else {
            tree.find_var(std::hint::black_box(s), std::hint::black_box(sym))?
        };
        hits += usize::from(found.is_some());
    }
    println!("{hits} hits");
    Ok(())
}
