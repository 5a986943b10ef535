//! Initializers: how `get_variable` makes the first value of a variable it
//! creates ([`Initializer`]), and their type-erased form carried through the
//! custom-getter chain.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::arena::Payload;
use crate::sharing::shape::{HasShape, Shape};

/// The three kinds of TensorFlow 1 initializer the port keeps.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum InitKind {
    /// A value (TF: a tensor or a Python value as `initializer`): its shape
    /// is its own, so a spec that also gives a shape is an error.
    Constant,
    /// A closure without arguments (TF: a callable with no arguments): any
    /// spec shape is checked against the value it makes.
    NoArgs,
    /// A closure taking the shape (TF: `tf.keras.initializers.*` and
    /// friends): the spec must give a fully defined shape.
    Shaped,
}

/// How to make the first value of a variable that
/// [`get_variable`](crate::sharing::VariableStore::get_variable) creates.
///
/// An initializer is cheap to clone (one `Arc`). It is called only when a
/// variable is created, never on reuse. Give one per call in the
/// [`VarSpec`](crate::sharing::VarSpec), or as a scope default per value type
/// ([`ScopeOpts::initializer`](crate::sharing::ScopeOpts::initializer)).
///
/// ```
/// use scopetree::sharing::Initializer;
/// let c = Initializer::constant(vec![1.0_f32, 2.0]);
/// let z = Initializer::with_shape(|shape: &[usize]| vec![0.0_f32; shape.iter().product()]);
/// let r = Initializer::from_fn(|| 0.5_f32);
/// # let _ = (c, z, r);
/// ```
pub struct Initializer<T> {
    kind: InitKind,
    make: MakeFn<T>,
}

/// The closure behind an [`Initializer`]: shape in, value (or failure) out.
type MakeFn<T> = Arc<dyn Fn(&[usize]) -> Result<T, InitError> + Send + Sync>;

/// The closure behind an [`ErasedInit`]: shape in, shape and boxed value out.
type ErasedMakeFn =
    Arc<dyn Fn(&[usize]) -> Result<(Shape, Box<dyn Payload>), InitError> + Send + Sync>;

/// Why a fallible initializer ([`Initializer::try_with_shape`]) made no
/// value: the closure's own error, shared so that the sharing
/// [`Error`](crate::sharing::Error) stays `Clone`. Two `InitError`s are
/// equal when they hold the same error object.
///
/// ```
/// use scopetree::sharing::InitError;
/// let e = InitError::new("device out of memory");
/// assert_eq!(e.to_string(), "device out of memory");
/// assert_eq!(e.clone(), e);
/// ```
#[derive(Clone)]
pub struct InitError(Arc<dyn std::error::Error + Send + Sync>);

impl InitError {
    /// Wraps an error (or a message). O(1).
    ///
    /// ```
    /// let e = scopetree::sharing::InitError::new(std::io::Error::other("no"));
    /// assert_eq!(e.to_string(), "no");
    /// ```
    pub fn new(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        InitError(Arc::from(err.into()))
    }

    /// The closure's error, for downcasting. O(1).
    ///
    /// ```
    /// let e = scopetree::sharing::InitError::new(std::io::Error::other("no"));
    /// assert!(e.inner().downcast_ref::<std::io::Error>().is_some());
    /// ```
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl PartialEq for InitError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for InitError {}

impl fmt::Debug for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("InitError").field(&self.0).finish()
    }
}

/// The closure's message, cut to a bounded length.
impl fmt::Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::short::path(&self.0.to_string()))
    }
}

impl std::error::Error for InitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl<T> Clone for Initializer<T> {
    fn clone(&self) -> Self {
        Initializer {
            kind: self.kind,
            make: Arc::clone(&self.make),
        }
    }
}

impl<T> fmt::Debug for Initializer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Initializer::{:?}", self.kind)
    }
}

