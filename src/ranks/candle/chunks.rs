//! The all-reduce of the direct variables held off the host (feature
//! `candle`): a run of them copied to host staging, summed over the ranks
//! and copied back a chunk at a time, two chunks in flight, across the
//! variables of the run. On a CUDA device (feature `cuda`) the staging is
//! page-locked and the copies are asynchronous on the tensors' stream, so
//! the copy of chunk `k + 1` to the host (of the same variable or the
//! next) and the copy of chunk `k - 1`'s sums back to the device run while
//! chunk `k` is summed. The staging is four chunks (two each way), never a
//! variable.

use candle_core::Tensor;

use super::host::{Staged, candle};
use crate::ranks::error::Error;
use crate::ranks::vars::values::SumChunk;

/// The copies of the chunks of a run of variables through two send slots
/// and two receive slots of staging; `var` is a variable's place in the
/// run.
pub(super) trait ChunkCopies {
    /// Starts the copy of elements `first..first + n` of variable `var`
    /// into send slot `slot`.
    fn fetch(&mut self, slot: usize, var: usize, first: usize, n: usize) -> Result<(), Error>;
    /// Runs `f` on the first `nbytes` of send slot `slot` (once its copy
    /// has ended) and of receive slot `slot` (once the copy out of it has).
    fn sum(&mut self, slot: usize, nbytes: usize, f: &mut SumChunk<'_>) -> Result<(), Error>;
    /// Starts the copy of receive slot `slot`'s first `n` elements over
    /// elements `first..first + n` of variable `var`'s result.
    fn put(&mut self, slot: usize, var: usize, first: usize, n: usize) -> Result<(), Error>;
}

/// Reduces a run of variables of `lens` elements of `size` bytes each,
/// `per` elements a call of `f`, variable after variable (the calls of
/// each variable sent from its own buffer in pieces of `per`, so that every
/// rank makes the same calls whether it stages a variable or not): chunk
/// `k + 1` (of the same variable or the next) is fetched before chunk `k`
/// is summed, and chunk `k`'s sums are put before chunk `k + 1` is summed.
/// O(elements) copies; one call of `f` per chunk.
///
/// # Errors
/// The first failed copy or sum, after which no more chunks are reduced.
pub(super) fn reduce_chunks(
    io: &mut dyn ChunkCopies,
    lens: &[usize],
    per: usize,
    size: usize,
    f: &mut SumChunk<'_>,
) -> Result<(), Error> {
    let per = per.max(1);
    let mut chunks = lens
        .iter()
        .enumerate()
        .flat_map(|(v, &n)| (0..n.div_ceil(per)).map(move |i| (v, i * per, per.min(n - i * per))));
    let Some(mut cur) = chunks.next() else {
        return Ok(());
    };
    io.fetch(0, cur.0, cur.1, cur.2)?;
    let mut k = 0;
    loop {
        let next = chunks.next();
        if let Some((v, first, n)) = next {
            io.fetch((k + 1) % 2, v, first, n)?;
        }
        let (v, first, n) = cur;
        io.sum(k % 2, n * size, f)?;
        io.put(k % 2, v, first, n)?;
        let Some(c) = next else {
            return Ok(());
        };
        cur = c;
        k += 1;
    }
}

/// Chunks staged through plain host memory, with synchronous copies
/// ([`Staged`]): a device without page-locked staging, and the unit tests'
/// way to drive [`reduce_chunks`] on the CPU.
pub(super) struct HostChunks<'a> {
    /// Each variable's key, source (contiguous) and result (contiguous, of
    /// the source's dtype and length).
    vars: Vec<(&'a str, &'a Tensor, &'a Tensor)>,
    size: usize,
    /// `u64`s so that the bytes are aligned for any float.
    send: [Vec<u64>; 2],
    recv: [Vec<u64>; 2],
}

impl<'a> HostChunks<'a> {
    /// Staging of `per` elements of `size` bytes each way, for reducing
    /// `vars`. O(per).
    pub(super) fn new(
        vars: Vec<(&'a str, &'a Tensor, &'a Tensor)>,
        size: usize,
        per: usize,
    ) -> Self {
        let words = (per * size).div_ceil(8);
        let buf = || vec![0_u64; words];
        Self {
            vars,
            size,
            send: [buf(), buf()],
            recv: [buf(), buf()],
        }
    }
}

impl ChunkCopies for HostChunks<'_> {
    fn fetch(&mut self, slot: usize, var: usize, first: usize, n: usize) -> Result<(), Error> {
        let (key, src, _) = self.vars[var];
        let into: &mut [u8] = bytemuck::cast_slice_mut(&mut self.send[slot]);
        Staged::read(src, first * self.size, &mut into[..n * self.size]).map_err(|e| candle(key, e))
    }

