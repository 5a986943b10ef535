//! Host copies of candle tensors for the ranks layer: the native bytes of a
//! CPU tensor read and written in place, a device tensor's pieces read and
//! written through host memory ([`Staged`]), and the candle error naming a
//! variable.

use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Storage, Tensor};

use crate::ranks::error::Error;

/// A candle error on the variable `key`.
pub(in crate::ranks) fn candle(key: &str, source: candle_core::Error) -> Error {
    Error::from(crate::candle::Error::Candle {
        name: key.to_owned(),
        source,
    })
}

/// The elements whose native bytes are `bytes` (whatever their
/// alignment). O(bytes).
fn native<F, const N: usize>(bytes: &[u8], from: fn([u8; N]) -> F) -> Vec<F> {
    bytes
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0_u8; N];
            a.copy_from_slice(c);
            from(a)
        })
        .collect()
}

/// Device tensors read and written a piece at a time through host memory:
/// each piece a bucket's segment (at most a bucket), so the staging is
/// bounded by the bucket, not the gradients; in a pipelined all-reduce the
/// copies of one bucket run while another bucket's transfer is in flight.
pub(super) struct Staged;

impl Staged {
    /// Copies the bytes `at..at + into.len()` of the contiguous tensor `t`
    /// (`F32` or `F64`, on any device) into `into`. O(piece).
    pub(super) fn read(t: &Tensor, at: usize, into: &mut [u8]) -> candle_core::Result<()> {
        let size = t.dtype().size_in_bytes();
        let piece = t
            .flatten_all()?
            .narrow(0, at / size, into.len() / size)?
            .to_device(&Device::Cpu)?;
        with_bytes(&piece, |b| into.copy_from_slice(b))
    }

    /// Copies the elements in `from` (native bytes of `t`'s dtype) over
    /// the elements `at / size..` of the contiguous tensor `t`, on its
    /// device, in place. O(piece).
    pub(super) fn write(t: &Tensor, at: usize, from: &[u8]) -> candle_core::Result<()> {
        let size = t.dtype().size_in_bytes();
        let n = from.len() / size;
        let piece = match t.dtype() {
            DType::F64 => {
                Tensor::from_vec(native::<f64, 8>(from, f64::from_ne_bytes), n, &Device::Cpu)?
            }
            _ => Tensor::from_vec(native::<f32, 4>(from, f32::from_ne_bytes), n, &Device::Cpu)?,
        };
        t.flatten_all()?
            .slice_set(&piece.to_device(t.device())?, 0, at / size)
    }
}

/// Runs `f` on the native bytes of a contiguous CPU tensor of `F32` or
/// `F64`, in place (no copy).
pub(super) fn with_bytes<R>(t: &Tensor, f: impl FnOnce(&[u8]) -> R) -> candle_core::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("a tensor that is not contiguous".into()))?;
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => Ok(f(bytemuck::cast_slice(&v[start..end]))),
        Storage::Cpu(CpuStorage::F64(v)) => Ok(f(bytemuck::cast_slice(&v[start..end]))),
        _ => Err(candle_core::Error::Msg(format!(
            "a {:?} tensor on {:?}; the ranks layer reads F32 or F64 on the CPU",
            t.dtype(),
            t.device().location()
        ))),
    }
}

/// Copies `from` over the bytes `at..at + from.len()` of the contiguous
/// CPU tensor `t` of `F32` or `F64`, in its storage (no allocation).
/// O(bytes).
pub(super) fn write_bytes(t: &Tensor, at: usize, from: &[u8]) -> candle_core::Result<()> {
    t.inplace_op1(&WriteBytes { at, from })
}

/// The in-place op of [`write_bytes`].
struct WriteBytes<'a> {
    at: usize,
    from: &'a [u8],
}

impl InplaceOp1 for WriteBytes<'_> {
    fn name(&self) -> &'static str {
        "scopetree-write-bytes"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("a write into a strided tensor".into()))?;
        let bytes: &mut [u8] = match storage {
            CpuStorage::F32(v) => bytemuck::cast_slice_mut(&mut v[start..end]),
            CpuStorage::F64(v) => bytemuck::cast_slice_mut(&mut v[start..end]),
            _ => {
                return Err(candle_core::Error::Msg(
                    "a write into a tensor of neither F32 nor F64".into(),
                ));
            }
        };
        let len = bytes.len();
        let to = (bytes.get_mut(self.at..self.at + self.from.len())).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "a write of bytes [{}, {}) into a tensor of {len}",
                self.at,
                self.at + self.from.len()
            ))
        })?;
        to.copy_from_slice(self.from);
        Ok(())
    }
}
