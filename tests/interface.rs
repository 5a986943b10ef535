//! Seed 000's orthogonal interface: strict create, absence is not an error,
//! get-or-create, delete a variable; plus name validation and symbols.

use scopetree::{Error, InvalidNameReason, ScopeTree};

#[test]
fn strict_create_fails_on_a_local_conflict_only() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let kid = tree.new_scope(root)?;
    let w = tree.create_var(root, "w")?;
    let err = tree.create_var(root, "w").unwrap_err();
    assert_eq!(
        err,
        Error::NameTaken {
            name: "w".into(),
            scope: String::new()
        }
    );
    // The same name in a kid is not a conflict: it shadows.
    let kw = tree.create_var(kid, "w")?;
    assert_ne!(kw, w);
    assert_eq!(tree.find_var(kid, "w")?, Some(kw));
    Ok(())
}

#[test]
fn absence_is_none_not_an_error() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    assert_eq!(tree.find_var(root, "never_seen")?, None);
    tree.intern("seen_but_unused")?;
    assert_eq!(tree.find_var(root, "seen_but_unused")?, None);
    assert_eq!(tree.find_local_var(root, "never_seen")?, None);
    assert_eq!(tree.find_scope(root, "never_seen")?, None);
    assert_eq!(tree.kid(root, "never_seen")?, None);
    Ok(())
}

#[test]
fn get_or_create_returns_the_same_handle() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let a = tree.var(root, "a")?;
    assert_eq!(tree.var(root, "a")?, a);
    assert_eq!(tree.var_count(), 1);
    // get-or-create is local: in a kid it creates a shadowing variable.
    let kid = tree.new_scope(root)?;
    let ka = tree.var(kid, "a")?;
    assert_ne!(ka, a);
    assert_eq!(tree.var_count(), 2);
    Ok(())
}

#[test]
fn delete_variable_by_handle() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let kid = tree.new_scope(root)?;
    let outer = tree.var(root, "a")?;
    let inner = tree.var(kid, "a")?;
    tree.remove_var(inner)?;
    // The parent's variable is visible again.
    assert_eq!(tree.find_var(kid, "a")?, Some(outer));
    assert_eq!(tree.remove_var(inner), Err(Error::StaleVar { var: inner }));
    Ok(())
}

#[test]
fn names_are_validated_everywhere() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let empty = Error::InvalidName {
        name: String::new(),
        reason: InvalidNameReason::Empty,
    };
    assert_eq!(tree.var(root, ""), Err(empty.clone()));
    assert_eq!(tree.create_var(root, "").unwrap_err(), empty);
    assert_eq!(tree.find_var(root, "").unwrap_err(), empty);
    let sep = tree.var(root, "enc/w").unwrap_err();
    assert!(matches!(
        sep,
        Error::InvalidName {
            reason: InvalidNameReason::ContainsSeparator,
            ..
        }
    ));
    assert!(sep.to_string().contains("\"enc/w\""), "{sep}");
    assert!(tree.new_named_scope(root, "a/b").is_err());
    assert!(tree.unique_var(root, "").is_err());
    assert!(tree.rename(root, "x", "").is_err());
    assert_eq!(tree.var_count(), 0);
    assert_eq!(tree.scope_count(), 1);
    Ok(())
}

#[test]
fn any_other_text_is_a_valid_name() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    for name in ["w@GRAD", "поток", "重み", " ", "a.b:c", "🦀"] {
        let v = tree.create_var(root, name)?;
        assert_eq!(tree.var_name(v)?, name);
        assert_eq!(tree.find_var(root, name)?, Some(v));
    }
    Ok(())
}

#[test]
fn symbols_and_strings_name_the_same_variable() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let sym = tree.intern("w")?;
    let by_sym = tree.var(root, sym)?;
    assert_eq!(tree.find_var(root, "w")?, Some(by_sym));
    let by_ref: &scopetree::Symbol = &sym;
    assert_eq!(tree.find_var(root, by_ref)?, Some(by_sym));
    assert_eq!(tree.symbol("w"), Some(sym));
    assert_eq!(tree.resolve(sym)?, "w");
    Ok(())
}