    fn sum(&mut self, slot: usize, nbytes: usize, f: &mut SumChunk<'_>) -> Result<(), Error> {
        let send: &[u8] = bytemuck::cast_slice(&self.send[slot]);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(&mut self.recv[slot]);
        f(&send[..nbytes], &mut recv[..nbytes])
    }

    fn put(&mut self, slot: usize, var: usize, first: usize, n: usize) -> Result<(), Error> {
        let (key, _, result) = self.vars[var];
        let from: &[u8] = bytemuck::cast_slice(&self.recv[slot]);
        Staged::write(result, first * self.size, &from[..n * self.size]).map_err(|e| candle(key, e))
    }
}

/// Reduces a run of variables (key, source, result: contiguous tensors of
/// one device and dtype, each result of its source's length) through
/// staging, `per` elements a call of `f` ([`reduce_chunks`]): the plan's
/// page-locked `staging` on a CUDA device, plain host memory on any other.
/// O(elements) copies; host memory: four chunks.
///
/// # Errors
/// [`Error::Candle`] naming the variable of a failed copy;
/// [`Error::BadBuffers`] when the staging cannot be page-locked; the sum's.
pub(super) fn reduce_run(
    vars: &[(&str, &Tensor, &Tensor)],
    staging: &mut ChunkStaging,
    per: usize,
    f: &mut SumChunk<'_>,
) -> Result<(), Error> {
    let Some(&(_, first, _)) = vars.first() else {
        return Ok(());
    };
    let size = first.dtype().size_in_bytes();
    let lens: Vec<usize> = vars.iter().map(|(_, t, _)| t.elem_count()).collect();
    // No chunk is longer than the longest variable: the staging need not be.
    let per = per.clamp(1, lens.iter().copied().max().unwrap_or(1).max(1));
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(device) = first.device() {
        let ctx = device.cuda_stream().context().clone();
        let bufs = staging.buffers(&ctx, per * size)?;
        let mut io = cuda::DeviceChunks { vars, size, bufs };
        return reduce_chunks(&mut io, &lens, per, size, f);
    }
    let _ = staging; // page-locked memory is for CUDA devices only
    let mut io = HostChunks::new(vars.to_vec(), size, per);
    reduce_chunks(&mut io, &lens, per, size, f)
}

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

    use super::{ChunkCopies, ChunkStaging};
    use crate::candle::cuda::{Pinned, read_range, write_range};
    use crate::ranks::candle::host::candle;
    use crate::ranks::error::Error;
    use crate::ranks::vars::values::SumChunk;

    impl ChunkStaging {
        /// Four buffers of at least `len` bytes in `ctx`'s device: the
        /// kept ones, else new ones (page-locked once per plan, and again
        /// only for a larger chunk or another device).
        pub(super) fn buffers(
            &mut self,
            ctx: &Arc<CudaContext>,
            len: usize,
        ) -> Result<&mut [Pinned], Error> {
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

    /// The chunks of a run of variables between their CUDA storage and the
    /// staging: `bufs` are send slots 0 and 1, then receive slots 0 and 1.
    pub(super) struct DeviceChunks<'a, 'v> {
        pub(super) vars: &'a [(&'v str, &'v Tensor, &'v Tensor)],
        pub(super) size: usize,
        pub(super) bufs: &'a mut [Pinned],
    }

    fn driver(key: &str, what: &str, e: impl std::fmt::Display) -> Error {
        candle(key, candle_core::Error::Msg(format!("{what}: {e}")))
    }

    impl ChunkCopies for DeviceChunks<'_, '_> {
        fn fetch(&mut self, slot: usize, var: usize, first: usize, n: usize) -> Result<(), Error> {
            let (key, src, _) = self.vars[var];
            let (storage, layout) = src.storage_and_layout();
            let Storage::Cuda(s) = &*storage else {
                return Err(driver(key, "staging a gradient", "not on a CUDA device"));
            };
            let (start, _) = layout
                .contiguous_offsets()
                .ok_or_else(|| driver(key, "staging a gradient", "strided"))?;
            let buf = &mut self.bufs[slot];
            read_range(s, start + first, n, buf, 0).map_err(|e| candle(key, e))?;
            buf.flush()
                .map_err(|e| driver(key, "queueing a copy from the device", e))
        }

