//! Every `Error` variant, reached through the public API, with its message
//! checked for the variable's name, the scope's path (or the handle, for stale
//! and foreign handles) and a hint of what to do.

use std::collections::BTreeSet;

use scopetree::{Error, InvalidNameReason, ScopeId, ScopeTree};

/// The variants of `Error` this file must reach (the enum is
/// `#[non_exhaustive]`, so a new variant must be added here by hand).
const ALL_VARIANTS: [&str; 14] = [
    "StaleScope",
    "StaleVar",
    "ForeignScope",
    "ForeignVar",
    "ForeignSymbol",
    "NotFound",
    "NameTaken",
    "ScopeNameTaken",
    "InvalidName",
    "TypeMismatch",
    "Uninitialized",
    "NotAKid",
    "RootScope",
    "AliasedVar",
];

fn variant(e: &Error) -> &'static str {
    match e {
        Error::StaleScope { .. } => "StaleScope",
        Error::StaleVar { .. } => "StaleVar",
        Error::ForeignScope { .. } => "ForeignScope",
        Error::ForeignVar { .. } => "ForeignVar",
        Error::ForeignSymbol { .. } => "ForeignSymbol",
        Error::NotFound { .. } => "NotFound",
        Error::NameTaken { .. } => "NameTaken",
        Error::ScopeNameTaken { .. } => "ScopeNameTaken",
        Error::InvalidName { .. } => "InvalidName",
        Error::TypeMismatch { .. } => "TypeMismatch",
        Error::Uninitialized { .. } => "Uninitialized",
        Error::NotAKid { .. } => "NotAKid",
        Error::RootScope => "RootScope",
        Error::AliasedVar { .. } => "AliasedVar",
        _ => "unknown (a variant added after this test was written)",
    }
}

/// A tree with `encoder/layer_1/<unnamed>` and a few variables.
struct Fixture {
    tree: ScopeTree,
    enc: ScopeId,
    layer: ScopeId,
    step: ScopeId,
    step_path: String,
}

fn fixture() -> Fixture {
    let mut tree = ScopeTree::new();
    let enc = tree.new_named_scope(tree.root(), "encoder").unwrap();
    let layer = tree.new_named_scope(enc, "layer_1").unwrap();
    let step = tree.new_scope(layer).unwrap();
    let step_path = tree.path(step).unwrap();
    assert!(step_path.starts_with("encoder/layer_1/#"), "{step_path}");
    Fixture {
        tree,
        enc,
        layer,
        step,
        step_path,
    }
}

/// Checks a message: it mentions every needle and ends with a hint after `;`
/// or `:` (what to do, or why).
fn check_message(e: &Error, needles: &[&str]) -> String {
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} lacks {n:?}");
    }
    assert!(
        msg.contains(';') || msg.contains(':'),
        "message {msg:?} gives no hint"
    );
    assert!(!msg.is_empty() && !msg.ends_with(' '), "{msg:?}");
    msg
}

