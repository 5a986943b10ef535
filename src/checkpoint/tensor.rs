//! Which values are tensors: the [`Checkpointable`] trait, its element
//! types ([`Element`]), the shaped [`Tensor`] and the type-erased codecs the
//! save and load passes look values up with.

use std::any::{Any, TypeId, type_name};
use std::borrow::Cow;
use std::io::{self, Read};

use half::{bf16, f16};
pub use safetensors::Dtype;

/// A float dtype a checkpoint converts to: on load
/// ([`LoadOptions::create_floats_as`](super::LoadOptions::create_floats_as))
/// or on save ([`SaveOptions::floats_as`](super::SaveOptions::floats_as)).
///
/// ```
/// use scopetree::checkpoint::{Dtype, FloatDtype};
/// assert_eq!(FloatDtype::BF16.dtype(), Dtype::BF16);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatDtype {
    /// IEEE half precision.
    F16,
    /// bfloat16, the usual dtype of published checkpoints.
    BF16,
    /// Single precision.
    F32,
    /// Double precision.
    F64,
}

impl FloatDtype {
    /// The safetensors dtype. O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::{Dtype, FloatDtype};
    /// assert_eq!(FloatDtype::F32.dtype(), Dtype::F32);
    /// ```
    pub fn dtype(self) -> Dtype {
        match self {
            Self::F16 => Dtype::F16,
            Self::BF16 => Dtype::BF16,
            Self::F32 => Dtype::F32,
            Self::F64 => Dtype::F64,
        }
    }
}

use super::error::Error;
use rustc_hash::FxHashMap;

/// A value that can be written to and read from a checkpoint: a dtype, a
/// shape, little-endian row-major bytes, and the inverse.
///
/// Implemented for `Vec<T>`, `Box<[T]>` and [`Tensor<T>`] of every
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
fn read_slice_in_place<E: Element>(
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

mod sealed {
    pub trait Sealed {}
}

/// An element type a checkpoint stores: its safetensors [`Dtype`] and its
/// little-endian encoding. Sealed: the crate implements it for `f32`, `f64`,
/// `i8`–`i64`, `u8`–`u64`, `bool`, [`half::f16`] and [`half::bf16`].
///
/// ```
/// use scopetree::checkpoint::{Dtype, Element};
/// assert_eq!(<f32 as Element>::DTYPE, Dtype::F32);
/// assert_eq!(<half::bf16 as Element>::DTYPE, Dtype::BF16);
/// ```
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The safetensors dtype of this element type.
    const DTYPE: Dtype;

    /// The elements as little-endian bytes. O(1) when the memory already has
    /// that layout, else O(len).
    #[doc(hidden)]
    fn slice_le_bytes(items: &[Self]) -> Cow<'_, [u8]>;

    /// Decodes little-endian bytes (`bytes.len()` a multiple of the size).
    /// O(len).
    #[doc(hidden)]
    fn vec_from_le_bytes(bytes: &[u8]) -> Vec<Self>;

    /// Reads `n` elements from `reader`, straight into the vector's memory
    /// where the layout allows. O(n).
    #[doc(hidden)]
    fn read_vec(n: usize, reader: &mut dyn Read) -> io::Result<Vec<Self>> {
        let mut bytes = vec![0_u8; n * (Self::DTYPE.bitsize() / 8)];
        reader.read_exact(&mut bytes)?;
        Ok(Self::vec_from_le_bytes(&bytes))
    }

    /// Reads `items.len()` elements from `reader` into `items` in place;
    /// `Ok(false)` when the type cannot (then nothing was read). O(n).
    #[doc(hidden)]
    fn read_into_slice(items: &mut [Self], reader: &mut dyn Read) -> io::Result<bool> {
        let _ = (items, reader);
        Ok(false)
    }
}

