//! The gaps of tch-rs and candle that users hit, each an error here, and the
//! sharing layer's behaviour on the arena underneath (deletion, stale and
//! foreign handles).

use scopetree::sharing::{
    self, Initializer, Reuse, ScopeOpts, Shape, VarScope, VarSpec, VariableStore,
};
use scopetree::{Error, VarId};

type R = Result<(), sharing::Error>;

fn w(len: usize) -> VarSpec<Vec<f32>> {
    VarSpec::new("w").initializer(Initializer::from_fn(move || vec![0.5_f32; len]))
}

fn in_scope<T>(
    store: &mut VariableStore,
    name: &str,
    reuse: Reuse,
    f: impl FnOnce(&mut VariableStore, &mut VarScope) -> Result<T, sharing::Error>,
) -> Result<T, sharing::Error> {
    let root = store.root_scope();
    store.variable_scope(&root, name, reuse, f)
}

// ----- peers' gaps ---------------------------------------------------------------

#[test]
fn tch_duplicate_name_is_an_error_not_a_silent_rename() -> R {
    let mut store = VariableStore::new();
    in_scope(&mut store, "linear", Reuse::Inherit, |s, vs| {
        s.get_variable(vs, w(4))
    })?;
    let err = in_scope(&mut store, "linear", Reuse::Inherit, |s, vs| {
        s.get_variable(vs, w(4))
    });
    assert!(
        matches!(err, Err(sharing::Error::VariableExists { ref name, ref scope }) if name == "w" && scope == "linear")
    );
    let msg = err.unwrap_err().to_string();
    assert!(
        msg.contains("Reuse::Reuse") && msg.contains("Reuse::AutoReuse"),
        "{msg}"
    );
    // Nothing like `w_1` or `w__1` appeared.
    let names: Vec<_> = store
        .global_variables(None)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["linear/w"]);
    Ok(())
}

#[test]
fn tch_get_or_create_with_another_shape_is_an_error() -> R {
    let mut store = VariableStore::new();
    let v = in_scope(&mut store, "emb", Reuse::AutoReuse, |s, vs| {
        s.get_variable(vs, w(4).shape([4]))
    })?;
    let err = in_scope(&mut store, "emb", Reuse::AutoReuse, |s, vs| {
        s.get_variable(vs, w(8).shape([8]))
    })
    .unwrap_err();
    match &err {
        sharing::Error::ShapeMismatch {
            name,
            scope,
            expected,
            found,
        } => {
            assert_eq!((name.as_str(), scope.as_str()), ("w", "emb"));
            assert_eq!((expected.as_str(), found.as_str()), ("[8]", "[4]"));
        }
        e => panic!("unexpected {e:?}"),
    }
    assert_eq!(store.tree().get::<Vec<f32>>(v)?.len(), 4);
    // The shape of the *held* value is checked, not a stale record.
    store.tree_mut().set(v, vec![0.0_f32; 8])?;
    let again = in_scope(&mut store, "emb", Reuse::AutoReuse, |s, vs| {
        s.get_variable(vs, w(8).shape([8]))
    })?;
    assert_eq!(again, v);
    Ok(())
}

#[test]
fn tch_get_or_create_with_another_type_is_an_error() -> R {
    let mut store = VariableStore::new();
    in_scope(&mut store, "emb", Reuse::AutoReuse, |s, vs| {
        s.get_variable(vs, w(4))
    })?;
    let err = in_scope(&mut store, "emb", Reuse::AutoReuse, |s, vs| {
        s.get_variable(vs, VarSpec::<Vec<f64>>::new("w"))
    });
    assert!(
        matches!(err, Err(sharing::Error::ShareTypeMismatch { expected, found, .. })
        if expected.contains("f64") && found.contains("f32"))
    );
    Ok(())
}

#[test]
fn candle_missing_name_is_an_error_not_silent_zeros() -> R {
    let mut store = VariableStore::new();
    // Loading (reuse) a name that was never created: an error, nothing made.
    let err = in_scope(&mut store, "encoder", Reuse::Reuse, |s, vs| {
        s.get_variable(vs, VarSpec::<Vec<f32>>::new("weight").shape([4]))
    });
    assert!(
        matches!(err, Err(sharing::Error::VariableMissing { ref name, ref scope }) if name == "weight" && scope == "encoder")
    );
    assert_eq!(store.tree().var_count(), 0);
    // Creating without saying how: an error too, never a default of zeros.
    let err = in_scope(&mut store, "encoder", Reuse::AutoReuse, |s, vs| {
        s.get_variable(vs, VarSpec::<Vec<f32>>::new("weight").shape([4]))
    });
    assert!(matches!(
        err,
        Err(sharing::Error::InitializerRequired { .. })
    ));
    assert_eq!(store.tree().var_count(), 0);
    Ok(())
}

#[test]
fn initializer_whose_value_does_not_fit_the_shape_is_an_error() -> R {
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let err = store.get_variable(&root, w(3).shape([4])).unwrap_err();
    assert!(matches!(err, sharing::Error::InitShapeMismatch { .. }));
    assert_eq!(store.tree().var_count(), 0);
    Ok(())
}

// ----- the arena underneath ------------------------------------------------------