#[test]
fn every_variant_is_reached_with_a_useful_message() {
    let mut reached = BTreeSet::new();
    let mut seen = |e: Error| {
        reached.insert(variant(&e));
        e
    };
    let Fixture {
        mut tree,
        enc,
        layer,
        step,
        step_path,
    } = fixture();
    let root = tree.root();

    // StaleScope: a deleted scope, through several entry points.
    let gone = tree.new_scope(layer).unwrap();
    tree.delete_scope(gone).unwrap();
    for e in [
        tree.parent(gone).unwrap_err(),
        tree.new_scope(gone).unwrap_err(),
        tree.var(gone, "w").unwrap_err(),
        tree.find_var(gone, "w").unwrap_err(),
        tree.delete_scope(gone).unwrap_err(),
        tree.dump(gone).map(|_| ()).unwrap_err(),
    ] {
        assert_eq!(e, Error::StaleScope { scope: gone });
        check_message(&seen(e), &[&format!("{gone:?}"), "stale", "deleted"]);
    }

    // StaleVar: an erased variable, and one whose scope was deleted.
    let w = tree.var(step, "w").unwrap();
    tree.remove_var(w).unwrap();
    let e = seen(tree.get::<f32>(w).unwrap_err());
    assert_eq!(e, Error::StaleVar { var: w });
    check_message(&e, &[&format!("{w:?}"), "stale", "find_var"]);
    let inner = tree.new_scope(step).unwrap();
    let h = tree.var(inner, "h").unwrap();
    tree.delete_scope(inner).unwrap();
    for e in [
        tree.set(h, 1_u8).unwrap_err(),
        tree.owner(h).unwrap_err(),
        tree.remove_var(h).unwrap_err(),
        tree.clear(h).unwrap_err(),
    ] {
        assert_eq!(e, Error::StaleVar { var: h });
        seen(e);
    }

    // ForeignScope / ForeignVar / ForeignSymbol: handles of another tree.
    let mut other = ScopeTree::new();
    let o_scope = other.new_scope(other.root()).unwrap();
    let o_var = other.var(o_scope, "w").unwrap();
    let o_sym = other.intern("w").unwrap();
    let e = seen(tree.find_var(o_scope, "w").unwrap_err());
    assert_eq!(
        e,
        Error::ForeignScope {
            scope: o_scope,
            tree: tree.tag()
        }
    );
    check_message(
        &e,
        &[
            &format!("{o_scope:?}"),
            &format!("{:?}", other.tag()),
            &format!("{:?}", tree.tag()),
            "use handles only with the tree",
        ],
    );
    let e = seen(tree.get::<u8>(o_var).unwrap_err());
    assert_eq!(
        e,
        Error::ForeignVar {
            var: o_var,
            tree: tree.tag()
        }
    );
    check_message(
        &e,
        &[
            &format!("{o_var:?}"),
            &format!("{:?}", other.tag()),
            "use handles only",
        ],
    );
    let e = seen(tree.find_var(root, o_sym).unwrap_err());
    assert_eq!(
        e,
        Error::ForeignSymbol {
            symbol: o_sym,
            tree: tree.tag()
        }
    );
    check_message(
        &e,
        &[&format!("{:?}", tree.tag()), "intern names with the tree"],
    );
    assert_eq!(tree.resolve(o_sym).unwrap_err(), e);
    // The foreign tree's own handles still work there.
    assert_eq!(other.find_var(o_scope, "w").unwrap(), Some(o_var));

    // NotFound: a strict lookup, and a rename of a name the scope lacks.
    let e = seen(tree.get_var(step, "bias").unwrap_err());
    assert_eq!(
        e,
        Error::NotFound {
            name: "bias".into(),
            scope: step_path.clone()
        }
    );
    check_message(
        &e,
        &[
            "`bias`",
            &format!("`{step_path}`"),
            "ancestors",
            "create_var",
        ],
    );
    let e = seen(tree.get_var(root, "bias").unwrap_err());
    check_message(&e, &["`bias`", "`<root>`"]);
    tree.var(root, "lr").unwrap();
    let e = tree.rename(layer, "lr", "rate").unwrap_err(); // only the root holds it
    assert_eq!(
        e,
        Error::NotFound {
            name: "lr".into(),
            scope: "encoder/layer_1".into()
        }
    );
    let e = seen(tree.rename_unique(enc, "lr").unwrap_err());
    check_message(&e, &["`lr`", "`encoder`"]);

    // NameTaken: a strict create, and a rename onto a taken name.
    tree.create_var(layer, "w").unwrap();
    tree.create_var(layer, "b").unwrap();
    let e = seen(tree.create_var(layer, "w").unwrap_err());
    assert_eq!(
        e,
        Error::NameTaken {
            name: "w".into(),
            scope: "encoder/layer_1".into()
        }
    );
    check_message(&e, &["`w`", "`encoder/layer_1`", "unique_var"]);
    let e = seen(tree.rename(layer, "b", "w").unwrap_err());
    check_message(&e, &["`w`", "`encoder/layer_1`"]);
    // A name in a parent does not conflict: it is shadowed.
    assert!(tree.create_var(step, "w").is_ok());

    // ScopeNameTaken.
    let e = seen(tree.new_named_scope(enc, "layer_1").unwrap_err());
    assert_eq!(
        e,
        Error::ScopeNameTaken {
            name: "layer_1".into(),
            scope: "encoder".into()
        }
    );
    check_message(&e, &["`layer_1`", "`encoder`", "kid"]);
    let e = seen(tree.new_named_scope(root, "encoder").unwrap_err());
    check_message(&e, &["`encoder`", "`<root>`"]);

    // InvalidName, both reasons, through every kind of entry point.
    let sep = seen(tree.var(layer, "a/b").unwrap_err());
    assert_eq!(
        sep,
        Error::InvalidName {
            name: "a/b".into(),
            reason: InvalidNameReason::ContainsSeparator
        }
    );
    check_message(&sep, &["\"a/b\"", "'/'", "one scope per path component"]);
    let empty = seen(tree.var(layer, "").unwrap_err());
    assert_eq!(
        empty,
        Error::InvalidName {
            name: String::new(),
            reason: InvalidNameReason::Empty
        }
    );
    check_message(&empty, &["\"\"", "empty", "non-empty name"]);

    // TypeMismatch: both types named, short, and the variable and path.
    let p = tree.var(step, "param").unwrap();
    tree.set(p, vec![1.0_f32]).unwrap();
    let e = seen(tree.get::<f32>(p).unwrap_err());
    assert_eq!(
        e,
        Error::TypeMismatch {
            name: "param".into(),
            scope: step_path.clone(),
            expected: std::any::type_name::<f32>(),
            found: std::any::type_name::<Vec<f32>>(),
        }
    );
    check_message(
        &e,
        &["`param`", &step_path, "`Vec<f32>`", "`f32`", "read it as"],
    );
    assert!(!e.to_string().contains("alloc::"), "{e}");
    for e in [
        tree.get_mut::<u8>(p).unwrap_err(),
        tree.take::<u8>(p).unwrap_err(),
        tree.replace(p, 1_u8).unwrap_err(),
        tree.get_or_default::<u8>(p).map(|_| ()).unwrap_err(),
    ] {
        assert!(matches!(e, Error::TypeMismatch { .. }), "{e:?}");
    }
    assert_eq!(
        tree.get::<Vec<f32>>(p).unwrap(),
        &[1.0],
        "failed calls changed the value"
    );

    // TypeMismatch between two types with the same short name: full paths.
    mod a {
        #[derive(Debug)]
        pub struct T;
    }
    mod b {
        #[derive(Debug)]
        pub struct T;
    }
    tree.set(p, a::T).unwrap();
    let msg = tree.get::<b::T>(p).unwrap_err().to_string();
    assert!(msg.contains("a::T") && msg.contains("b::T"), "{msg}");

    // Uninitialized.
    let u = tree.var(root, "u").unwrap();
    let e = seen(tree.get::<u64>(u).unwrap_err());
    assert_eq!(
        e,
        Error::Uninitialized {
            name: "u".into(),
            scope: String::new(),
            expected: "u64"
        }
    );
    check_message(&e, &["`u`", "`<root>`", "`u64`", "set"]);
    assert!(matches!(
        tree.take::<u64>(u),
        Err(Error::Uninitialized { .. })
    ));

    // NotAKid: a grandchild, the root, and a sibling.
    let e = seen(tree.delete_kid(root, layer).unwrap_err());
    assert_eq!(
        e,
        Error::NotAKid {
            kid: "encoder/layer_1".into(),
            scope: String::new()
        }
    );
    check_message(&e, &["`encoder/layer_1`", "`<root>`", "own parent"]);
    assert!(matches!(
        tree.delete_kid(enc, root),
        Err(Error::NotAKid { .. })
    ));
    assert!(matches!(
        tree.delete_kid(step, step),
        Err(Error::NotAKid { .. })
    ));
    assert!(tree.contains_scope(layer) && tree.contains_scope(step));

    // RootScope.
    let e = seen(tree.delete_scope(root).unwrap_err());
    assert_eq!(e, Error::RootScope);
    check_message(&e, &["root scope", "drop_kids"]);
    assert_eq!(tree.scope_count(), 4);

    // AliasedVar.
    let g = tree.var(step, "param@GRAD").unwrap();
    tree.set(p, 1.0_f32).unwrap();
    tree.set(g, 0.5_f32).unwrap();
    let e = seen(
        tree.get_disjoint_mut::<f32, 3>([p, g, p])
            .map(|_| ())
            .unwrap_err(),
    );
    assert_eq!(
        e,
        Error::AliasedVar {
            name: "param".into(),
            scope: step_path.clone()
        }
    );
    check_message(
        &e,
        &[
            "`param`",
            &step_path,
            "more than once",
            "pass each handle once",
        ],
    );
    let [x, y] = tree.get_disjoint_mut::<f32, 2>([p, g]).unwrap();
    *x -= *y;
    assert_eq!(*tree.get::<f32>(p).unwrap(), 0.5);

    let missing: Vec<_> = ALL_VARIANTS
        .iter()
        .filter(|v| !reached.contains(*v))
        .collect();
    assert!(missing.is_empty(), "variants never reached: {missing:?}");
    assert_eq!(reached.len(), ALL_VARIANTS.len(), "{reached:?}");
}

