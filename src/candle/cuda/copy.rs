//! Copies between page-locked staging buffers and the elements of a
//! `CudaStorage`, by dtype, and new zeroed device storage.

use candle_core::cuda_backend::{CudaStorageSlice, cudarc::driver::DriverError};
use candle_core::{CudaDevice, CudaStorage, DType};
use half::{bf16, f16};

use super::pinned::Pinned;

/// Runs `$body` with `$s` bound to the typed `CudaSlice` of `$slice` (a
/// `CudaStorageSlice` or a reference to one) for the dtypes checkpoints
/// hold; `$other` for the rest.
macro_rules! typed {
    ($slice:expr, $s:ident => $body:expr, $other:ident => $fallback:expr) => {
        match $slice {
            CudaStorageSlice::U8($s) => $body,
            CudaStorageSlice::U32($s) => $body,
            CudaStorageSlice::I16($s) => $body,
            CudaStorageSlice::I32($s) => $body,
            CudaStorageSlice::I64($s) => $body,
            CudaStorageSlice::BF16($s) => $body,
            CudaStorageSlice::F16($s) => $body,
            CudaStorageSlice::F32($s) => $body,
            CudaStorageSlice::F64($s) => $body,
            $other => $fallback,
        }
    };
}

/// A candle error for a failed driver call, naming what was done.
fn driver(what: &str, e: DriverError) -> candle_core::Error {
    candle_core::Error::Msg(format!("{what}: {e}"))
}

fn unsupported(what: &str, slice: &CudaStorageSlice) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{what}: scopetree checkpoints do not store {:?}",
        dtype_of(slice)
    ))
}

fn dtype_of(slice: &CudaStorageSlice) -> &'static str {
    match slice {
        CudaStorageSlice::F8E4M3(_) => "F8E4M3",
        CudaStorageSlice::F6E2M3(_) => "F6E2M3",
        CudaStorageSlice::F6E3M2(_) => "F6E3M2",
        CudaStorageSlice::F4(_) => "F4",
        CudaStorageSlice::F8E8M0(_) => "F8E8M0",
        _ => "this dtype",
    }
}

/// New device storage of `n` zeros of `dtype` on `device`. O(n) on the
/// device.
///
/// # Errors
/// candle's, when the device is out of memory or `dtype` is not one a
/// checkpoint holds.
pub(crate) fn fresh(
    device: &CudaDevice,
    dtype: DType,
    n: usize,
) -> candle_core::Result<CudaStorage> {
    let d = device.clone();
    Ok(match dtype {
        DType::U8 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<u8>(n)?, d),
        DType::U32 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<u32>(n)?, d),
        DType::I16 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<i16>(n)?, d),
        DType::I32 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<i32>(n)?, d),
        DType::I64 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<i64>(n)?, d),
        DType::BF16 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<bf16>(n)?, d),
        DType::F16 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<f16>(n)?, d),
        DType::F32 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<f32>(n)?, d),
        DType::F64 => CudaStorage::wrap_cuda_slice(device.alloc_zeros::<f64>(n)?, d),
        other => {
            return Err(candle_core::Error::Msg(format!(
                "scopetree checkpoints do not store {other:?}"
            )));
        }
    })
}

/// Queues a copy of `nbytes` staged bytes at `from` in `buf` into the
/// elements of `storage` that start at element `first`, on the storage's
/// stream. `from` and `nbytes` are multiples of the element size.
///
/// # Errors
/// candle's, naming the failed driver call or a range outside the storage.
pub(crate) fn write_range(
    storage: &mut CudaStorage,
    first: usize,
    buf: &mut Pinned,
    from: usize,
    nbytes: usize,
) -> candle_core::Result<()> {
    let stream = storage.device.cuda_stream();
    typed!(&mut storage.slice, s => {
        let n = nbytes / elem_size(s);
        if first + n > s.len() {
            return Err(candle_core::Error::Msg(format!(
                "a copy to elements [{first}, {}) of a device tensor of {}", first + n, s.len()
            )));
        }
        let mut view = s.slice_mut(first..first + n);
        buf.copy_to_device(from, &mut view, &stream)
            .map_err(|e| driver("copying staged bytes to the device", e))
    }, other => Err(unsupported("copying staged bytes to the device", other)))
}

/// Queues a copy of `n` elements of `storage`, from element `first`, into
/// `buf` at byte `at`, on the storage's stream. `at` is a multiple of the
/// element size.
///
/// # Errors
/// As [`write_range`].
pub(crate) fn read_range(
    storage: &CudaStorage,
    first: usize,
    n: usize,
    buf: &mut Pinned,
    at: usize,
) -> candle_core::Result<()> {
    let stream = storage.device.cuda_stream();
    typed!(&storage.slice, s => {
        if first + n > s.len() {
            return Err(candle_core::Error::Msg(format!(
                "a copy of elements [{first}, {}) of a device tensor of {}", first + n, s.len()
            )));
        }
        let view = s.slice(first..first + n);
        buf.copy_from_device(&view, at, &stream)
            .map_err(|e| driver("copying a device tensor to staging", e))
    }, other => Err(unsupported("copying a device tensor to staging", other)))
}

/// The size of one element of `s`.
fn elem_size<T>(_: &candle_core::cuda_backend::cudarc::driver::CudaSlice<T>) -> usize {
    std::mem::size_of::<T>()
}

/// Two timing events around work queued on one stream.
pub(crate) struct Timer {
    start: candle_core::cuda_backend::cudarc::driver::CudaEvent,
    end: Option<candle_core::cuda_backend::cudarc::driver::CudaEvent>,
}

impl Timer {
    /// Records the start on `stream`.
    pub(crate) fn start(
        stream: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    ) -> Result<Self, DriverError> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
        let ctx = stream.context();
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(stream)?;
        Ok(Self { start, end: None })
    }

    /// Records the end on `stream`.
    pub(crate) fn stop(
        mut self,
        stream: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    ) -> Result<Self, DriverError> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
        let end = stream
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        end.record(stream)?;
        self.end = Some(end);
        Ok(self)
    }

    /// The time between the two, once both have passed.
    pub(crate) fn elapsed(&self) -> Result<std::time::Duration, DriverError> {
        let end = self.end.as_ref().ok_or(DriverError(
            candle_core::cuda_backend::cudarc::driver::sys::cudaError_enum::CUDA_ERROR_NOT_READY,
        ))?;
        let ms = self.start.elapsed_ms(end)?;
        Ok(std::time::Duration::from_secs_f64(
            f64::from(ms.max(0.0)) / 1e3,
        ))
    }
}
