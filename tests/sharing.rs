//! Ports of TensorFlow 1.15's `tensorflow/python/kernel_tests/variable_scope_test.py`
//! to `scopetree::sharing`. Each test is named after the TensorFlow test
//! method it ports (snake case); the docs/sharing.md table lists the ones
//! judged not applicable and why.
//!
//! TensorFlow gives float variables a default (glorot) initializer; this
//! crate has no default, so most tests give the root scope a zero
//! initializer per value type, which sub-scopes inherit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use scopetree::sharing::Error;
use scopetree::sharing::{
    CustomGetter, GLOBAL_VARIABLES, HasShape, Initializer, LOCAL_VARIABLES, Reuse, ScopeOpts,
    Shape, TRAINABLE_VARIABLES, VarScope, VarSpec, VariableStore,
};

type R = Result<(), Error>;

/// A user tensor type: a shape and flat data.
#[derive(Clone, Debug, PartialEq)]
struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl HasShape for Tensor {
    fn shape(&self) -> Shape {
        Shape::new(self.shape.iter().copied())
    }
}

fn zeros_tensor() -> Initializer<Tensor> {
    Initializer::with_shape(|s: &[usize]| Tensor {
        shape: s.to_vec(),
        data: vec![0.0; s.iter().product()],
    })
}

/// The root scope with zero initializers for `f32`, `Vec<f32>` and `Tensor`.
fn root(store: &VariableStore) -> VarScope {
    let mut r = store.root_scope();
    r.set_initializer(Initializer::with_shape(|_: &[usize]| 0.0_f32));
    r.set_initializer(Initializer::with_shape(|s: &[usize]| {
        vec![0.0_f32; s.iter().product()]
    }));
    r.set_initializer(zeros_tensor());
    r
}

/// TensorFlow's `get_variable(name, [])`.
fn scalar(name: &str) -> VarSpec<f32> {
    VarSpec::new(name).shape(Shape::scalar())
}

/// TensorFlow's `get_variable(name, [1])`.
fn vec1(name: &str) -> VarSpec<Vec<f32>> {
    VarSpec::new(name).shape([1])
}

fn o() -> ScopeOpts {
    ScopeOpts::new()
}

fn name_of(store: &VariableStore, v: scopetree::VarId) -> String {
    store.full_name(v).unwrap()
}

fn names(list: Vec<(String, scopetree::VarId)>) -> Vec<String> {
    list.into_iter().map(|(n, _)| n).collect()
}

// ----- class VariableScopeTest --------------------------------------------

#[test]
fn get_var() -> R {
    // Store-level `reuse=None` is get-or-create: `AutoReuse` here.
    let mut store = VariableStore::new();
    let r = root(&store);
    let v = store.get_variable(&r, vec1("v").reuse(Reuse::AutoReuse))?;
    let v1 = store.get_variable(&r, vec1("v").reuse(Reuse::AutoReuse))?;
    assert_eq!(v, v1);
    Ok(())
}

#[test]
fn name_exists() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let v = store.get_variable(&r, vec1("v").reuse(Reuse::AutoReuse))?;
    assert_eq!(
        store.get_variable(&r, vec1("v").reuse(Reuse::AutoReuse))?,
        v
    );
    // reuse=False: creating a new name is fine, an existing one fails.
    store.get_variable(&r, vec1("w"))?;
    assert!(matches!(
        store.get_variable(&r, vec1("v")),
        Err(Error::VariableExists { .. })
    ));
    // reuse=True: an existing name is fine, a new one fails.
    assert_eq!(store.get_variable(&r, vec1("v").reuse(Reuse::Reuse))?, v);
    assert!(matches!(
        store.get_variable(&r, vec1("u").reuse(Reuse::Reuse)),
        Err(Error::VariableMissing { .. })
    ));
    Ok(())
}

#[test]
fn nameless_store() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let a = store.get_variable(&r, VarSpec::<Vec<f32>>::new("v1").shape([2]))?;
    let b = store.get_variable(&r, VarSpec::<Vec<f32>>::new("v2").shape([2]))?;
    assert_eq!(name_of(&store, a), "v1");
    assert_eq!(name_of(&store, b), "v2");
    Ok(())
}

#[test]
fn var_scope_initializer() -> R {
    let mut store = VariableStore::new();
    let r = store.root_scope(); // no defaults: the scopes bring them
    let init = Initializer::with_shape(|_: &[usize]| 0.3_f32);
    let (v, w) = store.variable_scope(&r, "tower0", o(), |s, tower| {
        let captured = tower.clone();
        let v = s.variable_scope(tower, "foo", o().initializer(init.clone()), |s, foo| {
            s.get_variable(foo, scalar("v"))
        })?;
        let w = s.reenter_scope(&captured, o().initializer(init.clone()), |s, t| {
            s.get_variable(t, scalar("w"))
        })?;
        Ok((v, w))
    })?;
    assert_eq!(*store.tree().get::<f32>(v)?, 0.3);
    assert_eq!(*store.tree().get::<f32>(w)?, 0.3);
    assert_eq!(name_of(&store, v), "tower0/foo/v");
    assert_eq!(name_of(&store, w), "tower0/w");
    Ok(())
}

