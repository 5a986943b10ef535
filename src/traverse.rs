//! Iterators over the tree: kids, ancestors, descendants and local variables.
//! All are iterative and allocation-free.

use std::iter::FusedIterator;

use crate::arena::{Entry, KeyWalk, ScopeId, ScopeKey, Structure, VarId};
use crate::error::Error;
use crate::tree::ScopeTree;

/// The direct kids of a scope, in creation order. Made by
/// [`ScopeTree::kids`].
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let a = tree.new_scope(tree.root())?;
/// let kids: scopetree::Kids<'_> = tree.kids(tree.root())?;
/// assert_eq!(kids.collect::<Vec<_>>(), [a]);
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Clone)]
pub struct Kids<'a> {
    walk: KeyWalk<'a>,
}

impl Iterator for Kids<'_> {
    type Item = ScopeId;
    fn next(&mut self) -> Option<ScopeId> {
        let tag = self.walk.tag();
        self.walk.next().map(|k| ScopeId::new(k, tag))
    }
}

impl FusedIterator for Kids<'_> {}

/// A scope and its ancestors up to the root, nearest first. Made by
/// [`ScopeTree::ancestors`].
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let a = tree.new_scope(tree.root())?;
/// let up: scopetree::Ancestors<'_> = tree.ancestors(a)?;
/// assert_eq!(up.collect::<Vec<_>>(), [a, tree.root()]);
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Clone)]
pub struct Ancestors<'a> {
    walk: KeyWalk<'a>,
}

impl Iterator for Ancestors<'_> {
    type Item = ScopeId;
    fn next(&mut self) -> Option<ScopeId> {
        let tag = self.walk.tag();
        self.walk.next().map(|k| ScopeId::new(k, tag))
    }
}

impl FusedIterator for Ancestors<'_> {}

/// A scope and all its descendants in pre-order (a scope before its kids,
/// kids in creation order), with each one's depth below the start. Made by
/// [`ScopeTree::descendants`]. Walks the kid and sibling links without a
/// stack.
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let root = tree.root();
/// let a = tree.new_scope(root)?;
/// let b = tree.new_scope(a)?;
/// let c = tree.new_scope(root)?;
/// let order: Vec<_> = tree.descendants(root)?.collect();
/// assert_eq!(order, [(root, 0), (a, 1), (b, 2), (c, 1)]);
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Clone)]
pub struct Descendants<'a> {
    view: Structure<'a>,
    top: ScopeKey,
    next: Option<ScopeKey>,
    depth: usize,
}

impl Iterator for Descendants<'_> {
    type Item = (ScopeId, usize);
    fn next(&mut self) -> Option<(ScopeId, usize)> {
        let cur = self.next?;
        let item = (ScopeId::new(cur, self.view.tag()), self.depth);
        self.next = match self.view.preorder_next(cur, self.top) {
            Some((next, climbed)) => {
                self.depth = self.depth.saturating_add_signed(-climbed);
                Some(next)
            }
            None => None,
        };
        Some(item)
    }
}

impl FusedIterator for Descendants<'_> {}

/// The local variables of one scope as (name, handle), in creation order.
/// Made by [`ScopeTree::local_vars`].
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// let vars: scopetree::LocalVars<'_> = tree.local_vars(tree.root())?;
/// assert_eq!(vars.collect::<Vec<_>>(), [("w", w)]);
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Clone)]
pub struct LocalVars<'a> {
    tree: &'a ScopeTree,
    /// The table's entries and holes; `remaining` counts the entries left.
    entries: std::slice::Iter<'a, Entry>,
    remaining: usize,
}

impl<'a> Iterator for LocalVars<'a> {
    type Item = (&'a str, VarId);
    fn next(&mut self) -> Option<(&'a str, VarId)> {
        let e = self.entries.by_ref().find(|e| !e.is_hole())?;
        self.remaining -= 1;
        Some(self.item(*e))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl<'a> LocalVars<'a> {
    fn item(&self, e: Entry) -> (&'a str, VarId) {
        (
            self.tree.arena().names().text(e.sym),
            VarId::new(e.var, self.tree.tag()),
        )
    }
}

impl ExactSizeIterator for LocalVars<'_> {}
impl<'a> DoubleEndedIterator for LocalVars<'a> {
    fn next_back(&mut self) -> Option<(&'a str, VarId)> {
        let e = self.entries.by_ref().rev().find(|e| !e.is_hole())?;
        self.remaining -= 1;
        Some(self.item(*e))
    }
}
impl FusedIterator for LocalVars<'_> {}

impl ScopeTree {
    /// The direct kids of `scope`, in creation order. O(1) to create, O(1)
    /// per step.
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let (a, b) = (tree.new_scope(root)?, tree.new_scope(root)?);
    /// assert_eq!(tree.kids(root)?.collect::<Vec<_>>(), [a, b]);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn kids(&self, scope: ScopeId) -> Result<Kids<'_>, Error> {
        let k = self.check_scope(scope)?;
        Ok(Kids {
            walk: self.arena().kids(k),
        })
    }

    /// `scope` itself, then its parent, and so on up to the root. O(1) per
    /// step.
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let b = tree.new_scope(a)?;
    /// assert_eq!(tree.ancestors(b)?.count(), 3);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn ancestors(&self, scope: ScopeId) -> Result<Ancestors<'_>, Error> {
        let k = self.check_scope(scope)?;
        Ok(Ancestors {
            walk: self.arena().parents(k),
        })
    }

    /// `scope` and every scope below it, in pre-order, each with its depth
    /// below `scope`. O(size of the subtree) in all, no allocation.
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// tree.new_scope(a)?;
    /// assert_eq!(tree.descendants(tree.root())?.count(), 3);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn descendants(&self, scope: ScopeId) -> Result<Descendants<'_>, Error> {
        let k = self.check_scope(scope)?;
        Ok(Descendants {
            view: self.arena().structure(),
            top: k,
            next: Some(k),
            depth: 0,
        })
    }

    /// The variables `scope` itself holds, as (name, handle) in creation
    /// order. O(1) per step.
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let w = tree.var(root, "w")?;
    /// let b = tree.var(root, "b")?;
    /// assert_eq!(tree.local_vars(root)?.collect::<Vec<_>>(), [("w", w), ("b", b)]);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn local_vars(&self, scope: ScopeId) -> Result<LocalVars<'_>, Error> {
        let slot = self.scope_slot(scope)?;
        Ok(LocalVars {
            tree: self,
            entries: slot.vars().slots().iter(),
            remaining: slot.vars().len(),
        })
    }

    /// The names of the variables `scope` itself holds, in creation order
    /// (Paddle's `LocalVarNames`). O(1) per step.
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// tree.var(root, "w")?;
    /// tree.var(root, "b")?;
    /// assert_eq!(tree.local_var_names(root)?.collect::<Vec<_>>(), ["w", "b"]);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn local_var_names(
        &self,
        scope: ScopeId,
    ) -> Result<impl ExactSizeIterator<Item = &str> + '_, Error> {
        Ok(self.local_vars(scope)?.map(|(name, _)| name))
    }
}
