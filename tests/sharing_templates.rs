//! Ports of TensorFlow 1.15's `tensorflow/python/kernel_tests/template_test.py`
//! to `scopetree::sharing::Template`. Each test is named after the
//! TensorFlow test it ports; docs/sharing.md lists the ones judged not
//! applicable.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use scopetree::sharing::{
    self, CustomGetter, Initializer, Reuse, ScopeOpts, Template, VarScope, VarSpec, VariableStore,
};
use scopetree::{Error, VarId};

type R = Result<(), sharing::Error>;

fn zeros() -> Initializer<Vec<f32>> {
    Initializer::with_shape(|s: &[usize]| vec![0.0_f32; s.iter().product()])
}

fn dummy_spec(trainable: bool) -> VarSpec<Vec<f32>> {
    VarSpec::new("dummy")
        .shape([1])
        .trainable(trainable)
        .initializer(zeros())
}

/// TensorFlow's `variable_scoped_function`.
fn variable_scoped_function(
    trainable: bool,
) -> impl FnMut(&mut VariableStore, &mut VarScope, ()) -> Result<VarId, sharing::Error> {
    move |s, vs, ()| s.get_variable(vs, dummy_spec(trainable))
}

/// TensorFlow's `internally_variable_scoped_function`.
fn internally_variable_scoped_function(
    s: &mut VariableStore,
    vs: &mut VarScope,
    scope_name: &str,
) -> Result<VarId, sharing::Error> {
    s.variable_scope(vs, scope_name, ScopeOpts::new(), |s, inner| {
        s.get_variable(inner, dummy_spec(true))
    })
}

/// TensorFlow's `function_with_create`: a side variable of a fresh name on
/// every call (TensorFlow uses `tf.Variable`; here a per-call `AutoReuse`
/// `get_variable`, which creates under a reusing scope all the same).
fn function_with_create(
    trainable: bool,
) -> impl FnMut(&mut VariableStore, &mut VarScope, ()) -> Result<VarId, sharing::Error> {
    let mut n = 0;
    move |s, vs, ()| {
        let name = format!("Variable_{n}");
        n += 1;
        s.get_variable(
            vs,
            VarSpec::new(name)
                .reuse(Reuse::AutoReuse)
                .trainable(trainable)
                .initializer(Initializer::constant(0_i32)),
        )?;
        s.get_variable(vs, dummy_spec(true))
    }
}

fn name_of(store: &VariableStore, v: VarId) -> String {
    store.full_name(v).unwrap()
}

fn o() -> ScopeOpts {
    ScopeOpts::new()
}

#[test]
fn template_with_empty_name() {
    // TensorFlow accepts "" and names the variable `outer//dummy` (and
    // `make_template(None)` fails); a `&str` cannot be `None`, and the empty
    // name is rejected like any empty name in this crate.
    let t = Template::new("", variable_scoped_function(true));
    assert!(matches!(
        t,
        Err(sharing::Error::Tree(Error::InvalidName { .. }))
    ));
    let t = Template::new("a/b", variable_scoped_function(true));
    assert!(matches!(
        t,
        Err(sharing::Error::Tree(Error::InvalidName { .. }))
    ));
}

#[test]
fn template_with_name() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let mut tmpl1 = Template::new("s1", variable_scoped_function(true))?;
    let mut tmpl2 = Template::new("s1", variable_scoped_function(true))?;
    let v1 = tmpl1.call(&mut store, &root, ())?;
    let v2 = tmpl1.call(&mut store, &root, ())?;
    let v3 = tmpl2.call(&mut store, &root, ())?;
    assert_eq!(v1, v2);
    assert_ne!(v1, v3);
    assert_eq!(name_of(&store, v1), "s1/dummy");
    assert_eq!(name_of(&store, v3), "s1_1/dummy");
    Ok(())
}

