//! Variables as members of scopes: create, get-or-create, unique names,
//! erase, rename, owner and names.

use crate::arena::Sym;
use crate::arena::{ScopeId, ScopeKey, VarId, resume};
use crate::error::Error;
use crate::names::{Name, validate_name};
use crate::tree::ScopeTree;

impl ScopeTree {
    /// Gets the variable `name` of `scope` itself, creating it (uninitialised)
    /// if the scope has none: Paddle's `Scope::Var`. Parents are not searched:
    /// a `var` in a kid creates a new variable that shadows the parent's.
    ///
    /// O(1) for a scope with up to 16 variables or through the hash index
    /// above; creating a variable never allocates while the scope holds at
    /// most [`INLINE_VARS`](crate::diagnostics::INLINE_VARS) and the name was seen before.
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let a = tree.var(root, "a")?;
    /// assert_eq!(tree.var(root, "a")?, a);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn var(&mut self, scope: ScopeId, name: impl Name) -> Result<VarId, Error> {
        let s = self.check_scope(scope)?;
        let sym = self.intern_name(name.as_name_ref())?;
        if let Some(v) = self.arena().scope(s).and_then(|slot| slot.vars().find(sym)) {
            return Ok(VarId::new(v, self.tag()));
        }
        Ok(self.insert_var(s, sym))
    }

    /// Creates the variable `name` in `scope`, failing if the scope itself
    /// already holds that name (seed 000's `CreateVariable`). A variable of the
    /// same name in a parent does not conflict: the new one shadows it.
    /// Same cost as [`var`](Self::var).
    ///
    /// # Errors
    /// [`Error::NameTaken`] on a local conflict; [`Error::InvalidName`];
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::{Error, ScopeTree};
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// tree.create_var(root, "w")?;
    /// assert!(matches!(tree.create_var(root, "w"), Err(Error::NameTaken { .. })));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn create_var(&mut self, scope: ScopeId, name: impl Name) -> Result<VarId, Error> {
        let s = self.check_scope(scope)?;
        let name = name.as_name_ref();
        let sym = self.intern_name(name)?;
        if self
            .arena()
            .scope(s)
            .is_some_and(|slot| slot.vars().find(sym).is_some())
        {
            return Err(Error::NameTaken {
                name: self.name_text(name),
                scope: self.error_path(s),
            });
        }
        Ok(self.insert_var(s, sym))
    }

    /// Draws the next name `{prefix}_{n}` that the tree's counter gives and
    /// `scope` does not hold. The counter only grows, so the generator never
    /// hands out the same name twice in the tree's lifetime.
    fn next_unique_name(&mut self, scope: ScopeKey, prefix: &str) -> Result<Sym, Error> {
        validate_name(prefix)?;
        loop {
            let n = self.next_unique_number();
            let sym = self.arena_mut().intern(&format!("{prefix}_{n}"));
            if self
                .arena()
                .scope(scope)
                .is_none_or(|slot| slot.vars().find(sym).is_none())
            {
                return Ok(sym);
            }
        }
    }

    /// Creates a variable named `sym` (interned) in the live scope `s`.
    pub(crate) fn insert_var(&mut self, s: ScopeKey, sym: Sym) -> VarId {
        let key = self.arena_mut().insert_var(s, sym);
        VarId::new(key, self.tag())
    }

    /// Creates a variable in `scope` under a fresh name `{prefix}_{n}` (Paddle's
    /// `Var(std::string* name)`). The number comes from a counter of the tree
    /// that never repeats, and names the scope already holds are skipped.
    /// O(1) amortised; allocates the new name.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad prefix; [`Error::StaleScope`] or
    /// [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let a = tree.unique_var(root, "tmp")?;
    /// let b = tree.unique_var(root, "tmp")?;
    /// assert_eq!(tree.var_name(a)?, "tmp_0");
    /// assert_eq!(tree.var_name(b)?, "tmp_1");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn unique_var(&mut self, scope: ScopeId, prefix: &str) -> Result<VarId, Error> {
        let s = self.check_scope(scope)?;
        let sym = self.next_unique_name(s, prefix)?;
        Ok(self.insert_var(s, sym))
    }

    /// Erases the variables of `scope` named in `names`, dropping their values;
    /// names the scope does not hold are ignored (Paddle's `EraseVars`). Returns
    /// how many were erased. Every name is checked before anything is erased.
    /// O(len(names)) amortised (each name hashed once), plus dropping the
    /// values.
    ///
    /// # Errors
    /// [`Error::InvalidName`] or [`Error::ForeignSymbol`] for any name (then
    /// nothing is erased); [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// # Panics
    /// Only if a value's own `Drop` panics. That panic is passed on once every
    /// variable named is erased, so the scope stays consistent and usable.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// tree.var(root, "a")?;
    /// tree.var(root, "b")?;
    /// assert_eq!(tree.erase_vars(root, ["a", "zzz"])?, 1);
    /// assert_eq!(tree.local_var_names(root)?.collect::<Vec<_>>(), ["b"]);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn erase_vars<N: Name>(
        &mut self,
        scope: ScopeId,
        names: impl IntoIterator<Item = N>,
    ) -> Result<usize, Error> {
        let s = self.check_scope(scope)?;
        let syms = self.lookup_names(names)?;
        Ok(self.erase_syms(s, &syms, false))
    }

    /// Erases every variable of `scope` except those named in `keep` (Paddle's
    /// `EraseVarsExcept`). Returns how many were erased.
    /// O(local variables + len(keep)), plus dropping the values.
    ///
    /// # Errors
    /// [`Error::InvalidName`] or [`Error::ForeignSymbol`] for any name (then
    /// nothing is erased); [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// # Panics
    /// Only if a value's own `Drop` panics. That panic is passed on once every
    /// variable named is erased, so the scope stays consistent and usable.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// for n in ["w", "b", "tmp"] {
    ///     tree.var(root, n)?;
    /// }
    /// assert_eq!(tree.erase_vars_except(root, ["w", "b"])?, 1);
    /// assert_eq!(tree.local_var_count(root)?, 2);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn erase_vars_except<N: Name>(
        &mut self,
        scope: ScopeId,
        keep: impl IntoIterator<Item = N>,
    ) -> Result<usize, Error> {
        let s = self.check_scope(scope)?;
        let syms = self.lookup_names(keep)?;
        Ok(self.erase_syms(s, &syms, true))
    }

    /// The symbols of those `names` the tree has seen; fails on the first
    /// invalid or foreign name.
    fn lookup_names<N: Name>(&self, names: impl IntoIterator<Item = N>) -> Result<Vec<u32>, Error> {
        let mut syms = Vec::new();
        for n in names {
            if let Some(sym) = self.lookup_name(n.as_name_ref())? {
                syms.push(sym);
            }
        }
        Ok(syms)
    }

    /// Removes the given entries of scope `s` (or, with `keep`, every entry
    /// but them), then frees their variables. O(names) to remove the given
    /// ones, O(local variables + names) to keep them.
    fn erase_syms(&mut self, s: ScopeKey, syms: &[Sym], keep: bool) -> usize {
        let (n, deferred) = self.arena_mut().remove_vars(s, syms, keep);
        resume(deferred);
        n
    }

    /// Erases one variable by handle (seed 000's `DeleteVariable`), dropping
    /// its value. The handle, and every copy of it, is stale afterwards.
    /// O(1) amortised, in any order (a removal leaves a hole that a later
    /// one compacts away), plus dropping the value.
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// # Panics
    /// Only if a value's own `Drop` panics. That panic is passed on once every
    /// variable named is erased, so the scope stays consistent and usable.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.remove_var(w)?;
    /// assert_eq!(tree.find_var(tree.root(), "w")?, None);
    /// assert!(tree.remove_var(w).is_err());
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn remove_var(&mut self, var: VarId) -> Result<(), Error> {
        let slot = self.var_slot(var)?;
        let (owner, sym) = (slot.owner().unwrap_or_default(), slot.name());
        self.erase_syms(owner, &[sym], false);
        Ok(())
    }

    /// Renames the variable `old` of `scope` to `new`, keeping its handle and
    /// value (Paddle's `Rename`). O(1) amortised, plus hashing the names.
    ///
    /// # Errors
    /// [`Error::NotFound`] if `scope` itself does not hold `old`;
    /// [`Error::NameTaken`] if it already holds `new`; [`Error::InvalidName`];
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let w = tree.var(root, "w")?;
    /// assert_eq!(tree.rename(root, "w", "weight")?, w);
    /// assert_eq!(tree.find_var(root, "weight")?, Some(w));
    /// assert_eq!(tree.find_var(root, "w")?, None);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn rename(
        &mut self,
        scope: ScopeId,
        old: impl Name,
        new: impl Name,
    ) -> Result<VarId, Error> {
        let s = self.check_scope(scope)?;
        let (old, new) = (old.as_name_ref(), new.as_name_ref());
        let pos = self
            .lookup_name(old)?
            .and_then(|sym| self.arena().scope(s)?.vars().position(sym));
        let Some(pos) = pos else {
            // Check `new` too, so that a bad new name is reported as such.
            self.lookup_name(new)?;
            return Err(Error::NotFound {
                name: self.name_text(old),
                scope: self.error_path(s),
            });
        };
        let new_sym = self.intern_name(new)?;
        self.rename_at(s, pos, new_sym)
            .ok_or_else(|| Error::NameTaken {
                name: self.name_text(new),
                scope: self.error_path(s),
            })
    }

    /// Renames the variable `old` of `scope` to a fresh name `{old}_{n}` drawn
    /// as [`unique_var`](Self::unique_var) draws them, and returns the new
    /// name (Paddle's `Rename(origin)`). O(1) amortised, as `unique_var`;
    /// allocates the new name.
    ///
    /// # Errors
    /// [`Error::NotFound`] if `scope` itself does not hold `old`;
    /// [`Error::InvalidName`]; [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let w = tree.var(root, "w")?;
    /// let new = tree.rename_unique(root, "w")?.to_owned();
    /// assert_eq!(new, "w_0");
    /// assert_eq!(tree.var_name(w)?, "w_0");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn rename_unique(&mut self, scope: ScopeId, old: &str) -> Result<&str, Error> {
        let s = self.check_scope(scope)?;
        let pos = self
            .lookup_name(old.as_name_ref())?
            .and_then(|sym| self.arena().scope(s)?.vars().position(sym));
        let Some(pos) = pos else {
            return Err(Error::NotFound {
                name: crate::short::name(old),
                scope: self.error_path(s),
            });
        };
        let sym = self.next_unique_name(s, old)?;
        self.rename_at(s, pos, sym);
        Ok(self.arena().names().text(sym))
    }

    /// Renames the entry at `pos` of scope `s` to `sym`; `None` if the scope
    /// already holds `sym` under another entry.
    fn rename_at(&mut self, s: ScopeKey, pos: usize, sym: Sym) -> Option<VarId> {
        let var = self.arena_mut().rename_var(s, pos, sym).ok()?;
        Some(VarId::new(var, self.tag()))
    }

    /// The scope that holds `var`: for a [`find_var`](Self::find_var) result,
    /// the scope the name was found in. O(1).
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// assert_eq!(tree.owner(w)?, tree.root());
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn owner(&self, var: VarId) -> Result<ScopeId, Error> {
        Ok(ScopeId::new(self.owner_key(var)?, self.tag()))
    }

    /// The local name of `var`. O(1).
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// assert_eq!(tree.var_name(w)?, "w");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn var_name(&self, var: VarId) -> Result<&str, Error> {
        Ok(self.arena().names().text(self.var_slot(var)?.name()))
    }

    /// The variable's scope path and name joined by `/`, as in messages.
    /// O(depth).
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let enc = tree.new_named_scope(tree.root(), "enc")?;
    /// let w = tree.var(enc, "w")?;
    /// assert_eq!(tree.var_path(w)?, "enc/w");
    /// let b = tree.var(tree.root(), "b")?;
    /// assert_eq!(tree.var_path(b)?, "b");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn var_path(&self, var: VarId) -> Result<String, Error> {
        let slot = self.var_slot(var)?;
        let mut p = self.path_of(slot.owner().unwrap_or_default());
        if !p.is_empty() {
            p.push('/');
        }
        p.push_str(self.arena().names().text(slot.name()));
        Ok(p)
    }

    /// Number of variables `scope` itself holds. O(1).
    ///
    /// # Errors
    /// [`Error::StaleScope`] or [`Error::ForeignScope`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// tree.var(tree.root(), "w")?;
    /// assert_eq!(tree.local_var_count(tree.root())?, 1);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn local_var_count(&self, scope: ScopeId) -> Result<usize, Error> {
        Ok(self.scope_slot(scope)?.vars().len())
    }

    /// The (name, handle) message text of a live variable: its name and its
    /// scope's path.
    pub(crate) fn describe_var(&self, var: VarId) -> (String, String) {
        match self.arena().var(var.key) {
            Some(slot) => (
                crate::short::name(self.arena().names().text(slot.name())),
                self.error_path(slot.owner().unwrap_or_default()),
            ),
            None => (format!("{var:?}"), String::new()),
        }
    }
}
