//! The [`Checkpointable`] trait: which values are tensors; and its
//! implementations for `Vec<E>` and `Box<[E]>` of every [`Element`].

use std::any::{Any, type_name};
use std::borrow::Cow;
use std::io::Read;

use super::dtype::Dtype;
use super::element::Element;
use super::error::Error;

/// A value that can be written to and read from a checkpoint: a dtype, a
/// shape, little-endian row-major bytes, and the inverse.
///
/// Implemented for `Vec<T>`, `Box<[T]>` and [`Tensor<T>`](super::Tensor) of every
/// [`Element`] (`f32`, `f64`, `i8`–`i64`, `u8`–`u64`, `bool`, [`half::f16`],
/// [`half::bf16`]). Implement it for a type of your own and register the type
/// with [`SaveOptions::with_type`](super::SaveOptions::with_type) and
/// [`LoadOptions::with_type`](super::LoadOptions::with_type).
///
/// ```
/// use scopetree::checkpoint::{Checkpointable, Dtype};
/// let v = vec![1.0_f32, 2.0];
/// assert_eq!(v.dtype(), Dtype::F32);
/// assert_eq!(&*v.shape(), &[2]);
/// assert_eq!(v.le_bytes().len(), 8);
/// let back = Vec::<f32>::from_le_bytes(Dtype::F32, &[2], v.le_bytes().into_owned())?;
/// assert_eq!(back, v);
/// # Ok::<(), scopetree::checkpoint::Error>(())
/// ```
pub trait Checkpointable: Any + Send + Sync + Sized {
    /// Whether the value has no shape of its own beyond its length (`Vec`,
    /// `Box<[T]>`): such a value loads from a tensor of any shape with the
    /// same element count, and saves with the shape the sharing layer
    /// recorded for it, if any.
    const FLAT: bool = false;

    /// Whether other owners share this value's storage: a handle such as a
    /// candle `Var`, which a model and an optimizer hold too. A load never
    /// replaces such a value: it writes the new elements into it with
    /// [`assign`](Self::assign), so every owner sees them. For a type of
    /// yours the load reads every tensor of the file first, so a failed read
    /// changes nothing; a candle store's load assigns its `Var`s one tensor
    /// at a time instead, as values of the crate's own types are read in
    /// place (see [`LoadOptions::rollback`](super::LoadOptions::rollback)).
    /// `false` by default.
    const SHARED: bool = false;

    /// The element type. O(1).
    fn dtype(&self) -> Dtype;

    /// The shape, outermost dimension first; `[len]` for a flat value. O(rank).
    fn shape(&self) -> Cow<'_, [usize]>;

    /// The elements as little-endian bytes, row-major. Borrowed when the
    /// memory already has that layout (every numeric type on a little-endian
    /// machine), else a copy. O(1) or O(len).
    fn le_bytes(&self) -> Cow<'_, [u8]>;

