//! [`ScopeTree`]: the public face of the arena. Handles in, handles out;
//! every call checks its handles, builds its errors, and leaves the
//! bookkeeping to the arena (`crate::arena`).

use std::fmt;

use crate::arena::Sym;
use crate::arena::{Arena, ScopeId, ScopeKey, Symbol, TreeTag, VarId, VarSlot, resume};
use crate::error::Error;
use crate::names::{Name, NameRef, validate_name};

/// A tree of scopes holding named, typed variables, all in one generational
/// arena.
///
/// A new tree has one scope, the [root](ScopeTree::root). Every other scope has
/// a parent; a variable belongs to exactly one scope. Lookups with
/// [`find_var`](ScopeTree::find_var) walk from a scope up to the root, so a
/// step scope sees the parameters of the model scope above it, and a name in a
/// kid shadows the same name in a parent.
///
/// Handles ([`ScopeId`], [`VarId`]) are `Copy` keys, never references: after
/// [`delete_scope`](ScopeTree::delete_scope) every handle into the deleted
/// subtree reports [`Error::StaleScope`] or [`Error::StaleVar`] and never
/// aliases a newer scope or variable, even once the slot has been reused, and
/// even after 2^31 reuses of one slot (such a slot is retired; see
/// `docs/design.md`).
///
/// `ScopeTree` is `Send + Sync`: share `&ScopeTree` between threads to read.
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let root = tree.root();
/// let w = tree.var(root, "W")?;
/// tree.set(w, vec![0.5_f32; 4])?;
///
/// let step = tree.new_scope(root)?;
/// let h = tree.var(step, "h")?;
/// assert_eq!(tree.find_var(step, "W")?, Some(w)); // found in the parent
///
/// tree.delete_scope(step)?;
/// assert!(tree.get::<f32>(h).is_err()); // stale, not dangling
/// assert_eq!(tree.get::<Vec<f32>>(w)?.len(), 4);
/// # Ok::<(), scopetree::Error>(())
/// ```
pub struct ScopeTree {
    arena: Arena,
    /// The counter behind [`unique_var`](ScopeTree::unique_var) names.
    unique_counter: u64,
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ScopeTree>();
};

impl Default for ScopeTree {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ScopeTree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopeTree")
            .field("tag", &self.tag())
            .field("scopes", &self.scope_count())
            .field("vars", &self.var_count())
            .field("names", &self.arena.names().len())
            .finish()
    }
}

impl ScopeTree {
    /// Creates a tree holding only its root scope. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let tree = ScopeTree::new();
    /// assert_eq!(tree.scope_count(), 1);
    /// assert_eq!(tree.var_count(), 0);
    /// ```
    pub fn new() -> Self {
        Self::with_capacity(1, 0)
    }

    /// Creates a tree with room for `scopes` scopes and `vars` variables
    /// before its arenas reallocate.
    ///
    /// The capacities are hints, clamped to the most slots an arena can index
    /// (2^32 − 2). As with `Vec::with_capacity`, an allocation the system
    /// cannot satisfy aborts the process; it does not panic.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let tree = ScopeTree::with_capacity(1024, 8192);
    /// assert_eq!(tree.scope_count(), 1);
    /// ```
    pub fn with_capacity(scopes: usize, vars: usize) -> Self {
        ScopeTree {
            arena: Arena::with_capacity(scopes, vars),
            unique_counter: 0,
        }
    }

    /// The tag carried by every handle of this tree.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let tree = ScopeTree::new();
    /// assert_eq!(tree.root().tree(), tree.tag());
    /// ```
    pub fn tag(&self) -> TreeTag {
        self.arena.tag()
    }