macro_rules! pod_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
            fn slice_le_bytes(items: &[Self]) -> Cow<'_, [u8]> {
                if cfg!(target_endian = "little") {
                    Cow::Borrowed(bytemuck::cast_slice(items))
                } else {
                    Cow::Owned(items.iter().flat_map(|x| x.to_le_bytes()).collect())
                }
            }
            fn vec_from_le_bytes(bytes: &[u8]) -> Vec<Self> {
                const N: usize = std::mem::size_of::<$t>();
                bytes
                    .chunks_exact(N)
                    .map(|c| {
                        let mut a = [0_u8; N];
                        a.copy_from_slice(c);
                        <$t>::from_le_bytes(a)
                    })
                    .collect()
            }
            fn read_vec(n: usize, reader: &mut dyn Read) -> io::Result<Vec<Self>> {
                let mut v: Vec<$t> = vec![<$t>::default(); n];
                reader.read_exact(bytemuck::cast_slice_mut(&mut v))?;
                if cfg!(target_endian = "big") {
                    for x in &mut v {
                        *x = <$t>::from_le_bytes(x.to_ne_bytes());
                    }
                }
                Ok(v)
            }
            fn read_into_slice(items: &mut [Self], reader: &mut dyn Read) -> io::Result<bool> {
                reader.read_exact(bytemuck::cast_slice_mut(items))?;
                if cfg!(target_endian = "big") {
                    for x in items.iter_mut() {
                        *x = <$t>::from_le_bytes(x.to_ne_bytes());
                    }
                }
                Ok(true)
            }
        }
    )*};
}

pod_element!(
    f32 => F32, f64 => F64,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
);

macro_rules! half_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
            fn slice_le_bytes(items: &[Self]) -> Cow<'_, [u8]> {
                Cow::Owned(items.iter().flat_map(|x| x.to_le_bytes()).collect())
            }
            fn vec_from_le_bytes(bytes: &[u8]) -> Vec<Self> {
                bytes
                    .chunks_exact(2)
                    .map(|c| <$t>::from_le_bytes([c[0], c[1]]))
                    .collect()
            }
        }
    )*};
}

half_element!(f16 => F16, bf16 => BF16);

impl sealed::Sealed for bool {}
/// `bool` is stored as one byte, 0 or 1; any non-zero byte loads as `true`.
impl Element for bool {
    const DTYPE: Dtype = Dtype::BOOL;
    fn slice_le_bytes(items: &[Self]) -> Cow<'_, [u8]> {
        Cow::Owned(items.iter().map(|&b| u8::from(b)).collect())
    }
    fn vec_from_le_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
}

fn check_bytes<E: Element>(dtype: Dtype, shape: &[usize], nbytes: usize) -> Result<usize, Error> {
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

// ----- type-erased codecs ----------------------------------------------------

/// What a save needs of one value.
pub(crate) struct Parts<'a> {
    pub(crate) dtype: Dtype,
    pub(crate) shape: Cow<'a, [usize]>,
    pub(crate) flat: bool,
    pub(crate) bytes: Cow<'a, [u8]>,
}

/// A value's dtype, shape and flatness.
pub(crate) type Meta = (Dtype, Vec<usize>, bool);

/// A value taken out of a variable by a load, kept to undo the load.
pub(crate) type Old = Box<dyn Any + Send + Sync>;

