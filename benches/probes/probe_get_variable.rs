//! Instruction-count probe for `docs/benchmarks.md`: N calls of
//! `get_variable` that reuse an existing variable `w` in a variable scope of
//! five components, with the spec built per call as a layer does (the
//! `full_name/get_variable/5` case of `benches/sharing.rs`).
//!
//! `valgrind --tool=callgrind target/release/examples/probe_get_variable N`
//! at N = 0 and N = 100000; the difference divided by N is one call.

use scopetree::sharing::{Initializer, Reuse, ScopeOpts, VarSpec, VariableStore};

fn main() -> Result<(), scopetree::sharing::Error> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let path = "encoder/layer_1/attention0/attention1";
    let vs = store.variable_scope(&root, path, ScopeOpts::new(), |s, vs| {
        s.get_variable(
            vs,
            VarSpec::new("w").initializer(Initializer::constant(vec![0.0_f32; 4])),
        )?;
        Ok(vs.clone())
    })?;
    let mut found = 0_usize;
    for _ in 0..n {
        let spec = VarSpec::<Vec<f32>>::new(std::hint::black_box("w")).reuse(Reuse::Reuse);
        let got = store.get_variable(std::hint::black_box(&vs), spec)?;
        found += usize::from(std::hint::black_box(got) == std::hint::black_box(got));
    }
    println!("{found} found");
    Ok(())
}
