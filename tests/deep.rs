//! Deep trees: no operation recurses, so a chain a million scopes deep is
//! created, searched, dumped and deleted without overflowing the stack.

use scopetree::{ScopeId, ScopeTree};

fn chain(tree: &mut ScopeTree, depth: usize) -> scopetree::Result<ScopeId> {
    let mut s = tree.root();
    for _ in 0..depth {
        s = tree.new_scope(s)?;
    }
    Ok(s)
}

/// Runs `f` on a thread with a small stack (256 KiB), so that any recursion
/// proportional to depth would overflow it.
fn on_small_stack(f: impl FnOnce() -> scopetree::Result<()> + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(f)
        .expect("spawn")
        .join()
        .expect("the deep-tree thread panicked")
        .expect("the deep-tree thread returned an error");
}

const DEPTH: usize = if cfg!(debug_assertions) {
    100_000
} else {
    1_000_000
};

#[test]
fn a_deep_chain_is_created_searched_and_deleted() {
    on_small_stack(|| {
        let mut tree = ScopeTree::with_capacity(DEPTH + 1, 4);
        let root = tree.root();
        let w = tree.var(root, "W")?;
        let leaf = chain(&mut tree, DEPTH)?;
        assert_eq!(tree.depth(leaf)?, DEPTH);
        assert_eq!(tree.find_var(leaf, "W")?, Some(w));
        assert_eq!(tree.find_scope(leaf, "W")?, Some(root));
        assert_eq!(tree.find_var(leaf, "missing")?, None);
        assert_eq!(tree.ancestors(leaf)?.count(), DEPTH + 1);
        assert_eq!(tree.descendants(root)?.count(), DEPTH + 1);
        let first = tree.kids(root)?.next().expect("a kid");
        tree.delete_scope(first)?;
        assert_eq!(tree.scope_count(), 1);
        assert!(!tree.contains_scope(leaf));
        assert_eq!(tree.var_count(), 1);
        Ok(())
    });
}

#[test]
fn a_deep_chain_dumps_in_linear_size() {
    on_small_stack(|| {
        let mut tree = ScopeTree::new();
        let leaf = chain(&mut tree, DEPTH / 10)?;
        tree.var(leaf, "x")?;
        let text = tree.dump(tree.root())?.to_string();
        assert_eq!(text.lines().count(), DEPTH / 10 + 2);
        // Indentation is capped, so each line is short.
        assert!(text.lines().all(|l| l.len() < 120));
        assert!(text.contains(&format!("[depth {}]", DEPTH / 10)));
        let dot = tree.to_dot(tree.root())?.to_string();
        assert_eq!(dot.matches(" -> ").count(), DEPTH / 10);
        Ok(())
    });
}

#[test]
fn drop_kids_and_tree_drop_of_a_deep_chain() {
    on_small_stack(|| {
        let mut tree = ScopeTree::new();
        let root = tree.root();
        chain(&mut tree, DEPTH)?;
        tree.drop_kids(root)?;
        assert_eq!(tree.scope_count(), 1);
        // Dropping a whole deep tree must not recurse either.
        chain(&mut tree, DEPTH)?;
        drop(tree);
        Ok(())
    });
}

#[test]
fn a_wide_and_deep_tree_deletes_every_scope_and_variable() -> scopetree::Result<()> {
    // A complete 4-ary tree of depth 7 (21,845 scopes), 2 variables each.
    let mut tree = ScopeTree::new();
    let top = tree.new_scope(tree.root())?;
    let mut level = vec![top];
    let mut total = 1;
    for _ in 0..7 {
        let mut next = Vec::new();
        for &s in &level {
            for _ in 0..4 {
                let k = tree.new_scope(s)?;
                tree.var(k, "a")?;
                tree.var(k, "b")?;
                next.push(k);
            }
        }
        total += next.len();
        level = next;
    }
    assert_eq!(tree.descendants(top)?.count(), total);
    assert_eq!(tree.scope_count(), total + 1);
    assert_eq!(tree.var_count(), 2 * (total - 1));
    tree.delete_scope(top)?;
    assert_eq!((tree.scope_count(), tree.var_count()), (1, 0));
    assert!(level.iter().all(|s| !tree.contains_scope(*s)));
    Ok(())
}