impl<T: Send + Sync + 'static> Initializer<T> {
    /// A constant: every variable it creates starts as a clone of `value`,
    /// and takes `value`'s shape (TensorFlow's "initializer is a tensor").
    /// A spec that gives a shape as well is rejected with
    /// [`Error::ConstantWithShape`](crate::sharing::Error::ConstantWithShape).
    /// O(1); each use clones the value.
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let v = store.get_variable(&root, VarSpec::new("v").initializer(Initializer::constant(4_i32)))?;
    /// assert_eq!(*store.tree().get::<i32>(v)?, 4);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn constant(value: T) -> Self
    where
        T: Clone,
    {
        Initializer {
            kind: InitKind::Constant,
            make: Arc::new(move |_: &[usize]| Ok(value.clone())),
        }
    }

    /// A closure without arguments (TensorFlow's "callable with no
    /// arguments"): no shape is needed; if the spec gives one, the value made
    /// must have a compatible shape. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let v = store.get_variable(&root, VarSpec::new("v").initializer(Initializer::from_fn(|| vec![1.0_f32; 3])))?;
    /// assert_eq!(store.tree().get::<Vec<f32>>(v)?.len(), 3);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn from_fn(f: impl Fn() -> T + Send + Sync + 'static) -> Self {
        Initializer {
            kind: InitKind::NoArgs,
            make: Arc::new(move |_: &[usize]| Ok(f())),
        }
    }

    /// A closure given the spec's shape (TensorFlow's initializers that take
    /// `shape`): the spec must give a fully defined shape, or the call fails
    /// with [`Error::ShapeRequired`](crate::sharing::Error::ShapeRequired). O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let zeros = Initializer::with_shape(|s: &[usize]| vec![0.0_f32; s[0]]);
    /// let v = store.get_variable(&root, VarSpec::new("v").shape([3]).initializer(zeros))?;
    /// assert_eq!(store.tree().get::<Vec<f32>>(v)?, &[0.0; 3]);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn with_shape(f: impl Fn(&[usize]) -> T + Send + Sync + 'static) -> Self {
        Initializer {
            kind: InitKind::Shaped,
            make: Arc::new(move |shape: &[usize]| Ok(f(shape))),
        }
    }

    /// A closure given the spec's shape that may fail (a tensor library's
    /// constructor, which can run out of device memory): as
    /// [`with_shape`](Self::with_shape), and an error makes `get_variable`
    /// fail with [`Error::InitFailed`](crate::sharing::Error::InitFailed),
    /// creating nothing. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Error, Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let init = Initializer::try_with_shape(|s: &[usize]| {
    ///     if s[0] > 4 { Err("too large") } else { Ok(vec![0_u8; s[0]]) }
    /// });
    /// let err = store.get_variable(&root, VarSpec::new("v").shape([9]).initializer(init)).unwrap_err();
    /// assert!(matches!(err, Error::InitFailed { .. }));
    /// assert_eq!(store.variable("v")?, None);
    /// # Ok::<(), Error>(())
    /// ```
    pub fn try_with_shape<E>(f: impl Fn(&[usize]) -> Result<T, E> + Send + Sync + 'static) -> Self
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        Initializer {
            kind: InitKind::Shaped,
            make: Arc::new(move |shape: &[usize]| f(shape).map_err(InitError::new)),
        }
    }

    /// Makes one value, for a fully defined `shape` (ignored unless this is a
    /// shape-taking initializer). O(cost of the closure).
    ///
    /// # Errors
    /// The closure's error, for an initializer made with
    /// [`try_with_shape`](Self::try_with_shape).
    ///
    /// ```
    /// use scopetree::sharing::Initializer;
    /// let init = Initializer::with_shape(|s: &[usize]| vec![1_u8; s[0]]);
    /// assert_eq!(init.make(&[2])?, vec![1, 1]);
    /// # Ok::<(), scopetree::sharing::InitError>(())
    /// ```
    pub fn make(&self, shape: &[usize]) -> Result<T, InitError> {
        (self.make)(shape)
    }

    /// Type-erases this initializer for the getter chain.
    /// How this initializer is called. O(1).
    pub(crate) fn kind(&self) -> InitKind {
        self.kind
    }

    pub(crate) fn erase(&self) -> ErasedInit
    where
        T: HasShape,
    {
        let make = Arc::clone(&self.make);
        ErasedInit {
            kind: self.kind,
            make: Arc::new(move |shape: &[usize]| {
                let value = make(shape)?;
                let s = value.shape();
                Ok((s, Box::new(value) as Box<dyn Payload>))
            }),
        }
    }
}

/// An [`Initializer`] with its value type erased: it makes the boxed value
/// and reports the value's shape.
#[derive(Clone)]
pub(crate) struct ErasedInit {
    pub(crate) kind: InitKind,
    pub(crate) make: ErasedMakeFn,
}

/// A scope default initializer for one value type, stored as `Any`.
pub(crate) type AnyInit = Arc<dyn Any + Send + Sync>;
