//! The exchanges of variables held off the host (feature `candle`), a
//! chunk at a time through host staging, two chunks in flight: the
//! all-reduce of a run of large gradients, ZeRO's reduce-scatter and
//! all-gather, and the broadcast; and the fused buckets' pieces copied
//! together ([`fetch_now`], [`put_now`]). A chunk gathers parts of one or
//! more tensors into a send slot, is exchanged over MPI into a receive
//! slot, and its receive slot's parts go back to tensors. On a CUDA device
//! (feature `cuda`) the staging is page-locked and the copies are
//! asynchronous on the tensors' stream, so the copies of chunk `k + 1` to
//! the host and of chunk `k - 1`'s results back to the device run while
//! chunk `k` is exchanged. The staging is four chunks (two each way), never
//! a variable.

use candle_core::Tensor;
use smallvec::SmallVec;

use super::host::{Staged, candle, with_bytes, write_bytes};
use crate::ranks::error::Error;
use crate::ranks::layout::partition::Piece;
use crate::ranks::vars::values::SumChunk;

/// Pieces of tensors laid end to end (one rank's pieces of one float
/// type, or whole variables), the elements of a stream of chunks.
pub(super) struct Laid {
    pieces: Vec<Piece>,
    /// Where each piece ends in the concatenation.
    ends: Vec<usize>,
}

impl Laid {
    /// `pieces`, laid end to end. O(pieces).
    pub(super) fn new(pieces: Vec<Piece>) -> Self {
        let ends = (pieces.iter())
            .scan(0, |at, p| {
                *at += p.len;
                Some(*at)
            })
            .collect();
        Self { pieces, ends }
    }

    /// The number of elements. O(1).
    pub(super) fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    /// The parts of the pieces that the elements `at..at + n` of their
    /// concatenation cover: `(piece, first element within it, length)`, in
    /// order. O(log pieces + parts).
    fn parts(&self, at: usize, n: usize) -> impl Iterator<Item = (Piece, usize, usize)> + '_ {
        let first = self.ends.partition_point(|&end| end <= at);
        (self.pieces[first..].iter().zip(&self.ends[first..]))
            .map(move |(&p, &hi)| {
                let lo = hi - p.len;
                let (a, b) = (lo.max(at), hi.min(at + n));
                (p, a, b, lo)
            })
            .take_while(|&(_, a, b, _)| a < b)
            .map(|(p, a, b, lo)| (p, a - lo, b - a))
    }

    /// The parts of elements `at..at + n` of the concatenation, laid from
    /// byte `base` of a slot, `size` bytes an element. O(log pieces +
    /// parts).
    pub(super) fn slot_parts(
        &self,
        at: usize,
        n: usize,
        size: usize,
        base: usize,
    ) -> SmallVec<[Part; 2]> {
        let mut k = base;
        (self.parts(at, n))
            .map(|(p, from, len)| {
                let part = Part {
                    var: p.var,
                    first: p.start + from,
                    n: len,
                    at: k,
                };
                k += len * size;
                part
            })
            .collect()
    }
}

/// Elements `first..first + n` of tensor `var` (a place in the exchange's
/// tensors), at byte `at` of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Part {
    pub(super) var: usize,
    pub(super) first: usize,
    pub(super) n: usize,
    pub(super) at: usize,
}

/// One chunk of an exchange: the parts copied into the first `send_len`
/// bytes of a send slot (the bytes no part covers, and the parts of a
/// tensor that is absent, are zeros), and those copied out of the first
/// `recv_len` bytes of a receive slot (into the tensors that are present).
/// `root` is the exchange's own (the rank a reduce-scatter's chunk goes
/// to).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Chunk {
    pub(super) send: SmallVec<[Part; 2]>,
    pub(super) send_len: usize,
    pub(super) recv: SmallVec<[Part; 2]>,
    pub(super) recv_len: usize,
    pub(super) root: usize,
}

/// What is done with a chunk between its copies: it reads the send slot's
/// first `send_len` bytes and writes the receive slot's first `recv_len`.
pub(super) type Exchange<'a> = dyn FnMut(&Chunk, &[u8], &mut [u8]) -> Result<(), Error> + 'a;