#[test]
fn same_unique_name_raise_error() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let mut tmpl1 = Template::new("_", variable_scoped_function(true))?.with_unique_name("s1")?;
    tmpl1.call(&mut store, &root, ())?;
    let mut tmpl2 = Template::new("_", variable_scoped_function(true))?.with_unique_name("s1")?;
    let err = tmpl2.call(&mut store, &root, ()).unwrap_err();
    assert!(
        matches!(err, sharing::Error::VariableExists { ref name, ref scope } if name == "dummy" && scope == "s1")
    );
    assert!(err.to_string().contains("already exists"));
    assert!(!tmpl2.variables_created());
    Ok(())
}

#[test]
fn unique_name_and_reuse() -> R {
    let mut store = VariableStore::new();
    let mut root = store.root_scope();
    let mut tmpl1 = Template::new("_", variable_scoped_function(true))?.with_unique_name("s1")?;
    let v1 = tmpl1.call(&mut store, &root, ())?;
    let v2 = tmpl1.call(&mut store, &root, ())?;
    root.reuse_variables();
    let mut tmpl2 = Template::new("_", variable_scoped_function(true))?.with_unique_name("s1")?;
    let v3 = tmpl2.call(&mut store, &root, ())?;
    assert_eq!(v1, v2);
    assert_eq!(v1, v3);
    assert_eq!(name_of(&store, v1), "s1/dummy");
    Ok(())
}

#[test]
fn template_in_scope() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let mut tmpl1 = Template::new("s1", variable_scoped_function(true))?;
    let mut tmpl2 = Template::new("s1", variable_scoped_function(true))?;
    let (v1, v3) = store.variable_scope(&root, "scope", o(), |s, vs| {
        Ok((tmpl1.call(s, vs, ())?, tmpl2.call(s, vs, ())?))
    })?;
    let v2 = store.variable_scope(&root, "scope2", o(), |s, vs| tmpl1.call(s, vs, ()))?;
    assert_eq!(v1, v2);
    assert_ne!(v1, v3);
    assert_eq!(name_of(&store, v1), "scope/s1/dummy");
    assert_eq!(name_of(&store, v3), "scope/s1_1/dummy");
    Ok(())
}

#[test]
fn template_with_internal_reuse() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let mut tmpl1 = Template::new("s1", internally_variable_scoped_function)?;
    let mut tmpl2 = Template::new("s1", internally_variable_scoped_function)?;
    let v1 = tmpl1.call(&mut store, &root, "test")?;
    let v2 = tmpl1.call(&mut store, &root, "test")?;
    let v3 = tmpl2.call(&mut store, &root, "test")?;
    assert_eq!(v1, v2);
    assert_ne!(v1, v3);
    assert_eq!(name_of(&store, v1), "s1/test/dummy");
    assert_eq!(name_of(&store, v3), "s1_1/test/dummy");
    assert!(matches!(
        tmpl1.call(&mut store, &root, "not_test"),
        Err(sharing::Error::VariableMissing { .. })
    ));
    Ok(())
}

#[test]
fn make_template() -> R {
    // TensorFlow binds `scope_name="test"` as a keyword argument; a closure
    // captures it here.
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let bound = |s: &mut VariableStore, vs: &mut VarScope, ()| {
        internally_variable_scoped_function(s, vs, "test")
    };
    let mut tmpl1 = Template::new("s1", bound)?;
    let mut tmpl2 = Template::new("s1", bound)?;
    let v1 = tmpl1.call(&mut store, &root, ())?;
    let v2 = tmpl1.call(&mut store, &root, ())?;
    let v3 = tmpl2.call(&mut store, &root, ())?;
    assert_eq!(v1, v2);
    assert_ne!(v1, v3);
    assert_eq!(name_of(&store, v1), "s1/test/dummy");
    assert_eq!(name_of(&store, v3), "s1_1/test/dummy");
    Ok(())
}

