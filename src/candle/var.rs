//! A candle [`Var`] as a value of the tree: its shape for the sharing
//! layer, and its bytes for checkpoints.

use std::borrow::Cow;

use candle_core::{CpuStorage, DType, Device, Storage, Tensor, Var};
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

/// The elements of `t` as little-endian bytes: one copy out of a
/// contiguous CPU tensor's storage; other tensors are first made
/// contiguous on the host.
pub(crate) fn host_bytes(t: &Tensor) -> candle_core::Result<Vec<u8>> {
    fn le<E: Element>(items: &[E], (start, end): (usize, usize)) -> candle_core::Result<Vec<u8>> {
        let items = items.get(start..end).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "a layout [{start}, {end}) past a storage of {} elements",
                items.len()
            ))
        })?;
        Ok(E::slice_le_bytes(items).into_owned())
    }
    let host;
    let t = if t.device().is_cpu() && t.is_contiguous() {
        t
    } else {
        host = t.to_device(&Device::Cpu)?.contiguous()?;
        &host
    };
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(candle_core::Error::Msg(
            "a CPU tensor without CPU storage".into(),
        ));
    };
    let range = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("a contiguous tensor without offsets".into()))?;
    match cpu {
        CpuStorage::U8(v) => le(v, range),
        CpuStorage::U32(v) => le(v, range),
        CpuStorage::I16(v) => le(v, range),
        CpuStorage::I32(v) => le(v, range),
        CpuStorage::I64(v) => le(v, range),
        CpuStorage::BF16(v) => le(v, range),
        CpuStorage::F16(v) => le(v, range),
        CpuStorage::F32(v) => le(v, range),
        CpuStorage::F64(v) => le(v, range),
        _ => Err(candle_core::Error::Msg(format!(
            "scopetree checkpoints do not store {:?}",
            t.dtype()
        ))),
    }
}

/// A CPU `Var` of `dtype` and `shape` from elements read off `reader`
/// straight into the tensor's memory.
fn var_from_reader(
    dtype: Dtype,
    shape: &[usize],
    nbytes: usize,
    reader: &mut dyn std::io::Read,
) -> Result<Var, Error> {
    fn read<E: Element + candle_core::WithDType>(
        n: usize,
        shape: &[usize],
        reader: &mut dyn std::io::Read,
    ) -> Result<Var, Error> {
        let v = E::read_vec(n, reader).map_err(Error::io(""))?;
        Var::from_vec(v, shape, &Device::Cpu).map_err(bad)
    }
    let d = candle_dtype(dtype).ok_or_else(|| bad(format!("candle has no {dtype:?}")))?;
    let n: Option<usize> = shape.iter().try_fold(1_usize, |a, &b| a.checked_mul(b));
    if n.and_then(|n| n.checked_mul(d.size_in_bytes())) != Some(nbytes) {
        return Err(bad(format!(
            "{nbytes} bytes cannot make a {dtype:?} tensor of shape {shape:?}"
        )));
    }
    let n = n.unwrap_or(0);
    match d {
        DType::U8 => read::<u8>(n, shape, reader),
        DType::U32 => read::<u32>(n, shape, reader),
        DType::I16 => read::<i16>(n, shape, reader),
        DType::I32 => read::<i32>(n, shape, reader),
        DType::I64 => read::<i64>(n, shape, reader),
        DType::BF16 => read::<bf16>(n, shape, reader),
        DType::F16 => read::<f16>(n, shape, reader),
        DType::F32 => read::<f32>(n, shape, reader),
        _ => read::<f64>(n, shape, reader),
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

    /// Streams the elements without a whole copy on the host: a contiguous
    /// CPU tensor's bytes straight from its storage, a CUDA tensor's
    /// through two page-locked buffers of `chunk` bytes (the next piece
    /// copies from the device while the last is written); other tensors
    /// are made contiguous first.
    fn write_le(
        &self,
        chunk: usize,
        out: &mut dyn FnMut(&[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        write_var(self, chunk, out)
    }

    fn from_le_bytes(dtype: Dtype, shape: &[usize], bytes: Vec<u8>) -> Result<Self, Error> {
        let n = bytes.len();
        var_from_reader(dtype, shape, n, &mut bytes.as_slice())
    }

    fn read_le(
        dtype: Dtype,
        shape: &[usize],
        nbytes: usize,
        reader: &mut dyn std::io::Read,
    ) -> Result<Self, Error> {
        var_from_reader(dtype, shape, nbytes, reader)
    }

    fn assign(&mut self, new: Self) -> Result<(), Error> {
        let t = new.as_tensor().to_device(self.device()).map_err(bad)?;
        self.set(&t).map_err(bad)
    }
}

/// Hands the elements of `t` to `out` as little-endian bytes, in pieces of
/// at most `chunk` bytes (see `Checkpointable::write_le` for `Var`).
pub(super) fn write_var(
    t: &Tensor,
    chunk: usize,
    out: &mut dyn FnMut(&[u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    fn pieces<E: bytemuck::Pod>(
        items: &[E],
        (start, end): (usize, usize),
        chunk: usize,
        out: &mut dyn FnMut(&[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let items = items.get(start..end).ok_or_else(|| {
            bad(format!(
                "a layout [{start}, {end}) past a storage of {} elements",
                items.len()
            ))
        })?;
        let size = std::mem::size_of::<E>();
        let per = (chunk / size).max(1);
        if items.is_empty() {
            return out(&[]);
        }
        for c in items.chunks(per) {
            if cfg!(target_endian = "little") {
                out(bytemuck::cast_slice(c))?;
            } else {
                let mut b: Vec<u8> = bytemuck::cast_slice(c).to_vec();
                for e in b.chunks_exact_mut(size) {
                    e.reverse();
                }
                out(&b)?;
            }
        }
        Ok(())
    }
    if !t.is_contiguous() {
        let c = t.contiguous().map_err(bad)?;
        return write_var(&c, chunk, out);
    }
    #[cfg(feature = "cuda")]
    if let Device::Cuda(_) = t.device() {
        return super::cuda::write_device(t, chunk, out);
    }
    if !t.device().is_cpu() {
        let host = t.to_device(&Device::Cpu).map_err(bad)?;
        return write_var(&host, chunk, out);
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(bad("a CPU tensor without CPU storage"));
    };
    let range = layout
        .contiguous_offsets()
        .ok_or_else(|| bad("a contiguous tensor without offsets"))?;
    match cpu {
        CpuStorage::U8(v) => pieces(v, range, chunk, out),
        CpuStorage::U32(v) => pieces(v, range, chunk, out),
        CpuStorage::I16(v) => pieces(v, range, chunk, out),
        CpuStorage::I32(v) => pieces(v, range, chunk, out),
        CpuStorage::I64(v) => pieces(v, range, chunk, out),
        CpuStorage::BF16(v) => pieces(v, range, chunk, out),
        CpuStorage::F16(v) => pieces(v, range, chunk, out),
        CpuStorage::F32(v) => pieces(v, range, chunk, out),
        CpuStorage::F64(v) => pieces(v, range, chunk, out),
        _ => Err(bad(format!(
            "scopetree checkpoints do not store {:?}",
            t.dtype()
        ))),
    }
}

/// The codec of the `Var`s a candle store's load creates.
pub(crate) fn var_codec(d: Dtype) -> Option<Codec> {
    candle_dtype(d).map(|_| Codec::of::<Var>().1)
}
