//! Shapes: [`Shape`] (TensorFlow's `TensorShape` with a known rank) and
//! [`HasShape`], how the sharing layer reads the shape of a held value.

use std::fmt;

use smallvec::SmallVec;

/// The shape of a value: a list of dimensions, each known (`Some(n)`) or
/// unknown (`None`), as TensorFlow 1's `TensorShape` of known rank. A spec
/// that gives no shape at all (`None` where an `Option<Shape>` is taken) is
/// TensorFlow's unknown rank: it is compatible with every shape.
///
/// ```
/// use scopetree::sharing::Shape;
/// let s = Shape::new([2, 3]);
/// assert_eq!(s.rank(), 2);
/// assert!(s.is_compatible_with(&Shape::from_dims([Some(2), None])));
/// assert_eq!(s.to_string(), "[2, 3]");
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape {
    dims: SmallVec<[Option<usize>; 4]>,
}

impl Shape {
    /// A fully defined shape. O(rank).
    ///
    /// ```
    /// use scopetree::sharing::Shape;
    /// assert!(Shape::new([4]).is_fully_defined());
    /// ```
    pub fn new(dims: impl IntoIterator<Item = usize>) -> Self {
        Shape {
            dims: dims.into_iter().map(Some).collect(),
        }
    }

    /// The shape of a scalar: rank 0. O(1).
    ///
    /// ```
    /// use scopetree::sharing::Shape;
    /// assert_eq!(Shape::scalar().rank(), 0);
    /// ```
    pub fn scalar() -> Self {
        Shape::default()
    }

    /// A shape whose dimensions may be unknown (`None`). O(rank).
    ///
    /// ```
    /// use scopetree::sharing::Shape;
    /// let s = Shape::from_dims([None, Some(3)]);
    /// assert!(!s.is_fully_defined());
    /// ```
    pub fn from_dims(dims: impl IntoIterator<Item = Option<usize>>) -> Self {
        Shape {
            dims: dims.into_iter().collect(),
        }
    }

    /// The number of dimensions. O(1).
    ///
    /// ```
    /// use scopetree::sharing::Shape;
    /// assert_eq!(Shape::new([2, 3, 4]).rank(), 3);
    /// ```
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The dimensions. O(1).
    ///
    /// ```
    /// use scopetree::sharing::Shape;
    /// assert_eq!(Shape::new([5]).dims(), &[Some(5)]);
    /// ```
    pub fn dims(&self) -> &[Option<usize>] {
        &self.dims
    }

    /// Whether every dimension is known. O(rank).
    ///
    /// ```
    /// use scopetree::sharing::Shape;
    /// assert!(!Shape::from_dims([None]).is_fully_defined());
    /// ```
    pub fn is_fully_defined(&self) -> bool {
        self.dims.iter().all(Option::is_some)
    }

    /// The dimensions as plain numbers, if every one is known. O(rank).
    ///
    /// ```
    /// use scopetree::sharing::Shape;
    /// assert_eq!(Shape::new([2, 3]).to_vec(), Some(vec![2, 3]));
    /// assert_eq!(Shape::from_dims([None]).to_vec(), None);
    /// ```
    pub fn to_vec(&self) -> Option<Vec<usize>> {
        self.dims.iter().copied().collect()
    }

    /// TensorFlow's `is_compatible_with`: same rank, and every pair of
    /// dimensions equal or at least one of them unknown. O(rank).
    ///
    /// ```
    /// use scopetree::sharing::Shape;
    /// assert!(Shape::new([1]).is_compatible_with(&Shape::from_dims([None])));
    /// assert!(!Shape::new([1]).is_compatible_with(&Shape::new([2])));
    /// assert!(!Shape::new([1]).is_compatible_with(&Shape::new([1, 1])));
    /// ```
    pub fn is_compatible_with(&self, other: &Shape) -> bool {
        self.rank() == other.rank()
            && self
                .dims
                .iter()
                .zip(&other.dims)
                .all(|(a, b)| a.is_none() || b.is_none() || a == b)
    }

    /// Prepends a dimension (used by the [`HasShape`] impls of containers).
    fn prepend(mut self, dim: usize) -> Self {
        self.dims.insert(0, Some(dim));
        self
    }
}

/// Writes `[2, ?, 3]`; a scalar is `[]`.
impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match d {
                Some(n) => write!(f, "{n}")?,
                None => f.write_str("?")?,
            }
        }
        f.write_str("]")
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Shape{self}")
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape::new(dims)
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        Shape::new(dims.iter().copied())
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Shape::new(dims)
    }
}

/// How the sharing layer reads the shape of a value, to check a reuse request
/// against what the variable holds.
///
/// Implemented for the scalar types (shape `[]`), `String` (a scalar, as
/// TensorFlow's string tensors), `Vec<T>`, `[T; N]` and `Box<[T]>` (the length,
/// then the shape of the *first* element: an empty container has shape `[0]`,
/// and ragged nesting is not detected). Implement it for your tensor type:
///
/// ```
/// use scopetree::sharing::{HasShape, Shape};
/// struct Matrix { rows: usize, cols: usize, data: Vec<f32> }
/// impl HasShape for Matrix {
///     fn shape(&self) -> Shape { Shape::new([self.rows, self.cols]) }
/// }
/// let m = Matrix { rows: 2, cols: 3, data: vec![0.0; 6] };
/// assert_eq!(m.shape(), Shape::new([2, 3]));
/// assert_eq!(vec![vec![1.0_f32; 3]; 2].shape(), Shape::new([2, 3]));
/// ```
pub trait HasShape {
    /// The shape of this value. O(rank²) for the nested-container impls of
    /// this crate (each level prepends its dimension), O(1) for scalars.
    ///
    /// ```
    /// use scopetree::sharing::{HasShape, Shape};
    /// assert_eq!([1_u8, 2, 3].shape(), Shape::new([3]));
    /// ```
    fn shape(&self) -> Shape;
}

macro_rules! scalar_shapes {
    ($($t:ty),* $(,)?) => {
        $(impl HasShape for $t {
            fn shape(&self) -> Shape {
                Shape::scalar()
            }
        })*
    };
}

scalar_shapes!(
    f32,
    f64,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    bool,
    char,
    String,
    ()
);

impl<T: HasShape> HasShape for Vec<T> {
    fn shape(&self) -> Shape {
        self.as_slice().shape()
    }
}

impl<T: HasShape> HasShape for Box<[T]> {
    fn shape(&self) -> Shape {
        (**self).shape()
    }
}

impl<T: HasShape, const N: usize> HasShape for [T; N] {
    fn shape(&self) -> Shape {
        self.as_slice().shape()
    }
}

impl<T: HasShape> HasShape for [T] {
    fn shape(&self) -> Shape {
        match self.first() {
            Some(first) => first.shape().prepend(self.len()),
            None => Shape::new([0]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_containers_report_outer_then_inner() {
        assert_eq!([[0u8; 3]; 2].shape(), Shape::new([2, 3]));
        assert_eq!(Vec::<f32>::new().shape(), Shape::new([0]));
        assert_eq!(1.0_f32.shape(), Shape::scalar());
    }

    #[test]
    fn display_marks_unknown_dims() {
        assert_eq!(Shape::from_dims([Some(2), None]).to_string(), "[2, ?]");
        assert_eq!(Shape::scalar().to_string(), "[]");
    }
}