/// The tensors of an exchange: each one's key, the tensor its parts are
/// read from (`None`: zeros) and the one they are written into (`None`:
/// dropped); both contiguous.
pub(super) type Ends<'a> = [(&'a str, Option<&'a Tensor>, Option<&'a Tensor>)];

/// The copies of chunks through two send slots and two receive slots of
/// staging.
pub(super) trait ChunkCopies {
    /// Starts the copies of `chunk`'s send parts into send slot `slot`.
    fn fetch(&mut self, slot: usize, chunk: &Chunk) -> Result<(), Error>;
    /// Runs `f` on send slot `slot` (once the copies into it have ended)
    /// and receive slot `slot` (once the copies out of it have).
    fn exchange(&mut self, slot: usize, chunk: &Chunk, f: &mut Exchange<'_>) -> Result<(), Error>;
    /// Starts the copies of `chunk`'s receive parts out of receive slot
    /// `slot`.
    fn put(&mut self, slot: usize, chunk: &Chunk) -> Result<(), Error>;
}

/// Exchanges `chunks` in order, two in flight: chunk `k + 1` is fetched
/// before chunk `k` is exchanged, and chunk `k`'s results are put before
/// chunk `k + 1` is exchanged; the slots alternate. O(chunks) calls.
///
/// # Errors
/// The first failed copy or exchange, after which no more chunks are
/// exchanged.
pub(super) fn pipeline(
    io: &mut dyn ChunkCopies,
    chunks: &mut dyn Iterator<Item = Chunk>,
    f: &mut Exchange<'_>,
) -> Result<(), Error> {
    let Some(mut cur) = chunks.next() else {
        return Ok(());
    };
    io.fetch(0, &cur)?;
    let mut k = 0;
    loop {
        let next = chunks.next();
        if let Some(c) = &next {
            io.fetch((k + 1) % 2, c)?;
        }
        io.exchange(k % 2, &cur, f)?;
        io.put(k % 2, &cur)?;
        let Some(c) = next else {
            return Ok(());
        };
        cur = c;
        k += 1;
    }
}

/// The chunks of `len` elements, `per` (at least 1) a chunk: each one's
/// first element and length. O(1) per chunk.
pub(super) fn steps(len: usize, per: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len).step_by(per).map(move |at| (at, per.min(len - at)))
}

/// The chunks of an all-reduce of tensors of `lens` elements of `size`
/// bytes each, `per` elements a chunk, tensor after tensor (each sent in
/// pieces of `per` from its own start, so that every rank makes the same
/// calls whether it stages a tensor or not): each part read from and
/// written to the same place of the same tensor.
pub(super) fn reduce_chunks(
    lens: &[usize],
    per: usize,
    size: usize,
) -> impl Iterator<Item = Chunk> + '_ {
    let per = per.max(1);
    lens.iter().enumerate().flat_map(move |(var, &len)| {
        steps(len, per).map(move |(first, n)| {
            let part = Part {
                var,
                first,
                n,
                at: 0,
            };
            Chunk {
                send: SmallVec::from_elem(part, 1),
                send_len: n * size,
                recv: SmallVec::from_elem(part, 1),
                recv_len: n * size,
                root: 0,
            }
        })
    })
}

/// The bytes of `chunk`'s send parts that a tensor covers (the rest of
/// its `send_len` are zeros). O(parts).
fn covered(ends: &Ends<'_>, chunk: &Chunk) -> usize {
    (chunk.send.iter())
        .filter_map(|p| ends[p.var].1.map(|t| p.n * t.dtype().size_in_bytes()))
        .sum()
}

