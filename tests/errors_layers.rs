//! Every error variant of the layers above the core (the sharing layer, step
//! scopes, the worker split) is reached by a test here, and its message names
//! the variable, the scope path (`<root>` for the root) and what to do.

use std::num::NonZeroUsize;

use scopetree::sharing::{
    self, Initializer, Reuse, ScopeOpts, Template, VarScope, VarSpec, VariableStore,
};
use scopetree::{Error, ScopeTree, StepError, StepScopes, WorkerAccessReason, WorkerError};

/// Asserts that `msg` contains every one of `parts`.
#[track_caller]
fn says(err: &impl std::fmt::Display, parts: &[&str]) {
    let msg = err.to_string();
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
    }
}

fn f32s(n: usize) -> Initializer<Vec<f32>> {
    Initializer::constant(vec![0.0_f32; n])
}

/// A store with `enc/layer/w`, a `Vec<f32>` of shape [2].
fn store_with_w() -> Result<(VariableStore, VarScope), sharing::Error> {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    store.variable_scope(&root, "enc/layer", ScopeOpts::new(), |s, vs| {
        s.get_variable(vs, VarSpec::new("w").initializer(f32s(2)))
    })?;
    Ok((store, root))
}

#[test]
fn variable_exists_names_the_variable_scope_and_the_reuse_modes() -> Result<(), sharing::Error> {
    let (mut store, root) = store_with_w()?;
    let err = store
        .variable_scope(&root, "enc/layer", ScopeOpts::new(), |s, vs| {
            s.get_variable(vs, VarSpec::new("w").initializer(f32s(2)))
        })
        .unwrap_err();
    assert!(
        matches!(&err, sharing::Error::VariableExists { name, scope } if name == "w" && scope == "enc/layer")
    );
    says(
        &err,
        &["`w`", "`enc/layer`", "Reuse::Reuse", "Reuse::AutoReuse"],
    );
    // A name with `/` under the root: the scope part is the full scope name.
    let err = store
        .get_variable(&root, VarSpec::new("enc/layer/w").initializer(f32s(2)))
        .unwrap_err();
    says(&err, &["`w`", "`enc/layer`"]);
    // At the root the path is shown as `<root>`.
    store.get_variable(&root, VarSpec::new("top").initializer(f32s(1)))?;
    let err = store
        .get_variable(&root, VarSpec::new("top").initializer(f32s(1)))
        .unwrap_err();
    assert!(matches!(&err, sharing::Error::VariableExists { scope, .. } if scope.is_empty()));
    says(&err, &["`top`", "`<root>`"]);
    Ok(())
}

#[test]
fn variable_missing_names_the_variable_scope_and_auto_reuse() -> Result<(), sharing::Error> {
    let (mut store, root) = store_with_w()?;
    let err = store
        .variable_scope(&root, "enc/layer", Reuse::Reuse, |s, vs| {
            s.get_variable::<Vec<f32>>(vs, VarSpec::new("b"))
        })
        .unwrap_err();
    assert!(
        matches!(&err, sharing::Error::VariableMissing { name, scope } if name == "b" && scope == "enc/layer")
    );
    says(
        &err,
        &["`b`", "`enc/layer`", "Reuse::AutoReuse", "create it first"],
    );
    // Reuse per call, at the root.
    let err = store
        .get_variable::<f32>(&root, VarSpec::new("nope").reuse(Reuse::Reuse))
        .unwrap_err();
    says(&err, &["`nope`", "`<root>`"]);
    Ok(())
}