        fn sum(&mut self, slot: usize, nbytes: usize, f: &mut SumChunk<'_>) -> Result<(), Error> {
            let (send, recv) = self.bufs.split_at_mut(2);
            let key = self.vars.first().map_or("", |v| v.0);
            let send = (send[slot].bytes())
                .map_err(|e| driver(key, "waiting for a copy from the device", e))?;
            let recv = (recv[slot].bytes_mut())
                .map_err(|e| driver(key, "waiting for a copy to the device", e))?;
            f(&send[..nbytes], &mut recv[..nbytes])
        }

        fn put(&mut self, slot: usize, var: usize, first: usize, n: usize) -> Result<(), Error> {
            let (key, _, result) = self.vars[var];
            let op = PutChunk {
                buf: RefCell::new(&mut self.bufs[2 + slot]),
                first,
                nbytes: n * self.size,
            };
            result.inplace_op1(&op).map_err(|e| candle(key, e))?;
            self.bufs[2 + slot]
                .flush()
                .map_err(|e| driver(key, "queueing a copy to the device", e))
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
    struct Calls(Vec<(char, usize, usize, usize, usize)>);

    impl ChunkCopies for Calls {
        fn fetch(&mut self, slot: usize, var: usize, first: usize, n: usize) -> Result<(), Error> {
            self.0.push(('f', slot, var, first, n));
            Ok(())
        }
        fn sum(&mut self, slot: usize, nbytes: usize, f: &mut SumChunk<'_>) -> Result<(), Error> {
            self.0.push(('s', slot, 0, 0, nbytes));
            f(&vec![0; nbytes], &mut vec![0; nbytes])
        }
        fn put(&mut self, slot: usize, var: usize, first: usize, n: usize) -> Result<(), Error> {
            self.0.push(('p', slot, var, first, n));
            Ok(())
        }
    }

    #[test]
    fn chunks_make_the_calls_of_variables_sent_whole_and_keep_two_in_flight() {
        for lens in [
            vec![1],
            vec![5],
            vec![6, 7],
            vec![40, 1, 3],
            vec![2, 2, 2, 2],
        ] {
            for per in [1, 3, 6, 100] {
                let size = 4;
                let mut calls = Calls::default();
                let mut sums = Vec::new();
                reduce_chunks(&mut calls, &lens, per, size, &mut |s, r| {
                    assert_eq!(s.len(), r.len());
                    sums.push(s.len());
                    Ok(())
                })
                .expect("a reduce");
                // The calls of `chunks(per)` over each variable in turn:
                // every rank makes the same, staged or not.
                let chunks: Vec<(usize, usize, usize)> = (lens.iter().enumerate())
                    .flat_map(|(v, &n)| {
                        let whole = vec![0_u8; n];
                        let sizes: Vec<usize> = whole.chunks(per).map(<[u8]>::len).collect();
                        sizes
                            .into_iter()
                            .enumerate()
                            .map(move |(i, len)| (v, i * per, len))
                    })
                    .collect();
                let whole: Vec<usize> = chunks.iter().map(|c| c.2 * size).collect();
                assert_eq!(sums, whole, "lens {lens:?} per {per}");
                // Chunk k + 1 (of this variable or the next) is fetched
                // before chunk k is summed; chunk k is put before chunk
                // k + 1 is summed; the slots alternate across variables.
                let mut want = vec![('f', 0, 0, 0, chunks[0].2)];
                for (k, &(v, first, n)) in chunks.iter().enumerate() {
                    if let Some(&(nv, nfirst, nn)) = chunks.get(k + 1) {
                        want.push(('f', (k + 1) % 2, nv, nfirst, nn));
                    }
                    want.push(('s', k % 2, 0, 0, n * size));
                    want.push(('p', k % 2, v, first, n));
                }
                assert_eq!(calls.0, want, "lens {lens:?} per {per}");
            }
        }
    }

    #[test]
    fn a_failed_sum_stops_the_chunks() {
        let mut calls = Calls::default();
        let mut k = 0;
        let e = reduce_chunks(&mut calls, &[4, 6], 2, 4, &mut |_, _| {
            k += 1;
            if k == 3 {
                return Err(Error::BadBuffers {
                    op: "all-reduce",
                    reason: "a test".into(),
                });
            }
            Ok(())
        });
        assert!(matches!(e, Err(Error::BadBuffers { .. })), "{e:?}");
        assert_eq!(calls.0.iter().filter(|c| c.0 == 's').count(), 3);
        assert_eq!(calls.0.iter().filter(|c| c.0 == 'p').count(), 2);
    }

    #[test]
    fn no_variables_make_no_calls() {
        let mut calls = Calls::default();
        reduce_chunks(&mut calls, &[], 3, 4, &mut |_, _| panic!("no sum")).expect("nothing");
        assert!(calls.0.is_empty());
    }
}
