//! Typed values: what a variable holds, and the reads and writes through a
//! [`VarId`].
//!
//! A variable holds any `Send + Sync + 'static` value, or nothing (it is
//! uninitialised until set). Reads name the type they expect; a read of
//! another type is [`Error::TypeMismatch`], naming both types. These are the
//! counterparts of Paddle's `Variable::Get<T>`, `GetMutable<T>`, `IsType<T>`,
//! `IsInitialized` and `Clear`.

use std::any::{Any, type_name};

use crate::arena::{Payload, VarId, VarSlot};
use crate::error::Error;
use crate::tree::ScopeTree;

/// Why a slot's value cannot be read as a `T`: it is uninitialised, or holds
/// another type. The typed-value core below returns it; the tree and the
/// worker split each turn it into an [`Error`] with the names they know.
#[derive(Copy, Clone, Debug)]
pub(crate) enum ValueError {
    /// Nothing was set.
    Uninit,
    /// The value is of this other type.
    Mismatch(&'static str),
}

impl ValueError {
    /// The error for a read of `T` from the variable `name` in `scope`.
    #[cold]
    pub(crate) fn into_error<T: Any>(self, name: String, scope: String) -> Error {
        match self {
            ValueError::Uninit => Error::Uninitialized {
                name,
                scope,
                expected: type_name::<T>(),
            },
            ValueError::Mismatch(found) => Error::TypeMismatch {
                name,
                scope,
                expected: type_name::<T>(),
                found,
            },
        }
    }
}

#[inline]
fn as_any<'a>(p: &'a (dyn Payload + 'static)) -> &'a (dyn Any + 'static) {
    p
}

#[inline]
fn as_any_mut<'a>(p: &'a mut (dyn Payload + 'static)) -> &'a mut (dyn Any + 'static) {
    p
}

/// The typed-value core: every typed read and write of a variable, by the
/// tree, the worker split and the step scopes, goes through these.
impl VarSlot {
    /// The value as a `T`. O(1): one type-id comparison.
    #[inline]
    pub(crate) fn typed<T: Any>(&self) -> Result<&T, ValueError> {
        match self.value.as_deref() {
            Some(v) => as_any(v)
                .downcast_ref::<T>()
                .ok_or_else(|| ValueError::Mismatch(v.type_name())),
            None => Err(ValueError::Uninit),
        }
    }

    /// The value as a mutable `T`. O(1).
    #[inline]
    pub(crate) fn typed_mut<T: Any>(&mut self) -> Result<&mut T, ValueError> {
        match self.value.as_deref_mut() {
            Some(v) if !as_any(v).is::<T>() => Err(ValueError::Mismatch((*v).type_name())),
            Some(v) => as_any_mut(v).downcast_mut::<T>().ok_or(ValueError::Uninit),
            None => Err(ValueError::Uninit),
        }
    }

    /// Whether the value is a `T`. O(1).
    #[inline]
    pub(crate) fn holds<T: Any>(&self) -> bool {
        self.typed::<T>().is_ok()
    }

    /// Stores `value`, overwriting a value of the same type in place (no
    /// allocation) or boxing it otherwise. O(1).
    #[inline]
    pub(crate) fn put<T: Any + Send + Sync>(&mut self, value: T) {
        match self.typed_mut::<T>() {
            Ok(old) => *old = value,
            Err(_) => self.value = Some(Box::new(value)),
        }
    }

    /// Moves the value out as a `T`, leaving the slot uninitialised; on an
    /// error the value stays. O(1).
    pub(crate) fn take_typed<T: Any>(&mut self) -> Result<T, ValueError> {
        self.typed::<T>()?;
        let boxed: Box<dyn Any> = self.value.take().ok_or(ValueError::Uninit)?;
        // `typed` just checked the type, so the downcast cannot fail.
        boxed
            .downcast::<T>()
            .map(|b| *b)
            .map_err(|_| ValueError::Uninit)
    }

    /// Moves the boxed value out, whatever its type (step scopes carry
    /// values from a recycled slot to its successor this way). O(1).
    #[inline]
    pub(crate) fn take_box(&mut self) -> Option<Box<dyn Payload>> {
        self.value.take()
    }

    /// Puts a boxed value back (see [`take_box`](Self::take_box)). O(1).
    #[inline]
    pub(crate) fn put_box(&mut self, value: Option<Box<dyn Payload>>) {
        self.value = value;
    }

    /// The value as `&dyn Any`, for dispatch on its `TypeId`. O(1).
    #[inline]
    pub(crate) fn value_any(&self) -> Option<&dyn Any> {
        self.value.as_deref().map(as_any)
    }

    /// The type name of the value, if any.
    #[inline]
    pub(crate) fn value_type_name(&self) -> Option<&'static str> {
        self.value.as_deref().map(Payload::type_name)
    }
}

impl ScopeTree {
    /// Why a value read of `var` as `T` failed: stale (retired slot),
    /// uninitialised or type mismatch. Only called off the fast path.
    #[cold]
    #[inline(never)]
    fn read_error<T: Any>(&self, var: VarId) -> Error {
        match self.var_slot(var) {
            Ok(slot) => match slot.typed::<T>() {
                Ok(_) => Error::StaleVar { var },
                Err(e) => {
                    let (name, scope) = self.describe_var(var);
                    e.into_error::<T>(name, scope)
                }
            },
            Err(e) => e,
        }
    }

    /// Borrows the value of `var` as a `T` (Paddle's `Get<T>`). O(1): a key
    /// check and one type-id comparison.
    ///
    /// # Errors
    /// [`Error::Uninitialized`] if nothing was set; [`Error::TypeMismatch`]
    /// if it holds another type; [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// assert!(tree.get::<f32>(w).is_err()); // uninitialised
    /// tree.set(w, 2.0_f32)?;
    /// assert_eq!(*tree.get::<f32>(w)?, 2.0);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    #[inline]
    pub fn get<T: Any>(&self, var: VarId) -> Result<&T, Error> {
        // A retired slot's value is empty, so it takes the error path.
        match self.var_slot_unretired(var)?.typed::<T>() {
            Ok(t) => Ok(t),
            Err(_) => Err(self.read_error::<T>(var)),
        }
    }

    /// Borrows the value of `var` mutably as a `T`. O(1).
    ///
    /// # Errors
    /// As [`get`](Self::get).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![1.0_f32, 2.0])?;
    /// tree.get_mut::<Vec<f32>>(w)?.push(3.0);
    /// assert_eq!(tree.get::<Vec<f32>>(w)?.len(), 3);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    #[inline]
    pub fn get_mut<T: Any>(&mut self, var: VarId) -> Result<&mut T, Error> {
        // A shared probe first: stable Rust's borrow checker rejects building
        // the error while the mutable borrow of the success path is alive.
        if !self.var_slot_unretired(var)?.holds::<T>() {
            return Err(self.read_error::<T>(var));
        }
        self.var_slot_mut(var)?
            .typed_mut::<T>()
            .map_err(|_| Error::StaleVar { var })
    }

    /// Sets the value of `var`, dropping any value it held, of whatever type.
    /// When it already holds a `T`, the value is overwritten in place without
    /// allocating; otherwise the value is boxed. O(1).
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let v = tree.var(tree.root(), "v")?;
    /// tree.set(v, 1_i32)?;
    /// tree.set(v, "now a string")?;
    /// assert!(tree.is::<&str>(v)?);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    #[inline]
    pub fn set<T: Any + Send + Sync>(&mut self, var: VarId, value: T) -> Result<(), Error> {
        self.var_slot_mut(var)?.put(value);
        Ok(())
    }

    /// Replaces a `T` value of `var` and returns the old one; sets it if the
    /// variable was uninitialised (returning `None`). O(1).
    ///
    /// # Errors
    /// [`Error::TypeMismatch`] if it holds another type (nothing changes);
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let v = tree.var(tree.root(), "v")?;
    /// assert_eq!(tree.replace(v, 1_u64)?, None);
    /// assert_eq!(tree.replace(v, 2_u64)?, Some(1));
    /// assert!(tree.replace(v, 3.0_f32).is_err());
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn replace<T: Any + Send + Sync>(
        &mut self,
        var: VarId,
        value: T,
    ) -> Result<Option<T>, Error> {
        if !self.is_initialized(var)? {
            self.set(var, value)?;
            return Ok(None);
        }
        let old = self.get_mut::<T>(var)?;
        Ok(Some(std::mem::replace(old, value)))
    }

    /// Moves the `T` value out of `var`, leaving it uninitialised. O(1).
    ///
    /// # Errors
    /// [`Error::Uninitialized`]; [`Error::TypeMismatch`] (nothing changes);
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let v = tree.var(tree.root(), "v")?;
    /// tree.set(v, String::from("state"))?;
    /// assert_eq!(tree.take::<String>(v)?, "state");
    /// assert!(!tree.is_initialized(v)?);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn take<T: Any>(&mut self, var: VarId) -> Result<T, Error> {
        self.get::<T>(var)?;
        self.var_slot_mut(var)?
            .take_typed::<T>()
            .map_err(|_| Error::StaleVar { var })
    }

    /// Drops the value of `var`, leaving it uninitialised (Paddle's `Clear`).
    /// Returns whether there was a value. O(1).
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let v = tree.var(tree.root(), "v")?;
    /// tree.set(v, 1_u8)?;
    /// assert!(tree.clear(v)?);
    /// assert!(!tree.clear(v)?);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn clear(&mut self, var: VarId) -> Result<bool, Error> {
        Ok(self.var_slot_mut(var)?.value.take().is_some())
    }