#[test]
fn shape_mismatch_names_both_shapes() -> Result<(), sharing::Error> {
    let (mut store, root) = store_with_w()?;
    let err = store
        .variable_scope(&root, "enc/layer", Reuse::Reuse, |s, vs| {
            s.get_variable::<Vec<f32>>(vs, VarSpec::new("w").shape([3]))
        })
        .unwrap_err();
    assert!(
        matches!(&err, sharing::Error::ShapeMismatch { expected, found, .. } if expected == "[3]" && found == "[2]")
    );
    says(
        &err,
        &["`w`", "`enc/layer`", "[3]", "[2]", "compatible shape"],
    );
    // A rank mismatch is a shape mismatch too.
    let err = store
        .variable_scope(&root, "enc/layer", Reuse::AutoReuse, |s, vs| {
            s.get_variable::<Vec<f32>>(vs, VarSpec::new("w").shape([2, 1]))
        })
        .unwrap_err();
    says(&err, &["[2, 1]", "[2]"]);
    Ok(())
}

#[test]
fn share_type_mismatch_names_both_types() -> Result<(), sharing::Error> {
    let (mut store, root) = store_with_w()?;
    let err = store
        .variable_scope(&root, "enc/layer", Reuse::Reuse, |s, vs| {
            s.get_variable::<Vec<u8>>(vs, VarSpec::new("w"))
        })
        .unwrap_err();
    assert!(matches!(&err, sharing::Error::ShareTypeMismatch { name, .. } if name == "w"));
    says(
        &err,
        &["`w`", "`enc/layer`", "Vec<u8>", "Vec<f32>", "held type"],
    );
    Ok(())
}

#[test]
fn init_shape_mismatch_names_the_made_and_the_asked_shape() {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let err = store
        .variable_scope(&root, "dense", ScopeOpts::new(), |s, vs| {
            s.get_variable(
                vs,
                VarSpec::new("k")
                    .shape([4])
                    .initializer(Initializer::from_fn(|| vec![0.0_f32; 3])),
            )
        })
        .unwrap_err();
    assert!(
        matches!(&err, sharing::Error::InitShapeMismatch { expected, found, .. } if expected == "[4]" && found == "[3]")
    );
    says(
        &err,
        &["`k`", "`dense`", "[3]", "[4]", "fix the initializer"],
    );
    // Nothing was created.
    assert_eq!(store.variable("dense/k"), Ok(None));
}

#[test]
fn initializer_required_names_the_type_and_both_places_to_give_one() {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let err = store
        .variable_scope(&root, "a/b", ScopeOpts::new(), |s, vs| {
            s.get_variable::<Vec<f64>>(vs, VarSpec::new("w"))
        })
        .unwrap_err();
    assert!(
        matches!(&err, sharing::Error::InitializerRequired { name, scope, .. } if name == "w" && scope == "a/b")
    );
    says(
        &err,
        &[
            "`w`",
            "`a/b`",
            "Vec<f64>",
            "VarSpec::initializer",
            "ScopeOpts::initializer",
        ],
    );
    // AutoReuse creates too, so it needs one as well.
    let err = store
        .get_variable::<u8>(&root, VarSpec::new("x").reuse(Reuse::AutoReuse))
        .unwrap_err();
    says(&err, &["`x`", "`<root>`", "u8"]);
}

#[test]
fn constant_with_shape_says_a_constant_brings_its_shape() {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let err = store
        .variable_scope(&root, "c", ScopeOpts::new(), |s, vs| {
            s.get_variable(vs, VarSpec::new("v").shape([2]).initializer(f32s(2)))
        })
        .unwrap_err();
    assert!(
        matches!(&err, sharing::Error::ConstantWithShape { name, scope } if name == "v" && scope == "c")
    );
    says(
        &err,
        &[
            "`v`",
            "`c`",
            "do not specify one",
            "Initializer::with_shape",
        ],
    );
}

#[test]
fn shape_required_shows_the_shape_given_or_unknown() {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let zeros = || Initializer::with_shape(|s: &[usize]| vec![0.0_f32; s.iter().product()]);
    let err = store
        .get_variable(&root, VarSpec::new("z").initializer(zeros()))
        .unwrap_err();
    assert!(matches!(&err, sharing::Error::ShapeRequired { shape, .. } if shape == "unknown"));
    says(
        &err,
        &[
            "`z`",
            "`<root>`",
            "unknown",
            "fully defined shape",
            "Initializer::from_fn",
        ],
    );
    let err = store
        .variable_scope(&root, "p", ScopeOpts::new(), |s, vs| {
            s.get_variable(
                vs,
                VarSpec::new("z")
                    .shape(scopetree::sharing::Shape::from_dims([Some(2), None]))
                    .initializer(zeros()),
            )
        })
        .unwrap_err();
    says(&err, &["`z`", "`p`", "[2, ?]"]);
}

