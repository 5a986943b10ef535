//! Paddle's own `scope_test.cc` and `variable_test.cc` behaviours, ported.
//!
//! Each test names the Paddle test it ports. Paddle compares raw pointers; here
//! handles are compared, and a stale handle can never equal a live one.

use scopetree::{Error, ScopeTree};

/// `TEST(Scope, VarsShadowing)`: a kid's variable shadows its parent's, and a
/// sibling still sees the parent's.
#[test]
fn vars_shadowing() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let s = tree.root();
    let ss1 = tree.new_scope(s)?;
    let ss2 = tree.new_scope(s)?;

    let v0 = tree.var(s, "a")?;
    let v1 = tree.var(ss1, "a")?;
    assert_ne!(v0, v1);

    assert_eq!(tree.find_var(s, "a")?, Some(v0));
    assert_eq!(tree.find_var(ss1, "a")?, Some(v1));
    assert_eq!(tree.find_var(ss2, "a")?, Some(v0));
    Ok(())
}

/// `TEST(Scope, FindVar)`: a name is found in the scope that holds it and
/// below, never above.
#[test]
fn find_var_from_child_scope_only() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let s = tree.root();
    let ss = tree.new_scope(s)?;
    assert_eq!(tree.find_var(s, "a")?, None);
    assert_eq!(tree.find_var(ss, "a")?, None);

    let a = tree.var(ss, "a")?;
    assert_eq!(tree.find_var(s, "a")?, None);
    assert_eq!(tree.find_var(ss, "a")?, Some(a));
    Ok(())
}

/// `TEST(Scope, FindScope)`: the owning scope is found from the scope itself
/// and from a kid, by handle and by name.
#[test]
fn find_scope_by_handle_and_by_name() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let s = tree.root();
    let ss = tree.new_scope(s)?;
    let v = tree.var(s, "a")?;

    assert_eq!(tree.owner(v)?, s);
    assert_eq!(tree.find_scope(s, "a")?, Some(s));
    assert_eq!(tree.find_scope(ss, "a")?, Some(s));
    assert_eq!(tree.find_scope(ss, "b")?, None);
    Ok(())
}

/// `TEST(Scope, GetAllNames)`: local names of a scope.
#[test]
fn get_all_names() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let s = tree.root();
    let v = tree.var(s, "a")?;
    assert_eq!(tree.owner(v)?, s);
    let names: String = tree.local_var_names(s)?.collect();
    assert_eq!(names, "a");
    Ok(())
}

/// `LocalVarNames` is not recursive: a kid's names are not listed by the
/// parent, nor the parent's by the kid. Order is creation order here (Paddle's
/// is unspecified).
#[test]
fn local_var_names_are_local_and_ordered() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let s = tree.root();
    let kid = tree.new_scope(s)?;
    for n in ["z", "a", "m"] {
        tree.var(s, n)?;
    }
    tree.var(kid, "k")?;
    assert_eq!(
        tree.local_var_names(s)?.collect::<Vec<_>>(),
        ["z", "a", "m"]
    );
    assert_eq!(tree.local_var_names(kid)?.collect::<Vec<_>>(), ["k"]);
    assert_eq!(tree.local_var_count(s)?, 3);
    Ok(())
}

/// `Scope::GetVar`: absence is an error naming the variable and the scope.
#[test]
fn get_var_names_variable_and_scope_path() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let enc = tree.new_named_scope(tree.root(), "encoder")?;
    let err = tree.get_var(enc, "w").unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }));
    let msg = err.to_string();
    assert!(msg.contains("`w`") && msg.contains("`encoder`"), "{msg}");
    Ok(())
}

/// `Scope::EraseVars`: listed names go, absent names are ignored, kids are
/// untouched.
#[test]
fn erase_vars_ignores_absent_names() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let s = tree.root();
    let kid = tree.new_scope(s)?;
    let a = tree.var(s, "a")?;
    let b = tree.var(s, "b")?;
    let ka = tree.var(kid, "a")?;
    assert_eq!(tree.erase_vars(s, ["a", "nope"])?, 1);
    assert!(!tree.contains_var(a));
    assert!(tree.contains_var(b));
    assert!(tree.contains_var(ka));
    assert_eq!(tree.find_var(kid, "a")?, Some(ka));
    Ok(())
}

