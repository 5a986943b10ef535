//! Human-readable dumps of a tree or subtree: an indented text form (Paddle's
//! `GenScopeTreeDebugInfo`) and a Graphviz DOT graph.

use std::fmt::{self, Write};

use slotmap::Key;

use crate::arena::{ScopeId, ScopeKey, SlotLabel};
use crate::error::Error;
use crate::tree::ScopeTree;

/// Deeper scopes than this are not indented further; their line starts with
/// `[depth N]` instead, so that a dump of a very deep chain stays linear in
/// size.
const MAX_INDENT: usize = 32;

/// An indented text dump of a subtree; format it with `{}`. Made by
/// [`ScopeTree::dump`].
///
/// Each scope is a line `scope NAME` (the first one with its full path),
/// followed by one line per variable, `NAME: TYPE` or `NAME: <uninitialised>`,
/// and then its kids, indented two spaces per level.
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let enc = tree.new_named_scope(tree.root(), "encoder")?;
/// let w = tree.var(enc, "w")?;
/// tree.set(w, 0.5_f32)?;
/// tree.var(tree.root(), "lr")?;
/// let text = tree.dump(tree.root())?.to_string();
/// assert_eq!(
///     text,
///     "scope <root>\n  lr: <uninitialised>\n  scope encoder\n    w: f32\n"
/// );
/// # Ok::<(), scopetree::Error>(())
/// ```
pub struct Dump<'a> {
    tree: &'a ScopeTree,
    top: ScopeId,
}

/// A Graphviz DOT graph of a subtree; format it with `{}`. Made by
/// [`ScopeTree::to_dot`].
///
/// One box per scope, labelled with its name and its variables; one edge per
/// parent-kid link.
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// tree.new_named_scope(tree.root(), "encoder")?;
/// let dot = tree.to_dot(tree.root())?.to_string();
/// assert!(dot.starts_with("digraph scopetree {"));
/// assert!(dot.contains("encoder"));
/// assert!(dot.contains("->"));
/// # Ok::<(), scopetree::Error>(())
/// ```
pub struct Dot<'a> {
    tree: &'a ScopeTree,
    top: ScopeId,
}

impl ScopeTree {
    /// An indented dump of `scope` and everything below it. O(size of the
    /// subtree, variables included, + depth of `scope`, for the full path on
    /// its first line) when formatted; iterative.
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// tree.var(tree.root(), "w")?;
    /// println!("{}", tree.dump(tree.root())?);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn dump(&self, scope: ScopeId) -> Result<Dump<'_>, Error> {
        self.check_scope(scope)?;
        Ok(Dump {
            tree: self,
            top: scope,
        })
    }

    /// A Graphviz DOT graph of `scope` and everything below it. O(size of the
    /// subtree + depth of `scope`, for the top label's full path) when
    /// formatted; iterative.
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let tree = ScopeTree::new();
    /// # let tmp = tempfile::tempdir().unwrap();
    /// # let dir = tmp.path();
    /// std::fs::write(dir.join("tree.dot"), tree.to_dot(tree.root())?.to_string()).unwrap();
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn to_dot(&self, scope: ScopeId) -> Result<Dot<'_>, Error> {
        self.check_scope(scope)?;
        Ok(Dot {
            tree: self,
            top: scope,
        })
    }

    /// Writes the variables of `key`, one per line, each after `prefix`.
    fn write_vars(&self, f: &mut impl Write, key: ScopeKey, prefix: &str) -> fmt::Result {
        let Some(slot) = self.arena().scope(key) else {
            return Ok(());
        };
        for e in slot.vars().iter() {
            let ty = self
                .arena()
                .var(e.var)
                .and_then(|v| v.value_type_name())
                .map_or_else(
                    || "<uninitialised>".to_owned(),
                    crate::error::short_type_name,
                );
            writeln!(f, "{prefix}{}: {ty}", self.arena().names().text(e.sym))?;
        }
        Ok(())
    }

    /// The label of one scope: the full path for the top, else its component.
    fn scope_label(&self, key: ScopeKey, is_top: bool) -> String {
        if is_top {
            let path = self.path_of(key);
            if path.is_empty() {
                "<root>".to_owned()
            } else {
                path
            }
        } else {
            let mut s = String::new();
            self.arena().structure().push_component(&mut s, key);
            s
        }
    }
}

impl fmt::Display for Dump<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Ok(walk) = self.tree.descendants(self.top) else {
            return Ok(());
        };
        let mut indent = String::new();
        for (id, depth) in walk {
            indent.clear();
            let shown = depth.min(MAX_INDENT);
            for _ in 0..shown {
                indent.push_str("  ");
            }
            if depth > MAX_INDENT {
                write!(indent, "[depth {depth}] ")?;
            }
            let label = self.tree.scope_label(id.key, id == self.top);
            writeln!(f, "{indent}scope {label}")?;
            indent.push_str("  ");
            self.tree.write_vars(f, id.key, &indent)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Dump<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Escapes text for a double-quoted DOT label.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn node_id(key: ScopeKey) -> String {
    format!("s{}", SlotLabel(key.data()))
}

impl fmt::Display for Dot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Ok(walk) = self.tree.descendants(self.top) else {
            return Ok(());
        };
        writeln!(f, "digraph scopetree {{")?;
        writeln!(f, "  node [shape=box, fontname=\"monospace\"];")?;
        for (id, _) in walk {
            let key = id.key;
            let mut label = self.tree.scope_label(key, id == self.top);
            let mut vars = String::new();
            self.tree.write_vars(&mut vars, key, "")?;
            if !vars.is_empty() {
                label.push('\n');
                label.push_str(vars.trim_end());
            }
            writeln!(f, "  {} [label=\"{}\"];", node_id(key), escape(&label))?;
            if id != self.top {
                if let Some(parent) = self.tree.arena().parent(key) {
                    writeln!(f, "  {} -> {};", node_id(parent), node_id(key))?;
                }
            }
        }
        writeln!(f, "}}")
    }
}

impl fmt::Debug for Dot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