#[test]
fn eager_variables_store_adds_to_collections() -> R {
    // Collection rules only (the eager store itself does not apply).
    let mut store = VariableStore::new();
    let r = root(&store);
    store.get_variable(&r, scalar("v1").trainable(true))?;
    store.get_variable(&r, scalar("v2").trainable(false))?;
    store.get_variable(&r, scalar("v3").collections(["concatenated_variables"]))?;
    assert_eq!(names(store.global_variables(None)?), ["v1", "v2"]);
    assert_eq!(names(store.trainable_variables(None)?), ["v1", "v3"]);
    assert_eq!(
        names(store.collection("concatenated_variables", None)?),
        ["v3"]
    );
    Ok(())
}

#[test]
fn init_from_non_tensor_value() -> R {
    let mut store = VariableStore::new();
    let r = store.root_scope();
    let v = store.get_variable(
        &r,
        VarSpec::new("v4").initializer(Initializer::constant(4_i32)),
    )?;
    assert_eq!(*store.tree().get::<i32>(v)?, 4);
    let w = store.get_variable(
        &r,
        VarSpec::new("w4").initializer(Initializer::constant(vec![1_i64, 2, 3])),
    )?;
    assert_eq!(store.tree().get::<Vec<i64>>(w)?, &[1, 2, 3]);
    assert_eq!(store.initial_shape(w)?, Some(&Shape::new([3])));
    // TensorFlow's `initializer={}` TypeError is a compile error here: a
    // value type must implement `HasShape`.
    Ok(())
}

#[test]
fn initialize_from_value() -> R {
    let mut store = VariableStore::new();
    let r = store.root_scope();
    let init = Initializer::constant(0.1_f32);
    let w = store.get_variable(&r, VarSpec::new("v").initializer(init.clone()))?;
    assert_eq!(*store.tree().get::<f32>(w)?, 0.1);

    // A constant initializer and a shape: rejected, the message says "shape".
    let err = store
        .get_variable(&r, VarSpec::new("u").shape([1]).initializer(init.clone()))
        .unwrap_err();
    assert!(matches!(err, Error::ConstantWithShape { .. }));
    assert!(err.to_string().contains("shape"));
    assert_eq!(store.variable("u")?, None);

    // A constant initializer set on a scope is inherited.
    let v = store.variable_scope(&r, "foo", o().initializer(init), |s, foo| {
        s.get_variable::<f32>(foo, VarSpec::new("v"))
    })?;
    assert_eq!(*store.tree().get::<f32>(v)?, 0.1);

    // A non-f32 constant makes a variable of its own type.
    let t = store.get_variable(
        &r,
        VarSpec::new("t").initializer(Initializer::constant(1_i32)),
    )?;
    assert!(store.tree().is::<i32>(t)?);
    // "Initializer type and explicit dtype don't match" cannot be written:
    // `VarSpec<T>` and `Initializer<T>` share `T`.
    Ok(())
}

#[test]
fn get_variable_scope() -> R {
    let mut store = VariableStore::new();
    let r = store.root_scope();
    let init = Initializer::with_shape(|_: &[usize]| 0.3_f32);
    store.variable_scope(&r, "bar", o(), |s, bar| {
        assert!(bar.initializer::<f32>().is_none());
        bar.set_initializer(init);
        let v = s.get_variable(bar, scalar("v"))?;
        assert_eq!(*s.tree().get::<f32>(v)?, 0.3);
        bar.reuse_variables();
        assert!(matches!(
            s.get_variable(bar, vec1("w")),
            Err(Error::VariableMissing { .. })
        ));
        Ok(())
    })?;
    assert!(r.initializer::<f32>().is_none());
    Ok(())
}

#[test]
fn var_scope() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let tower = store.variable_scope(&r, "tower4", o(), |_, t| Ok(t.clone()))?;
    assert_eq!(tower.name(), "tower4");
    store.variable_scope(&r, "tower5", o(), |s, t5| {
        s.variable_scope(t5, "bar", o(), |_, bar| {
            assert_eq!(bar.name(), "tower5/bar");
            Ok(())
        })
    })?;
    store.variable_scope(&r, "tower6", o(), |s, _| {
        s.reenter_scope(&tower, Reuse::Reuse, |_, shared| {
            assert_eq!(shared.name(), "tower4");
            Ok(())
        })
    })
}