#[test]
fn reuse_without_name_names_the_default_name_and_the_mode() {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    for reuse in [Reuse::Reuse, Reuse::AutoReuse] {
        let err = store
            .variable_scope(&root, "outer", ScopeOpts::new(), |s, vs| {
                s.variable_scope_unique(vs, "layer", reuse, |_, _| Ok(()))
            })
            .unwrap_err();
        assert!(
            matches!(&err, sharing::Error::ReuseWithoutName { default_name, scope, reuse: r }
            if default_name == "layer" && scope == "outer" && *r == reuse)
        );
        says(
            &err,
            &[
                "`layer`",
                "`outer`",
                &format!("{reuse:?}"),
                "enter it by name",
            ],
        );
    }
    // Under the root; and an inherited Reuse is fine (only the asked mode counts).
    let err = store
        .variable_scope_unique(&root, "l", Reuse::Reuse, |_, _| Ok(()))
        .unwrap_err();
    says(&err, &["`l`", "`<root>`"]);
    let mut reusing = root.clone();
    reusing.reuse_variables();
    assert_eq!(
        store.variable_scope_unique(&reusing, "l", ScopeOpts::new(), |_, vs| Ok(vs.reuse())),
        Ok(Reuse::Reuse)
    );
}

#[test]
fn template_created_variable_lists_the_new_full_names() -> Result<(), sharing::Error> {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let mut calls = 0;
    let mut t = Template::new(
        "grow",
        |s: &mut VariableStore, vs: &mut VarScope, (): ()| {
            calls += 1;
            // Under the template's `Reuse`, only a call-level `AutoReuse` can create.
            let spec = VarSpec::new(format!("w{calls}")).reuse(Reuse::AutoReuse);
            s.get_variable(vs, spec.initializer(f32s(1)))
        },
    )?;
    store.variable_scope(&root, "net", ScopeOpts::new(), |s, vs| t.call(s, vs, ()))?;
    let err = t.call(&mut store, &root, ()).unwrap_err();
    assert!(
        matches!(&err, sharing::Error::TemplateCreatedVariable { template, scope, names }
        if template == "grow" && scope == "net/grow" && names == &["net/grow/w2".to_owned()])
    );
    says(
        &err,
        &[
            "`grow`",
            "`net/grow`",
            "net/grow/w2",
            "first call",
            "non-trainable",
        ],
    );
    // The variable stays in the store, as documented.
    assert!(store.variable("net/grow/w2")?.is_some());
    Ok(())
}

#[test]
fn stale_template_says_to_make_a_new_one() -> Result<(), sharing::Error> {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let mut t = Template::new(
        "dense",
        |s: &mut VariableStore, vs: &mut VarScope, (): ()| {
            s.get_variable(vs, VarSpec::new("w").initializer(f32s(1)))
        },
    )?;
    t.call(&mut store, &root, ())?;
    let place = t
        .variable_scope()
        .map(VarScope::place)
        .unwrap_or(root.place());
    store.delete_scope(place)?;
    for err in [
        t.call(&mut store, &root, ()).unwrap_err(),
        t.global_variables(&store).unwrap_err(),
        t.variables(&store).unwrap_err(),
        t.non_trainable_variables(&store).unwrap_err(),
    ] {
        assert!(
            matches!(&err, sharing::Error::StaleTemplate { template, scope } if template == "dense" && *scope == place)
        );
        says(&err, &["`dense`", "deleted", "make a new template"]);
    }
    Ok(())
}