/// `Scope::EraseVarsExcept`: everything local but the kept names goes.
#[test]
fn erase_vars_except_keeps_only_listed() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let s = tree.root();
    let keep = tree.var(s, "keep")?;
    let gone = [tree.var(s, "x")?, tree.var(s, "y")?];
    assert_eq!(tree.erase_vars_except(s, ["keep"])?, 2);
    assert!(tree.contains_var(keep));
    assert!(gone.iter().all(|v| !tree.contains_var(*v)));
    Ok(())
}

/// `Scope::DropKids`: the kids go, the scope and its variables stay.
#[test]
fn drop_kids_keeps_own_variables() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let s = tree.new_scope(tree.root())?;
    let own = tree.var(s, "own")?;
    let k1 = tree.new_scope(s)?;
    let k2 = tree.new_scope(s)?;
    let deep = tree.new_scope(k1)?;
    let kv = tree.var(deep, "v")?;
    tree.drop_kids(s)?;
    assert!(tree.contains_var(own));
    for k in [k1, k2, deep] {
        assert!(!tree.contains_scope(k));
    }
    assert!(!tree.contains_var(kv));
    assert_eq!(tree.kids(s)?.count(), 0);
    // The scope is usable afterwards.
    let k3 = tree.new_scope(s)?;
    assert_eq!(tree.kids(s)?.collect::<Vec<_>>(), [k3]);
    Ok(())
}

/// `Scope::DeleteScope(kid)`: only a direct kid can be deleted through its
/// parent; otherwise `NotAKid` (Paddle: "%p is not found in %p as kid scope").
#[test]
fn delete_kid_requires_a_direct_kid() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let a = tree.new_named_scope(root, "a")?;
    let b = tree.new_named_scope(a, "b")?;
    let err = tree.delete_kid(root, b).unwrap_err();
    assert!(matches!(err, Error::NotAKid { .. }));
    assert!(err.to_string().contains("`a/b`"), "{err}");
    assert!(tree.contains_scope(b));
    tree.delete_kid(a, b)?;
    assert!(!tree.contains_scope(b));
    assert!(tree.has_kid(root, a)?);
    Ok(())
}

/// `Scope::HasKid` and `kids()`: direct kids only, in creation order.
#[test]
fn has_kid_and_kids_in_creation_order() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let kids: Vec<_> = (0..5)
        .map(|_| tree.new_scope(root))
        .collect::<Result<_, _>>()?;
    let grandkid = tree.new_scope(kids[2])?;
    assert_eq!(tree.kids(root)?.collect::<Vec<_>>(), kids);
    assert!(kids.iter().all(|k| tree.has_kid(root, *k).unwrap_or(false)));
    assert!(!tree.has_kid(root, grandkid)?);
    tree.delete_scope(kids[2])?;
    let left: Vec<_> = tree.kids(root)?.collect();
    assert_eq!(left, [kids[0], kids[1], kids[3], kids[4]]);
    Ok(())
}

/// `Scope::HasKid` compares addresses in Paddle, so a kid created at a freed
/// kid's address matches the old pointer. Here the stale handle is an error.
#[test]
fn has_kid_never_matches_a_reused_slot() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let old = tree.new_scope(root)?;
    tree.delete_scope(old)?;
    let new = tree.new_scope(root)?; // reuses the slot
    assert_ne!(old, new);
    assert!(matches!(
        tree.has_kid(root, old),
        Err(Error::StaleScope { .. })
    ));
    assert!(tree.has_kid(root, new)?);
    Ok(())
}

/// `Scope::Rename(origin, new)`: the same variable under a new name; errors
/// when the origin is missing or the new name is taken.
#[test]
fn rename_keeps_the_variable() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let s = tree.root();
    let a = tree.var(s, "a")?;
    tree.set(a, 7_i32)?;
    let b = tree.var(s, "b")?;
    assert_eq!(tree.rename(s, "a", "c")?, a);
    assert_eq!(*tree.get::<i32>(a)?, 7);
    assert_eq!(tree.find_var(s, "a")?, None);
    assert_eq!(tree.find_var(s, "c")?, Some(a));

    assert!(matches!(
        tree.rename(s, "missing", "d"),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        tree.rename(s, "c", "b"),
        Err(Error::NameTaken { .. })
    ));
    assert_eq!(tree.find_var(s, "b")?, Some(b));
    Ok(())
}