#[test]
fn var_scope_object_reuse() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let vs = store.variable_scope(&r, "jump", Reuse::Reuse, |_, s| Ok(s.clone()))?;
    store.reenter_scope(&vs, o(), |_, j| {
        assert_eq!(j.reuse(), Reuse::Reuse);
        Ok(())
    })?;
    store.reenter_scope(&vs, Reuse::Reuse, |_, j| {
        assert_eq!(j.reuse(), Reuse::Reuse);
        Ok(())
    })?;
    store.reenter_scope(&vs, Reuse::Inherit, |_, j| {
        assert_eq!(j.reuse(), Reuse::Reuse); // inherited, cannot be undone
        Ok(())
    })?;

    let vs = store.variable_scope(&r, "jump", o(), |_, s| Ok(s.clone()))?;
    store.reenter_scope(&vs, o(), |_, j| {
        assert_eq!(j.reuse(), Reuse::Inherit);
        Ok(())
    })?;
    store.reenter_scope(&vs, Reuse::Reuse, |_, j| {
        assert_eq!(j.reuse(), Reuse::Reuse);
        Ok(())
    })?;
    store.reenter_scope(&vs, Reuse::Inherit, |_, j| {
        assert_eq!(j.reuse(), Reuse::Inherit);
        Ok(())
    })
}

#[test]
fn var_scope_get_or_create_reuse() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    for value in [42.0_f32, 13.0, 17.0] {
        store.variable_scope(&r, "bar", Reuse::AutoReuse, |s, vs| {
            let v = s.get_variable(vs, scalar("var"))?;
            Ok(s.tree_mut().set(v, value)?)
        })?;
        let seen = store.variable_scope(&r, "bar", Reuse::AutoReuse, |s, vs| {
            let v = s.get_variable(vs, scalar("var"))?;
            Ok(*s.tree().get::<f32>(v)?)
        })?;
        assert_eq!(seen, value);
    }
    assert_eq!(names(store.global_variables(None)?), ["bar/var"]);
    Ok(())
}

#[test]
fn var_op_scope() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    // `variable_scope("tower", "default")`: the name wins, used as given.
    let w = store.variable_scope(&r, "tower", o(), |s, vs| s.get_variable(vs, scalar("w")))?;
    assert_eq!(name_of(&store, w), "tower/w");
    assert!(matches!(
        store.variable_scope(&r, "tower", o(), |s, vs| s.get_variable(vs, scalar("w"))),
        Err(Error::VariableExists { .. })
    ));
    let d =
        store.variable_scope_unique(&r, "default", o(), |s, vs| s.get_variable(vs, scalar("w")))?;
    assert_eq!(name_of(&store, d), "default/w");
    let d1 =
        store.variable_scope_unique(&r, "default", o(), |s, vs| s.get_variable(vs, scalar("w")))?;
    assert_eq!(name_of(&store, d1), "default_1/w");
    Ok(())
}

#[test]
fn var_op_scope_unique_names_interleaved_substring_scopes() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let mut got = Vec::new();
    for outer in [
        "defaultScope1",
        "defaultScope1",
        "defaultScope",
        "defaultScope1",
    ] {
        let v = store.variable_scope_unique(&r, outer, o(), |s, a| {
            s.variable_scope_unique(a, "layer", o(), |s, l| s.get_variable(l, scalar("w")))
        })?;
        got.push(name_of(&store, v));
    }
    assert_eq!(
        got,
        [
            "defaultScope1/layer/w",
            "defaultScope1_1/layer/w",
            "defaultScope/layer/w",
            "defaultScope1_2/layer/w"
        ]
    );
    Ok(())
}

#[test]
fn var_op_scope_unique_names_with_jump() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let got = store.variable_scope(&r, "default", o(), |s, default| {
        let captured = default.clone();
        let a =
            s.variable_scope_unique(default, "layer", o(), |s, l| s.get_variable(l, scalar("w")))?;
        let b =
            s.variable_scope_unique(default, "layer", o(), |s, l| s.get_variable(l, scalar("w")))?;
        s.reenter_scope(&captured, o(), |_, _| Ok(()))?;
        let c =
            s.variable_scope_unique(default, "layer", o(), |s, l| s.get_variable(l, scalar("w")))?;
        Ok([a, b, c].map(|v| s.full_name(v).unwrap()))
    })?;
    assert_eq!(
        got,
        ["default/layer/w", "default/layer_1/w", "default/layer_2/w"]
    );
    Ok(())
}

