//! The [`Element`] trait: the element types a checkpoint stores (`f32`,
//! `f64`, the integers, `bool`, `f16`, `bf16`) and their little-endian
//! encodings.

use std::borrow::Cow;
use std::io::{self, Read};

use half::{bf16, f16};

use super::dtype::Dtype;

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
                if cfg!(target_endian = "little") {
                    Cow::Borrowed(bytemuck::cast_slice(items))
                } else {
                    Cow::Owned(items.iter().flat_map(|x| x.to_le_bytes()).collect())
                }
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
