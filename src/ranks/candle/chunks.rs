//! The all-reduce of a direct variable held off the host (feature
//! `candle`): its elements copied to host staging, summed over the ranks
//! and copied back a chunk at a time, two chunks in flight. On a CUDA
//! device (feature `cuda`) the staging is page-locked and the copies are
//! asynchronous on the tensor's stream, so the copy of chunk `i + 1` to
//! the host and the copy of chunk `i - 1`'s sums back to the device run
//! while chunk `i` is summed. The staging is four chunks (two each way),
//! never the variable.

use candle_core::Tensor;

use super::host::{Staged, candle};
use crate::ranks::error::Error;
use crate::ranks::vars::values::SumChunk;

/// The copies of one variable's chunks through two send slots and two
/// receive slots of staging.
pub(super) trait ChunkCopies {
    /// Starts the copy of elements `first..first + n` of the variable into
    /// send slot `slot`.
    fn fetch(&mut self, slot: usize, first: usize, n: usize) -> Result<(), Error>;
    /// Runs `f` on the first `nbytes` of send slot `slot` (once its copy
    /// has ended) and of receive slot `slot` (once the copy out of it has).
    fn sum(&mut self, slot: usize, nbytes: usize, f: &mut SumChunk<'_>) -> Result<(), Error>;
    /// Starts the copy of receive slot `slot`'s first `n` elements over the
    /// result's elements `first..first + n`.
    fn put(&mut self, slot: usize, first: usize, n: usize) -> Result<(), Error>;
}

/// Reduces a variable of `n` elements of `size` bytes, `per` elements a
/// call of `f` (the lane's cap, so that every rank makes the same calls
/// whether it stages the variable or sends it from its own buffer):
/// chunk `i + 1` is fetched before chunk `i` is summed, and chunk `i`'s
/// sums are put before chunk `i + 1` is. O(n) copies; `n.div_ceil(per)`
/// calls of `f`.
///
/// # Errors
/// The first failed copy or sum, after which no more chunks are reduced.
pub(super) fn reduce_chunks(
    io: &mut dyn ChunkCopies,
    n: usize,
    per: usize,
    size: usize,
    f: &mut SumChunk<'_>,
) -> Result<(), Error> {
    let per = per.max(1);
    let chunks = n.div_ceil(per);
    let piece = |i: usize| (i * per, per.min(n - i * per));
    if chunks == 0 {
        return Ok(());
    }
    io.fetch(0, 0, piece(0).1)?;
    for i in 0..chunks {
        if i + 1 < chunks {
            let (first, len) = piece(i + 1);
            io.fetch((i + 1) % 2, first, len)?;
        }
        let (first, len) = piece(i);
        io.sum(i % 2, len * size, f)?;
        io.put(i % 2, first, len)?;
    }
    Ok(())
}

/// Chunks staged through plain host memory, with synchronous copies
/// ([`Staged`]): a device without page-locked staging, and the unit tests'
/// way to drive [`reduce_chunks`] on the CPU.
pub(super) struct HostChunks<'a> {
    key: &'a str,
    src: &'a Tensor,
    result: &'a Tensor,
    size: usize,
    /// `u64`s so that the bytes are aligned for any float.
    send: [Vec<u64>; 2],
    recv: [Vec<u64>; 2],
}

impl<'a> HostChunks<'a> {
    /// Staging of `per` elements of `src`'s dtype each way, for reducing
    /// `src` (contiguous) into `result` (contiguous, of its dtype and
    /// length). O(per).
    pub(super) fn new(key: &'a str, src: &'a Tensor, result: &'a Tensor, per: usize) -> Self {
        let size = src.dtype().size_in_bytes();
        let words = (per * size).div_ceil(8);
        let buf = || vec![0_u64; words];
        Self {
            key,
            src,
            result,
            size,
            send: [buf(), buf()],
            recv: [buf(), buf()],
        }
    }
}

impl ChunkCopies for HostChunks<'_> {
    fn fetch(&mut self, slot: usize, first: usize, n: usize) -> Result<(), Error> {
        let into: &mut [u8] = bytemuck::cast_slice_mut(&mut self.send[slot]);
        Staged::read(self.src, first * self.size, &mut into[..n * self.size])
            .map_err(|e| candle(self.key, e))
    }

    fn sum(&mut self, slot: usize, nbytes: usize, f: &mut SumChunk<'_>) -> Result<(), Error> {
        let send: &[u8] = bytemuck::cast_slice(&self.send[slot]);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(&mut self.recv[slot]);
        f(&send[..nbytes], &mut recv[..nbytes])
    }

    fn put(&mut self, slot: usize, first: usize, n: usize) -> Result<(), Error> {
        let from: &[u8] = bytemuck::cast_slice(&self.recv[slot]);
        Staged::write(self.result, first * self.size, &from[..n * self.size])
            .map_err(|e| candle(self.key, e))
    }
}