/// Every name-taking call rejects an invalid name with `InvalidName`, before
/// it changes anything, and a stale scope wins over a bad name.
#[test]
fn invalid_names_are_rejected_everywhere_before_any_change() {
    let Fixture {
        mut tree, layer, ..
    } = fixture();
    tree.var(layer, "keep").unwrap();
    tree.var(layer, "tmp").unwrap();
    let (scopes, vars) = (tree.scope_count(), tree.var_count());
    for bad in ["", "a/b", "/", "trailing/", "/leading"] {
        let is_invalid = |r: Result<(), Error>| matches!(r, Err(Error::InvalidName { .. }));
        assert!(is_invalid(tree.var(layer, bad).map(|_| ())), "var {bad:?}");
        assert!(
            is_invalid(tree.create_var(layer, bad).map(|_| ())),
            "create_var"
        );
        assert!(
            is_invalid(tree.unique_var(layer, bad).map(|_| ())),
            "unique_var"
        );
        assert!(
            is_invalid(tree.find_var(layer, bad).map(|_| ())),
            "find_var"
        );
        assert!(
            is_invalid(tree.find_local_var(layer, bad).map(|_| ())),
            "find_local_var"
        );
        assert!(is_invalid(tree.get_var(layer, bad).map(|_| ())), "get_var");
        assert!(
            is_invalid(tree.find_scope(layer, bad).map(|_| ())),
            "find_scope"
        );
        assert!(is_invalid(tree.kid(layer, bad).map(|_| ())), "kid");
        assert!(
            is_invalid(tree.new_named_scope(layer, bad).map(|_| ())),
            "new_named_scope"
        );
        assert!(is_invalid(tree.intern(bad).map(|_| ())), "intern");
        assert!(
            is_invalid(tree.rename(layer, "keep", bad).map(|_| ())),
            "rename new"
        );
        assert!(
            is_invalid(tree.rename(layer, bad, "x").map(|_| ())),
            "rename old"
        );
        assert!(
            is_invalid(tree.rename(layer, "absent", bad).map(|_| ())),
            "rename new, old absent"
        );
        assert!(
            is_invalid(tree.rename_unique(layer, bad).map(|_| ())),
            "rename_unique"
        );
        assert!(
            is_invalid(tree.erase_vars(layer, ["tmp", bad]).map(|_| ())),
            "erase_vars"
        );
        assert!(
            is_invalid(tree.erase_vars_except(layer, ["keep", bad]).map(|_| ())),
            "erase_vars_except"
        );
    }
    assert_eq!((tree.scope_count(), tree.var_count()), (scopes, vars));
    assert_eq!(
        tree.local_var_names(layer).unwrap().collect::<Vec<_>>(),
        ["keep", "tmp"]
    );

    // Precedence: the scope handle is checked before the name.
    let gone = tree.new_scope(layer).unwrap();
    tree.delete_scope(gone).unwrap();
    assert!(matches!(tree.var(gone, ""), Err(Error::StaleScope { .. })));
    assert!(matches!(
        tree.find_var(gone, "a/b"),
        Err(Error::StaleScope { .. })
    ));
}

/// The error type is usable with `?` into `Box<dyn Error + Send + Sync>`,
/// and comparable and clonable for tests like these.
#[test]
fn error_type_is_a_good_citizen() {
    fn assert_traits<E: std::error::Error + Send + Sync + Clone + PartialEq + 'static>() {}
    assert_traits::<Error>();
    fn boxed() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let tree = ScopeTree::new();
        tree.get_var(tree.root(), "nothing")?;
        Ok(())
    }
    let e = boxed().unwrap_err();
    assert!(e.to_string().contains("`nothing`"));
    assert!(e.downcast_ref::<Error>().is_some());
    // Debug output names the variant.
    let dbg = format!("{:?}", Error::RootScope);
    assert_eq!(dbg, "RootScope");
}
