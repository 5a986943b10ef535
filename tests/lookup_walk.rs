//! The lookup walk reads the dense parent and signature arrays: these tests
//! check that those arrays follow every change that affects a lookup (slot
//! reuse, erase, rename, deletion) and that deep and wide trees still resolve.

use scopetree::ScopeTree;

#[test]
fn a_reused_slot_starts_with_a_fresh_parent_and_no_names() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let a = tree.new_scope(root).unwrap();
    let b = tree.new_scope(a).unwrap();
    tree.var(b, "x").unwrap();
    let w = tree.var(a, "w").unwrap();
    tree.delete_scope(b).unwrap();
    // The new scope takes b's slot, under the root this time.
    let c = tree.new_scope(root).unwrap();
    assert_eq!(tree.parent(c).unwrap(), Some(root));
    assert_eq!(tree.find_var(c, "x").unwrap(), None);
    assert_eq!(tree.find_var(c, "w").unwrap(), None);
    assert_eq!(tree.find_var(a, "w").unwrap(), Some(w));
    assert_eq!(tree.path(c).unwrap().matches('/').count(), 0);
}

#[test]
fn erase_and_rename_update_what_a_walk_sees() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w_root = tree.var(root, "w").unwrap();
    let mid = tree.new_scope(root).unwrap();
    let leaf = tree.new_scope(mid).unwrap();
    let w_mid = tree.var(mid, "w").unwrap();
    assert_eq!(tree.find_var(leaf, "w").unwrap(), Some(w_mid));

    tree.rename(mid, "w", "v").unwrap();
    assert_eq!(tree.find_var(leaf, "w").unwrap(), Some(w_root));
    assert_eq!(tree.find_var(leaf, "v").unwrap(), Some(w_mid));
    assert_eq!(tree.find_scope(leaf, "v").unwrap(), Some(mid));

    tree.erase_vars(mid, ["v"]).unwrap();
    assert_eq!(tree.find_var(leaf, "v").unwrap(), None);
    tree.remove_var(w_root).unwrap();
    assert_eq!(tree.find_var(leaf, "w").unwrap(), None);
}

#[test]
fn every_level_of_a_deep_chain_is_found_from_the_bottom() {
    let mut tree = ScopeTree::new();
    let mut s = tree.root();
    let mut vars = Vec::new();
    for level in 0..300 {
        vars.push(tree.var(s, format!("v{level}").as_str()).unwrap());
        s = tree.new_scope(s).unwrap();
    }
    for (level, v) in vars.iter().enumerate() {
        assert_eq!(
            tree.find_var(s, format!("v{level}").as_str()).unwrap(),
            Some(*v)
        );
    }
    assert_eq!(tree.ancestors(s).unwrap().count(), 301);
}

#[test]
fn a_walk_through_a_wide_scope_with_a_hash_index() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "W").unwrap();
    let wide = tree.new_scope(root).unwrap();
    let xs: Vec<_> = (0..1000)
        .map(|i| tree.var(wide, format!("x{i}").as_str()).unwrap())
        .collect();
    let leaf = tree.new_scope(wide).unwrap();
    assert_eq!(tree.find_var(leaf, "W").unwrap(), Some(w));
    assert_eq!(tree.find_var(leaf, "x999").unwrap(), Some(xs[999]));
    tree.erase_vars_except(wide, ["x7"]).unwrap();
    assert_eq!(tree.find_var(leaf, "x999").unwrap(), None);
    assert_eq!(tree.find_var(leaf, "x7").unwrap(), Some(xs[7]));
}
