//! [`Tensor`]: the crate's shaped value, a checkpoint's n-dimensional array.

use std::borrow::Cow;
use std::io::Read;

use super::checkpointable::{Checkpointable, read_slice_in_place};
use super::dtype::Dtype;
use super::element::Element;
use super::error::Error;

/// An n-dimensional array: a shape and its elements in row-major order. The
/// crate's shaped value, for variables whose shape should survive a
/// checkpoint without the sharing layer.
///
/// ```
/// use scopetree::checkpoint::Tensor;
/// let t = Tensor::new(vec![2, 3], vec![0.0_f32; 6])?;
/// assert_eq!(t.shape(), &[2, 3]);
/// assert_eq!(t.data().len(), 6);
/// assert!(Tensor::new(vec![2, 3], vec![0.0_f32; 5]).is_err());
/// # Ok::<(), scopetree::checkpoint::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor<T> {
    shape: Vec<usize>,
    data: Vec<T>,
}

impl<T> Tensor<T> {
    /// A tensor of `shape` holding `data` (row-major). O(rank).
    ///
    /// # Errors
    /// [`Error::BadTensor`] if the product of `shape` is not `data.len()`.
    ///
    /// ```
    /// let t = scopetree::checkpoint::Tensor::new(vec![], vec![7_i32])?; // a scalar
    /// assert_eq!(t.data(), &[7]);
    /// # Ok::<(), scopetree::checkpoint::Error>(())
    /// ```
    pub fn new(shape: Vec<usize>, data: Vec<T>) -> Result<Self, Error> {
        let n = shape.iter().try_fold(1_usize, |a, &d| a.checked_mul(d));
        if n != Some(data.len()) {
            return Err(Error::BadTensor {
                reason: format!("shape {shape:?} does not hold {} elements", data.len()),
            });
        }
        Ok(Self { shape, data })
    }

    /// The shape, outermost dimension first. O(1).
    ///
    /// ```
    /// let t = scopetree::checkpoint::Tensor::new(vec![4], vec![0_u8; 4])?;
    /// assert_eq!(t.shape(), &[4]);
    /// # Ok::<(), scopetree::checkpoint::Error>(())
    /// ```
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The elements, row-major. O(1).
    ///
    /// ```
    /// let t = scopetree::checkpoint::Tensor::new(vec![2], vec![1_u8, 2])?;
    /// assert_eq!(t.data(), &[1, 2]);
    /// # Ok::<(), scopetree::checkpoint::Error>(())
    /// ```
    pub fn data(&self) -> &[T] {
        &self.data
    }

    /// The elements, mutably (the shape stays fixed). O(1).
    ///
    /// ```
    /// let mut t = scopetree::checkpoint::Tensor::new(vec![2], vec![1_u8, 2])?;
    /// t.data_mut()[0] = 9;
    /// assert_eq!(t.data(), &[9, 2]);
    /// # Ok::<(), scopetree::checkpoint::Error>(())
    /// ```
    pub fn data_mut(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// Swaps the elements with `other`'s when it holds as many (the shape
    /// stays); returns whether it did. O(1).
    pub(crate) fn swap_data(&mut self, other: &mut Vec<T>) -> bool {
        if other.len() != self.data.len() {
            return false;
        }
        std::mem::swap(&mut self.data, other);
        true
    }

    /// The shape and the elements. O(1).
    ///
    /// ```
    /// let t = scopetree::checkpoint::Tensor::new(vec![1, 2], vec![1_u8, 2])?;
    /// assert_eq!(t.into_parts(), (vec![1, 2], vec![1, 2]));
    /// # Ok::<(), scopetree::checkpoint::Error>(())
    /// ```
    pub fn into_parts(self) -> (Vec<usize>, Vec<T>) {
        (self.shape, self.data)
    }
}

impl<E: Element> Checkpointable for Tensor<E> {
    fn dtype(&self) -> Dtype {
        E::DTYPE
    }
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Borrowed(&self.shape)
    }
    fn le_bytes(&self) -> Cow<'_, [u8]> {
        E::slice_le_bytes(&self.data)
    }
    fn from_le_bytes(dtype: Dtype, shape: &[usize], bytes: Vec<u8>) -> Result<Self, Error> {
        let data = Vec::<E>::from_le_bytes(dtype, shape, bytes)?;
        Ok(Self {
            shape: shape.to_vec(),
            data,
        })
    }
    #[inline]
    fn read_le(
        dtype: Dtype,
        shape: &[usize],
        nbytes: usize,
        reader: &mut dyn Read,
    ) -> Result<Self, Error> {
        let data = Vec::<E>::read_le(dtype, shape, nbytes, reader)?;
        Ok(Self {
            shape: shape.to_vec(),
            data,
        })
    }
    fn read_le_in_place(
        &mut self,
        dtype: Dtype,
        shape: &[usize],
        nbytes: usize,
        reader: &mut dyn Read,
    ) -> Result<bool, Error> {
        if shape != self.shape.as_slice() {
            return Ok(false);
        }
        read_slice_in_place(&mut self.data, dtype, nbytes, reader)
    }
}

/// A [`Tensor`] can be a [`VariableStore`](crate::sharing::VariableStore)
/// variable: its shape is checked on creation and reuse like any other.
///
/// ```
/// use scopetree::{checkpoint::Tensor, sharing::{HasShape, Shape}};
/// let t = Tensor::new(vec![2, 3], vec![0_u8; 6])?;
/// assert_eq!(HasShape::shape(&t), Shape::new([2, 3]));
/// # Ok::<(), scopetree::checkpoint::Error>(())
/// ```
impl<T> crate::sharing::HasShape for Tensor<T> {
    fn shape(&self) -> crate::sharing::Shape {
        crate::sharing::Shape::new(self.shape.iter().copied())
    }
}