#[cfg(feature = "cuda")]
pub(super) use self::cuda::on_device;

/// The page-locked staging of a plan's chunked reduces, kept from call to
/// call: four buffers of one chunk in one device's context (empty until a
/// CUDA variable is reduced, and without the `cuda` feature).
#[derive(Default)]
pub(in crate::ranks) struct ChunkStaging {
    #[cfg(feature = "cuda")]
    kept: Option<(usize, Vec<crate::candle::cuda::Pinned>)>,
}

impl std::fmt::Debug for ChunkStaging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkStaging").finish_non_exhaustive()
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::cell::RefCell;
    use std::sync::Arc;

    use candle_core::cuda_backend::cudarc::driver::CudaContext;
    use candle_core::{CudaStorage, InplaceOp1, Layout, Storage, Tensor};

    use super::{ChunkCopies, ChunkStaging, reduce_chunks};
    use crate::candle::cuda::{Pinned, read_range, write_range};
    use crate::ranks::candle::host::candle;
    use crate::ranks::error::Error;
    use crate::ranks::vars::values::SumChunk;

    impl ChunkStaging {
        /// Four buffers of at least `len` bytes in `ctx`'s device: the
        /// kept ones, else new ones (page-locked once per plan, and again
        /// only for a larger chunk or another device).
        fn buffers(&mut self, ctx: &Arc<CudaContext>, len: usize) -> Result<&mut [Pinned], Error> {
            let ordinal = ctx.ordinal();
            let fits = |(o, b): &(usize, Vec<Pinned>)| *o == ordinal && b[0].len() >= len;
            if !self.kept.as_ref().is_some_and(fits) {
                self.kept = None; // the old ones go first
                let bufs = (0..4)
                    .map(|_| Pinned::new(ctx, len))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| Error::BadBuffers {
                        op: "all-reduce",
                        reason: format!("page-locking 4 × {len} bytes of staging: {e}"),
                    })?;
                self.kept = Some((ordinal, bufs));
            }
            Ok(self.kept.as_mut().map_or(&mut [][..], |(_, b)| &mut b[..]))
        }
    }

    /// Reduces the contiguous CUDA tensor `src` into `result` (contiguous,
    /// of its dtype and length, on its device) through `staging`, `per`
    /// elements at a time ([`reduce_chunks`]). Returns whether `src` was a
    /// CUDA tensor (else nothing was done). O(bytes) of copies on the
    /// device's copy engine; host memory: the staging.
    ///
    /// # Errors
    /// [`Error::Candle`] naming `key` for a failed copy; the sum's.
    pub(in crate::ranks::candle) fn on_device(
        key: &str,
        src: &Tensor,
        result: &Tensor,
        staging: &mut ChunkStaging,
        per: usize,
        f: &mut SumChunk<'_>,
    ) -> Result<bool, Error> {
        let (storage, layout) = src.storage_and_layout();
        let Storage::Cuda(s) = &*storage else {
            return Ok(false);
        };
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle(key, candle_core::Error::Msg("a strided gradient".into())))?;
        let size = src.dtype().size_in_bytes();
        let per = per.clamp(1, (end - start).max(1));
        let ctx = s.device.cuda_stream().context().clone();
        let bufs = staging.buffers(&ctx, per * size)?;
        let mut io = DeviceChunks {
            key,
            src: s,
            start,
            result,
            size,
            bufs,
        };
        reduce_chunks(&mut io, end - start, per, size, f)?;
        Ok(true)
    }

    /// One variable's chunks between its CUDA storage and the staging:
    /// `bufs` are send slots 0 and 1, then receive slots 0 and 1.
    struct DeviceChunks<'a> {
        key: &'a str,
        src: &'a CudaStorage,
        start: usize,
        result: &'a Tensor,
        size: usize,
        bufs: &'a mut [Pinned],
    }

    fn driver(key: &str, what: &str, e: impl std::fmt::Display) -> Error {
        candle(key, candle_core::Error::Msg(format!("{what}: {e}")))
    }

    impl ChunkCopies for DeviceChunks<'_> {
        fn fetch(&mut self, slot: usize, first: usize, n: usize) -> Result<(), Error> {
            let buf = &mut self.bufs[slot];
            read_range(self.src, self.start + first, n, buf, 0).map_err(|e| candle(self.key, e))?;
            buf.flush()
                .map_err(|e| driver(self.key, "queueing a copy from the device", e))
        }

        fn sum(&mut self, slot: usize, nbytes: usize, f: &mut SumChunk<'_>) -> Result<(), Error> {
            let (send, recv) = self.bufs.split_at_mut(2);
            let send = (send[slot].bytes())
                .map_err(|e| driver(self.key, "waiting for a copy from the device", e))?;
            let recv = (recv[slot].bytes_mut())
                .map_err(|e| driver(self.key, "waiting for a copy to the device", e))?;
            f(&send[..nbytes], &mut recv[..nbytes])
        }

        fn put(&mut self, slot: usize, first: usize, n: usize) -> Result<(), Error> {
            let op = PutChunk {
                buf: RefCell::new(&mut self.bufs[2 + slot]),
                first,
                nbytes: n * self.size,
            };
            (self.result.inplace_op1(&op)).map_err(|e| candle(self.key, e))?;
            self.bufs[2 + slot]
                .flush()
                .map_err(|e| driver(self.key, "queueing a copy to the device", e))
        }
    }

    /// The copy of a receive slot into the result's storage, through
    /// candle's `InplaceOp1` (the only way to reach a tensor's memory for
    /// writing).
    struct PutChunk<'a> {
        buf: RefCell<&'a mut Pinned>,
        first: usize,
        nbytes: usize,
    }

    impl InplaceOp1 for PutChunk<'_> {
        fn name(&self) -> &'static str {
            "scopetree-reduced-chunk"
        }

        fn cpu_fwd(&self, _: &mut candle_core::CpuStorage, _: &Layout) -> candle_core::Result<()> {
            Err(candle_core::Error::Msg(
                "a chunk staged for a CUDA tensor, put into a CPU one".into(),
            ))
        }

        fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
            let (start, _) = layout.contiguous_offsets().ok_or_else(|| {
                candle_core::Error::Msg("a reduced chunk put into a strided tensor".into())
            })?;
            let mut buf = self.buf.borrow_mut();
            write_range(storage, start + self.first, &mut buf, 0, self.nbytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the calls of a reduce, in order.
    #[derive(Default)]
    struct Calls(Vec<(char, usize, usize, usize)>);

    impl ChunkCopies for Calls {
        fn fetch(&mut self, slot: usize, first: usize, n: usize) -> Result<(), Error> {
            self.0.push(('f', slot, first, n));
            Ok(())
        }
        fn sum(&mut self, slot: usize, nbytes: usize, f: &mut SumChunk<'_>) -> Result<(), Error> {
            self.0.push(('s', slot, 0, nbytes));
            f(&vec![0; nbytes], &mut vec![0; nbytes])
        }
        fn put(&mut self, slot: usize, first: usize, n: usize) -> Result<(), Error> {
            self.0.push(('p', slot, first, n));
            Ok(())
        }
    }

    #[test]
    fn chunks_make_the_calls_of_a_variable_sent_whole_and_keep_two_in_flight() {
        for n in [1, 5, 6, 7, 40] {
            for per in [1, 3, 6, 100] {
                let size = 4;
                let mut calls = Calls::default();
                let mut sums = Vec::new();
                reduce_chunks(&mut calls, n, per, size, &mut |s, r| {
                    assert_eq!(s.len(), r.len());
                    sums.push(s.len());
                    Ok(())
                })
                .expect("a reduce");
                // The calls of `chunks(per)` over the whole variable: every
                // rank makes the same, staged or not.
                let whole: Vec<usize> = vec![0_u8; n].chunks(per).map(|c| c.len() * size).collect();
                assert_eq!(sums, whole, "n {n} per {per}");
                // Chunk i + 1 is fetched before chunk i is summed; chunk i
                // is put before chunk i + 1 is summed; the slots alternate.
                let mut want = vec![('f', 0, 0, per.min(n))];
                for (i, c) in vec![0_u8; n].chunks(per).enumerate() {
                    if (i + 1) * per < n {
                        let next = per.min(n - (i + 1) * per);
                        want.push(('f', (i + 1) % 2, (i + 1) * per, next));
                    }
                    want.push(('s', i % 2, 0, c.len() * size));
                    want.push(('p', i % 2, i * per, c.len()));
                }
                assert_eq!(calls.0, want, "n {n} per {per}");
            }
        }
    }

    #[test]
    fn a_failed_sum_stops_the_chunks() {
        let mut calls = Calls::default();
        let mut k = 0;
        let e = reduce_chunks(&mut calls, 10, 2, 4, &mut |_, _| {
            k += 1;
            if k == 2 {
                return Err(Error::BadBuffers {
                    op: "all-reduce",
                    reason: "a test".into(),
                });
            }
            Ok(())
        });
        assert!(matches!(e, Err(Error::BadBuffers { .. })), "{e:?}");
        assert_eq!(calls.0.iter().filter(|c| c.0 == 's').count(), 2);
        assert_eq!(calls.0.iter().filter(|c| c.0 == 'p').count(), 1);
    }
}
