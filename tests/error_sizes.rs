//! Every error of the tree, step and worker layers stays under 1 KiB when
//! shown, however long the names and however deep the scopes it names
//! (issue 9: a 1 MiB name and a million-deep path).

use std::fmt::Display;

use scopetree::{Error, ScopeId, ScopeTree, StepError, StepScopes, WorkerError};

const MIB: usize = 1 << 20;
/// A million levels in release (CI runs `cargo test --release --tests`); a
/// tenth of that in debug builds, where building the chain takes seconds.
const DEPTH: usize = if cfg!(debug_assertions) {
    100_000
} else {
    1_000_000
};
const LIMIT: usize = 1024;

/// A tree with a chain `deep` levels deep of named scopes, and a second
/// chain of unnamed scopes.
fn deep_tree(deep: usize) -> (ScopeTree, ScopeId, ScopeId) {
    let mut tree = ScopeTree::with_capacity(2 * deep + 2, 16);
    let mut named = tree.root();
    for _ in 0..deep {
        named = tree.new_named_scope(named, "layer").unwrap();
    }
    let mut unnamed = tree.root();
    for _ in 0..deep {
        unnamed = tree.new_scope(unnamed).unwrap();
    }
    (tree, named, unnamed)
}

#[track_caller]
fn short(what: &str, err: &impl Display) {
    let n = err.to_string().len();
    assert!(n < LIMIT, "{what}: {n} bytes: {}", &err.to_string()[..300]);
}

#[test]
fn every_error_is_short_whatever_the_name_and_the_depth() {
    let (mut tree, deep, deep_unnamed) = deep_tree(DEPTH);
    let long = "n".repeat(MIB);
    let long_bad = format!("{long}/x");

    // Names and paths.
    short(
        "InvalidName",
        &tree.var(deep, long_bad.as_str()).unwrap_err(),
    );
    short("NotFound", &tree.get_var(deep, long.as_str()).unwrap_err());
    short(
        "NotFound (unnamed chain)",
        &tree.get_var(deep_unnamed, long.as_str()).unwrap_err(),
    );
    let v = tree.create_var(deep, long.as_str()).unwrap();
    short(
        "NameTaken",
        &tree.create_var(deep, long.as_str()).unwrap_err(),
    );
    tree.new_named_scope(deep, long.as_str()).unwrap();
    short(
        "ScopeNameTaken",
        &tree.new_named_scope(deep, long.as_str()).unwrap_err(),
    );
    let other = tree.create_var(deep, "other").unwrap();
    short(
        "NameTaken (rename)",
        &tree.rename(deep, "other", long.as_str()).unwrap_err(),
    );
    short(
        "NotFound (rename)",
        &tree
            .rename(deep, "m".repeat(MIB).as_str(), "z")
            .unwrap_err(),
    );

    // Values.
    short("Uninitialized", &tree.get::<f32>(v).unwrap_err());
    tree.set(v, 1_u8).unwrap();
    short("TypeMismatch", &tree.get::<f32>(v).unwrap_err());
    tree.set(other, 2_u8).unwrap();
    short(
        "AliasedVar",
        &tree.get_disjoint_mut::<u8, 2>([v, v]).unwrap_err(),
    );

    // Structure and handles.
    let root = tree.root();
    short("NotAKid", &tree.delete_kid(deep_unnamed, deep).unwrap_err());
    short("RootScope", &tree.delete_scope(root).unwrap_err());
    let gone = tree.new_scope(deep).unwrap();
    tree.delete_scope(gone).unwrap();
    short("StaleScope", &tree.parent(gone).unwrap_err());
    let foreign = ScopeTree::new();
    short("ForeignScope", &foreign.parent(deep).unwrap_err());
    short("ForeignVar", &foreign.get::<u8>(v).unwrap_err());
    let sym = tree.intern("s").unwrap();
    short("ForeignSymbol", &foreign.resolve(sym).unwrap_err());

    // Step scopes under the deep scope.
    let mut steps = StepScopes::new(&tree, deep).unwrap();
    let h = steps.declare(&mut tree, long.as_str()).unwrap();
    let e = steps.var(h, 0).unwrap_err();
    assert!(matches!(e, StepError::NoSuchStep { .. }));
    short("NoSuchStep", &e);
    let mut others = StepScopes::new(&tree, deep).unwrap();
    others.push(&mut tree).unwrap();
    let e = others.var(h, 0).unwrap_err();
    assert!(matches!(e, StepError::ForeignStepVar { .. }));
    short("ForeignStepVar", &e);

    // Workers: a shared variable with a long name in a deep scope.
    let w0 = tree.new_scope(deep).unwrap();
    let w1 = tree.new_scope(deep).unwrap();
    let own = tree.var(w1, long.as_str()).unwrap();
    tree.set(own, 3_u8).unwrap();
    let e = tree.split_workers(&[w0, w0]).unwrap_err();
    assert!(matches!(e, WorkerError::OverlappingWorkers { .. }));
    short("OverlappingWorkers", &e);
    let mut ws = tree.split_workers(&[w0, w1]).unwrap();
    let e = ws[0].set(v, 0_u8).unwrap_err();
    assert!(matches!(e, WorkerError::WorkerAccess { .. }));
    short("WorkerAccess (read-only)", &e);
    short(
        "WorkerAccess (other worker)",
        &ws[0].get::<u8>(own).unwrap_err(),
    );
    short("TypeMismatch (worker)", &ws[1].get::<f32>(own).unwrap_err());
    drop(ws);

    // A symbol of a name that was freed.
    let (mut small, ..) = deep_tree(0);
    let r = small.root();
    let x = small.var(r, "gone_soon").unwrap();
    let stale = small.symbol("gone_soon").unwrap();
    small.remove_var(x).unwrap();
    for i in 0..5000 {
        let t = small.var(r, format!("t{i}").as_str()).unwrap();
        small.remove_var(t).unwrap();
    }
    let e = small.resolve(stale).unwrap_err();
    assert!(matches!(e, Error::StaleSymbol { .. }), "{e:?}");
    short("StaleSymbol", &e);
}