/// The operations on one checkpointable type, behind function pointers so
/// that a variable's value is matched by its `TypeId` in O(1).
#[derive(Clone, Copy)]
pub(crate) struct Codec {
    /// dtype, shape and flatness, without touching the bytes.
    pub(crate) meta: fn(&dyn Any) -> Option<Meta>,
    pub(crate) parts: fn(&dyn Any) -> Option<Result<Parts<'_>, Error>>,
    /// [`Checkpointable::SHARED`]: loads stage a new value, then assign it.
    pub(crate) shared: bool,
    /// Reads a new value without touching the tree (for shared types).
    pub(crate) stage: fn(Source<'_>) -> Result<Old, Error>,
    /// Writes a staged value into the variable's value in place.
    pub(crate) assign: fn(&mut crate::ScopeTree, crate::VarId, Old) -> Result<(), Error>,
    /// Reads a value into the variable's value in place, or (when the
    /// value declines) replaces it; returns the replaced value.
    pub(crate) read_into: ReadInto,
    /// Puts an old value back (undo).
    pub(crate) restore: fn(&mut crate::ScopeTree, crate::VarId, Old) -> Result<(), crate::Error>,
    /// Puts a staged value in the variable; returns the replaced one.
    pub(crate) put: fn(&mut crate::ScopeTree, crate::VarId, Old) -> Result<Option<Old>, Error>,
    /// One of the crate's own types (`Vec`, `Box<[_]>`, `Tensor` of an
    /// element, and candle's `Var` in a candle store's load), which take a
    /// tensor of their dtype and size in place: read into their memory, or
    /// for a shared type assigned from a value read just before.
    pub(crate) builtin: bool,
}

/// Reads a value into a variable, in place where the value fits; returns
/// the replaced value, for undo.
pub(crate) type ReadInto =
    fn(&mut crate::ScopeTree, crate::VarId, Source<'_>) -> Result<Option<Old>, Error>;

/// Where a load's value comes from: straight from the file, or from bytes
/// already converted to the target dtype.
pub(crate) enum Source<'a> {
    Reader {
        dtype: Dtype,
        shape: &'a [usize],
        nbytes: usize,
        reader: &'a mut dyn Read,
    },
    Bytes {
        dtype: Dtype,
        shape: &'a [usize],
        bytes: Vec<u8>,
    },
}

fn meta_of<T: Checkpointable>(v: &dyn Any) -> Option<Meta> {
    let v = v.downcast_ref::<T>()?;
    Some((v.dtype(), v.shape().into_owned(), T::FLAT))
}

fn parts_of<T: Checkpointable>(v: &dyn Any) -> Option<Result<Parts<'_>, Error>> {
    let v = v.downcast_ref::<T>()?;
    Some(v.try_le_bytes().map(|bytes| Parts {
        dtype: v.dtype(),
        shape: v.shape(),
        flat: T::FLAT,
        bytes,
    }))
}

/// Builds a value of `T` from a load's source.
fn build<T: Checkpointable>(src: Source<'_>) -> Result<T, Error> {
    match src {
        Source::Reader {
            dtype,
            shape,
            nbytes,
            reader,
        } => T::read_le(dtype, shape, nbytes, reader),
        Source::Bytes {
            dtype,
            shape,
            bytes,
        } => T::from_le_bytes(dtype, shape, bytes),
    }
}

fn stage<T: Checkpointable>(src: Source<'_>) -> Result<Old, Error> {
    Ok(Box::new(build::<T>(src)?))
}

fn assign<T: Checkpointable>(
    tree: &mut crate::ScopeTree,
    var: crate::VarId,
    new: Old,
) -> Result<(), Error> {
    let new = new.downcast::<T>().map_err(|_| Error::BadTensor {
        reason: format!("a staged value is not a {}", type_name::<T>()),
    })?;
    tree.get_mut::<T>(var)?.assign(*new)
}

fn read_into<T: Checkpointable>(
    tree: &mut crate::ScopeTree,
    var: crate::VarId,
    src: Source<'_>,
) -> Result<Option<Old>, Error> {
    let holds = tree.is::<T>(var)?;
    // A value of the right type and size takes the bytes where it is.
    let src = match src {
        Source::Reader {
            dtype,
            shape,
            nbytes,
            reader,
        } if holds => {
            let v = tree.get_mut::<T>(var)?;
            if v.read_le_in_place(dtype, shape, nbytes, reader)? {
                return Ok(None);
            }
            Source::Reader {
                dtype,
                shape,
                nbytes,
                reader,
            }
        }
        other => other,
    };
    if T::SHARED && holds {
        // Its owners hold this value: the new elements are assigned into
        // it, and the value read for them is dropped at once (its memory
        // serves the next tensor's).
        assign::<T>(tree, var, stage::<T>(src)?)?;
        return Ok(None);
    }
    put::<T>(tree, var, stage::<T>(src)?)
}

