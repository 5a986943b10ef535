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

/// The closure behind an [`Initializer`]: shape in, value out.
type MakeFn<T> = Arc<dyn Fn(&[usize]) -> T + Send + Sync>;

/// The closure behind an [`ErasedInit`]: shape in, shape and boxed value out.
type ErasedMakeFn = Arc<dyn Fn(&[usize]) -> (Shape, Box<dyn Payload>) + Send + Sync>;

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
            make: Arc::new(move |_: &[usize]| value.clone()),
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
            make: Arc::new(move |_: &[usize]| f()),
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
            make: Arc::new(f),
        }
    }

    /// Makes one value, for a fully defined `shape` (ignored unless this is a
    /// shape-taking initializer). O(cost of the closure).
    ///
    /// ```
    /// use scopetree::sharing::Initializer;
    /// let init = Initializer::with_shape(|s: &[usize]| vec![1_u8; s[0]]);
    /// assert_eq!(init.make(&[2]), vec![1, 1]);
    /// ```
    pub fn make(&self, shape: &[usize]) -> T {
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
                let value = make(shape);
                let s = value.shape();
                (s, Box::new(value) as Box<dyn Payload>)
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
