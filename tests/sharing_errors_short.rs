//! Every error of the sharing layer stays short whatever its input: with a
//! 1 MiB name or a million-deep scope path, each message is under 1 KiB
//! (names are cut to 64 characters with their length, paths shortened in
//! the middle).

use scopetree::sharing::Error;
use scopetree::sharing::{
    Initializer, Reuse, ScopeOpts, Template, VarScope, VarSpec, VariableStore,
};

const KIB: usize = 1024;

#[track_caller]
fn short(err: &Error, what: &str) {
    let msg = err.to_string();
    assert!(
        msg.len() < KIB,
        "{what}: a {} byte message: {}…",
        msg.len(),
        &msg[..msg.char_indices().nth(200).map_or(msg.len(), |(i, _)| i)]
    );
}

fn huge() -> String {
    "n".repeat(1 << 20)
}

/// A store with a million-deep chain of scopes `d/d/…`, and the variable
/// scope at its bottom.
fn deep() -> Result<(VariableStore, VarScope), Error> {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let path = vec!["d"; 1_000_000].join("/");
    let vs = store.variable_scope(&root, &path, ScopeOpts::new(), |_, vs| Ok(vs.clone()))?;
    Ok((store, vs))
}

fn f32s(n: usize) -> Initializer<Vec<f32>> {
    Initializer::constant(vec![0.0_f32; n])
}

/// Runs each sharing error case in scope `vs` with the local name `name`.
fn every_case(
    store: &mut VariableStore,
    vs: &VarScope,
    name: &str,
    what: &str,
) -> Result<(), Error> {
    let vs = vs.clone();
    let spec = || VarSpec::new(name).initializer(f32s(2));
    store.get_variable(&vs, spec())?;
    let err = store.get_variable(&vs, spec()).unwrap_err();
    assert!(matches!(err, Error::VariableExists { .. }));
    short(&err, &format!("VariableExists, {what}"));

    let mut reusing = vs.clone();
    reusing.reuse_variables();
    let missing = format!("{name}_missing");
    let err = store
        .get_variable(&reusing, VarSpec::<Vec<f32>>::new(&missing))
        .unwrap_err();
    assert!(matches!(err, Error::VariableMissing { .. }));
    short(&err, &format!("VariableMissing, {what}"));

    let err = store
        .get_variable(&reusing, VarSpec::<Vec<f32>>::new(name).shape([3]))
        .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }));
    short(&err, &format!("ShapeMismatch, {what}"));

    let err = store
        .get_variable(&reusing, VarSpec::<u8>::new(name))
        .unwrap_err();
    assert!(matches!(err, Error::ShareTypeMismatch { .. }));
    short(&err, &format!("ShareTypeMismatch, {what}"));

    let fresh = format!("{name}_fresh");
    let err = store
        .get_variable(
            &vs,
            VarSpec::new(&fresh)
                .shape([3])
                .initializer(Initializer::with_shape(|_: &[usize]| vec![0.0_f32; 2])),
        )
        .unwrap_err();
    assert!(matches!(err, Error::InitShapeMismatch { .. }));
    short(&err, &format!("InitShapeMismatch, {what}"));

    let err = store
        .get_variable(&vs, VarSpec::<Vec<f32>>::new(&fresh))
        .unwrap_err();
    assert!(matches!(err, Error::InitializerRequired { .. }));
    short(&err, &format!("InitializerRequired, {what}"));

    let err = store
        .get_variable(&vs, VarSpec::new(&fresh).shape([2]).initializer(f32s(2)))
        .unwrap_err();
    assert!(matches!(err, Error::ConstantWithShape { .. }));
    short(&err, &format!("ConstantWithShape, {what}"));

    let err = store
        .get_variable(
            &vs,
            VarSpec::new(&fresh)
                .initializer(Initializer::with_shape(|_: &[usize]| vec![0.0_f32; 2])),
        )
        .unwrap_err();
    assert!(matches!(err, Error::ShapeRequired { .. }));
    short(&err, &format!("ShapeRequired, {what}"));

    let err = store
        .variable_scope_unique(&vs, name, Reuse::Reuse, |_, _| Ok(()))
        .unwrap_err();
    assert!(matches!(err, Error::ReuseWithoutName { .. }));
    short(&err, &format!("ReuseWithoutName, {what}"));

    // A template that creates a new trainable variable with a long name on
    // every call, many of them.
    let mut calls = 0_usize;
    let mut t = Template::new(name, |s: &mut VariableStore, vs: &mut VarScope, (): ()| {
        calls += 1;
        for k in 0..5 {
            s.get_variable(
                vs,
                VarSpec::new(format!("{name}_{calls}_{k}"))
                    .reuse(Reuse::AutoReuse)
                    .initializer(f32s(1)),
            )?;
        }
        Ok(())
    })?;
    t.call(store, &vs, ())?;
    let err = t.call(store, &vs, ()).unwrap_err();
    assert!(matches!(err, Error::TemplateCreatedVariable { .. }));
    short(&err, &format!("TemplateCreatedVariable, {what}"));

    let place = t
        .variable_scope()
        .map(VarScope::place)
        .ok_or(scopetree::Error::RootScope)?;
    store.delete_scope(place)?;
    let err = t.call(store, &vs, ()).unwrap_err();
    assert!(matches!(err, Error::StaleTemplate { .. }));
    short(&err, &format!("StaleTemplate, {what}"));
    Ok(())
}

#[test]
fn every_sharing_error_is_short_with_a_huge_name() -> Result<(), Error> {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let name = huge();
    every_case(&mut store, &root, &name, "1 MiB name")?;
    let inner = store.variable_scope(&root, &name, ScopeOpts::new(), |_, vs| Ok(vs.clone()))?;
    every_case(&mut store, &inner, "w", "1 MiB scope name")
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only (a million scopes): run with cargo test --release"
)]
fn every_sharing_error_is_short_in_a_million_deep_scope() -> Result<(), Error> {
    let (mut store, vs) = deep()?;
    every_case(&mut store, &vs, "w", "million-deep scope")
}