    /// The root scope. It lives as long as the tree. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let tree = ScopeTree::new();
    /// assert_eq!(tree.parent(tree.root())?, None);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn root(&self) -> ScopeId {
        ScopeId::new(self.arena.root(), self.tag())
    }

    /// Number of live scopes, the root included. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// tree.new_scope(tree.root())?;
    /// assert_eq!(tree.scope_count(), 2);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn scope_count(&self) -> usize {
        self.arena.scope_count()
    }

    /// Number of live variables in the whole tree. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// tree.var(tree.root(), "w")?;
    /// assert_eq!(tree.var_count(), 1);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn var_count(&self) -> usize {
        self.arena.var_count()
    }

    /// Whether `scope` is a live scope of this tree (`false` for stale or
    /// foreign handles). O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let s = tree.new_scope(tree.root())?;
    /// tree.delete_scope(s)?;
    /// assert!(!tree.contains_scope(s));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn contains_scope(&self, scope: ScopeId) -> bool {
        self.scope_slot(scope).is_ok()
    }

    /// Whether `var` is a live variable of this tree (`false` for stale or
    /// foreign handles). O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// assert!(tree.contains_var(w));
    /// tree.remove_var(w)?;
    /// assert!(!tree.contains_var(w));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn contains_var(&self, var: VarId) -> bool {
        self.var_slot(var).is_ok()
    }

    // ----- handle checks --------------------------------------------------

    /// Resolves a scope handle, or says why it cannot be resolved.
    #[inline]
    pub(crate) fn scope_slot(&self, scope: ScopeId) -> Result<&crate::arena::ScopeSlot, Error> {
        if scope.tree != self.tag() {
            return Err(Error::ForeignScope {
                scope,
                tree: self.tag(),
            });
        }
        match self.arena.scope(scope.key) {
            Some(slot) => Ok(slot),
            None => Err(Error::StaleScope { scope }),
        }
    }

    /// Checks a scope handle and returns its key.
    #[inline]
    pub(crate) fn check_scope(&self, scope: ScopeId) -> Result<ScopeKey, Error> {
        self.scope_slot(scope).map(|_| scope.key)
    }

    /// Resolves a variable handle, or says why it cannot be resolved.
    #[inline]
    pub(crate) fn var_slot(&self, var: VarId) -> Result<&VarSlot, Error> {
        self.check_var_tag(var)?;
        match self.arena.var(var.key) {
            Some(slot) => Ok(slot),
            None => Err(Error::StaleVar { var }),
        }
    }

    #[inline]
    fn check_var_tag(&self, var: VarId) -> Result<(), Error> {
        if var.tree == self.tag() {
            Ok(())
        } else {
            Err(Error::ForeignVar {
                var,
                tree: self.tag(),
            })
        }
    }

    /// Like [`var_slot`](Self::var_slot) but lets a retired slot through; the
    /// caller must treat `owner.is_null()` as stale. Used by the value fast
    /// path, where a retired slot's empty value already leads to the slow path.
    #[inline]
    pub(crate) fn var_slot_unretired(&self, var: VarId) -> Result<&VarSlot, Error> {
        self.check_var_tag(var)?;
        // A `match`, not `ok_or`: an eagerly built error is dropped on every
        // successful read, a call on the hot path of `get`.
        match self.arena.var_slot_any(var.key) {
            Some(slot) => Ok(slot),
            None => Err(Error::StaleVar { var }),
        }
    }

    /// Mutable [`var_slot`](Self::var_slot).
    #[inline]
    pub(crate) fn var_slot_mut(&mut self, var: VarId) -> Result<&mut VarSlot, Error> {
        self.check_var_tag(var)?;
        match self.arena.var_mut(var.key) {
            Some(slot) => Ok(slot),
            None => Err(Error::StaleVar { var }),
        }
    }

    /// The arena, for the layers' crate-internal API.
    #[inline]
    pub(crate) fn arena(&self) -> &Arena {
        &self.arena
    }

    /// The arena, mutably, for the layers' crate-internal API.
    #[inline]
    pub(crate) fn arena_mut(&mut self) -> &mut Arena {
        &mut self.arena
    }

    // ----- names ------------------------------------------------------------

    /// Interns `name` in this tree and returns its [`Symbol`], which later
    /// calls accept in place of the string to skip hashing it. O(len(name));
    /// allocates only the first time a name is seen.
    ///
    /// An interned name is pinned: it stays in the tree's name table for the
    /// tree's lifetime, so its symbol never goes stale. Names that only
    /// scopes and variables carry are freed with their last carrier.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for an empty name or one containing `/`.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.intern("w")?;
    /// assert_eq!(tree.intern("w")?, w);
    /// assert!(tree.intern("a/b").is_err());
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn intern(&mut self, name: &str) -> Result<Symbol, Error> {
        validate_name(name)?;
        let idx = self.arena.intern(name);
        self.arena.pin(idx);
        Ok(self.symbol_of(idx))
    }

    /// The symbol of `name` if a scope or variable of the tree carries that
    /// name or it was [interned](Self::intern), without interning it.
    /// O(len(name)).
    ///
    /// A symbol got here stays valid while the name is in use; once no scope
    /// or variable carries it (and it was never interned) the name is freed and
    /// the symbol reports [`Error::StaleSymbol`]. Use [`intern`](Self::intern)
    /// for a symbol that never goes stale.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// assert_eq!(tree.symbol("w"), None);
    /// let w = tree.intern("w")?;
    /// assert_eq!(tree.symbol("w"), Some(w));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn symbol(&self, name: &str) -> Option<Symbol> {
        self.arena.names().get(name).map(|idx| self.symbol_of(idx))
    }

    pub(crate) fn symbol_of(&self, idx: Sym) -> Symbol {
        Symbol {
            idx,
            generation: self.arena.names().generation(idx),
            tree: self.tag(),
        }
    }

    /// The text of a symbol. O(1).
    ///
    /// # Errors
    /// [`Error::ForeignSymbol`] if `sym` was interned by another tree;
    /// [`Error::StaleSymbol`] if its name was freed (see
    /// [`symbol`](Self::symbol)).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let sym = tree.intern("bias")?;
    /// assert_eq!(tree.resolve(sym)?, "bias");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn resolve(&self, sym: Symbol) -> Result<&str, Error> {
        self.check_symbol(sym)?;
        Ok(self.arena.names().text(sym.idx))
    }

    #[inline]
    fn check_symbol(&self, sym: Symbol) -> Result<Sym, Error> {
        if sym.tree != self.tag() {
            Err(Error::ForeignSymbol {
                symbol: sym,
                tree: self.tag(),
            })
        } else if !self.arena.names().is_current(sym.idx, sym.generation) {
            Err(Error::StaleSymbol { symbol: sym })
        } else {
            Ok(sym.idx)
        }
    }

    /// The symbol index of a name for a lookup: `Ok(None)` if the name is
    /// not interned, so it cannot be anywhere in the tree.
    #[inline]
    pub(crate) fn lookup_name(&self, name: NameRef<'_>) -> Result<Option<Sym>, Error> {
        match name {
            NameRef::Str(s) => self.lookup_str(s),
            NameRef::Sym(sym) => self.check_symbol(sym).map(Some),
        }
    }

    /// The text half of [`lookup_name`](Self::lookup_name), out of line so
    /// the symbol half inlines into the lookups.
    #[inline(never)]
    fn lookup_str(&self, s: &str) -> Result<Option<Sym>, Error> {
        validate_name(s)?;
        Ok(self.arena.names().get(s))
    }

    /// The symbol index of a name for a create, interning it if new. The
    /// caller records the use by creating a scope or variable with it (a
    /// create that fails after interning fails on a name already in use).
    #[inline]
    pub(crate) fn intern_name(&mut self, name: NameRef<'_>) -> Result<Sym, Error> {
        match name {
            NameRef::Str(s) => self.intern_str(s),
            NameRef::Sym(sym) => self.check_symbol(sym),
        }
    }

    /// The text half of [`intern_name`](Self::intern_name), kept out of line
    /// so the symbol half inlines into its callers.
    #[inline(never)]
    fn intern_str(&mut self, s: &str) -> Result<Sym, Error> {
        validate_name(s)?;
        Ok(self.arena.intern(s))
    }

    /// Like [`intern_name`](Self::intern_name), and pins the name, for a layer
    /// that keeps the symbol across calls (step variables).
    pub(crate) fn intern_pinned(&mut self, name: NameRef<'_>) -> Result<Sym, Error> {
        let idx = self.intern_name(name)?;
        self.arena.pin(idx);
        Ok(idx)
    }

    /// The text of a name, for messages (cut to a bounded length). A foreign
    /// or stale symbol shows as its debug form.
    pub(crate) fn name_text(&self, name: NameRef<'_>) -> String {
        match name {
            NameRef::Str(s) => crate::short::name(s),
            NameRef::Sym(sym) if self.check_symbol(sym).is_ok() => {
                crate::short::name(self.arena.names().text(sym.idx))
            }
            NameRef::Sym(sym) => format!("{sym:?}"),
        }
    }

    // ----- structure ----------------------------------------------------------

    /// Creates an unnamed kid of `parent`, after its existing kids. O(1).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for a bad `parent`.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let b = tree.new_scope(a)?;
    /// assert_eq!(tree.depth(b)?, 2);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn new_scope(&mut self, parent: ScopeId) -> Result<ScopeId, Error> {
        let p = self.check_scope(parent)?;
        Ok(ScopeId::new(self.arena.insert_scope(p, None), self.tag()))
    }

    /// Creates a kid of `parent` named `name`, after its existing kids. A named
    /// scope can be found again with [`kid`](Self::kid) and shows its name in
    /// paths and dumps. O(1) amortised after hashing the name: the name check
    /// walks at most 8 kids of `parent`, or probes the tree's index of named
    /// kids once `parent` has a named kid past its first 8 kids.
    ///
    /// # Errors
    /// [`Error::ScopeNameTaken`] if a kid of `parent` already has that name;
    /// [`Error::InvalidName`]; [`Error::StaleScope`] or
    /// [`Error::ForeignScope`] for a bad `parent`.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let enc = tree.new_named_scope(tree.root(), "encoder")?;
    /// assert_eq!(tree.path(enc)?, "encoder");
    /// assert!(tree.new_named_scope(tree.root(), "encoder").is_err());
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn new_named_scope(&mut self, parent: ScopeId, name: impl Name) -> Result<ScopeId, Error> {
        let p = self.check_scope(parent)?;
        let name = name.as_name_ref();
        let sym = self.intern_name(name)?;
        if self.arena.kid_by_sym(p, sym).is_some() {
            return Err(Error::ScopeNameTaken {
                name: self.name_text(name),
                scope: self.arena.error_path(p),
            });
        }
        Ok(ScopeId::new(
            self.arena.insert_scope(p, Some(sym)),
            self.tag(),
        ))
    }

    /// The kid of `parent` named `name`, if any. O(1) after hashing the name
    /// (no hashing of text when `name` is a [`Symbol`]), however many kids
    /// `parent` has: a walk of at most 8 of its kids, or one probe of the
    /// tree's index of named kids once `parent` has a named kid past its
    /// first 8 kids.
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let enc = tree.new_named_scope(tree.root(), "encoder")?;
    /// assert_eq!(tree.kid(tree.root(), "encoder")?, Some(enc));
    /// assert_eq!(tree.kid(tree.root(), "decoder")?, None);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn kid(&self, parent: ScopeId, name: impl Name) -> Result<Option<ScopeId>, Error> {
        let p = self.check_scope(parent)?;
        let Some(sym) = self.lookup_name(name.as_name_ref())? else {
            return Ok(None);
        };
        Ok(self
            .arena
            .kid_by_sym(p, sym)
            .map(|k| ScopeId::new(k, self.tag())))
    }

    /// The name of a scope made with [`new_named_scope`](Self::new_named_scope);
    /// `None` for unnamed scopes and the root. O(1).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let enc = tree.new_named_scope(tree.root(), "encoder")?;
    /// assert_eq!(tree.scope_name(enc)?, Some("encoder"));
    /// assert_eq!(tree.scope_name(tree.root())?, None);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn scope_name(&self, scope: ScopeId) -> Result<Option<&str>, Error> {
        let slot = self.scope_slot(scope)?;
        Ok(slot.name().map(|sym| self.arena.names().text(sym)))
    }

    /// The parent of `scope`; `None` for the root. O(1).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let s = tree.new_scope(tree.root())?;
    /// assert_eq!(tree.parent(s)?, Some(tree.root()));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn parent(&self, scope: ScopeId) -> Result<Option<ScopeId>, Error> {
        let k = self.check_scope(scope)?;
        Ok(self.arena.parent(k).map(|p| ScopeId::new(p, self.tag())))
    }

    /// The depth of `scope`: 0 for the root, 1 for its kids, and so on. O(1).
    /// (A depth is stored in 31 bits: below 2^31 − 2 it is exact, and a tree
    /// that deep would need 256 GiB of scope slots.)
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let s = tree.new_scope(tree.root())?;
    /// assert_eq!(tree.depth(s)?, 1);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn depth(&self, scope: ScopeId) -> Result<usize, Error> {
        Ok(self.scope_slot(scope)?.depth().unwrap_or(0) as usize)
    }

    /// Whether `kid` is a direct kid of `parent`. O(1).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for either handle.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let b = tree.new_scope(a)?;
    /// assert!(tree.has_kid(a, b)?);
    /// assert!(!tree.has_kid(tree.root(), b)?);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn has_kid(&self, parent: ScopeId, kid: ScopeId) -> Result<bool, Error> {
        let p = self.check_scope(parent)?;
        Ok(self.arena.parent(self.check_scope(kid)?) == Some(p))
    }

    /// Number of direct kids of `scope`. O(number of kids).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// tree.new_scope(tree.root())?;
    /// tree.new_scope(tree.root())?;
    /// assert_eq!(tree.kid_count(tree.root())?, 2);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn kid_count(&self, scope: ScopeId) -> Result<usize, Error> {
        Ok(self.kids(scope)?.count())
    }

    /// The path of `scope` from the root: kid names joined by `/`, with an
    /// unnamed scope shown by its slot as `#3v1`; `""` for the root.
    /// O(depth).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let enc = tree.new_named_scope(tree.root(), "encoder")?;
    /// let l1 = tree.new_named_scope(enc, "layer_1")?;
    /// assert_eq!(tree.path(l1)?, "encoder/layer_1");
    /// assert_eq!(tree.path(tree.root())?, "");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn path(&self, scope: ScopeId) -> Result<String, Error> {
        let k = self.check_scope(scope)?;
        Ok(self.arena.path(k))
    }

    /// The path of a live scope key (see [`path`](Self::path)).
    pub(crate) fn path_of(&self, key: ScopeKey) -> String {
        self.arena.path(key)
    }

    /// The path of `key` as an error keeps it: cut in the middle when long
    /// (see `short::path`), so that an error stays small however deep the
    /// scope. O(depth).
    pub(crate) fn error_path(&self, key: ScopeKey) -> String {
        self.arena.error_path(key)
    }

    // ----- deletion ---------------------------------------------------------------

    /// Deletes `scope`, all its descendants and all their variables. Every
    /// handle into the deleted subtree reports stale from now on.
    ///
    /// O(size of the subtree), iterative (no recursion, no allocation), and
    /// independent of how many siblings `scope` has.
    ///
    /// # Errors
    /// [`Error::RootScope`] for the root; [`Error::StaleScope`] or
    /// [`Error::ForeignScope`].
    ///
    /// # Panics
    /// Only if a value's own `Drop` panics. That panic is passed on once the
    /// whole subtree is deleted, so the tree stays consistent and usable.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let b = tree.new_scope(a)?;
    /// let v = tree.var(b, "v")?;
    /// tree.delete_scope(a)?;
    /// assert!(!tree.contains_scope(b));
    /// assert!(!tree.contains_var(v));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn delete_scope(&mut self, scope: ScopeId) -> Result<(), Error> {
        let k = self.check_scope(scope)?;
        if k == self.arena.root() {
            return Err(Error::RootScope);
        }
        resume(self.arena.delete_subtree(k));
        Ok(())
    }

    /// Deletes `kid`, which must be a direct kid of `parent` (Paddle's
    /// `Scope::DeleteScope`). Same cost as [`delete_scope`](Self::delete_scope).
    ///
    /// # Errors
    /// [`Error::NotAKid`] if `kid` is not a kid of `parent`;
    /// [`Error::StaleScope`] or [`Error::ForeignScope`] for either handle.
    ///
    /// # Panics
    /// Only if a value's own `Drop` panics, as for [`delete_scope`](Self::delete_scope).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.new_scope(tree.root())?;
    /// let b = tree.new_scope(a)?;
    /// assert!(tree.delete_kid(tree.root(), b).is_err());
    /// tree.delete_kid(a, b)?;
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn delete_kid(&mut self, parent: ScopeId, kid: ScopeId) -> Result<(), Error> {
        if !self.has_kid(parent, kid)? {
            return Err(Error::NotAKid {
                kid: self.error_path(kid.key),
                scope: self.error_path(parent.key),
            });
        }
        self.delete_scope(kid)
    }

    /// Deletes every kid of `scope` (and their subtrees), keeping `scope` and
    /// its own variables (Paddle's `DropKids`). O(size of the deleted subtrees).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// # Panics
    /// Only if a value's own `Drop` panics, as for [`delete_scope`](Self::delete_scope).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// tree.new_scope(root)?;
    /// tree.new_scope(root)?;
    /// tree.drop_kids(root)?;
    /// assert_eq!(tree.scope_count(), 1);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn drop_kids(&mut self, scope: ScopeId) -> Result<(), Error> {
        let k = self.check_scope(scope)?;
        resume(self.arena.drop_kids(k));
        Ok(())
    }

    /// The scope key of a live variable.
    pub(crate) fn owner_key(&self, var: VarId) -> Result<ScopeKey, Error> {
        Ok(self.var_slot(var)?.owner().unwrap_or_default())
    }

    /// Takes the next number for a unique name.
    pub(crate) fn next_unique_number(&mut self) -> u64 {
        let n = self.unique_counter;
        self.unique_counter += 1;
        n
    }

    /// Heap bytes used by the tree's own tables, value payloads excluded:
    /// both arenas at their capacity, spilled variable tables and indexes, and
    /// the interner. O(number of scopes).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let before = tree.heap_bytes();
    /// for i in 0..100 {
    ///     tree.var(tree.root(), format!("v{i}"))?;
    /// }
    /// assert!(tree.heap_bytes() > before);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn heap_bytes(&self) -> usize {
        self.arena.heap_bytes()
    }
}