#[test]
fn var_op_scope_reuse() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let (outer, t, d) = store.variable_scope(&r, "outer", o(), |s, outer| {
        let t = s.variable_scope(outer, "tower", o(), |s, vs| s.get_variable(vs, scalar("w")))?;
        let d = s.variable_scope_unique(outer, "default", o(), |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        Ok((outer.clone(), t, d))
    })?;
    assert_eq!(name_of(&store, t), "outer/tower/w");
    assert_eq!(name_of(&store, d), "outer/default/w");
    store.reenter_scope(&outer, Reuse::Reuse, |s, outer| {
        let t2 = s.variable_scope(outer, "tower", o(), |s, vs| s.get_variable(vs, scalar("w")))?;
        // `default`, not `default_1`: the counts under `outer` were reset
        // when the named scope `outer` exited.
        let d2 = s.variable_scope_unique(outer, "default", o(), |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        assert_eq!((t2, d2), (t, d));
        Ok(())
    })
}

#[test]
fn var_scope_get_var() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    store.variable_scope(&r, "root", o(), |s, root| {
        let (tower_a, va) = s.variable_scope(root, "towerA", o(), |s, t| {
            Ok((t.clone(), s.get_variable(t, vec1("v"))?))
        })?;
        assert_eq!(s.full_name(va)?, "root/towerA/v");

        let va2 = s.reenter_scope(&tower_a, Reuse::Reuse, |s, t| s.get_variable(t, vec1("v")))?;
        assert_eq!(va2, va);

        let vb = s.variable_scope(root, "towerB", o(), |s, t| s.get_variable(t, vec1("v")))?;
        assert_eq!(s.full_name(vb)?, "root/towerB/v");

        assert!(matches!(
            s.variable_scope(root, "towerA", o(), |s, t| s.get_variable(t, vec1("v"))),
            Err(Error::VariableExists { .. })
        ));
        let va2 = s.variable_scope(root, "towerA", Reuse::Reuse, |s, t| {
            s.get_variable(t, vec1("v"))
        })?;
        assert_eq!(va2, va);

        s.variable_scope(root, "foo", o(), |s, foo| {
            s.variable_scope(foo, "bar", o(), |s, bar| {
                let v = s.get_variable(bar, vec1("v"))?;
                assert_eq!(s.full_name(v)?, "root/foo/bar/v");
                // The captured scope keeps its own name from in here.
                let va3 =
                    s.reenter_scope(&tower_a, Reuse::Reuse, |s, t| s.get_variable(t, vec1("v")))?;
                assert_eq!(va3, va);
                Ok(())
            })
        })?;

        // Reuse is inherited by `baz`, where `v` does not exist.
        assert!(matches!(
            s.reenter_scope(&tower_a, Reuse::Reuse, |s, t| {
                s.variable_scope(t, "baz", o(), |s, baz| s.get_variable(baz, vec1("v")))
            }),
            Err(Error::VariableMissing { .. })
        ));

        let err = s
            .reenter_scope(&tower_a, Reuse::Reuse, |s, t| {
                s.get_variable(t, VarSpec::<Vec<f32>>::new("v").shape([2]))
            })
            .unwrap_err();
        assert!(matches!(err, Error::ShapeMismatch { .. }));
        assert!(err.to_string().contains("shape"));

        let err = s
            .reenter_scope(&tower_a, Reuse::Reuse, |s, t| {
                s.get_variable(t, VarSpec::<Vec<i32>>::new("v").shape([1]))
            })
            .unwrap_err();
        assert!(matches!(err, Error::ShareTypeMismatch { .. }));
        let msg = err.to_string();
        assert!(
            msg.contains("Vec<i32>") && msg.contains("Vec<f32>"),
            "{msg}"
        );
        Ok(())
    })
}