#[test]
fn enforces_no_extra_trainable_variables() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let mut tmpl = Template::new("s", function_with_create(true))?;
    tmpl.call(&mut store, &root, ())?;
    let err = tmpl.call(&mut store, &root, ()).unwrap_err();
    match err {
        sharing::Error::TemplateCreatedVariable {
            template,
            scope,
            names,
        } => {
            assert_eq!((template.as_str(), scope.as_str()), ("s", "s"));
            assert_eq!(names, ["s/Variable_1"]);
        }
        e => panic!("unexpected {e:?}"),
    }
    Ok(())
}

#[test]
fn enforces_no_extra_trainable_variables_eager() -> R {
    // `function_with_side_create`: the side variable's name depends on the
    // call; a later call runs in `Reuse` mode, so a new name is missing
    // (TensorFlow's graph-mode outcome).
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let side = |s: &mut VariableStore, vs: &mut VarScope, name: &str| {
        s.get_variable(vs, VarSpec::new(name).shape([1]).initializer(zeros()))?;
        s.get_variable(vs, dummy_spec(true))
    };
    let mut tmpl = Template::new("s", side)?;
    tmpl.call(&mut store, &root, "1")?;
    assert!(matches!(
        tmpl.call(&mut store, &root, "2"),
        Err(sharing::Error::VariableMissing { .. })
    ));
    Ok(())
}

#[test]
fn permits_extra_non_trainable_variables() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let mut tmpl = Template::new("s", function_with_create(false))?;
    let a = tmpl.call(&mut store, &root, ())?;
    let b = tmpl.call(&mut store, &root, ())?;
    assert_eq!(a, b);
    Ok(())
}

#[test]
fn internal_variable_reuse() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let nested = |s: &mut VariableStore, vs: &mut VarScope, ()| {
        let (inner, v1) = s.variable_scope(vs, "nested", o(), |s, n| {
            let x = s.get_variable(
                n,
                VarSpec::<f32>::new("x")
                    .shape(scopetree::sharing::Shape::scalar())
                    .initializer(Initializer::with_shape(|_: &[usize]| 0.0)),
            )?;
            Ok((n.clone(), x))
        })?;
        let v2 = s.reenter_scope(&inner, Reuse::Reuse, |s, n| {
            s.get_variable::<f32>(n, VarSpec::new("x"))
        })?;
        assert_eq!(v1, v2);
        Ok(v1)
    };
    let mut tmpl1 = Template::new("s1", nested)?;
    let mut tmpl2 = Template::new("s1", nested)?;
    let v1 = tmpl1.call(&mut store, &root, ())?;
    let v2 = tmpl1.call(&mut store, &root, ())?;
    let v3 = tmpl2.call(&mut store, &root, ())?;
    assert_eq!(v1, v2);
    assert_ne!(v1, v3);
    assert_eq!(name_of(&store, v1), "s1/nested/x");
    assert_eq!(name_of(&store, v3), "s1_1/nested/x");
    Ok(())
}

