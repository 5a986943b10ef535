//! Handle lifetimes: stale after delete, after slot reuse (many times, and past
//! slotmap's version wrap), and foreign handles from another tree.

use scopetree::{Error, ScopeId, ScopeTree, VarId};

#[test]
fn handles_into_a_deleted_subtree_are_stale() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let keep = tree.var(root, "keep")?;
    let a = tree.new_scope(root)?;
    let b = tree.new_scope(a)?;
    let c = tree.new_scope(b)?;
    let sibling = tree.new_scope(a)?;
    let vars: Vec<VarId> = [a, b, c, sibling]
        .iter()
        .map(|s| tree.var(*s, "v"))
        .collect::<Result<_, _>>()?;

    tree.delete_scope(a)?;
    for s in [a, b, c, sibling] {
        assert_eq!(tree.parent(s), Err(Error::StaleScope { scope: s }));
        assert_eq!(tree.new_scope(s), Err(Error::StaleScope { scope: s }));
        assert_eq!(
            tree.find_var(s, "keep"),
            Err(Error::StaleScope { scope: s })
        );
        assert!(!tree.contains_scope(s));
    }
    for v in vars {
        assert_eq!(tree.get::<u8>(v), Err(Error::StaleVar { var: v }));
        assert_eq!(tree.set(v, 1_u8), Err(Error::StaleVar { var: v }));
        assert_eq!(tree.var_name(v), Err(Error::StaleVar { var: v }));
        assert_eq!(tree.owner(v), Err(Error::StaleVar { var: v }));
    }
    assert!(tree.contains_var(keep));
    assert_eq!((tree.scope_count(), tree.var_count()), (1, 1));
    Ok(())
}

#[test]
fn stale_handles_never_alias_a_reused_slot() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let mut old_scopes: Vec<ScopeId> = Vec::new();
    let mut old_vars: Vec<VarId> = Vec::new();
    for step in 0..1000_u32 {
        let s = tree.new_scope(root)?;
        let v = tree.var(s, "h")?;
        tree.set(v, step)?;
        // Every earlier handle is stale, though its slot is now `s`'s / `v`'s.
        if let (Some(&ps), Some(&pv)) = (old_scopes.last(), old_vars.last()) {
            assert_ne!(ps, s);
            assert_ne!(pv, v);
            assert_eq!(tree.get::<u32>(pv), Err(Error::StaleVar { var: pv }));
        }
        assert_eq!(*tree.get::<u32>(v)?, step);
        tree.delete_scope(s)?;
        old_scopes.push(s);
        old_vars.push(v);
    }
    for s in &old_scopes {
        assert!(!tree.contains_scope(*s));
    }
    for v in &old_vars {
        assert!(!tree.contains_var(*v));
    }
    Ok(())
}

#[test]
fn a_stale_variable_handle_does_not_see_a_same_named_successor() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let old = tree.var(root, "w")?;
    tree.set(old, 1_i32)?;
    tree.remove_var(old)?;
    let new = tree.var(root, "w")?;
    tree.set(new, 2_i32)?;
    assert_ne!(old, new);
    assert_eq!(tree.get::<i32>(old), Err(Error::StaleVar { var: old }));
    assert_eq!(*tree.get::<i32>(new)?, 2);
    Ok(())
}

#[test]
fn handles_from_another_tree_are_foreign() -> scopetree::Result<()> {
    let mut a = ScopeTree::new();
    let mut b = ScopeTree::new();
    // Same shape in both trees, so the raw slot keys coincide.
    let sa = a.new_scope(a.root())?;
    let sb = b.new_scope(b.root())?;
    let va = a.var(sa, "w")?;
    let vb = b.var(sb, "w")?;
    a.set(va, 1_u8)?;
    b.set(vb, 2_u8)?;

    assert_eq!(
        a.get::<u8>(vb),
        Err(Error::ForeignVar {
            var: vb,
            tree: a.tag()
        })
    );
    assert_eq!(
        a.find_var(sb, "w"),
        Err(Error::ForeignScope {
            scope: sb,
            tree: a.tag()
        })
    );
    assert!(matches!(
        a.delete_scope(sb),
        Err(Error::ForeignScope { .. })
    ));
    assert!(matches!(a.remove_var(vb), Err(Error::ForeignVar { .. })));
    assert!(matches!(
        a.has_kid(a.root(), sb),
        Err(Error::ForeignScope { .. })
    ));
    assert!(!a.contains_scope(sb) && !a.contains_var(vb));
    // Nothing in either tree was touched.
    assert_eq!(*a.get::<u8>(va)?, 1);
    assert_eq!(*b.get::<u8>(vb)?, 2);
    let msg = a.get::<u8>(vb).unwrap_err().to_string();
    assert!(msg.contains("belongs to tree"), "{msg}");
    Ok(())
}

#[test]
fn a_tree_and_its_handles_move_between_threads() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let w = tree.var(tree.root(), "w")?;
    tree.set(w, vec![1.0_f32; 8])?;
    let tree = std::thread::spawn(move || {
        let mut tree = tree;
        tree.get_mut::<Vec<f32>>(w)
            .map(|v| v[0] = 2.0)
            .map(|()| tree)
    })
    .join()
    .expect("the thread holding the tree panicked")?;
    assert_eq!(tree.get::<Vec<f32>>(w)?[0], 2.0);
    Ok(())
}

/// Slotmap versions are 32 bits: after 2^31 reuses of one slot a freed key's
/// version comes round again. The tree retires a slot at its last version
/// instead of freeing it, so the very first handle stays stale. 2^31
/// create/delete cycles take about 65-90 s in release mode on the 2-core CI
/// machine (measured 2026-11-21), far too long in debug. With retirement
/// disabled, this test fails: the next scope gets `first`'s key.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only (2^31 cycles): cargo test --release --test lifetimes"
)]
fn scope_handle_stays_stale_past_the_version_wrap() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let first = tree.new_scope(root)?;
    tree.delete_scope(first)?;
    let mut last = first;
    // Versions of one slot go 1, 3, 5, …, u32::MAX: 2^31 occupations.
    for _ in 1..(1_u64 << 31) {
        last = tree.new_scope(root)?;
        tree.delete_scope(last)?;
    }
    assert_ne!(last, first);
    // `last` occupied the same slot at its final version.
    let (first_dbg, last_dbg) = (format!("{first:?}"), format!("{last:?}"));
    let slot = first_dbg.split('v').next().unwrap_or_default();
    assert!(first_dbg.starts_with(&format!("{slot}v1@")), "{first_dbg}");
    assert!(
        last_dbg.starts_with(&format!("{slot}v4294967295@")),
        "{last_dbg}"
    );
    // Without retirement, these would reuse `first`'s slot at version 1.
    for _ in 0..4 {
        let s = tree.new_scope(root)?;
        assert_ne!(s, first);
        assert!(!tree.contains_scope(first));
        assert_eq!(tree.parent(first), Err(Error::StaleScope { scope: first }));
        assert_eq!(tree.parent(last), Err(Error::StaleScope { scope: last }));
        assert_eq!(tree.parent(s)?, Some(root));
    }
    assert_eq!(tree.scope_count(), 5);
    Ok(())
}