#[test]
fn symbols_from_another_tree_are_foreign() -> scopetree::Result<()> {
    let mut a = ScopeTree::new();
    let mut b = ScopeTree::new();
    let sym_b = b.intern("w")?;
    a.var(a.root(), "w")?;
    let err = a.find_var(a.root(), sym_b).unwrap_err();
    assert_eq!(
        err,
        Error::ForeignSymbol {
            symbol: sym_b,
            tree: a.tag()
        }
    );
    assert!(a.resolve(sym_b).is_err());
    assert!(a.var(a.root(), sym_b).is_err());
    Ok(())
}

#[test]
fn named_scopes_are_unique_among_siblings() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let a = tree.new_named_scope(root, "tower")?;
    let err = tree.new_named_scope(root, "tower").unwrap_err();
    assert!(matches!(err, Error::ScopeNameTaken { .. }));
    // Same name under another parent is fine.
    let b = tree.new_named_scope(a, "tower")?;
    assert_eq!(tree.path(b)?, "tower/tower");
    assert_eq!(tree.kid(root, "tower")?, Some(a));
    assert_eq!(tree.scope_name(b)?, Some("tower"));
    // After deletion the name is free again.
    tree.delete_scope(a)?;
    assert_eq!(tree.kid(root, "tower")?, None);
    let c = tree.new_named_scope(root, "tower")?;
    assert_ne!(c, a);
    Ok(())
}

#[test]
fn counts_track_the_tree() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let s = tree.new_scope(root)?;
    for i in 0..10 {
        tree.var(s, format!("v{i}"))?;
    }
    tree.var(root, "w")?;
    assert_eq!((tree.scope_count(), tree.var_count()), (2, 11));
    assert_eq!(tree.kid_count(root)?, 1);
    tree.delete_scope(s)?;
    assert_eq!((tree.scope_count(), tree.var_count()), (1, 1));
    Ok(())
}

#[test]
fn the_root_cannot_be_deleted() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    tree.var(root, "w")?;
    assert_eq!(tree.delete_scope(root), Err(Error::RootScope));
    assert!(tree.contains_scope(root));
    assert_eq!(tree.var_count(), 1);
    Ok(())
}

#[test]
fn wide_scopes_switch_to_a_hash_index_transparently() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let kid = tree.new_scope(root)?;
    let ids: Vec<_> = (0..200)
        .map(|i| tree.create_var(root, format!("p{i}")))
        .collect::<Result<_, _>>()?;
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(tree.find_var(kid, format!("p{i}").as_str())?, Some(*id));
    }
    // Erase, rename and re-create through the index.
    assert_eq!(tree.erase_vars(root, ["p5", "p150"])?, 2);
    assert_eq!(tree.find_var(kid, "p5")?, None);
    tree.rename(root, "p6", "p5")?;
    assert_eq!(tree.find_var(root, "p5")?, Some(ids[6]));
    assert_eq!(tree.find_var(root, "p6")?, None);
    let names: Vec<_> = tree.local_var_names(root)?.take(7).collect();
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4", "p5", "p7"]);
    assert_eq!(tree.local_var_count(root)?, 198);
    Ok(())
}

#[test]
fn ancestors_depth_and_paths() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let a = tree.new_named_scope(root, "a")?;
    let b = tree.new_scope(a)?;
    let c = tree.new_named_scope(b, "c")?;
    assert_eq!(tree.ancestors(c)?.collect::<Vec<_>>(), [c, b, a, root]);
    assert_eq!(tree.depth(c)?, 3);
    let p = tree.path(c)?;
    assert!(p.starts_with("a/#") && p.ends_with("/c"), "{p}");
    let w = tree.var(c, "w")?;
    assert_eq!(tree.var_path(w)?, format!("{p}/w"));
    Ok(())
}
