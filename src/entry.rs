//! [`VarEntry`]: one variable of one scope, found or not, after a single
//! lookup (the `HashMap::entry` pattern for [`ScopeTree`]). It replaces the
//! usual pair of calls, [`var`](ScopeTree::var) then
//! [`set`](ScopeTree::set) or [`get_or_insert_with`](ScopeTree::get_or_insert_with),
//! and lets code branch on "new or existing" without a second lookup.

use std::any::Any;

use crate::arena::{ScopeId, VarId};
use crate::error::Error;
use crate::names::Name;
use crate::tree::ScopeTree;

/// The variable `name` of one scope itself (parents are not searched), as
/// returned by [`ScopeTree::var_entry`]: either it exists
/// ([`Occupied`](VarEntry::Occupied)) or not ([`Vacant`](VarEntry::Vacant)).
///
/// ```
/// use scopetree::{ScopeTree, VarEntry};
/// let mut tree = ScopeTree::new();
/// let root = tree.root();
/// match tree.var_entry(root, "w")? {
///     VarEntry::Occupied(_) => unreachable!("a new tree holds no variable"),
///     VarEntry::Vacant(v) => v.insert(vec![0.5_f32; 4])?,
/// };
/// assert!(matches!(tree.var_entry(root, "w")?, VarEntry::Occupied(_)));
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "an entry does nothing until it is used"]
pub enum VarEntry<'t, N: Name> {
    /// The scope holds the variable.
    Occupied(OccupiedVar<'t>),
    /// The scope does not hold it; inserting creates it.
    Vacant(VacantVar<'t, N>),
}

/// An existing variable, from [`VarEntry::Occupied`].
///
/// ```
/// use scopetree::{ScopeTree, VarEntry};
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// let VarEntry::Occupied(e) = tree.var_entry(tree.root(), "w")? else { unreachable!() };
/// assert_eq!(e.id(), w);
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "an entry does nothing until it is used"]
pub struct OccupiedVar<'t> {
    tree: &'t mut ScopeTree,
    var: VarId,
}

/// A name the scope does not hold yet, from [`VarEntry::Vacant`].
///
/// ```
/// use scopetree::{ScopeTree, VarEntry};
/// let mut tree = ScopeTree::new();
/// let VarEntry::Vacant(e) = tree.var_entry(tree.root(), "w")? else { unreachable!() };
/// let w = e.create()?;
/// assert!(!tree.is_initialized(w)?);
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "an entry does nothing until it is used"]
pub struct VacantVar<'t, N: Name> {
    tree: &'t mut ScopeTree,
    scope: ScopeId,
    name: N,
}

impl ScopeTree {
    /// The variable `name` of `scope` itself, found or not, for
    /// get-or-create in one lookup. Parents are not searched (as for
    /// [`var`](Self::var)): an entry in a kid is vacant even if a parent
    /// holds the name. Looking a name up interns nothing; only an insert
    /// does. O(1), as [`var`](Self::var).
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::StaleScope`] or
    /// [`Error::ForeignScope`]. Nothing changes.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// // A step counter: created at 0 the first time, then incremented.
    /// for _ in 0..3 {
    ///     *tree.var_entry(root, "step")?.or_default::<u64>()? += 1;
    /// }
    /// let step = tree.get_var(root, "step")?;
    /// assert_eq!(*tree.get::<u64>(step)?, 3);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn var_entry<N: Name>(
        &mut self,
        scope: ScopeId,
        name: N,
    ) -> Result<VarEntry<'_, N>, Error> {
        Ok(match self.find_local_var(scope, name.as_name_ref())? {
            Some(var) => VarEntry::Occupied(OccupiedVar { tree: self, var }),
            None => VarEntry::Vacant(VacantVar {
                tree: self,
                scope,
                name,
            }),
        })
    }
}

impl<'t, N: Name> VarEntry<'t, N> {
    /// The variable, if the scope holds it. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// assert_eq!(tree.var_entry(tree.root(), "w")?.id(), None);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn id(&self) -> Option<VarId> {
        match self {
            VarEntry::Occupied(e) => Some(e.var),
            VarEntry::Vacant(_) => None,
        }
    }

    /// The variable, created uninitialised if the scope does not hold it:
    /// [`ScopeTree::var`] through an entry. O(1).
    ///
    /// # Errors
    /// None in practice: the name was checked by the lookup. The `Result`
    /// carries the tree's errors should the insert ever meet one.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var_entry(tree.root(), "w")?.or_create()?;
    /// assert_eq!(tree.var(tree.root(), "w")?, w);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn or_create(self) -> Result<VarId, Error> {
        match self {
            VarEntry::Occupied(e) => Ok(e.var),
            VarEntry::Vacant(e) => e.create(),
        }
    }

    /// The variable's `T`, made with `init` if the variable is new or holds
    /// no value yet. `init` runs only then. O(1) plus `init`.
    ///
    /// # Errors
    /// [`Error::TypeMismatch`] if the variable holds another type: nothing
    /// changes and `init` is not called.
    ///
    /// ```
    /// use scopetree::{Error, ScopeTree};
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// tree.var_entry(root, "w")?.or_insert_with(|| vec![0.0_f32; 3])?[1] = 2.0;
    /// let w = tree.var_entry(root, "w")?.or_insert_with(|| vec![9.0_f32])?;
    /// assert_eq!(w, &[0.0, 2.0, 0.0]);
    /// let wrong = tree.var_entry(root, "w")?.or_insert_with(|| 1_u8);
    /// assert!(matches!(wrong, Err(Error::TypeMismatch { .. })));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn or_insert_with<T: Any + Send + Sync>(
        self,
        init: impl FnOnce() -> T,
    ) -> Result<&'t mut T, Error> {
        match self {
            VarEntry::Occupied(e) => e.tree.get_or_insert_with(e.var, init),
            VarEntry::Vacant(e) => Ok(e.insert(init())?.1),
        }
    }

    /// [`or_insert_with`](Self::or_insert_with) with `T::default()`.
    ///
    /// # Errors
    /// As [`or_insert_with`](Self::or_insert_with).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// tree.var_entry(tree.root(), "loss")?.or_default::<Vec<f32>>()?.push(0.7);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn or_default<T: Any + Send + Sync + Default>(self) -> Result<&'t mut T, Error> {
        self.or_insert_with(T::default)
    }
}