#[test]
fn var_scope_outer_scope() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let outer = store.variable_scope(&r, "outer", o(), |_, vs| Ok(vs.clone()))?;
    let (w, d) = store.reenter_scope(&outer, o(), |s, outer| {
        let w = s.get_variable(outer, scalar("w"))?;
        let d = s.variable_scope(outer, "default", o(), |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        Ok((w, d))
    })?;
    assert_eq!(name_of(&store, w), "outer/w");
    assert_eq!(name_of(&store, d), "outer/default/w");
    store.reenter_scope(&outer, Reuse::Reuse, |s, outer| {
        assert_eq!(s.get_variable(outer, scalar("w"))?, w);
        let d2 = s.variable_scope(outer, "default", Reuse::Reuse, |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        assert_eq!(d2, d);
        Ok(())
    })
}

#[test]
fn var_scope_nested_outer_scope() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    store.variable_scope(&r, "outer", o(), |s, outer| {
        let captured = outer.clone();
        // Re-entering `outer` inside itself gives `outer/w`, not `outer/outer/w`.
        let w = s.reenter_scope(&captured, o(), |s, vs| s.get_variable(vs, scalar("w")))?;
        assert_eq!(s.full_name(w)?, "outer/w");
        let d = s.variable_scope(outer, "default", o(), |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        assert_eq!(s.full_name(d)?, "outer/default/w");
        let w2 = s.reenter_scope(&captured, Reuse::Reuse, |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        let d2 = s.variable_scope(outer, "default", Reuse::Reuse, |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        assert_eq!((w2, d2), (w, d));
        Ok(())
    })
}

#[test]
fn var_op_scope_reuse_param() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let (outer, t, d) = store.variable_scope(&r, "outer", o(), |s, outer| {
        let t = s.variable_scope(outer, "tower", o(), |s, vs| s.get_variable(vs, scalar("w")))?;
        let d = s.variable_scope_unique(outer, "default", o(), |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        Ok((outer.clone(), t, d))
    })?;
    store.reenter_scope(&outer, o(), |s, outer| {
        let t2 = s.variable_scope(outer, "tower", Reuse::Reuse, |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        assert_eq!(t2, t);
        outer.reuse_variables();
        let d2 = s.variable_scope_unique(outer, "default", o(), |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        assert_eq!(d2, d);
        Ok(())
    })
}

#[test]
fn var_op_scope_reuse_error() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    for reuse in [Reuse::Reuse, Reuse::AutoReuse] {
        let err = store
            .variable_scope_unique(&r, "default", reuse, |s, vs| {
                s.get_variable(vs, scalar("w"))
            })
            .unwrap_err();
        assert!(matches!(err, Error::ReuseWithoutName { .. }));
    }
    assert_eq!(store.tree().scope_count(), 1); // nothing was entered
    Ok(())
}

#[test]
fn var_op_scope_outer_scope() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let outer = store.variable_scope(&r, "outer", o(), |_, vs| Ok(vs.clone()))?;
    // `variable_scope(outer, "default")`: the default name is ignored.
    let (w, d) = store.reenter_scope(&outer, o(), |s, outer| {
        let w = s.get_variable(outer, scalar("w"))?;
        let d = s.variable_scope_unique(outer, "default", o(), |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        Ok((w, d))
    })?;
    assert_eq!(name_of(&store, w), "outer/w");
    assert_eq!(name_of(&store, d), "outer/default/w");
    store.reenter_scope(&outer, Reuse::Reuse, |s, outer| {
        assert_eq!(s.get_variable(outer, scalar("w"))?, w);
        outer.reuse_variables();
        // `default` again: counts made inside a re-entered scope are
        // forgotten when it exits.
        let d2 = s.variable_scope_unique(outer, "default", o(), |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        assert_eq!(d2, d);
        Ok(())
    })
}

#[test]
fn var_op_scope_nested_outer_scope() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let (outer, w, d) = store.variable_scope(&r, "outer", o(), |s, outer| {
        let captured = outer.clone();
        let w = s.reenter_scope(&captured, o(), |s, vs| s.get_variable(vs, scalar("w")))?;
        let d = s.variable_scope_unique(outer, "default", o(), |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        Ok((captured, w, d))
    })?;
    assert_eq!(name_of(&store, w), "outer/w");
    assert_eq!(name_of(&store, d), "outer/default/w");
    store.reenter_scope(&outer, Reuse::Reuse, |s, outer| {
        assert_eq!(s.get_variable(outer, scalar("w"))?, w);
        let d2 = s.variable_scope_unique(outer, "default", o(), |s, vs| {
            s.get_variable(vs, scalar("w"))
        })?;
        assert_eq!(d2, d);
        Ok(())
    })
}

#[test]
fn reenter_root_scope_when_auxiliary_name_scope_is_false() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let w = store.reenter_scope(&r, o(), |s, vs| s.get_variable(vs, scalar("w")))?;
    assert_eq!(name_of(&store, w), "w");
    let w1 = store.variable_scope(&r, "outer", o(), |s, _| {
        s.reenter_scope(&r, o(), |s, vs| s.get_variable(vs, scalar("w1")))
    })?;
    assert_eq!(name_of(&store, w1), "w1");
    Ok(())
}

#[test]
fn get_local_var() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let outer = store.variable_scope(&r, "outer", o(), |_, vs| Ok(vs.clone()))?;
    let local = store.reenter_scope(&outer, o(), |s, vs| {
        s.get_local_variable(vs, scalar("w").collections(["foo"]))
    })?;
    assert_eq!(name_of(&store, local), "outer/w");
    assert_eq!(names(store.local_variables(None)?), ["outer/w"]);
    assert_eq!(names(store.collection("foo", None)?), ["outer/w"]);
    assert!(store.trainable_variables(None)?.is_empty());
    assert!(store.global_variables(None)?.is_empty());
    let again = store.reenter_scope(&outer, Reuse::Reuse, |s, vs| {
        s.get_local_variable(vs, scalar("w"))
    })?;
    assert_eq!(again, local);
    Ok(())
}

#[test]
fn get_collection() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    store.get_variable(&r, scalar("a"))?;
    store.get_variable(&r, scalar("b").trainable(false))?;
    for scope in ["foo_", "foo"] {
        store.variable_scope(&r, scope, o(), |s, vs| {
            s.get_variable(vs, scalar("a"))?;
            s.get_variable(vs, scalar("b").trainable(false))?;
            assert_eq!(
                names(s.scope_collection(vs, TRAINABLE_VARIABLES)?),
                [format!("{scope}/a")]
            );
            assert_eq!(
                names(s.scope_collection(vs, GLOBAL_VARIABLES)?),
                [format!("{scope}/a"), format!("{scope}/b")]
            );
            Ok(())
        })?;
    }
    assert_eq!(
        names(store.scope_collection(&r, GLOBAL_VARIABLES)?),
        ["a", "b", "foo_/a", "foo_/b", "foo/a", "foo/b"]
    );
    assert_eq!(
        names(store.scope_collection(&r, TRAINABLE_VARIABLES)?),
        ["a", "foo_/a", "foo/a"]
    );
    // The same by path: `foo` never picks up `foo_`.
    assert_eq!(
        names(store.global_variables(Some("foo"))?),
        ["foo/a", "foo/b"]
    );
    Ok(())
}

#[test]
fn get_trainable_variables_with_get_variable() -> R {
    // The trainable flag part; synchronization does not apply.
    let mut store = VariableStore::new();
    let r = root(&store);
    store.get_variable(&r, scalar("a"))?;
    store.variable_scope(&r, "foo", o(), |s, vs| {
        s.get_variable(vs, scalar("b"))?;
        s.get_variable(vs, scalar("c").trainable(false))?;
        s.get_variable(vs, scalar("e").trainable(true))?;
        assert_eq!(
            names(s.scope_collection(vs, TRAINABLE_VARIABLES)?),
            ["foo/b", "foo/e"]
        );
        Ok(())
    })
}

#[test]
fn get_global_variables() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    store.get_variable(&r, scalar("a"))?;
    store.variable_scope(&r, "foo", o(), |s, vs| {
        s.get_variable(vs, scalar("b"))?;
        assert_eq!(names(s.scope_collection(vs, GLOBAL_VARIABLES)?), ["foo/b"]);
        Ok(())
    })
}

#[test]
fn get_local_variables() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    store.get_variable(&r, scalar("a").collections([LOCAL_VARIABLES]))?;
    store.variable_scope(&r, "foo", o(), |s, vs| {
        s.get_variable(vs, scalar("b").collections([LOCAL_VARIABLES]))?;
        s.get_variable(vs, scalar("c"))?;
        assert_eq!(names(s.scope_collection(vs, LOCAL_VARIABLES)?), ["foo/b"]);
        Ok(())
    })
}

