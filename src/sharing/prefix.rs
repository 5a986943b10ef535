//! [`Prefixes`]: the scopes along the last scope path a separated-name walk
//! (the candle store's `get`) resolved, so that the next name sharing a
//! prefix with it (`h.3.attn.k.weight` after `h.3.attn.q.bias`) starts its
//! walk at the deepest shared scope instead of at the root.
//!
//! A cache, never the truth. A scope's path cannot change while the scope
//! lives: scopes are never moved or renamed, and deleting a scope deletes
//! the scopes below it. So a cached scope that is still live, in the same
//! tree, still has the cached path, and one liveness check of the deepest
//! scope used is all a hit needs; a dead or foreign scope sends the walk
//! back to the root.

use crate::arena::{ScopeKey, TreeTag};
use crate::tree::ScopeTree;

/// The last scope path walked, by component.
#[derive(Debug, Default)]
pub(crate) struct Prefixes {
    /// The path, components separated by `sep`.
    text: String,
    sep: u8,
    /// The tree whose scopes `levels` holds.
    tree: Option<TreeTag>,
    /// Per component of `text`: where it ends in `text`, and its scope.
    levels: Vec<(usize, ScopeKey)>,
}

/// Where a walk of a scope path starts.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Start {
    /// The deepest known scope on the path (the root if none).
    pub(crate) key: ScopeKey,
    /// The length of its path in bytes: the walk goes on from there.
    pub(crate) done: usize,
    /// How many cached levels lead to it, for [`Prefixes::record`].
    kept: usize,
}

impl Prefixes {
    /// Where a walk of the scope path `dirs` (components separated by `sep`)
    /// can start: the deepest cached scope whose path is `dirs` or a prefix
    /// of it that ends at a separator. O(len(dirs) + depth).
    #[inline]
    pub(crate) fn start(&self, tree: &ScopeTree, dirs: &str, sep: u8) -> Start {
        let root = Start {
            key: tree.root_key(),
            done: 0,
            kept: 0,
        };
        if self.levels.is_empty() || self.sep != sep || self.tree != Some(tree.tag()) {
            return root;
        }
        let (d, t) = (dirs.as_bytes(), self.text.as_bytes());
        let common = common_prefix(d, t);
        let found = self
            .levels
            .iter()
            .rposition(|&(end, _)| end <= common && (end == d.len() || d[end] == sep));
        match found {
            Some(i) if tree.scope_is_live(self.levels[i].1) => Start {
                key: self.levels[i].1,
                done: self.levels[i].0,
                kept: i + 1,
            },
            _ => root,
        }
    }

    /// Remembers the scopes of `dirs` after a walk that began at `from`
    /// (a [`start`](Self::start) of the same `dirs`, `sep` and tree) and
    /// resolved the rest of the path to `walked` (component ends in `dirs`,
    /// and scopes). O(len(dirs) + depth).
    pub(crate) fn record(
        &mut self,
        tree: &ScopeTree,
        dirs: &str,
        sep: u8,
        from: Start,
        walked: &[(usize, ScopeKey)],
    ) {
        let same = self.tree == Some(tree.tag()) && self.sep == sep;
        self.levels.truncate(if same { from.kept } else { 0 });
        self.levels.extend_from_slice(walked);
        self.text.clear();
        self.text.push_str(dirs);
        self.sep = sep;
        self.tree = Some(tree.tag());
    }
}