    /// Whether `var` holds a `T` (Paddle's `IsType<T>`); `false` when
    /// uninitialised. O(1).
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let v = tree.var(tree.root(), "v")?;
    /// assert!(!tree.is::<f32>(v)?);
    /// tree.set(v, 1.0_f32)?;
    /// assert!(tree.is::<f32>(v)?);
    /// assert!(!tree.is::<f64>(v)?);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn is<T: Any>(&self, var: VarId) -> Result<bool, Error> {
        Ok(self.var_slot(var)?.holds::<T>())
    }

    /// Whether `var` holds a value (Paddle's `IsInitialized`). O(1).
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let v = tree.var(tree.root(), "v")?;
    /// assert!(!tree.is_initialized(v)?);
    /// tree.set(v, ())?;
    /// assert!(tree.is_initialized(v)?);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn is_initialized(&self, var: VarId) -> Result<bool, Error> {
        Ok(self.var_slot(var)?.value.is_some())
    }

    /// The name of the type `var` holds (as `std::any::type_name` gives it);
    /// `None` when uninitialised. O(1).
    ///
    /// # Errors
    /// [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let v = tree.var(tree.root(), "v")?;
    /// assert_eq!(tree.type_name(v)?, None);
    /// tree.set(v, 1.0_f32)?;
    /// assert_eq!(tree.type_name(v)?, Some("f32"));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn type_name(&self, var: VarId) -> Result<Option<&'static str>, Error> {
        Ok(self.var_slot(var)?.value_type_name())
    }

    /// Borrows the `T` value of `var` mutably, first setting it to `init()` if
    /// the variable is uninitialised (Paddle's `GetMutable<T>`). O(1).
    ///
    /// # Errors
    /// [`Error::TypeMismatch`] if it holds another type (nothing changes, and
    /// `init` is not called); [`Error::StaleVar`] or [`Error::ForeignVar`].
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let v = tree.var(tree.root(), "v")?;
    /// tree.get_or_insert_with(v, || vec![0.0_f32; 3])?[1] = 5.0;
    /// assert_eq!(tree.get::<Vec<f32>>(v)?, &[0.0, 5.0, 0.0]);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn get_or_insert_with<T: Any + Send + Sync>(
        &mut self,
        var: VarId,
        init: impl FnOnce() -> T,
    ) -> Result<&mut T, Error> {
        if !self.is_initialized(var)? {
            self.var_slot_mut(var)?.value = Some(Box::new(init()));
        }
        self.get_mut::<T>(var)
    }

    /// [`get_or_insert_with`](Self::get_or_insert_with) with `T::default()`.
    ///
    /// # Errors
    /// As [`get_or_insert_with`](Self::get_or_insert_with).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let steps = tree.var(tree.root(), "steps")?;
    /// *tree.get_or_default::<u64>(steps)? += 1;
    /// assert_eq!(*tree.get::<u64>(steps)?, 1);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn get_or_default<T: Any + Send + Sync + Default>(
        &mut self,
        var: VarId,
    ) -> Result<&mut T, Error> {
        self.get_or_insert_with(var, T::default)
    }

    /// Borrows the `T` values of `N` distinct variables mutably at once, for
    /// example a parameter and its gradient. O(N²) to check distinctness
    /// (N is small), then O(N).
    ///
    /// # Errors
    /// [`Error::AliasedVar`] if a handle is passed twice; otherwise the errors
    /// of [`get`](Self::get) for the first handle that fails.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let (w, g) = (tree.var(root, "w")?, tree.var(root, "w@GRAD")?);
    /// tree.set(w, vec![1.0_f32, 1.0])?;
    /// tree.set(g, vec![0.5_f32, -0.5])?;
    /// let [w_val, g_val] = tree.get_disjoint_mut::<Vec<f32>, 2>([w, g])?;
    /// for (p, d) in w_val.iter_mut().zip(g_val.iter()) {
    ///     *p -= 0.1 * d;
    /// }
    /// assert_eq!(tree.get::<Vec<f32>>(w)?, &[0.95, 1.05]);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn get_disjoint_mut<T: Any, const N: usize>(
        &mut self,
        vars: [VarId; N],
    ) -> Result<[&mut T; N], Error> {
        for (i, v) in vars.iter().enumerate() {
            self.get::<T>(*v)?;
            if vars[..i].contains(v) {
                let (name, scope) = self.describe_var(*v);
                return Err(Error::AliasedVar { name, scope });
            }
        }
        // Every handle was just checked live, distinct and holding a `T`, so
        // neither failure below can happen; each still reports the first
        // handle as stale rather than panicking.
        let stale = || Error::StaleVar { var: vars[0] };
        let slots = self
            .arena_mut()
            .vars_disjoint_mut(vars.map(|v| v.key))
            .ok_or_else(stale)?;
        let mut typed = slots.map(|s| s.typed_mut::<T>().ok());
        if typed.iter().any(Option::is_none) {
            return Err(stale());
        }
        Ok(std::array::from_fn(|i| {
            typed[i]
                .take()
                .unwrap_or_else(|| unreachable!("checked above"))
        }))
    }
}

