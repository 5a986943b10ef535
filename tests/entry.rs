//! `ScopeTree::var_entry`: get-or-create in one lookup. An entry sees the
//! scope's own variables only, interns nothing until an insert, and a failed
//! call changes nothing.

use scopetree::{Error, ScopeTree, VarEntry};

#[test]
fn a_vacant_entry_becomes_an_occupied_one_after_an_insert() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let VarEntry::Vacant(e) = tree.var_entry(root, "w").unwrap() else {
        panic!("a new tree holds no variable");
    };
    assert_eq!(*e.name(), "w");
    let (w, value) = e.insert(vec![1.0_f32, 2.0]).unwrap();
    value.push(3.0);
    assert_eq!(tree.get::<Vec<f32>>(w).unwrap(), &[1.0, 2.0, 3.0]);
    assert_eq!(tree.var_name(w).unwrap(), "w");
    assert_eq!(tree.owner(w).unwrap(), root);
    match tree.var_entry(root, "w").unwrap() {
        VarEntry::Occupied(e) => {
            assert_eq!(e.id(), w);
            assert_eq!(e.get::<Vec<f32>>().unwrap().len(), 3);
        }
        VarEntry::Vacant(_) => panic!("w was inserted"),
    }
    assert_eq!(tree.var_count(), 1);
}

#[test]
fn or_insert_with_makes_the_value_once_and_keeps_it() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let mut calls = 0;
    for _ in 0..5 {
        let n = tree
            .var_entry(root, "steps")
            .unwrap()
            .or_insert_with(|| {
                calls += 1;
                0_u64
            })
            .unwrap();
        *n += 1;
    }
    assert_eq!(calls, 1);
    let steps = tree.get_var(root, "steps").unwrap();
    assert_eq!(*tree.get::<u64>(steps).unwrap(), 5);
    assert_eq!(tree.var_count(), 1);
}

#[test]
fn or_insert_with_fills_an_existing_uninitialised_variable() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "w").unwrap();
    assert!(!tree.is_initialized(w).unwrap());
    let value = tree
        .var_entry(root, "w")
        .unwrap()
        .or_insert_with(|| 7_i32)
        .unwrap();
    assert_eq!(*value, 7);
    assert_eq!(tree.get::<i32>(w).unwrap(), &7);
}

#[test]
fn a_value_of_another_type_is_an_error_and_changes_nothing() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "w").unwrap();
    tree.set(w, vec![1.0_f32]).unwrap();
    let mut called = false;
    let err = tree
        .var_entry(root, "w")
        .unwrap()
        .or_insert_with(|| {
            called = true;
            1_u8
        })
        .unwrap_err();
    assert!(matches!(err, Error::TypeMismatch { .. }), "{err}");
    assert!(!called, "init ran for an occupied variable");
    assert_eq!(tree.get::<Vec<f32>>(w).unwrap(), &[1.0]);
    let VarEntry::Occupied(e) = tree.var_entry(root, "w").unwrap() else {
        panic!("w exists");
    };
    assert!(matches!(
        e.into_mut::<u8>(),
        Err(Error::TypeMismatch { .. })
    ));
    assert_eq!(tree.get::<Vec<f32>>(w).unwrap(), &[1.0]);
}

#[test]
fn an_entry_sees_only_the_scope_itself_as_var_does() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let parent_w = tree.var(root, "w").unwrap();
    let kid = tree.new_named_scope(root, "kid").unwrap();
    let entry = tree.var_entry(kid, "w").unwrap();
    assert_eq!(entry.id(), None, "the parent's w is not the kid's");
    let kid_w = entry.or_create().unwrap();
    assert_ne!(kid_w, parent_w);
    assert_eq!(tree.owner(kid_w).unwrap(), kid);
    assert_eq!(tree.find_var(kid, "w").unwrap(), Some(kid_w));
    assert_eq!(tree.var(kid, "w").unwrap(), kid_w);
}

#[test]
fn remove_through_an_entry_makes_the_handle_stale() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "w").unwrap();
    tree.set(w, 1_u32).unwrap();
    let VarEntry::Occupied(e) = tree.var_entry(root, "w").unwrap() else {
        panic!("w exists");
    };
    e.remove().unwrap();
    assert!(!tree.contains_var(w));
    assert!(matches!(tree.get::<u32>(w), Err(Error::StaleVar { .. })));
    assert_eq!(tree.var_entry(root, "w").unwrap().id(), None);
}

#[test]
fn symbols_name_entries_as_text_does() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let sym = tree.intern("w").unwrap();
    let w = tree.var_entry(root, sym).unwrap().or_create().unwrap();
    assert_eq!(tree.var_entry(root, "w").unwrap().id(), Some(w));
    assert_eq!(tree.var_entry(root, &sym).unwrap().id(), Some(w));
}

#[test]
fn bad_names_and_scopes_are_errors_and_change_nothing() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let kid = tree.new_named_scope(root, "kid").unwrap();
    let before = tree.dump(root).unwrap().to_string();
    for bad in ["", "a/b", "/"] {
        let err = tree.var_entry(root, bad).unwrap_err();
        assert!(matches!(err, Error::InvalidName { .. }), "{bad:?}: {err}");
    }
    assert_eq!(tree.dump(root).unwrap().to_string(), before);
    tree.delete_scope(kid).unwrap();
    let after_delete = tree.dump(root).unwrap().to_string();
    assert!(matches!(
        tree.var_entry(kid, "w"),
        Err(Error::StaleScope { .. })
    ));
    let other = ScopeTree::new();
    assert!(matches!(
        tree.var_entry(other.root(), "w"),
        Err(Error::ForeignScope { .. })
    ));
    assert_eq!(tree.dump(root).unwrap().to_string(), after_delete);
    assert_ne!(before, after_delete);
    assert_eq!(tree.var_count(), 0);
}

#[test]
fn looking_up_a_new_name_interns_nothing() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    for i in 0..100 {
        assert_eq!(
            tree.var_entry(root, format!("never_{i}")).unwrap().id(),
            None
        );
    }
    assert_eq!(tree.symbol("never_0"), None);
    assert_eq!(tree.symbol("never_99"), None);
    // An insert interns its name.
    let w = tree.var_entry(root, "kept").unwrap().or_create().unwrap();
    assert!(tree.symbol("kept").is_some());
    assert_eq!(tree.var_name(w).unwrap(), "kept");
}