/// Exchanges `chunks` of the tensors `ends` ([`pipeline`]) through
/// staging of at most `send_cap` bytes a send slot and `recv_cap` a
/// receive slot: the plan's page-locked `staging` when every tensor is on
/// one CUDA device, plain host memory otherwise. O(bytes) copies; host
/// memory: two slots each way.
///
/// # Errors
/// [`Error::Candle`] naming the tensor of a failed copy;
/// [`Error::BadBuffers`] when the staging cannot be page-locked; `f`'s.
pub(super) fn exchange_staged(
    ends: &Ends<'_>,
    staging: &mut ChunkStaging,
    (send_cap, recv_cap): (usize, usize),
    chunks: &mut dyn Iterator<Item = Chunk>,
    f: &mut Exchange<'_>,
) -> Result<(), Error> {
    #[cfg(feature = "cuda")]
    if let Some(ctx) = one_cuda(ends.iter().flat_map(|&(_, s, r)| [s, r]).flatten()) {
        let bufs = staging.buffers(&ctx, send_cap, recv_cap)?;
        return pipeline(&mut cuda::DeviceChunks { ends, bufs }, chunks, f);
    }
    let _ = staging; // page-locked memory is for one CUDA device
    pipeline(&mut HostChunks::new(ends, send_cap, recv_cap), chunks, f)
}

/// The context of the one CUDA device that every tensor of `tensors` is
/// on (`None` when one is elsewhere, or there is none). O(tensors).
#[cfg(feature = "cuda")]
fn one_cuda<'v>(
    mut tensors: impl Iterator<Item = &'v Tensor>,
) -> Option<std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaContext>> {
    let first = tensors.next()?;
    let candle_core::Device::Cuda(device) = first.device() else {
        return None;
    };
    (tensors.all(|t| t.device().same_device(first.device())))
        .then(|| device.cuda_stream().context().clone())
}

/// Copies `chunk`'s send parts into `into` (its `send_len` bytes) now,
/// through send slot `slot` of the page-locked `staging`, when every
/// tensor they read is on one CUDA device: whether it did (else nothing is
/// done). O(chunk), one wait for the copies.
///
/// # Errors
/// As [`exchange_staged`].
pub(super) fn fetch_now(
    ends: &Ends<'_>,
    staging: &mut ChunkStaging,
    slot: usize,
    chunk: &Chunk,
    into: &mut [u8],
) -> Result<bool, Error> {
    #[cfg(feature = "cuda")]
    if let Some(ctx) = one_cuda(chunk.send.iter().filter_map(|p| ends[p.var].1)) {
        let bufs = staging.buffers(&ctx, chunk.send_len, chunk.recv_len)?;
        let mut io = cuda::DeviceChunks { ends, bufs };
        io.fetch(slot, chunk)?;
        let staged = (io.bufs[slot].bytes())
            .map_err(|e| cuda::driver(cuda::key_of(ends, chunk), "waiting for a copy", e))?;
        into.copy_from_slice(&staged[..chunk.send_len]);
        return Ok(true);
    }
    let _ = (ends, staging, slot, chunk, into);
    Ok(false)
}

/// Copies `from` (`chunk`'s `recv_len` bytes) into its receive parts'
/// tensors, through receive slot `slot` of the page-locked `staging`,
/// when every tensor they write is on one CUDA device: whether it did
/// (else nothing is done). The copies to the device are queued, not
/// waited for. O(chunk).
///
/// # Errors
/// As [`exchange_staged`].
pub(super) fn put_now(
    ends: &Ends<'_>,
    staging: &mut ChunkStaging,
    slot: usize,
    chunk: &Chunk,
    from: &[u8],
) -> Result<bool, Error> {
    #[cfg(feature = "cuda")]
    if let Some(ctx) = one_cuda(chunk.recv.iter().filter_map(|p| ends[p.var].2)) {
        let bufs = staging.buffers(&ctx, chunk.send_len, chunk.recv_len)?;
        let key = cuda::key_of(ends, chunk);
        let slot_bytes =
            (bufs[2 + slot].bytes_mut()).map_err(|e| cuda::driver(key, "waiting for a copy", e))?;
        slot_bytes[..from.len()].copy_from_slice(from);
        cuda::DeviceChunks { ends, bufs }.put(slot, chunk)?;
        return Ok(true);
    }
    let _ = (ends, staging, slot, chunk, from);
    Ok(false)
}

