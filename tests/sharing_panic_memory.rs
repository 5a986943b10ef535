//! Memory after a caught panic in the sharing layer, measured with a
//! counting global allocator (this file's own; it counts the bytes of the
//! thread that allocates them, so the tests of this file can run in
//! parallel). Before the store became panic-safe, a panic inside a
//! re-entered scope left its re-entry bookkeeping behind and every later
//! scope entry grew it (10.4 MB after 100,000 entries).

#[path = "support/peak_alloc.rs"]
mod peak_alloc;

use std::panic::{AssertUnwindSafe, catch_unwind};

use scopetree::sharing::Error;
use scopetree::sharing::{Initializer, ScopeOpts, VarScope, VarSpec, VariableStore};

use peak_alloc::live;

/// Enters `outer`, and in it a default-named `layer` with one variable;
/// gives the inner scope's full name.
fn step(store: &mut VariableStore, root: &VarScope) -> Result<String, Error> {
    store.variable_scope(root, "outer", ScopeOpts::new(), |s, vs| {
        s.variable_scope_unique(vs, "layer", ScopeOpts::new(), |s, inner| {
            s.get_variable(
                inner,
                VarSpec::new("w")
                    .reuse(scopetree::sharing::Reuse::AutoReuse)
                    .initializer(Initializer::constant(0_u8)),
            )?;
            Ok(inner.name().to_owned())
        })
    })
}

/// Live bytes added by `n` more calls of `step` after a warm-up.
fn growth(store: &mut VariableStore, root: &VarScope, n: usize) -> Result<i64, Error> {
    for _ in 0..1_000 {
        step(store, root)?;
    }
    let before = live();
    for _ in 0..n {
        assert!(step(store, root)?.ends_with("outer/layer"));
    }
    Ok(live() - before)
}

#[test]
fn nothing_grows_after_a_panic_in_a_reentered_scope() -> Result<(), Error> {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let captured =
        store.variable_scope(&root, "outer", ScopeOpts::new(), |_, vs| Ok(vs.clone()))?;
    let caught = catch_unwind(AssertUnwindSafe(|| {
        let _ = store.reenter_scope(&captured, ScopeOpts::new(), |s, vs| {
            s.variable_scope_unique(vs, "layer", ScopeOpts::new(), |_, _| -> Result<(), Error> {
                panic!("injected")
            })
        });
    }));
    assert!(caught.is_err());
    // The counters are as before the panic: the first default name is free.
    assert_eq!(step(&mut store, &root)?, "outer/layer");
    let grown = growth(&mut store, &root, 100_000)?;
    assert!(
        grown < 4096,
        "{grown} bytes stayed live after 100,000 scope entries following a caught panic"
    );
    Ok(())
}

#[test]
fn nothing_grows_while_one_outer_scope_stays_open() -> Result<(), Error> {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    store.variable_scope(&root, "model", ScopeOpts::new(), |s, model| {
        let grown = growth(s, model, 100_000)?;
        assert!(
            grown < 4096,
            "{grown} bytes stayed live after 100,000 scope entries inside one open scope"
        );
        Ok(())
    })
}
