//! A candle [`Var`] as a value of the tree: its shape for the sharing
//! layer, and its bytes for checkpoints.

use std::borrow::Cow;

use candle_core::{DType, Device, Tensor, Var};
use half::{bf16, f16};

use crate::checkpoint::{Checkpointable, Codec, Dtype, Element, Error};
use crate::sharing::{HasShape, Shape};

/// A `Var`'s shape is its tensor's dims, so the sharing layer checks it on
/// reuse like any other value's.
///
/// ```
/// use scopetree::sharing::{HasShape, Shape};
/// let v = candle_core::Var::zeros((2, 3), candle_core::DType::F32, &candle_core::Device::Cpu)?;
/// assert_eq!(HasShape::shape(&v), Shape::new([2, 3]));
/// # Ok::<(), candle_core::Error>(())
/// ```
impl HasShape for Var {
    fn shape(&self) -> Shape {
        Shape::new(self.dims().iter().copied())
    }
}

fn bad(reason: impl std::fmt::Display) -> Error {
    Error::BadTensor {
        reason: reason.to_string(),
    }
}

/// The candle dtype of a checkpoint dtype, if candle and scopetree both
/// have an element type for it.
pub(crate) fn candle_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::U8 => DType::U8,
        Dtype::U32 => DType::U32,
        Dtype::I16 => DType::I16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::BF16 => DType::BF16,
        Dtype::F16 => DType::F16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        _ => return None,
    })
}

/// The elements of `t` as little-endian bytes, copied to the host.
fn host_bytes(t: &Tensor) -> candle_core::Result<Vec<u8>> {
    fn le<E: Element + candle_core::WithDType>(t: &Tensor) -> candle_core::Result<Vec<u8>> {
        let v = t.flatten_all()?.to_vec1::<E>()?;
        Ok(E::slice_le_bytes(&v).into_owned())
    }
    let t = t.to_device(&Device::Cpu)?;
    match t.dtype() {
        DType::U8 => le::<u8>(&t),
        DType::U32 => le::<u32>(&t),
        DType::I16 => le::<i16>(&t),
        DType::I32 => le::<i32>(&t),
        DType::I64 => le::<i64>(&t),
        DType::BF16 => le::<bf16>(&t),
        DType::F16 => le::<f16>(&t),
        DType::F32 => le::<f32>(&t),
        DType::F64 => le::<f64>(&t),
        other => Err(candle_core::Error::Msg(format!(
            "scopetree checkpoints do not store {other:?}"
        ))),
    }
}

/// A candle `Var` is a tensor of a checkpoint. It is
/// [`SHARED`](Checkpointable::SHARED): a model and an optimizer hold the
/// same storage, so a load writes into it with `Var::set` instead of
/// replacing it. A `Var` a load creates lives on the CPU.
///
/// With [`Checkpointable`] in scope, `var.dtype()` and `var.shape()` name
/// the trait's methods (a `Var` is the receiver before it derefs to its
/// `Tensor`); write `var.as_tensor().dtype()` for candle's.
///
/// ```
/// use scopetree::checkpoint::{Checkpointable, Dtype};
/// let v = candle_core::Var::ones((2, 2), candle_core::DType::F32, &candle_core::Device::Cpu)?;
/// assert_eq!(v.as_tensor().dtype(), candle_core::DType::F32);
/// assert_eq!(Checkpointable::dtype(&v), Dtype::F32);
/// assert_eq!(v.try_le_bytes()?.len(), 16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl Checkpointable for Var {
    const SHARED: bool = true;

    fn dtype(&self) -> Dtype {
        Tensor::dtype(self).into()
    }

    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Borrowed(self.dims())
    }

    /// The bytes, or none when the copy to the host fails; saves call
    /// [`try_le_bytes`](Checkpointable::try_le_bytes), which reports that
    /// failure.
    fn le_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Owned(host_bytes(self).unwrap_or_default())
    }

    fn try_le_bytes(&self) -> Result<Cow<'_, [u8]>, Error> {
        host_bytes(self).map(Cow::Owned).map_err(bad)
    }

    fn from_le_bytes(dtype: Dtype, shape: &[usize], bytes: Vec<u8>) -> Result<Self, Error> {
        let d = candle_dtype(dtype).ok_or_else(|| bad(format!("candle has no {dtype:?}")))?;
        let want = shape
            .iter()
            .try_fold(d.size_in_bytes(), |a, &b| a.checked_mul(b));
        if want != Some(bytes.len()) {
            return Err(bad(format!(
                "{} bytes cannot make a {dtype:?} tensor of shape {shape:?}",
                bytes.len()
            )));
        }
        let t = Tensor::from_raw_buffer(&bytes, d, shape, &Device::Cpu).map_err(bad)?;
        Var::from_tensor(&t).map_err(bad)
    }

    fn assign(&mut self, new: Self) -> Result<(), Error> {
        let t = new.as_tensor().to_device(self.device()).map_err(bad)?;
        self.set(&t).map_err(bad)
    }
}

/// The codec of the `Var`s a candle store's load creates.
pub(crate) fn var_codec(d: Dtype) -> Option<Codec> {
    candle_dtype(d).map(|_| Codec::of::<Var>().1)
}