#[test]
fn tree_errors_of_sharing_calls_are_wrapped_and_keep_the_tree_message() -> Result<(), sharing::Error>
{
    let (mut store, root) = store_with_w()?;
    // A tree error raised by the sharing layer itself.
    let err = store.variable("enc//w").unwrap_err();
    let sharing::Error::Tree(inner) = &err else {
        panic!("not a tree error: {err:?}");
    };
    assert!(matches!(inner, Error::InvalidName { .. }));
    assert_eq!(err.to_string(), inner.to_string());
    // A tree error raised in a scope body converts with `?` and comes back
    // unchanged.
    let w = store.variable("enc/layer/w")?.ok_or(Error::RootScope)?;
    let err = store
        .variable_scope(&root, "enc", ScopeOpts::new(), |s, _| {
            s.tree().get::<u8>(w)?;
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(&err, sharing::Error::Tree(Error::TypeMismatch { name, scope, .. }) if name == "w" && scope == "enc/layer")
    );
    says(&err, &["`w`", "`enc/layer`", "Vec<f32>", "u8"]);
    Ok(())
}

/// `<root>` with `W`, and two workers `w0`, `w1` with a variable each.
fn split_fixture() -> Result<(ScopeTree, [scopetree::VarId; 3], [scopetree::ScopeId; 2]), Error> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "W")?;
    tree.set(w, 1.0_f32)?;
    let a = tree.new_named_scope(root, "w0")?;
    let b = tree.new_named_scope(root, "w1")?;
    let inner = tree.new_named_scope(a, "step")?;
    let xa = tree.var(inner, "h")?;
    let xb = tree.var(b, "g")?;
    tree.set(xa, 2.0_f32)?;
    tree.set(xb, 3.0_f32)?;
    Ok((tree, [w, xa, xb], [a, b]))
}

#[test]
fn worker_access_read_only_names_the_shared_variable_and_when_to_write_it()
-> Result<(), WorkerError> {
    let (mut tree, [w, ..], workers) = split_fixture()?;
    let mut ws = tree.split_workers(&workers)?;
    let errs = [
        ws[0].set(w, 0.0_f32).unwrap_err(),
        ws[0].get_mut::<f32>(w).unwrap_err(),
        ws[1].get_or_insert_with(w, || 0.0_f32).unwrap_err(),
    ];
    for err in errs {
        assert!(
            matches!(&err, WorkerError::WorkerAccess { reason: WorkerAccessReason::ReadOnly, name, scope, .. }
            if name == "W" && scope.is_empty())
        );
        says(
            &err,
            &["`W`", "`<root>`", "read-only", "after the split ends"],
        );
    }
    says(
        &ws[1].set(w, 0.0_f32).unwrap_err(),
        &["worker of scope `w1`"],
    );
    Ok(())
}

#[test]
fn worker_access_other_worker_names_both_scopes() -> Result<(), WorkerError> {
    let (mut tree, [_, xa, xb], workers) = split_fixture()?;
    let mut ws = tree.split_workers(&workers)?;
    let err = ws[1].get::<f32>(xa).unwrap_err();
    assert!(
        matches!(&err, WorkerError::WorkerAccess { reason: WorkerAccessReason::OtherWorker, name, scope, worker }
        if name == "h" && scope == "w0/step" && worker == "w1")
    );
    says(
        &err,
        &[
            "`h`",
            "`w0/step`",
            "`w1`",
            "another worker",
            "worker that owns it",
        ],
    );
    let err = ws[0].set(xb, 0.0_f32).unwrap_err();
    says(&err, &["`g`", "`w1`", "`w0`", "another worker"]);
    let err = ws[0].shared::<f32>(xb).unwrap_err();
    says(&err, &["`g`", "another worker"]);
    Ok(())
}

#[test]
fn worker_access_not_shared_suggests_get_or_get_disjoint_mut() -> Result<(), WorkerError> {
    let (mut tree, [_, xa, _], workers) = split_fixture()?;
    let ws = tree.split_workers(&workers)?;
    let err = ws[0].shared::<f32>(xa).unwrap_err();
    assert!(
        matches!(&err, WorkerError::WorkerAccess { reason: WorkerAccessReason::NotShared, name, scope, worker }
        if name == "h" && scope == "w0/step" && worker == "w0")
    );
    says(
        &err,
        &[
            "`h`",
            "`w0/step`",
            "`w0`",
            "belongs to this worker",
            "`get`",
            "`get_disjoint_mut`",
        ],
    );
    Ok(())
}