#[test]
fn get_variable_with_initializer_which_takes_no_args() -> R {
    let mut store = VariableStore::new();
    let r = store.root_scope();
    let v = store.get_variable(
        &r,
        VarSpec::new("foo").initializer(Initializer::from_fn(|| vec![2_i32])),
    )?;
    assert_eq!(name_of(&store, v), "foo");
    assert_eq!(store.tree().get::<Vec<i32>>(v)?, &[2]);
    Ok(())
}

#[test]
fn get_variable_with_initializer_which_takes_unprovided_args_and_no_shape() -> R {
    let mut store = VariableStore::new();
    let r = store.root_scope();
    let init = Initializer::with_shape(|_: &[usize]| vec![2_i32]);
    let err = store
        .get_variable(&r, VarSpec::new("foo").initializer(init.clone()))
        .unwrap_err();
    assert!(matches!(err, Error::ShapeRequired { .. }));
    // A partly known shape is not enough either.
    let err = store
        .get_variable(
            &r,
            VarSpec::new("foo")
                .shape(Shape::from_dims([None]))
                .initializer(init),
        )
        .unwrap_err();
    assert!(matches!(err, Error::ShapeRequired { .. }));
    assert_eq!(store.tree().var_count(), 0);
    Ok(())
}

// ----- class VariableScopeWithCustomGetterTest -----------------------------

fn counting_getter(counter: &Arc<AtomicUsize>) -> CustomGetter {
    let c = Arc::clone(counter);
    CustomGetter::new(move |store, args, next| {
        c.fetch_add(1, Ordering::Relaxed);
        next.get(store, args)
    })
}

#[test]
fn no_side_effects_with_identity_custom_getter() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let called = Arc::new(AtomicUsize::new(0));
    let getter = counting_getter(&called);
    let (scope, v) =
        store.variable_scope(&r, "scope", o().custom_getter(getter.clone()), |s, vs| {
            Ok((vs.clone(), s.get_variable(vs, vec1("v"))?))
        })?;
    // The getter travels with the captured scope.
    let v2 = store.reenter_scope(&scope, Reuse::Reuse, |s, vs| s.get_variable(vs, vec1("v")))?;
    let (new_scope, v3) = store.variable_scope(&r, "new_scope", o(), |s, vs| {
        Ok((vs.clone(), s.get_variable(vs, vec1("v3"))?))
    })?;
    let v4 = store.reenter_scope(
        &new_scope,
        o().reuse(Reuse::Reuse).custom_getter(getter),
        |s, vs| s.get_variable(vs, vec1("v3")),
    )?;
    assert_eq!(v, v2);
    assert_eq!(v3, v4);
    assert_eq!(called.load(Ordering::Relaxed), 3);
    Ok(())
}

#[test]
fn custom_getter_with_reuse() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let getter = CustomGetter::new(move |store, args, next| {
        log.lock().unwrap().push(args.reuse);
        next.get(store, args)
    });
    let scope = store.variable_scope(&r, "scope", o().custom_getter(getter), |s, vs| {
        s.get_variable(vs, vec1("v"))?;
        Ok(vs.clone())
    })?;
    store.reenter_scope(&scope, Reuse::Reuse, |s, vs| s.get_variable(vs, vec1("v")))?;
    assert_eq!(*seen.lock().unwrap(), [Reuse::Inherit, Reuse::Reuse]);
    Ok(())
}

/// A getter that creates `<name>/<tag>0` and `<name>/<tag>1` and returns the
/// first (TensorFlow's returns their sum, which is not a stored variable; a
/// getter here must return a handle).
fn splitting_getter(tag: &'static str) -> CustomGetter {
    CustomGetter::new(move |store, args, next| {
        let mut a = args.clone();
        a.name = format!("{}/{tag}0", args.name);
        let first = next.get(store, a)?;
        let mut b = args.clone();
        b.name = format!("{}/{tag}1", args.name);
        next.get(store, b)?;
        Ok(first)
    })
}

