//! Instruction-count probe for `docs/benchmarks.md`: N reads of an `f32`
//! through a `VarId`.
//!
//! `valgrind --tool=callgrind target/release/examples/probe_get N` at N = 0
//! and N = 100000; the difference divided by N is one read (and the loop).

use scopetree::ScopeTree;

fn main() -> Result<(), scopetree::Error> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let mut tree = ScopeTree::new();
    let v = tree.var(tree.root(), "w")?;
    tree.set(v, 0.5_f32)?;
    let mut acc = 0.0_f32;
    for _ in 0..n {
        acc += *tree.get::<f32>(std::hint::black_box(v))?;
    }
    println!("{acc}");
    Ok(())
}
