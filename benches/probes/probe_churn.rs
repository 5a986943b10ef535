//! Instruction-count probe for `docs/benchmarks.md`: N training steps, each a
//! new scope under the root, 8 variables, 4 parameter reads through handles,
//! and the scope's deletion.
//!
//! `valgrind --tool=callgrind target/release/examples/probe_churn N [str]`
//! at N = 0 and N = 20000; the difference divided by N is one step, with
//! names as `Symbol`s (default) or as `&str` (`str`).

use scopetree::ScopeTree;

fn main() -> Result<(), scopetree::Error> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let by_str = args.next().is_some();
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let mut params = Vec::new();
    for p in ["W_ih", "W_hh", "b_ih", "b_hh"] {
        let v = tree.var(root, p)?;
        tree.set(v, 0.5_f32)?;
        params.push(v);
    }
    let names = ["x", "h", "c", "i", "f", "o", "g", "loss"];
    let syms = names
        .iter()
        .map(|n| tree.intern(n))
        .collect::<Result<Vec<_>, _>>()?;
    let mut acc = 0.0_f32;
    for _ in 0..n {
        let step = tree.new_scope(root)?;
        if by_str {
            for n in names {
                std::hint::black_box(tree.var(step, n)?);
            }
        } else {
            for &s in &syms {
                std::hint::black_box(tree.var(step, s)?);
            }
        }
        for &p in &params {
            acc += *tree.get::<f32>(p)?;
        }
        tree.delete_scope(step)?;
    }
    println!("{acc}");
    Ok(())
}