#[test]
fn getter_that_creates_two_variables_and_sums_them() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let v = store.variable_scope(
        &r,
        "scope",
        o().custom_getter(splitting_getter("")),
        |s, vs| s.get_variable(vs, VarSpec::<Tensor>::new("v").shape([1, 2, 3])),
    )?;
    let trainable = store.trainable_variables(None)?;
    assert_eq!(names(trainable.clone()), ["scope/v/0", "scope/v/1"]);
    assert_eq!(v, trainable[0].1);
    for (_, t) in &trainable {
        assert_eq!(
            store.tree().get::<Tensor>(*t)?.shape(),
            Shape::new([1, 2, 3])
        );
    }
    Ok(())
}

#[test]
fn nested_custom_getters() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    store.variable_scope(
        &r,
        "prod_scope",
        o().custom_getter(splitting_getter("prod_")),
        |s, p| {
            s.variable_scope(
                p,
                "sum_scope",
                o().custom_getter(splitting_getter("sum_")),
                |s, q| {
                    s.variable_scope(
                        q,
                        "inner_sum_scope",
                        o().custom_getter(splitting_getter("sum_")),
                        |s, vs| s.get_variable(vs, VarSpec::<Tensor>::new("v").shape([1, 2, 3])),
                    )
                },
            )
        },
    )?;
    let got = names(store.trainable_variables(None)?);
    let want: Vec<String> = (0..8)
        .map(|i| {
            format!(
                "prod_scope/sum_scope/inner_sum_scope/v/sum_{}/sum_{}/prod_{}",
                i >> 2,
                (i >> 1) & 1,
                i & 1
            )
        })
        .collect();
    assert_eq!(got, want); // the innermost getter ran first
    Ok(())
}

// ----- class VariableScopeMultithreadedTest ----------------------------------

#[test]
fn two_threads_disjoint_scope_entry() {
    let store = Mutex::new(VariableStore::new());
    std::thread::scope(|t| {
        for i in 0..2 {
            let store = &store;
            t.spawn(move || {
                let mut s = store.lock().unwrap();
                let r = root(&s);
                let out = s.variable_scope(&r, "foo", o(), |s, vs| s.get_variable(vs, scalar("v")));
                match i {
                    0 => assert_eq!(s.full_name(out.unwrap()).unwrap(), "foo/v"),
                    _ => assert!(matches!(out, Err(Error::VariableExists { .. }))),
                }
            })
            .join()
            .unwrap();
        }
    });
}

#[test]
fn two_threads_nested_scope_entry() {
    // Both threads are "inside" `foo` at once: each holds its own captured
    // `VarScope` and locks the shared store only per call.
    let store = Mutex::new(VariableStore::new());
    let paused = Barrier::new(2);
    let first_done = Barrier::new(2);
    std::thread::scope(|t| {
        for i in 0..2 {
            let (store, paused, first_done) = (&store, &paused, &first_done);
            t.spawn(move || {
                let foo = {
                    let mut s = store.lock().unwrap();
                    let r = root(&s);
                    s.variable_scope(&r, "foo", o(), |_, vs| Ok(vs.clone()))
                        .unwrap()
                };
                paused.wait();
                if i == 1 {
                    first_done.wait();
                }
                let out = store.lock().unwrap().get_variable(&foo, scalar("v"));
                if i == 0 {
                    assert!(out.is_ok());
                    first_done.wait();
                } else {
                    assert!(matches!(out, Err(Error::VariableExists { .. })));
                }
            });
        }
    });
}

#[test]
fn reenter_main_scope() -> R {
    let store = Mutex::new(VariableStore::new());
    let main = {
        let mut s = store.lock().unwrap();
        let r = root(&s);
        s.variable_scope(&r, "main", o(), |_, vs| Ok(vs.clone()))?
    };
    std::thread::scope(|t| {
        t.spawn(|| -> R {
            let mut s = store.lock().unwrap();
            let v = s.reenter_scope(&main, o(), |s, m| {
                s.variable_scope(m, "foo", o(), |s, vs| s.get_variable(vs, scalar("v")))
            })?;
            assert_eq!(s.full_name(v)?, "main/foo/v");
            // A new thread starts from the root, not from `main`.
            let r = root(&s);
            let v = s.variable_scope(&r, "bar", o(), |s, vs| s.get_variable(vs, scalar("v")))?;
            assert_eq!(s.full_name(v)?, "bar/v");
            Ok(())
        })
        .join()
        .unwrap()
    })
}

// ----- semantics the TensorFlow source fixes without a dedicated test --------

#[test]
fn reuse_is_sticky_in_sub_scopes() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    store.variable_scope(&r, "a", Reuse::Reuse, |s, a| {
        s.variable_scope(a, "b", Reuse::Inherit, |_, b| {
            assert_eq!(b.reuse(), Reuse::Reuse);
            Ok(())
        })
    })
}