/// The length of the longest common prefix of `a` and `b`, compared eight
/// bytes at a time. O(length).
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut done = 0;
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        let word = |c: &[u8]| {
            let mut w = [0_u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        };
        let diff = word(x) ^ word(y);
        if diff != 0 {
            // The lowest set bit is in the first differing byte.
            return done + (diff.trailing_zeros() / 8) as usize;
        }
        done += 8;
    }
    done + a[done..]
        .iter()
        .zip(&b[done..])
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(tree: &mut ScopeTree, path: &[&str]) -> Vec<(usize, ScopeKey)> {
        let mut k = tree.root();
        let mut end = 0;
        let mut out = Vec::new();
        for (i, c) in path.iter().enumerate() {
            k = match tree.kid(k, *c).expect("live") {
                Some(kid) => kid,
                None => tree.new_named_scope(k, *c).expect("made"),
            };
            end += c.len() + usize::from(i > 0);
            out.push((end, k.key));
        }
        out
    }

    /// The word-at-a-time common prefix agrees with a byte loop for every
    /// pair of strings over `ab` of up to 19 bytes (the first difference
    /// in each byte of a word, in the tail, and none).
    #[test]
    fn the_common_prefix_agrees_with_a_byte_loop() {
        let strings: Vec<Vec<u8>> = (0..20)
            .flat_map(|len| {
                (0..len).map(move |flip| {
                    let mut s = vec![b'a'; len];
                    s[flip] = b'b';
                    s
                })
            })
            .chain((0..20).map(|len| vec![b'a'; len]))
            .collect();
        for a in &strings {
            for b in &strings {
                let slow = a.iter().zip(b).take_while(|(x, y)| x == y).count();
                assert_eq!(common_prefix(a, b), slow, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn a_start_is_the_deepest_live_scope_on_a_whole_component_prefix() {
        let mut tree = ScopeTree::new();
        let levels = scope(&mut tree, &["h", "1", "attn"]);
        let mut p = Prefixes::default();
        let from = p.start(&tree, "h.1.attn", b'.');
        assert_eq!(from.done, 0);
        p.record(&tree, "h.1.attn", b'.', from, &levels);
        let at = |p: &Prefixes, tree: &ScopeTree, dirs: &str| {
            let s = p.start(tree, dirs, b'.');
            (s.done, s.key)
        };
        assert_eq!(at(&p, &tree, "h.1.attn"), (8, levels[2].1));
        assert_eq!(at(&p, &tree, "h.1.attn.q"), (8, levels[2].1));
        assert_eq!(at(&p, &tree, "h.1.mlp"), (3, levels[1].1));
        // `h.10` shares the bytes `h.1` but not the component `1`.
        assert_eq!(at(&p, &tree, "h.10.attn"), (1, levels[0].1));
        assert_eq!(at(&p, &tree, "h.1.attnx"), (3, levels[1].1));
        assert_eq!(at(&p, &tree, "x"), (0, tree.root_key()));
        assert_eq!(at(&p, &tree, ""), (0, tree.root_key()));
        // Another separator or another tree: from the root.
        assert_eq!(p.start(&tree, "h/1/attn", b'/').done, 0);
        let other = ScopeTree::new();
        assert_eq!(p.start(&other, "h.1.attn", b'.').done, 0);
        // A deleted scope is never a start.
        tree.delete_scope(tree.scope_id(levels[1].1))
            .expect("deleted");
        assert_eq!(at(&p, &tree, "h.1.attn"), (0, tree.root_key()));
        let again = scope(&mut tree, &["h", "1", "attn"]);
        assert_ne!(again[1].1, levels[1].1);
        assert_eq!(at(&p, &tree, "h.1.attn").0, 0);
    }

    #[test]
    fn a_record_keeps_the_shared_levels_and_replaces_the_rest() {
        let mut tree = ScopeTree::new();
        let a = scope(&mut tree, &["h", "1", "attn"]);
        let b = scope(&mut tree, &["h", "1", "mlp", "fc"]);
        let mut p = Prefixes::default();
        p.record(
            &tree,
            "h.1.attn",
            b'.',
            p.start(&tree, "h.1.attn", b'.'),
            &a,
        );
        let from = p.start(&tree, "h.1.mlp.fc", b'.');
        assert_eq!((from.done, from.kept), (3, 2));
        p.record(&tree, "h.1.mlp.fc", b'.', from, &b[2..]);
        assert_eq!(p.levels, b);
        assert_eq!(p.text, "h.1.mlp.fc");
        let s = p.start(&tree, "h.1.mlp.fc", b'.');
        assert_eq!((s.done, s.key), (10, b[3].1));
    }
}