#[test]
fn dropping_a_named_scope_drops_its_variables() -> R {
    let mut store = VariableStore::new();
    let (tower, v) = in_scope(&mut store, "tower", Reuse::Inherit, |s, vs| {
        s.variable_scope(vs, "inner", ScopeOpts::new(), |s, i| {
            s.get_variable(i, w(2))
        })?;
        Ok((vs.clone(), s.get_variable(vs, w(2))?))
    })?;
    let keep = in_scope(&mut store, "keep", Reuse::Inherit, |s, vs| {
        s.get_variable(vs, w(1))
    })?;
    store.delete_scope(tower.place())?;
    assert!(matches!(
        store.tree().get::<Vec<f32>>(v),
        Err(Error::StaleVar { .. })
    ));
    assert_eq!(store.variable("tower/w")?, None);
    let names: Vec<_> = store
        .global_variables(None)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["keep/w"]); // `tower/inner/w` went too
    assert_eq!(store.variable("tower/inner/w")?, None);
    assert_eq!(store.variable("keep/w")?, Some(keep));
    // The captured scope is stale everywhere it is used.
    assert!(matches!(
        store.get_variable(&tower, w(2)),
        Err(sharing::Error::Tree(Error::StaleScope { .. }))
    ));
    assert!(matches!(
        store.reenter_scope(&tower, Reuse::Reuse, |_, _| Ok(())),
        Err(sharing::Error::Tree(Error::StaleScope { .. }))
    ));
    assert!(matches!(
        store.variable_scope(&tower, "x", ScopeOpts::new(), |_, _| Ok(())),
        Err(sharing::Error::Tree(Error::StaleScope { .. }))
    ));
    assert!(matches!(
        store.scope_collection(&tower, "variables"),
        Err(sharing::Error::Tree(Error::StaleScope { .. }))
    ));
    // Entering `tower` by name again makes a new scope and a new variable.
    let v2 = in_scope(&mut store, "tower", Reuse::Inherit, |s, vs| {
        s.get_variable(vs, w(2))
    })?;
    assert_ne!(v2, v);
    assert!(matches!(
        store.tree().get::<Vec<f32>>(v),
        Err(Error::StaleVar { .. })
    ));
    Ok(())
}

#[test]
fn deleting_through_the_tree_keeps_metadata_consistent() -> R {
    let mut store = VariableStore::new();
    let (place, old) = in_scope(&mut store, "a", Reuse::Inherit, |s, vs| {
        Ok((vs.place(), s.get_variable(vs, w(3))?))
    })?;
    // Bypass the store: its metadata for `a/w` is left behind, and must
    // never be read for whatever reuses the slots.
    store.tree_mut().delete_scope(place)?;
    assert!(store.global_variables(None)?.is_empty());
    assert!(matches!(
        store.initial_shape(old),
        Err(sharing::Error::Tree(Error::StaleVar { .. }))
    ));
    let new = in_scope(&mut store, "a", Reuse::Inherit, |s, vs| {
        s.get_variable(
            vs,
            VarSpec::new("w").initializer(Initializer::constant(1_u8)),
        )
    })?;
    assert_eq!(store.initial_shape(new)?, Some(&Shape::scalar()));
    let names: Vec<_> = store
        .global_variables(None)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["a/w"]);
    Ok(())
}

#[test]
fn deleting_many_scopes_keeps_collections_exact() -> R {
    let mut store = VariableStore::new();
    let keep = in_scope(&mut store, "keep", Reuse::Inherit, |s, vs| {
        s.get_variable(vs, w(1))
    })?;
    for round in 0..200 {
        let place = in_scope(&mut store, "step", Reuse::Inherit, |s, vs| {
            s.get_variable(vs, w(1))?;
            s.get_local_variable(
                vs,
                VarSpec::new("n").initializer(Initializer::constant(round)),
            )?;
            Ok(vs.place())
        })?;
        store.delete_scope(place)?;
    }
    let globals: Vec<VarId> = store
        .global_variables(None)?
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(globals, [keep]);
    assert!(store.local_variables(None)?.is_empty());
    Ok(())
}

#[test]
fn scopes_of_another_store_are_foreign() -> R {
    let mut a = VariableStore::new();
    let b = VariableStore::new();
    let rb = b.root_scope();
    assert!(matches!(
        a.get_variable(&rb, w(1)),
        Err(sharing::Error::Tree(Error::ForeignScope { .. }))
    ));
    assert!(matches!(
        a.variable_scope(&rb, "x", ScopeOpts::new(), |_, _| Ok(())),
        Err(sharing::Error::Tree(Error::ForeignScope { .. }))
    ));
    assert_eq!(a.tree().scope_count(), 1);
    Ok(())
}

#[test]
fn root_scope_cannot_be_deleted() {
    let mut store = VariableStore::new();
    let root = store.tree().root();
    assert!(matches!(
        store.delete_scope(root),
        Err(sharing::Error::Tree(Error::RootScope))
    ));
}

#[test]
fn a_variable_made_by_the_tree_is_found_at_its_full_name() -> R {
    let mut store = VariableStore::new();
    let root = store.tree().root();
    let enc = store.tree_mut().new_named_scope(root, "enc")?;
    let raw = store.tree_mut().var(enc, "w")?;
    store.tree_mut().set(raw, vec![1.0_f32; 2])?;
    // Create-only: it exists, so that is an error; reuse: shared, checked.
    assert!(matches!(
        in_scope(&mut store, "enc", Reuse::Inherit, |s, vs| s
            .get_variable(vs, w(2))),
        Err(sharing::Error::VariableExists { .. })
    ));
    let got = in_scope(&mut store, "enc", Reuse::Reuse, |s, vs| {
        s.get_variable(vs, w(2).shape([2]))
    })?;
    assert_eq!(got, raw);
    // It is in no collection: only `get_variable` adds to collections.
    assert!(store.global_variables(None)?.is_empty());
    assert_eq!(store.is_trainable(raw)?, None);
    Ok(())
}