#[test]
fn nested_templates() -> R {
    // The checkpoint-dependency and Keras `Model` parts do not apply.
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let nested_template = |s: &mut VariableStore, vs: &mut VarScope, ()| {
        let mut nested1 = Template::new("nested", variable_scoped_function(true))?;
        let mut nested2 = Template::new("nested", variable_scoped_function(true))?;
        let v1 = nested1.call(s, vs, ())?;
        let v2 = nested2.call(s, vs, ())?;
        assert_ne!(v1, v2);
        for (t, v) in [(&nested1, v1), (&nested2, v2)] {
            let vars: Vec<VarId> = t.variables(s)?.into_iter().map(|(_, v)| v).collect();
            assert_eq!(vars, [v]);
            let tr: Vec<VarId> = t
                .trainable_variables(s)?
                .into_iter()
                .map(|(_, v)| v)
                .collect();
            assert_eq!(tr, [v]);
            assert!(t.non_trainable_variables(s)?.is_empty());
        }
        Ok((v1, v2))
    };
    let mut tmpl1 = Template::new("s1", nested_template)?;
    let mut tmpl2 = Template::new("s1", nested_template)?;
    let (v1, v2) = tmpl1.call(&mut store, &root, ())?;
    let (v3, v4) = tmpl1.call(&mut store, &root, ())?;
    let (v5, v6) = tmpl2.call(&mut store, &root, ())?;
    assert_eq!((v1, v2), (v3, v4));
    let ids = |l: Vec<(String, VarId)>| l.into_iter().map(|(_, v)| v).collect::<Vec<_>>();
    assert_eq!(ids(tmpl1.variables(&store)?), [v1, v2]);
    assert_eq!(ids(tmpl1.trainable_variables(&store)?), [v1, v2]);
    assert!(tmpl1.non_trainable_variables(&store)?.is_empty());
    assert_ne!(v1, v5);
    assert_ne!(v2, v6);
    assert_eq!(ids(tmpl2.variables(&store)?), [v5, v6]);
    assert_eq!(ids(tmpl2.trainable_variables(&store)?), [v5, v6]);
    assert!(tmpl2.non_trainable_variables(&store)?.is_empty());
    assert_eq!(name_of(&store, v1), "s1/nested/dummy");
    assert_eq!(name_of(&store, v2), "s1/nested_1/dummy");
    assert_eq!(name_of(&store, v5), "s1_1/nested/dummy");
    assert_eq!(name_of(&store, v6), "s1_1/nested_1/dummy");
    Ok(())
}

#[test]
fn immediate_scope_creation() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let (mut tmpl_immed, mut tmpl_defer) =
        store.variable_scope(&root, "ctor_scope", o(), |s, vs| {
            let immed =
                Template::new("a", variable_scoped_function(true))?.create_scope_now(s, vs)?;
            let defer = Template::new("b", variable_scoped_function(true))?;
            Ok((immed, defer))
        })?;
    let (inner_imm, inner_defer) = store.variable_scope(&root, "call_scope", o(), |s, vs| {
        Ok((tmpl_immed.call(s, vs, ())?, tmpl_defer.call(s, vs, ())?))
    })?;
    let outer_imm = tmpl_immed.call(&mut store, &root, ())?;
    let outer_defer = tmpl_defer.call(&mut store, &root, ())?;
    assert_ne!(inner_imm, inner_defer);
    assert_eq!(outer_imm, inner_imm);
    assert_eq!(outer_defer, inner_defer);
    assert_eq!(name_of(&store, inner_imm), "ctor_scope/a/dummy");
    assert_eq!(name_of(&store, inner_defer), "call_scope/b/dummy");
    Ok(())
}

#[test]
fn scope_access() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let (ta, tb) = store.variable_scope(&root, "foo", o(), |s, vs| {
        let ta = Template::new("bar", variable_scoped_function(true))?.create_scope_now(s, vs)?;
        let tb = Template::new("bar", variable_scoped_function(true))?.create_scope_now(s, vs)?;
        Ok((ta, tb))
    })?;
    assert_eq!(ta.variable_scope().map(VarScope::name), Some("foo/bar"));
    assert_eq!(tb.variable_scope().map(VarScope::name), Some("foo/bar_1"));
    let mut tc = store.variable_scope(&root, "foo_2", o(), |_, _| {
        Template::new("blah", variable_scoped_function(true))
    })?;
    assert!(tc.variable_scope().is_none());
    tc.call(&mut store, &root, ())?;
    assert_eq!(tc.variable_scope().map(VarScope::name), Some("blah"));
    Ok(())
}

