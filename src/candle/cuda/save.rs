//! Saves from a CUDA device: a tensor's bytes through two page-locked
//! buffers, the next piece copying from the device while the host writes
//! the last, so a save holds two pieces of host memory, not the tensor.

use std::sync::{Mutex, PoisonError};

use candle_core::{Storage, Tensor};

use super::copy::read_range;
use super::pinned::Pinned;
use crate::checkpoint::Error;

/// Page-locked buffers kept between saves, with the ordinal of the device
/// whose context made them; two per piece size in use.
static KEPT: Mutex<Vec<(usize, Pinned)>> = Mutex::new(Vec::new());

fn bad(reason: impl std::fmt::Display) -> Error {
    Error::BadTensor {
        reason: reason.to_string(),
    }
}

/// Two buffers of `len` bytes in the context of device `ordinal`: kept ones
/// when there are, else new ones.
fn take_pair(
    ctx: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaContext>,
    len: usize,
) -> Result<[Pinned; 2], Error> {
    let ordinal = ctx.ordinal();
    let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    let mut pick = || -> Result<Pinned, Error> {
        match kept
            .iter()
            .position(|(o, p)| *o == ordinal && p.len() == len)
        {
            Some(i) => Ok(kept.swap_remove(i).1),
            None => Pinned::new(ctx, len)
                .map_err(|e| bad(format!("page-locking {len} bytes of save staging: {e}"))),
        }
    };
    Ok([pick()?, pick()?])
}

/// Keeps `pair` for the next save (at most one pair per device and size).
fn give_pair(ordinal: usize, pair: [Pinned; 2]) {
    let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    for p in pair {
        if kept
            .iter()
            .filter(|(o, q)| *o == ordinal && q.len() == p.len())
            .count()
            < 2
        {
            kept.push((ordinal, p));
        }
    }
}

/// Drops the page-locked buffers kept between saves.
pub(crate) fn free_save_staging() {
    KEPT.lock().unwrap_or_else(PoisonError::into_inner).clear();
}

/// The bytes of page-locked save staging kept.
pub(crate) fn save_staging_bytes() -> usize {
    KEPT.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(_, p)| p.len())
        .sum()
}

/// Hands the elements of the contiguous CUDA tensor `t` to `out`, in
/// pieces of at most `chunk` bytes, copied from the device on its stream
/// (the calling thread's work on it comes first). O(bytes); host memory:
/// two pieces.
pub(crate) fn write_device(
    t: &Tensor,
    chunk: usize,
    out: &mut dyn FnMut(&[u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(s) = &*storage else {
        return Err(bad("a CUDA tensor without CUDA storage"));
    };
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| bad("a contiguous tensor without offsets"))?;
    let size = t.dtype().size_in_bytes();
    let per = (chunk / size).clamp(1, (end - start).max(1));
    let n = end - start;
    if n == 0 {
        return out(&[]);
    }
    let ctx = s.device.cuda_stream().context().clone();
    let mut pair = take_pair(&ctx, per * size)?;
    let pieces = n.div_ceil(per);
    let piece = |i: usize| (start + i * per, per.min(n - i * per));
    let run = (|| {
        let (first, len) = piece(0);
        let fetch = |first: usize, len: usize, buf: &mut Pinned| -> Result<(), Error> {
            read_range(s, first, len, buf, 0).map_err(bad)?;
            buf.flush()
                .map_err(|e| bad(format!("queueing a copy from the device: {e}")))
        };
        fetch(first, len, &mut pair[0])?;
        for i in 0..pieces {
            if i + 1 < pieces {
                let (first, len) = piece(i + 1);
                fetch(first, len, &mut pair[(i + 1) % 2])?;
            }
            let (_, len) = piece(i);
            let bytes = pair[i % 2]
                .bytes()
                .map_err(|e| bad(format!("waiting for a copy from the device: {e}")))?;
            out(&bytes[..len * size])?;
        }
        Ok(())
    })();
    give_pair(ctx.ordinal(), pair);
    run
}