#[test]
fn auto_reuse_overrides_inherited_reuse() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let v = store.variable_scope(&r, "a", Reuse::Reuse, |s, a| {
        s.variable_scope(a, "b", Reuse::AutoReuse, |s, b| {
            assert_eq!(b.reuse(), Reuse::AutoReuse);
            s.get_variable(b, scalar("v"))
        })
    })?;
    assert_eq!(name_of(&store, v), "a/b/v");
    Ok(())
}

#[test]
fn call_site_custom_getter_replaces_scope_chain() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let (scope_calls, call_calls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    store.variable_scope(
        &r,
        "s",
        o().custom_getter(counting_getter(&scope_calls)),
        |s, vs| s.get_variable(vs, scalar("v").custom_getter(counting_getter(&call_calls))),
    )?;
    assert_eq!(scope_calls.load(Ordering::Relaxed), 0);
    assert_eq!(call_calls.load(Ordering::Relaxed), 1);
    Ok(())
}

#[test]
fn on_reuse_initializer_and_trainable_of_the_call_are_ignored() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let v = store.get_variable(&r, scalar("v"))?;
    let again = store.get_variable(
        &r,
        scalar("v")
            .reuse(Reuse::Reuse)
            .trainable(false)
            .initializer(Initializer::with_shape(|_: &[usize]| 9.0_f32)),
    )?;
    assert_eq!(again, v);
    assert_eq!(*store.tree().get::<f32>(v)?, 0.0);
    assert_eq!(store.is_trainable(v)?, Some(true));
    Ok(())
}

#[test]
fn spec_initializer_beats_scope_default_and_trainable_default_is_inherited() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let (a, b) = store.variable_scope(&r, "frozen", o().trainable(false), |s, vs| {
        s.variable_scope(vs, "inner", o(), |s, inner| {
            let a = s.get_variable(inner, scalar("a"))?;
            let b = s.get_variable(
                inner,
                scalar("b")
                    .trainable(true)
                    .initializer(Initializer::with_shape(|_: &[usize]| 1.0_f32)),
            )?;
            Ok((a, b))
        })
    })?;
    assert_eq!(store.is_trainable(a)?, Some(false));
    assert_eq!(store.is_trainable(b)?, Some(true));
    assert_eq!(*store.tree().get::<f32>(b)?, 1.0);
    Ok(())
}

#[test]
fn names_with_slashes_resolve_component_by_component() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let v = store.variable_scope(&r, "enc/layer", o(), |s, vs| {
        assert_eq!(vs.name(), "enc/layer");
        s.get_variable(vs, scalar("w/kernel"))
    })?;
    assert_eq!(name_of(&store, v), "enc/layer/w/kernel");
    assert_eq!(store.variable("enc/layer/w/kernel")?, Some(v));
    assert!(matches!(
        store.variable_scope(&r, "a//b", o(), |_, _| Ok(())),
        Err(Error::Tree(scopetree::Error::InvalidName { .. }))
    ));
    assert!(matches!(
        store.get_variable(&r, scalar("")),
        Err(Error::Tree(scopetree::Error::InvalidName { .. }))
    ));
    Ok(())
}

#[test]
fn get_variable_does_not_search_parents_but_find_var_does() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let w = store.get_variable(&r, scalar("w"))?;
    store.variable_scope(&r, "sub", Reuse::Reuse, |s, sub| {
        // TensorFlow semantics: `sub/w` is a different full name.
        assert!(matches!(
            s.get_variable(sub, scalar("w")),
            Err(Error::VariableMissing { .. })
        ));
        // Paddle semantics, on the same tree: the parent's `w` is found.
        assert_eq!(s.tree().find_var(sub.place(), "w")?, Some(w));
        Ok(())
    })
}

/// The full-name index checks a hit against the variable's name symbol and
/// that symbol's generation. A variable renamed away from `w`, whose old
/// name is freed and whose symbol slot is reused by the names it is renamed
/// through, must never be found at `enc/w` again; renamed back, it is.
#[test]
fn the_full_name_index_never_answers_for_a_renamed_variable() -> R {
    let mut store = VariableStore::new();
    let r = root(&store);
    let (enc, v) = store.variable_scope(&r, "enc", o(), |s, vs| {
        Ok((vs.place(), s.get_variable(vs, scalar("w"))?))
    })?;
    assert_eq!(store.variable("enc/w")?, Some(v));
    let mut current = "w".to_owned();
    // Enough renames that `w` is freed by a sweep of idle names and every
    // free symbol slot, `w`'s among them, is handed out again.
    for i in 0..5_000 {
        let next = format!("n{i}");
        assert_eq!(
            store
                .tree_mut()
                .rename(enc, current.as_str(), next.as_str())?,
            v
        );
        current = next;
        assert_eq!(store.variable("enc/w")?, None, "after {i} renames");
        assert_eq!(store.variable(&format!("enc/{current}"))?, Some(v));
    }
    store.tree_mut().rename(enc, current.as_str(), "w")?;
    assert_eq!(store.variable("enc/w")?, Some(v));
    Ok(())
}