#[test]
fn custom_getter() -> R {
    for create_now in [false, true] {
        let mut store = VariableStore::new();
        let root = store.root_scope();
        let count = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&count);
        let getter = CustomGetter::new(move |s, args, next| {
            c.fetch_add(1, Ordering::Relaxed);
            next.get(s, args)
        });
        let mut tmpl =
            Template::new("s1", variable_scoped_function(true))?.with_custom_getter(getter);
        if create_now {
            tmpl = tmpl.create_scope_now(&mut store, &root)?;
        }
        assert_eq!(count.load(Ordering::Relaxed), 0);
        tmpl.call(&mut store, &root, ())?;
        assert_eq!(count.load(Ordering::Relaxed), 1);
        tmpl.call(&mut store, &root, ())?;
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
    Ok(())
}

#[test]
fn fails_gracefully() -> R {
    for create_now in [true, false] {
        let mut store = VariableStore::new();
        let root = store.root_scope();
        // A call with `bad` fails before creating anything (TensorFlow's
        // unexpected keyword argument).
        let module = |s: &mut VariableStore, vs: &mut VarScope, bad: bool| {
            if bad {
                return Err(Error::InvalidName {
                    name: "is_training".into(),
                    reason: scopetree::InvalidNameReason::Empty,
                }
                .into());
            }
            s.get_variable(vs, VarSpec::new("w").shape([1]).initializer(zeros()))
        };
        let mut tmpl = Template::new("f1", module)?;
        if create_now {
            tmpl = tmpl.create_scope_now(&mut store, &root)?;
        }
        assert!(tmpl.call(&mut store, &root, true).is_err());
        assert!(!tmpl.variables_created());
        let w = tmpl.call(&mut store, &root, false)?;
        assert!(tmpl.variables_created());
        assert_eq!(name_of(&store, w), "f1/w");
    }
    Ok(())
}

#[test]
fn name_scopes_for_variable_scopes() -> R {
    // The variable-scope half; op name scopes do not apply.
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let linear = |s: &mut VariableStore, vs: &mut VarScope, ()| {
        s.get_variable(vs, VarSpec::new("w").shape([4 * 2]).initializer(zeros()))
    };
    let mut linear1 = Template::new("foo", linear)?.create_scope_now(&mut store, &root)?;
    let w1 = linear1.call(&mut store, &root, ())?;
    linear1.call(&mut store, &root, ())?;
    assert_eq!(linear1.variable_scope().map(VarScope::name), Some("foo"));
    assert_eq!(name_of(&store, w1), "foo/w");
    let mut linear2 = Template::new("foo", linear)?.create_scope_now(&mut store, &root)?;
    let w2 = linear2.call(&mut store, &root, ())?;
    linear2.call(&mut store, &root, ())?;
    assert_eq!(linear2.variable_scope().map(VarScope::name), Some("foo_1"));
    assert_eq!(name_of(&store, w2), "foo_1/w");
    Ok(())
}

#[test]
fn global_variables() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let (mut ta, mut tb) = store.variable_scope(&root, "foo", o(), |s, vs| {
        let ta = Template::new("bar", variable_scoped_function(true))?.create_scope_now(s, vs)?;
        let tb = Template::new("s", function_with_create(false))?;
        Ok((ta, tb))
    })?;
    assert!(ta.global_variables(&store)?.is_empty());
    assert!(tb.global_variables(&store)?.is_empty());
    ta.call(&mut store, &root, ())?;
    tb.call(&mut store, &root, ())?;
    assert_eq!(ta.global_variables(&store)?.len(), 1);
    assert_eq!(tb.global_variables(&store)?.len(), 2);
    Ok(())
}

#[test]
fn trainable_variables() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let (mut ta, mut tb) = store.variable_scope(&root, "foo2", o(), |s, vs| {
        let ta = Template::new("bar", variable_scoped_function(true))?.create_scope_now(s, vs)?;
        let tb = Template::new("bar", variable_scoped_function(true))?.create_scope_now(s, vs)?;
        Ok((ta, tb))
    })?;
    assert!(ta.trainable_variables(&store)?.is_empty());
    assert!(tb.trainable_variables(&store)?.is_empty());
    ta.call(&mut store, &root, ())?;
    tb.call(&mut store, &root, ())?;
    for t in [&ta, &tb] {
        assert_eq!(t.trainable_variables(&store)?.len(), 1);
        assert!(t.non_trainable_variables(&store)?.is_empty());
        assert_eq!(t.variables(&store)?.len(), 1);
    }
    Ok(())
}