    /// The elements as little-endian bytes, or an error when they cannot be
    /// read (a tensor on a device that fails to copy to the host). Saves call
    /// this; the default returns [`le_bytes`](Self::le_bytes). O(len).
    ///
    /// # Errors
    /// [`Error::BadTensor`] naming what failed.
    ///
    /// ```
    /// use scopetree::checkpoint::Checkpointable;
    /// assert_eq!(vec![1_u8, 2].try_le_bytes()?.len(), 2);
    /// # Ok::<(), scopetree::checkpoint::Error>(())
    /// ```
    fn try_le_bytes(&self) -> Result<Cow<'_, [u8]>, Error> {
        Ok(self.le_bytes())
    }

    /// Hands the elements to `out` as little-endian bytes, row-major, in
    /// order, in pieces of at most `chunk` bytes where the value can: saves
    /// call this, so that a value is written without a whole copy of it in
    /// host memory (a device tensor stages its bytes through host buffers
    /// of `chunk` bytes). The pieces hold whole elements. The default hands
    /// over [`try_le_bytes`](Self::try_le_bytes) in pieces. O(len); memory:
    /// what `try_le_bytes` holds (the crate's own types: nothing on a
    /// little-endian machine; a candle `Var` on a device: `chunk` bytes).
    ///
    /// # Errors
    /// [`Error::BadTensor`] when the elements cannot be read; `out`'s
    /// errors.
    ///
    /// ```
    /// use scopetree::checkpoint::Checkpointable;
    /// let mut got = Vec::new();
    /// vec![1_u16, 2, 3].write_le(4, &mut |piece| {
    ///     assert!(piece.len() <= 4);
    ///     got.extend_from_slice(piece);
    ///     Ok(())
    /// })?;
    /// assert_eq!(got, [1, 0, 2, 0, 3, 0]);
    /// # Ok::<(), scopetree::checkpoint::Error>(())
    /// ```
    fn write_le(
        &self,
        chunk: usize,
        out: &mut dyn FnMut(&[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let bytes = self.try_le_bytes()?;
        let size = self.dtype().bitsize().div_ceil(8).max(1);
        let chunk = (chunk / size).max(1) * size;
        if bytes.is_empty() {
            return out(&[]);
        }
        bytes.chunks(chunk).try_for_each(out)
    }

    /// Writes the elements of `new` into this value in place. A load calls
    /// it for [`SHARED`](Self::SHARED) types only, after checking that `new`
    /// has this value's dtype and shape. The default replaces the value.
    /// O(len).
    ///
    /// # Errors
    /// [`Error::BadTensor`] if the value cannot take the elements.
    ///
    /// ```
    /// use scopetree::checkpoint::Checkpointable;
    /// let mut v = vec![0_u8; 2];
    /// v.assign(vec![1, 2])?;
    /// assert_eq!(v, [1, 2]);
    /// # Ok::<(), scopetree::checkpoint::Error>(())
    /// ```
    fn assign(&mut self, new: Self) -> Result<(), Error> {
        *self = new;
        Ok(())
    }

    /// Builds a value from `bytes` (little-endian, row-major) of `dtype` and
    /// `shape`. The load calls it only with a dtype equal to the value's own
    /// (after any conversion) and `bytes.len()` equal to the element count
    /// times the dtype's size. O(len).
    ///
    /// # Errors
    /// [`Error::BadTensor`] if `dtype` or the byte count does not fit the type.
    fn from_le_bytes(dtype: Dtype, shape: &[usize], bytes: Vec<u8>) -> Result<Self, Error>;

    /// Reads `nbytes` from `reader` and builds the value. The default reads
    /// into a byte buffer and calls
    /// [`from_le_bytes`](Self::from_le_bytes); the crate's own types read
    /// straight into the value's memory, so a load holds one copy. O(len).
    ///
    /// # Errors
    /// [`Error::BadTensor`] as for `from_le_bytes`; [`Error::Io`] from the
    /// reader (with an empty path, which the load fills in).
    fn read_le(
        dtype: Dtype,
        shape: &[usize],
        nbytes: usize,
        reader: &mut dyn Read,
    ) -> Result<Self, Error> {
        let mut bytes = vec![0_u8; nbytes];
        reader.read_exact(&mut bytes).map_err(Error::io(""))?;
        Self::from_le_bytes(dtype, shape, bytes)
    }

    /// Reads `nbytes` from `reader` into this value in place, when its
    /// dtype and size already fit (the load then allocates nothing);
    /// `Ok(false)` when it cannot, and then nothing was read. The default
    /// always declines. Used by loads with
    /// the default [`rollback(false)`](super::LoadOptions::rollback). O(len).
    ///
    /// # Errors
    /// [`Error::Io`] from the reader; the value may then be partly
    /// overwritten.
    fn read_le_in_place(
        &mut self,
        dtype: Dtype,
        shape: &[usize],
        nbytes: usize,
        reader: &mut dyn Read,
    ) -> Result<bool, Error> {
        let _ = (dtype, shape, nbytes, reader);
        Ok(false)
    }
}

/// Reads into `items` in place if `dtype` and `nbytes` fit them.
pub(super) fn read_slice_in_place<E: Element>(
    items: &mut [E],
    dtype: Dtype,
    nbytes: usize,
    reader: &mut dyn Read,
) -> Result<bool, Error> {
    if dtype != E::DTYPE || items.len().checked_mul(E::DTYPE.bitsize() / 8) != Some(nbytes) {
        return Ok(false);
    }
    E::read_into_slice(items, reader).map_err(Error::io(""))
}

/// The element count of `shape` if `nbytes` of `dtype` make it in `E`.
pub(super) fn check_bytes<E: Element>(
    dtype: Dtype,
    shape: &[usize],
    nbytes: usize,
) -> Result<usize, Error> {
    let n = shape.iter().try_fold(1_usize, |a, &d| a.checked_mul(d));
    match n {
        Some(n) if dtype == E::DTYPE && n.checked_mul(E::DTYPE.bitsize() / 8) == Some(nbytes) => {
            Ok(n)
        }
        _ => Err(Error::BadTensor {
            reason: format!(
                "{nbytes} bytes of {dtype:?} with shape {shape:?} cannot make a {}",
                type_name::<E>()
            ),
        }),
    }
}

impl<E: Element> Checkpointable for Vec<E> {
    const FLAT: bool = true;
    fn dtype(&self) -> Dtype {
        E::DTYPE
    }
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Owned(vec![self.len()])
    }
    fn le_bytes(&self) -> Cow<'_, [u8]> {
        E::slice_le_bytes(self)
    }
    fn from_le_bytes(dtype: Dtype, shape: &[usize], bytes: Vec<u8>) -> Result<Self, Error> {
        check_bytes::<E>(dtype, shape, bytes.len())?;
        Ok(E::vec_from_le_bytes(&bytes))
    }
    fn read_le(
        dtype: Dtype,
        shape: &[usize],
        nbytes: usize,
        reader: &mut dyn Read,
    ) -> Result<Self, Error> {
        let n = check_bytes::<E>(dtype, shape, nbytes)?;
        E::read_vec(n, reader).map_err(Error::io(""))
    }
    fn read_le_in_place(
        &mut self,
        dtype: Dtype,
        _shape: &[usize],
        nbytes: usize,
        reader: &mut dyn Read,
    ) -> Result<bool, Error> {
        read_slice_in_place(self, dtype, nbytes, reader)
    }
}

impl<E: Element> Checkpointable for Box<[E]> {
    const FLAT: bool = true;
    fn dtype(&self) -> Dtype {
        E::DTYPE
    }
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Owned(vec![self.len()])
    }
    fn le_bytes(&self) -> Cow<'_, [u8]> {
        E::slice_le_bytes(self)
    }
    fn from_le_bytes(dtype: Dtype, shape: &[usize], bytes: Vec<u8>) -> Result<Self, Error> {
        Vec::<E>::from_le_bytes(dtype, shape, bytes).map(Vec::into_boxed_slice)
    }
    fn read_le(
        dtype: Dtype,
        shape: &[usize],
        nbytes: usize,
        reader: &mut dyn Read,
    ) -> Result<Self, Error> {
        Vec::<E>::read_le(dtype, shape, nbytes, reader).map(Vec::into_boxed_slice)
    }
    fn read_le_in_place(
        &mut self,
        dtype: Dtype,
        _shape: &[usize],
        nbytes: usize,
        reader: &mut dyn Read,
    ) -> Result<bool, Error> {
        read_slice_in_place(self, dtype, nbytes, reader)
    }
}