#[test]
fn overlapping_workers_names_both_scopes_in_every_arrangement() -> Result<(), WorkerError> {
    let (mut tree, _, [a, b]) = split_fixture()?;
    let inner = tree.kid(a, "step")?.ok_or(Error::RootScope)?;
    let root = tree.root();
    let cases = [
        (vec![a, a], ("w0", "w0")),
        (vec![a, inner], ("w0", "w0/step")),
        (vec![inner, a], ("w0/step", "w0")),
        (vec![b, root], ("w1", "")),
        (vec![b, inner, a], ("w0/step", "w0")),
    ];
    for (scopes, (p, q)) in cases {
        let err = tree.split_workers(&scopes).unwrap_err();
        assert!(
            matches!(&err, WorkerError::OverlappingWorkers { scope, other } if scope == p && other == q),
            "{scopes:?}: {err:?}"
        );
        let show = |s: &str| {
            if s.is_empty() {
                "`<root>`".to_owned()
            } else {
                format!("`{s}`")
            }
        };
        says(&err, &[&show(p), &show(q), "overlap", "disjoint subtree"]);
        // run_workers refuses the same split before running anything.
        let ran = tree.run_workers(&scopes, |_| -> () { panic!("must not run") });
        assert!(matches!(ran, Err(WorkerError::OverlappingWorkers { .. })));
    }
    Ok(())
}

#[test]
fn no_such_step_names_the_step_the_live_range_and_the_parent() -> Result<(), StepError> {
    let mut tree = ScopeTree::new();
    let rnn = tree.new_named_scope(tree.root(), "rnn")?;
    let mut steps =
        StepScopes::with_window(&tree, rnn, NonZeroUsize::new(2).ok_or(Error::RootScope)?)?;
    let h = steps.declare(&mut tree, "h")?;
    let err = steps.var(h, 0).unwrap_err();
    assert!(
        matches!(&err, StepError::NoSuchStep { step: 0, first: 0, end: 0, scope } if scope == "rnn")
    );
    says(&err, &["step 0", "`rnn`", "0..0", "`push` it first"]);
    for _ in 0..5 {
        steps.push(&mut tree)?;
    }
    let err = steps.scope(2).unwrap_err();
    assert!(matches!(
        &err,
        StepError::NoSuchStep {
            step: 2,
            first: 3,
            end: 5,
            ..
        }
    ));
    says(&err, &["step 2", "3..5", "larger window"]);
    let mut top = StepScopes::new(&tree, tree.root())?;
    let c = top.declare(&mut tree, "c")?;
    says(&top.var(c, 7).unwrap_err(), &["step 7", "`<root>`"]);
    Ok(())
}

#[test]
fn foreign_step_var_names_the_step_scopes_it_was_used_with() -> Result<(), StepError> {
    let mut tree = ScopeTree::new();
    let (p, q) = (
        tree.new_named_scope(tree.root(), "enc")?,
        tree.new_named_scope(tree.root(), "dec")?,
    );
    let mut enc = StepScopes::new(&tree, p)?;
    let mut dec = StepScopes::new(&tree, q)?;
    let h_enc = enc.declare(&mut tree, "h")?;
    dec.declare(&mut tree, "h")?;
    dec.push(&mut tree)?;
    let err = dec.var(h_enc, 0).unwrap_err();
    assert!(matches!(&err, StepError::ForeignStepVar { scope, .. } if scope == "dec"));
    // `var` has no tree to spell the name with, so the column stands in for it.
    says(
        &err,
        &[
            "`dec`",
            "#0",
            "declared by other step scopes",
            "`declare`",
            "`step_var`",
        ],
    );
    Ok(())
}