#[test]
fn non_trainable_variables() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let (mut ta, mut tb) = store.variable_scope(&root, "foo2", o(), |s, vs| {
        let ta = Template::new("a", variable_scoped_function(true))?.create_scope_now(s, vs)?;
        let tb = Template::new("b", variable_scoped_function(false))?.create_scope_now(s, vs)?;
        Ok((ta, tb))
    })?;
    assert!(ta.variables(&store)?.is_empty());
    assert!(tb.variables(&store)?.is_empty());
    ta.call(&mut store, &root, ())?;
    tb.call(&mut store, &root, ())?;
    assert_eq!(ta.trainable_variables(&store)?.len(), 1);
    assert!(ta.non_trainable_variables(&store)?.is_empty());
    assert!(tb.trainable_variables(&store)?.is_empty());
    assert_eq!(tb.non_trainable_variables(&store)?.len(), 1);
    assert_eq!(ta.variables(&store)?.len(), 1);
    assert_eq!(tb.variables(&store)?.len(), 1);
    Ok(())
}

#[test]
fn local_variables() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let with_local = |s: &mut VariableStore, vs: &mut VarScope, ()| {
        s.get_local_variable(vs, VarSpec::new("local").shape([1]).initializer(zeros()))?;
        s.get_variable(vs, dummy_spec(true))
    };
    let (mut ta, mut tb) = store.variable_scope(&root, "foo3", o(), |s, vs| {
        let ta = Template::new("bar", variable_scoped_function(true))?.create_scope_now(s, vs)?;
        let tb = Template::new("bar", with_local)?.create_scope_now(s, vs)?;
        Ok((ta, tb))
    })?;
    assert!(ta.local_variables(&store)?.is_empty());
    assert!(tb.local_variables(&store)?.is_empty());
    ta.call(&mut store, &root, ())?;
    tb.call(&mut store, &root, ())?;
    assert!(ta.local_variables(&store)?.is_empty());
    assert_eq!(tb.local_variables(&store)?.len(), 1);
    Ok(())
}

// ----- the arena underneath ----------------------------------------------------

#[test]
fn template_whose_scope_was_deleted_reports_stale() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let mut t = Template::new("t", variable_scoped_function(true))?;
    t.call(&mut store, &root, ())?;
    let place = t.variable_scope().map(VarScope::place).unwrap();
    store.delete_scope(place)?;
    let err = t.call(&mut store, &root, ()).unwrap_err();
    assert!(
        matches!(err, sharing::Error::StaleTemplate { ref template, scope } if template == "t" && scope == place)
    );
    assert!(matches!(
        t.variables(&store),
        Err(sharing::Error::StaleTemplate { .. })
    ));
    // Nothing was silently recreated.
    assert!(store.global_variables(None)?.is_empty());
    assert_eq!(store.tree().kid(store.tree().root(), "t")?, None);
    Ok(())
}

#[test]
fn template_called_with_another_store_is_foreign() -> R {
    let mut a = VariableStore::new();
    let mut b = VariableStore::new();
    let (ra, rb) = (a.root_scope(), b.root_scope());
    let mut t = Template::new("t", variable_scoped_function(true))?;
    t.call(&mut a, &ra, ())?;
    assert!(matches!(
        t.call(&mut b, &rb, ()),
        Err(sharing::Error::Tree(Error::ForeignScope { .. }))
    ));
    assert_eq!(b.tree().var_count(), 0);
    Ok(())
}