impl<'t> OccupiedVar<'t> {
    /// The variable's handle. O(1).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// assert_eq!(tree.var_entry(tree.root(), "w")?.id(), Some(w));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn id(&self) -> VarId {
        self.var
    }

    /// The variable's value as a `T`: [`ScopeTree::get`]. O(1).
    ///
    /// # Errors
    /// [`Error::Uninitialized`] or [`Error::TypeMismatch`].
    ///
    /// ```
    /// use scopetree::{ScopeTree, VarEntry};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, 3_i64)?;
    /// let VarEntry::Occupied(e) = tree.var_entry(tree.root(), "w")? else { unreachable!() };
    /// assert_eq!(e.get::<i64>()?, &3);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn get<T: Any>(&self) -> Result<&T, Error> {
        self.tree.get(self.var)
    }

    /// The variable's value as a mutable `T`, borrowed for as long as the
    /// tree is: [`ScopeTree::get_mut`]. O(1).
    ///
    /// # Errors
    /// [`Error::Uninitialized`] or [`Error::TypeMismatch`]; nothing changes.
    ///
    /// ```
    /// use scopetree::{ScopeTree, VarEntry};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, 3_i64)?;
    /// if let VarEntry::Occupied(e) = tree.var_entry(tree.root(), "w")? {
    ///     *e.into_mut::<i64>()? *= 2;
    /// }
    /// assert_eq!(tree.get::<i64>(w)?, &6);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn into_mut<T: Any>(self) -> Result<&'t mut T, Error> {
        self.tree.get_mut(self.var)
    }

    /// Removes the variable and its value from the scope:
    /// [`ScopeTree::remove_var`]. Its handle then reports stale. O(1)
    /// amortised.
    ///
    /// # Errors
    /// None in practice: the entry holds a live variable.
    ///
    /// ```
    /// use scopetree::{ScopeTree, VarEntry};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// if let VarEntry::Occupied(e) = tree.var_entry(tree.root(), "w")? {
    ///     e.remove()?;
    /// }
    /// assert!(!tree.contains_var(w));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn remove(self) -> Result<(), Error> {
        self.tree.remove_var(self.var)
    }
}

impl<'t, N: Name> VacantVar<'t, N> {
    /// The name the entry was asked for, as given. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, VarEntry};
    /// let mut tree = ScopeTree::new();
    /// let VarEntry::Vacant(e) = tree.var_entry(tree.root(), "w")? else { unreachable!() };
    /// assert_eq!(*e.name(), "w");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn name(&self) -> &N {
        &self.name
    }

    /// Creates the variable, uninitialised. O(1); allocates only when the
    /// name is new to the tree or the scope's table grows.
    ///
    /// # Errors
    /// None in practice: the lookup checked the name and the scope. The
    /// `Result` carries the tree's errors should the insert ever meet one.
    ///
    /// ```
    /// use scopetree::{ScopeTree, VarEntry};
    /// let mut tree = ScopeTree::new();
    /// let VarEntry::Vacant(e) = tree.var_entry(tree.root(), "w")? else { unreachable!() };
    /// let w = e.create()?;
    /// assert_eq!(tree.var_name(w)?, "w");
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn create(self) -> Result<VarId, Error> {
        Ok(self.create_in()?.0)
    }

    /// Creates the variable; returns it with the tree, borrowed for as long
    /// as the entry was.
    fn create_in(self) -> Result<(VarId, &'t mut ScopeTree), Error> {
        let s = self.tree.check_scope(self.scope)?;
        let sym = self.tree.intern_name(self.name.as_name_ref())?;
        Ok((self.tree.insert_var(s, sym), self.tree))
    }

    /// Creates the variable holding `value`; returns its handle and the
    /// value, borrowed for as long as the tree is. O(1), as
    /// [`create`](Self::create).
    ///
    /// # Errors
    /// As [`create`](Self::create).
    ///
    /// ```
    /// use scopetree::{ScopeTree, VarEntry};
    /// let mut tree = ScopeTree::new();
    /// let VarEntry::Vacant(e) = tree.var_entry(tree.root(), "b")? else { unreachable!() };
    /// let (b, value) = e.insert(vec![0.0_f64; 2])?;
    /// value[0] = 1.0;
    /// assert_eq!(tree.get::<Vec<f64>>(b)?, &[1.0, 0.0]);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn insert<T: Any + Send + Sync>(self, value: T) -> Result<(VarId, &'t mut T), Error> {
        let (var, tree) = self.create_in()?;
        tree.set(var, value)?;
        Ok((var, tree.get_mut(var)?))
    }
}
