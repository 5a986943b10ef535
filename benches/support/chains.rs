//! Fixtures shared by the benches: a chain of scopes of a given depth, built
//! the same way in `scopetree` and in the Paddle-style baseline.
//!
//! Level `i` (the root is level 0) holds [`VARS_PER_SCOPE`] variables named
//! `v{i}_0` … `v{i}_3`, and the scope at level `i >= 1` is named `s{i}`. So a
//! lookup of `v0_0` from the deepest scope is a hit at the root, `v{d}_0` a hit
//! in the current scope, and `absent` a miss that walks the whole chain.
//! Names differ from level to level, the harder case for a name signature
//! (an RNN whose step scopes all reuse the same names is easier).

#![allow(dead_code)]

use std::hash::BuildHasher;
use std::sync::Arc;

use scopetree::{ScopeId, ScopeTree};

use super::paddle_style::Scope;

/// Variables per level of a chain.
pub const VARS_PER_SCOPE: usize = 4;

/// The depths every depth group measures.
pub const DEPTHS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// Name of variable `j` of level `level`.
pub fn var_name(level: usize, j: usize) -> String {
    format!("v{level}_{j}")
}

/// Name of the scope at level `level` (>= 1).
pub fn scope_name(level: usize) -> String {
    format!("s{level}")
}

/// A `scopetree` chain of `depth` named scopes under the root; `scopes[i]` is
/// the scope at level `i`.
pub fn scopetree_chain(depth: usize) -> (ScopeTree, Vec<ScopeId>) {
    let mut tree = ScopeTree::new();
    let mut scopes = vec![tree.root()];
    for level in 0..=depth {
        let s = scopes[level];
        for j in 0..VARS_PER_SCOPE {
            let v = tree.var(s, var_name(level, j)).unwrap();
            tree.set(v, level as f32).unwrap();
        }
        if level < depth {
            scopes.push(tree.new_named_scope(s, scope_name(level + 1)).unwrap());
        }
    }
    (tree, scopes)
}

/// A chain like [`scopetree_chain`] in which every scope on the path also has
/// `siblings` other named kids (`x0`, `x1`, …), created before the kid the
/// path goes through, so that the path's kid is the last of `siblings + 1`.
pub fn scopetree_wide_chain(depth: usize, siblings: usize) -> (ScopeTree, Vec<ScopeId>) {
    let mut tree = ScopeTree::new();
    let mut scopes = vec![tree.root()];
    for level in 0..=depth {
        let s = scopes[level];
        for j in 0..VARS_PER_SCOPE {
            let v = tree.var(s, var_name(level, j)).unwrap();
            tree.set(v, level as f32).unwrap();
        }
        if level < depth {
            for x in 0..siblings {
                tree.new_named_scope(s, format!("x{x}")).unwrap();
            }
            scopes.push(tree.new_named_scope(s, scope_name(level + 1)).unwrap());
        }
    }
    (tree, scopes)
}

/// The full name of the variable `v{d}_0` at the bottom of a chain of depth
/// `d`: `s1/s2/…/s{d}/v{d}_0`.
pub fn full_name(depth: usize) -> String {
    let mut out = String::new();
    for level in 1..=depth {
        out.push_str(&scope_name(level));
        out.push('/');
    }
    out.push_str(&var_name(depth, 0));
    out
}

/// The same chain in the Paddle-style baseline; `scopes[i]` is level `i`.
pub fn paddle_chain<S: BuildHasher + Default>(depth: usize) -> Vec<Arc<Scope<S>>> {
    let mut scopes = vec![Scope::<S>::new_root()];
    for level in 0..=depth {
        for j in 0..VARS_PER_SCOPE {
            scopes[level].set(&var_name(level, j), level as f32);
        }
        if level < depth {
            let kid = scopes[level].new_scope();
            scopes.push(kid);
        }
    }
    scopes
}