/// Chunks staged through plain host memory, with synchronous copies
/// ([`Staged`]): tensors off one CUDA device (on the CPU, or without the
/// `cuda` feature).
pub(super) struct HostChunks<'a, 'v> {
    ends: &'a Ends<'v>,
    /// `u64`s so that the bytes are aligned for any float.
    send: [Vec<u64>; 2],
    recv: [Vec<u64>; 2],
}

impl<'a, 'v> HostChunks<'a, 'v> {
    /// Staging of `send_cap` bytes a send slot and `recv_cap` a receive
    /// slot, for the tensors `ends`. O(caps).
    pub(super) fn new(ends: &'a Ends<'v>, send_cap: usize, recv_cap: usize) -> Self {
        let buf = |n: usize| vec![0_u64; n.div_ceil(8)];
        Self {
            ends,
            send: [buf(send_cap), buf(send_cap)],
            recv: [buf(recv_cap), buf(recv_cap)],
        }
    }
}

impl ChunkCopies for HostChunks<'_, '_> {
    fn fetch(&mut self, slot: usize, chunk: &Chunk) -> Result<(), Error> {
        let into: &mut [u8] = bytemuck::cast_slice_mut(&mut self.send[slot]);
        let into = &mut into[..chunk.send_len];
        if covered(self.ends, chunk) < chunk.send_len {
            into.fill(0);
        }
        for p in &chunk.send {
            let (key, Some(t), _) = self.ends[p.var] else {
                continue;
            };
            let size = t.dtype().size_in_bytes();
            let (at, to) = (p.first * size, &mut into[p.at..p.at + p.n * size]);
            let read = if t.device().is_cpu() {
                with_bytes(t, |b| match b.get(at..at + to.len()) {
                    Some(b) => {
                        to.copy_from_slice(b);
                        Ok(())
                    }
                    None => Err(candle_core::Error::Msg(format!(
                        "a read of bytes [{at}, {}) of a tensor of {}",
                        at + to.len(),
                        b.len()
                    ))),
                })
                .and_then(|r| r)
            } else {
                Staged::read(t, at, to)
            };
            read.map_err(|e| candle(key, e))?;
        }
        Ok(())
    }

    fn exchange(&mut self, slot: usize, chunk: &Chunk, f: &mut Exchange<'_>) -> Result<(), Error> {
        let send: &[u8] = bytemuck::cast_slice(&self.send[slot]);
        let recv: &mut [u8] = bytemuck::cast_slice_mut(&mut self.recv[slot]);
        f(chunk, &send[..chunk.send_len], &mut recv[..chunk.recv_len])
    }

    fn put(&mut self, slot: usize, chunk: &Chunk) -> Result<(), Error> {
        let from: &[u8] = bytemuck::cast_slice(&self.recv[slot]);
        for p in &chunk.recv {
            let (key, _, result) = self.ends[p.var];
            if let Some(t) = result {
                let size = t.dtype().size_in_bytes();
                let (at, bytes) = (p.first * size, &from[p.at..p.at + p.n * size]);
                let written = if t.device().is_cpu() {
                    write_bytes(t, at, bytes)
                } else {
                    Staged::write(t, at, bytes)
                };
                written.map_err(|e| candle(key, e))?;
            }
        }
        Ok(())
    }
}

/// Reduces a run of variables (key, source, result: contiguous tensors of
/// one dtype, each result of its source's length) through staging, `per`
/// elements a call of `f` ([`reduce_chunks`], [`exchange_staged`]).
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
    let ends: Vec<_> = (vars.iter())
        .map(|&(k, s, r)| (k, Some(s), Some(r)))
        .collect();
    let caps = (per * size, per * size);
    let mut chunks = reduce_chunks(&lens, per, size);
    exchange_staged(&ends, staging, caps, &mut chunks, &mut |_, s, r| f(s, r))
}