fn restore<T: Checkpointable>(
    tree: &mut crate::ScopeTree,
    var: crate::VarId,
    old: Old,
) -> Result<(), crate::Error> {
    // The undo log only holds values `read_into::<T>` or `put::<T>` took out.
    match old.downcast::<T>() {
        Ok(v) => tree.set(var, *v),
        Err(_) => Ok(()),
    }
}

fn put<T: Checkpointable>(
    tree: &mut crate::ScopeTree,
    var: crate::VarId,
    new: Old,
) -> Result<Option<Old>, Error> {
    let new = new.downcast::<T>().map_err(|_| Error::BadTensor {
        reason: format!("a staged value is not a {}", type_name::<T>()),
    })?;
    // An uninitialised variable is simply set (`replace` returns `None`);
    // the load checked beforehand that an initialised one holds a `T`.
    let old = tree.replace::<T>(var, *new)?;
    Ok(old.map(|v| Box::new(v) as Old))
}

impl Codec {
    /// The codec of `T`.
    pub(crate) fn of<T: Checkpointable>() -> (TypeId, Self) {
        (
            TypeId::of::<T>(),
            Self {
                meta: meta_of::<T>,
                parts: parts_of::<T>,
                shared: T::SHARED,
                stage: stage::<T>,
                assign: assign::<T>,
                read_into: read_into::<T>,
                restore: restore::<T>,
                put: put::<T>,
                builtin: false,
            },
        )
    }
}

/// The checkpointable types a save or load knows, by `TypeId`.
#[derive(Clone)]
pub(crate) struct Types {
    pub(crate) by_id: FxHashMap<TypeId, Codec>,
}

impl Types {
    /// The crate's own types: `Vec`, `Box<[_]>` and `Tensor` of every element.
    pub(crate) fn builtin() -> Self {
        let mut by_id = FxHashMap::default();
        macro_rules! add {
            ($($e:ty),*) => {$(
                by_id.extend([
                    Codec::of::<Vec<$e>>(),
                    Codec::of::<Box<[$e]>>(),
                    Codec::of::<Tensor<$e>>(),
                ]);
            )*};
        }
        add!(
            f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, bool, f16, bf16
        );
        for c in by_id.values_mut() {
            c.builtin = true;
        }
        Self { by_id }
    }

    /// Registers `T` as one of the crate's own types (see
    /// [`Codec::builtin`]).
    #[cfg(feature = "candle")]
    pub(crate) fn add_builtin<T: Checkpointable>(&mut self) {
        let (id, mut c) = Codec::of::<T>();
        c.builtin = true;
        self.by_id.insert(id, c);
    }

    pub(crate) fn add<T: Checkpointable>(&mut self) {
        let (id, c) = Codec::of::<T>();
        self.by_id.entry(id).or_insert(c);
    }

    pub(crate) fn get(&self, id: TypeId) -> Option<&Codec> {
        self.by_id.get(&id)
    }
}

/// The codec a load uses for a variable that has no value yet: `Vec<E>`, or
/// [`Tensor<E>`] when `shaped`; `None` for a dtype the crate has no element
/// type for.
pub(crate) fn default_codec(dtype: Dtype, shaped: bool) -> Option<Codec> {
    macro_rules! pick {
        ($($d:ident => $e:ty),*) => {
            match dtype {
                $(Dtype::$d => Some(if shaped { Codec::of::<Tensor<$e>>().1 } else { Codec::of::<Vec<$e>>().1 }),)*
                _ => None,
            }
        };
    }
    pick!(F32 => f32, F64 => f64, I8 => i8, I16 => i16, I32 => i32, I64 => i64,
          U8 => u8, U16 => u16, U32 => u32, U64 => u64, BOOL => bool, F16 => f16, BF16 => bf16)
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
