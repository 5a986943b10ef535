//! Quickstart: a model scope with parameters, step scopes that read them
//! through handles resolved once, and what happens to handles after a step.
//!
//! Run with `cargo run --release --example quickstart`.

use scopetree::{Error, ScopeTree};

fn main() -> Result<(), Error> {
    let mut tree = ScopeTree::new();
    let model = tree.new_named_scope(tree.root(), "model")?;

    // Parameters live in the model scope.
    let w = tree.create_var(model, "W")?;
    let b = tree.create_var(model, "b")?;
    tree.set(w, vec![0.5_f32, -0.25, 1.0])?;
    tree.set(b, 0.1_f32)?;

    // Resolve the names once; the loop below uses only handles.
    let x_name = tree.intern("x")?;
    let y_name = tree.intern("y")?;
    let mut stale_handles = Vec::new();

    for step in 0..3 {
        let scope = tree.new_scope(model)?;
        let x = tree.var(scope, x_name)?;
        let y = tree.var(scope, y_name)?;
        tree.set(x, vec![step as f32, 1.0, 2.0])?;

        // A lookup from the step scope falls back to the model scope.
        assert_eq!(tree.find_var(scope, "W")?, Some(w));

        let dot: f32 = tree
            .get::<Vec<f32>>(w)?
            .iter()
            .zip(tree.get::<Vec<f32>>(x)?)
            .map(|(a, b)| a * b)
            .sum();
        let out = dot + *tree.get::<f32>(b)?;
        tree.set(y, out)?;
        println!("step {step}: y = {out:.3}");

        if step == 2 {
            println!("\ntree during the last step:\n{}", tree.dump(tree.root())?);
        }
        tree.delete_scope(scope)?;
        stale_handles.push(y);
    }

    // Every handle into a deleted step scope reports stale, even though the
    // arena slots were reused by later steps.
    for y in stale_handles {
        match tree.get::<f32>(y) {
            Err(Error::StaleVar { .. }) => {}
            other => panic!("expected a stale handle, got {other:?}"),
        }
    }
    println!(
        "after the loop: {} scopes, {} variables; old step handles are stale",
        tree.scope_count(),
        tree.var_count()
    );

    // Reading with the wrong type names both types.
    let err = tree.get::<f64>(b).unwrap_err();
    println!("wrong-type read: {err}");
    Ok(())
}