/// The page-locked staging of a plan's chunked exchanges, kept from call
/// to call: two send slots and two receive slots in one device's context
/// (empty until a CUDA tensor is exchanged, and without the `cuda`
/// feature).
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
    use candle_core::{CudaStorage, InplaceOp1, Layout, Storage};

    use super::{Chunk, ChunkCopies, ChunkStaging, Ends, Exchange};
    use crate::candle::cuda::{Pinned, read_range, write_range};
    use crate::ranks::candle::host::candle;
    use crate::ranks::error::Error;

    impl ChunkStaging {
        /// Two send slots of at least `send` bytes and two receive slots
        /// of at least `recv` in `ctx`'s device: the kept ones, else new
        /// ones (page-locked once per plan, and again only for larger
        /// chunks or another device).
        pub(super) fn buffers(
            &mut self,
            ctx: &Arc<CudaContext>,
            send: usize,
            recv: usize,
        ) -> Result<&mut [Pinned], Error> {
            let ordinal = ctx.ordinal();
            let fits = |(o, b): &(usize, Vec<Pinned>)| {
                *o == ordinal && b[0].len() >= send && b[2].len() >= recv
            };
            if !self.kept.as_ref().is_some_and(fits) {
                // The old ones go first; a new one is at least as large.
                let old = self.kept.take().map(|(_, b)| (b[0].len(), b[2].len()));
                let (send, recv) = old.map_or((send, recv), |(s, r)| (s.max(send), r.max(recv)));
                let bufs = [send, send, recv, recv]
                    .into_iter()
                    .map(|len| Pinned::new(ctx, len))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| Error::BadBuffers {
                        op: "staged exchange",
                        reason: format!(
                            "page-locking 2 × {send} + 2 × {recv} bytes of staging: {e}"
                        ),
                    })?;
                self.kept = Some((ordinal, bufs));
            }
            Ok(self.kept.as_mut().map_or(&mut [][..], |(_, b)| &mut b[..]))
        }
    }

    /// The chunks of an exchange between the tensors' CUDA storage and the
    /// staging: `bufs` are send slots 0 and 1, then receive slots 0 and 1.
    pub(super) struct DeviceChunks<'a, 'v> {
        pub(super) ends: &'a Ends<'v>,
        pub(super) bufs: &'a mut [Pinned],
    }

    pub(super) fn driver(key: &str, what: &str, e: impl std::fmt::Display) -> Error {
        candle(key, candle_core::Error::Msg(format!("{what}: {e}")))
    }

    /// The key of a chunk's first part, for errors of the whole chunk.
    pub(super) fn key_of<'v>(ends: &Ends<'v>, chunk: &Chunk) -> &'v str {
        let first = chunk.send.first().or(chunk.recv.first());
        first.map_or("", |p| ends[p.var].0)
    }

    impl ChunkCopies for DeviceChunks<'_, '_> {
        fn fetch(&mut self, slot: usize, chunk: &Chunk) -> Result<(), Error> {
            let key = key_of(self.ends, chunk);
            let buf = &mut self.bufs[slot];
            if super::covered(self.ends, chunk) < chunk.send_len {
                // Zeros under the copies: the slot's last copies ended
                // when its last chunk was exchanged, so this waits for
                // nothing.
                (buf.bytes_mut()
                    .map_err(|e| driver(key, "zeroing staging", e))?)[..chunk.send_len]
                    .fill(0);
            }
            for p in &chunk.send {
                let (key, Some(src), _) = self.ends[p.var] else {
                    continue;
                };
                let (storage, layout) = src.storage_and_layout();
                let Storage::Cuda(s) = &*storage else {
                    return Err(driver(key, "staging a tensor", "not on a CUDA device"));
                };
                let (start, _) = layout
                    .contiguous_offsets()
                    .ok_or_else(|| driver(key, "staging a tensor", "strided"))?;
                read_range(s, start + p.first, p.n, buf, p.at).map_err(|e| candle(key, e))?;
            }
            buf.flush()
                .map_err(|e| driver(key, "queueing a copy from the device", e))
        }

        fn exchange(
            &mut self,
            slot: usize,
            chunk: &Chunk,
            f: &mut Exchange<'_>,
        ) -> Result<(), Error> {
            let key = key_of(self.ends, chunk);
            let (send, recv) = self.bufs.split_at_mut(2);
            let send = (send[slot].bytes())
                .map_err(|e| driver(key, "waiting for a copy from the device", e))?;
            let recv = (recv[slot].bytes_mut())
                .map_err(|e| driver(key, "waiting for a copy to the device", e))?;
            f(chunk, &send[..chunk.send_len], &mut recv[..chunk.recv_len])
        }

        fn put(&mut self, slot: usize, chunk: &Chunk) -> Result<(), Error> {
            let key = key_of(self.ends, chunk);
            let buf = &mut self.bufs[2 + slot];
            for p in &chunk.recv {
                let (key, _, Some(result)) = self.ends[p.var] else {
                    continue;
                };
                let op = PutChunk {
                    buf: RefCell::new(&mut *buf),
                    first: p.first,
                    from: p.at,
                    nbytes: p.n * result.dtype().size_in_bytes(),
                };
                result.inplace_op1(&op).map_err(|e| candle(key, e))?;
            }
            buf.flush()
                .map_err(|e| driver(key, "queueing a copy to the device", e))
        }
    }

    /// The copy of part of a receive slot into a tensor's storage, through
    /// candle's `InplaceOp1` (the only way to reach a tensor's memory for
    /// writing).
    struct PutChunk<'a> {
        buf: RefCell<&'a mut Pinned>,
        first: usize,
        from: usize,
        nbytes: usize,
    }

    impl InplaceOp1 for PutChunk<'_> {
        fn name(&self) -> &'static str {
            "scopetree-staged-chunk"
        }

        fn cpu_fwd(&self, _: &mut candle_core::CpuStorage, _: &Layout) -> candle_core::Result<()> {
            Err(candle_core::Error::Msg(
                "a chunk staged for a CUDA tensor, put into a CPU one".into(),
            ))
        }

        fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
            let (start, _) = layout.contiguous_offsets().ok_or_else(|| {
                candle_core::Error::Msg("a staged chunk put into a strided tensor".into())
            })?;
            let mut buf = self.buf.borrow_mut();
            write_range(
                storage,
                start + self.first,
                &mut buf,
                self.from,
                self.nbytes,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the calls of an exchange, in order: (call, slot, the
    /// chunk's first send part, or its first receive part for a put).
    #[derive(Default)]
    struct Calls(Vec<(char, usize, Option<Part>)>);

    impl ChunkCopies for Calls {
        fn fetch(&mut self, slot: usize, chunk: &Chunk) -> Result<(), Error> {
            self.0.push(('f', slot, chunk.send.first().copied()));
            Ok(())
        }
        fn exchange(
            &mut self,
            slot: usize,
            chunk: &Chunk,
            f: &mut Exchange<'_>,
        ) -> Result<(), Error> {
            self.0.push(('x', slot, chunk.send.first().copied()));
            f(
                chunk,
                &vec![0; chunk.send_len],
                &mut vec![0; chunk.recv_len],
            )
        }
        fn put(&mut self, slot: usize, chunk: &Chunk) -> Result<(), Error> {
            self.0.push(('p', slot, chunk.recv.first().copied()));
            Ok(())
        }
    }

    #[test]
    fn an_all_reduce_makes_the_calls_of_variables_sent_whole_and_keeps_two_in_flight() {
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
                let mut chunks = reduce_chunks(&lens, per, size);
                pipeline(&mut calls, &mut chunks, &mut |_, s, r| {
                    assert_eq!(s.len(), r.len());
                    sums.push(s.len());
                    Ok(())
                })
                .expect("a reduce");
                // The calls of `chunks(per)` over each variable in turn:
                // every rank makes the same, staged or not.
                let parts: Vec<Part> = (lens.iter().enumerate())
                    .flat_map(|(var, &n)| {
                        let whole = vec![0_u8; n];
                        let sizes: Vec<usize> = whole.chunks(per).map(<[u8]>::len).collect();
                        sizes.into_iter().enumerate().map(move |(i, n)| Part {
                            var,
                            first: i * per,
                            n,
                            at: 0,
                        })
                    })
                    .collect();
                let whole: Vec<usize> = parts.iter().map(|p| p.n * size).collect();
                assert_eq!(sums, whole, "lens {lens:?} per {per}");
                // Chunk k + 1 (of this variable or the next) is fetched
                // before chunk k is exchanged; chunk k is put before chunk
                // k + 1 is exchanged; the slots alternate across variables.
                let mut want = vec![('f', 0, Some(parts[0]))];
                for (k, &p) in parts.iter().enumerate() {
                    if let Some(&next) = parts.get(k + 1) {
                        want.push(('f', (k + 1) % 2, Some(next)));
                    }
                    want.push(('x', k % 2, Some(p)));
                    want.push(('p', k % 2, Some(p)));
                }
                assert_eq!(calls.0, want, "lens {lens:?} per {per}");
            }
        }
    }

    #[test]
    fn a_failed_exchange_stops_the_chunks() {
        let mut calls = Calls::default();
        let mut k = 0;
        let e = pipeline(
            &mut calls,
            &mut reduce_chunks(&[4, 6], 2, 4),
            &mut |_, _, _| {
                k += 1;
                if k == 3 {
                    return Err(Error::BadBuffers {
                        op: "all-reduce",
                        reason: "a test".into(),
                    });
                }
                Ok(())
            },
        );
        assert!(matches!(e, Err(Error::BadBuffers { .. })), "{e:?}");
        assert_eq!(calls.0.iter().filter(|c| c.0 == 'x').count(), 3);
        assert_eq!(calls.0.iter().filter(|c| c.0 == 'p').count(), 2);
    }

    #[test]
    fn no_chunks_make_no_calls() {
        let mut calls = Calls::default();
        let mut none = reduce_chunks(&[], 3, 4);
        pipeline(&mut calls, &mut none, &mut |_, _, _| panic!("no exchange")).expect("nothing");
        assert!(calls.0.is_empty());
    }

    #[test]
    fn host_chunks_gather_parts_zero_the_gaps_and_scatter_the_results() {
        use candle_core::Device;
        let a = Tensor::arange(1_f32, 7., &Device::Cpu).expect("a");
        let b = Tensor::arange(10_f64, 13., &Device::Cpu).expect("b");
        let (ra, rb) = (a.zeros_like().expect("ra"), b.zeros_like().expect("rb"));
        let ends = [
            ("a", Some(&a), Some(&ra)),
            ("b", Some(&b), Some(&rb)),
            ("none", None, None),
        ];
        // a[2..5] at byte 0, a gap, b[1..3] at byte 16, "none"'s zeros at
        // 32; back: the first two f32s into ra[0..2], the two f64s into
        // rb[0..2].
        let part = |var, first, n, at| Part { var, first, n, at };
        let chunk = Chunk {
            send: [part(0, 2, 3, 0), part(1, 1, 2, 16), part(2, 0, 2, 32)]
                .into_iter()
                .collect(),
            send_len: 48,
            recv: [part(0, 0, 2, 0), part(1, 0, 2, 16)].into_iter().collect(),
            recv_len: 32,
            root: 7,
        };
        let mut io = HostChunks::new(&ends, 48, 32);
        io.send[0].fill(u64::MAX); // no stale bytes survive a fetch
        let mut sent = Vec::new();
        let mut chunks = [chunk].into_iter();
        pipeline(&mut io, &mut chunks, &mut |c, s, r| {
            assert_eq!(c.root, 7);
            sent = s.to_vec();
            r.copy_from_slice(&s[..32]);
            Ok(())
        })
        .expect("an exchange");
        let f32s: Vec<f32> = sent[..16]
            .chunks(4)
            .map(bytemuck::pod_read_unaligned)
            .collect();
        let f64s: Vec<f64> = sent[16..]
            .chunks(8)
            .map(bytemuck::pod_read_unaligned)
            .collect();
        assert_eq!(f32s, [3., 4., 5., 0.]);
        assert_eq!(f64s, [11., 12., 0., 0.]);
        assert_eq!(ra.to_vec1::<f32>().expect("ra"), [3., 4., 0., 0., 0., 0.]);
        assert_eq!(rb.to_vec1::<f64>().expect("rb"), [11., 12., 0.]);
    }
}