impl ScopeTree {
    /// Borrows the values of two distinct variables mutably at once, each as
    /// its own type (for values of one type, see
    /// [`get_disjoint_mut`](Self::get_disjoint_mut)). O(1).
    ///
    /// # Errors
    /// [`Error::AliasedVar`] if `a == b`; otherwise the errors of
    /// [`get`](Self::get) for the first handle that fails.
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let root = tree.root();
    /// let (steps, loss) = (tree.var(root, "steps")?, tree.var(root, "loss")?);
    /// tree.set(steps, 0_u64)?;
    /// tree.set(loss, vec![0.5_f32])?;
    /// let (n, l) = tree.get_pair_mut::<u64, Vec<f32>>(steps, loss)?;
    /// *n += 1;
    /// l.push(0.25);
    /// assert_eq!(*tree.get::<u64>(steps)?, 1);
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn get_pair_mut<A: Any, B: Any>(
        &mut self,
        a: VarId,
        b: VarId,
    ) -> Result<(&mut A, &mut B), Error> {
        self.get::<A>(a)?;
        self.get::<B>(b)?;
        if a == b {
            let (name, scope) = self.describe_var(a);
            return Err(Error::AliasedVar { name, scope });
        }
        // Both were checked live, distinct and of the right types above.
        let [sa, sb] = self
            .arena_mut()
            .vars_disjoint_mut([a.key, b.key])
            .ok_or(Error::StaleVar { var: a })?;
        match (sa.typed_mut::<A>(), sb.typed_mut::<B>()) {
            (Ok(va), Ok(vb)) => Ok((va, vb)),
            _ => Err(Error::StaleVar { var: a }),
        }
    }
}