/// `Scope::Rename(origin)` in Paddle derives the name from `vars_.size()`, so
/// two renames in a row collide. Here each draws a fresh name.
#[test]
fn rename_unique_never_collides() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let s = tree.root();
    let a = tree.var(s, "a")?;
    let first = tree.rename_unique(s, "a")?.to_owned();
    let second = tree.rename_unique(s, &first)?.to_owned();
    assert_ne!(first, second);
    assert_eq!(tree.var_name(a)?, second);
    Ok(())
}

/// `Scope::Var(std::string*)` in Paddle derives the name from the address and
/// `vars_.size()`, so after an erase it can return an existing variable.
/// Here generated names never repeat.
#[test]
fn unique_var_names_survive_erasure() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let s = tree.root();
    let a = tree.unique_var(s, "tmp")?;
    let b = tree.unique_var(s, "tmp")?;
    tree.remove_var(a)?;
    let c = tree.unique_var(s, "tmp")?;
    assert_ne!(c, b);
    let names: Vec<_> = tree.local_var_names(s)?.collect();
    assert_eq!(names, ["tmp_1", "tmp_2"]);
    // A user-made name in the generator's range is skipped, not reused.
    tree.var(s, "tmp_3")?;
    let d = tree.unique_var(s, "tmp")?;
    assert_eq!(tree.var_name(d)?, "tmp_4");
    Ok(())
}

/// `TEST(Variable, GetMutable)`: a value read back; asking for another type
/// on an initialised variable fails (current Paddle), it does not replace.
#[test]
fn variable_get_mutable() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let v = tree.var(tree.root(), "v")?;
    tree.get_or_insert_with(v, String::new)?.push_str("1234");
    assert_eq!(tree.get::<String>(v)?, "1234");
    let err = tree.get_or_default::<Vec<f32>>(v).unwrap_err();
    assert!(matches!(err, Error::TypeMismatch { .. }));
    assert_eq!(tree.get::<String>(v)?, "1234");
    Ok(())
}

/// The dead half of Paddle's `variable_test.cc`: a `vector<int>` grown through
/// `GetMutable` and read back.
#[test]
fn variable_get_mutable_vector() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let v = tree.var(tree.root(), "v")?;
    let vec = tree.get_or_default::<Vec<i32>>(v)?;
    vec.push(1);
    vec.push(2);
    assert_eq!(tree.get::<Vec<i32>>(v)?, &[1, 2]);
    Ok(())
}

/// `GenScopeTreeDebugInfo`: every scope and its variable names appear; here
/// nested by indentation, with held types.
#[test]
fn dump_lists_scopes_and_variables() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "w")?;
    tree.set(w, vec![1.0_f32])?;
    let enc = tree.new_named_scope(root, "enc")?;
    tree.var(enc, "h")?;
    let anon = tree.new_scope(enc)?;
    tree.var(anon, "x")?;
    let text = tree.dump(root)?.to_string();
    let anon_name = tree.path(anon)?.rsplit('/').next().map(str::to_owned);
    let expected = format!(
        "scope <root>\n  w: Vec<f32>\n  scope enc\n    h: <uninitialised>\n    scope {}\n      x: <uninitialised>\n",
        anon_name.unwrap_or_default()
    );
    assert_eq!(text, expected);

    let sub = tree.dump(enc)?.to_string();
    assert!(
        sub.starts_with("scope enc\n  h: <uninitialised>\n  scope #"),
        "{sub}"
    );
    Ok(())
}

/// The DOT export has one node per scope and one edge per kid link.
#[test]
fn dot_has_a_node_per_scope_and_an_edge_per_link() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let a = tree.new_named_scope(root, "a")?;
    tree.new_scope(a)?;
    tree.new_named_scope(root, "quote\"d")?;
    tree.var(a, "w")?;
    let dot = tree.to_dot(root)?.to_string();
    assert_eq!(dot.matches("[label=").count(), 4);
    assert_eq!(dot.matches(" -> ").count(), 3);
    assert!(dot.contains("quote\\\"d"));
    assert!(dot.trim_end().ends_with('}'));
    Ok(())
}
