//! The bucketed collectives of a plan: the all-reduce of one float type
//! ([`Lane`]) and the broadcast of bytes, each copying the variables into
//! a bucket, moving it, and copying it back.

use super::buckets::{Buckets, Segment};
use super::options::{PlanOptions, Reduce};
use crate::checkpoint::Dtype;
use crate::ranks::error::Error;
use crate::ranks::transport::collective::Collective;
use crate::ranks::transport::pipeline::Pipeline;
use crate::ranks::vars::values::{Direct, Float, Span, Values, cast, cast_mut};

/// The buckets and buffers of one float type: small variables fused into
/// buckets, copied in and out; variables of at least
/// [`PlanOptions::direct_bytes`] sent from their own buffers into spare
/// buffers, which then take their place.
#[derive(Default)]
pub(in crate::ranks) struct Lane<F> {
    buckets: Buckets,
    /// The variables sent from their own buffers, each with its spare.
    direct: Vec<Spare<F>>,
    /// Per variable of the plan: whether it is in `direct` (the candle
    /// path makes no result buffer for those).
    #[cfg_attr(not(feature = "candle"), allow(dead_code))]
    is_direct: Vec<bool>,
    /// The most elements one call moves.
    cap: usize,
    /// The fused buckets' buffer pairs (send, receive), one bucket each.
    bufs: Vec<(Vec<F>, Vec<F>)>,
}

/// A variable sent from its own buffer, and the buffer its sums go to.
struct Spare<F> {
    var: usize,
    len: usize,
    /// Made by the first reduce; after each, it holds the variable's old
    /// elements (or nothing, when the variable took it away).
    buf: Vec<F>,
}

impl<F: Float> Lane<F> {
    /// The buckets of the variables of type `F` among `vars` (dtype and
    /// bytes, in plan order), and the variables sent from their own
    /// buffers. O(variables + buckets); allocates the two buffers of one
    /// bucket (at most the fused variables' bytes).
    pub(in crate::ranks) fn new(
        vars: impl Iterator<Item = (Dtype, usize)>,
        opts: &PlanOptions,
    ) -> Self {
        let size = std::mem::size_of::<F>();
        let mut fused = Vec::new();
        let mut direct = Vec::new();
        let mut is_direct = Vec::new();
        for (i, (dtype, nbytes)) in vars.enumerate() {
            is_direct.push(dtype == F::DTYPE && nbytes > 0 && nbytes >= opts.direct_bytes);
            if dtype != F::DTYPE {
                continue;
            }
            if is_direct[i] {
                direct.push(Spare {
                    var: i,
                    len: nbytes / size,
                    buf: Vec::new(),
                });
            } else {
                fused.push((i, nbytes / size));
            }
        }
        let cap = opts.cap(size);
        let buckets = Buckets::cut(fused.into_iter(), cap);
        let n = buckets.longest();
        // One pair when one bucket holds every fused variable: nothing to
        // overlap.
        let pairs = if buckets.buckets.len() > 1 {
            opts.bucket_buffers.max(1)
        } else {
            1
        };
        Self {
            buckets,
            direct,
            is_direct,
            cap,
            bufs: (0..pairs)
                .map(|_| (vec![F::zeroed(); n], vec![F::zeroed(); n]))
                .collect(),
        }
    }

    /// Whether the plan's variable `var` is sent from its own buffer. O(1).
    #[cfg(feature = "candle")]
    pub(in crate::ranks) fn is_direct(&self, var: usize) -> bool {
        self.is_direct.get(var).copied().unwrap_or(false)
    }

    /// The fused variables' buckets, and the variables sent from their own
    /// buffers (plan indices, in order), for a transport that keeps its
    /// buffers on the device (NCCL). O(1).
    #[cfg(feature = "nccl")]
    pub(in crate::ranks) fn layout(&self) -> (&Buckets, impl Iterator<Item = usize> + '_) {
        (&self.buckets, self.direct.iter().map(|d| d.var))
    }

    /// How many all-reduce calls one reduction makes. O(direct variables).
    pub(in crate::ranks) fn calls(&self) -> usize {
        let direct: usize = self.direct.iter().map(|d| d.len.div_ceil(self.cap)).sum();
        self.buckets.buckets.len() + direct
    }

    /// Sums (or averages) every variable over the ranks, in place: the
    /// fused buckets copied in and out, the direct variables reduced from
    /// their buffers into their spares, which they then take, or, where
    /// `values` stages them (on a device), each run of them a chunk at a
    /// time through staging, with the same calls. The first call allocates
    /// the spares; later ones allocate nothing on a tree. O(bytes) of
    /// copies for the fused and staged variables only.
    pub(in crate::ranks) fn reduce<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        values: &mut impl Direct,
        op: Reduce,
    ) -> Result<(), Error> {
        let ranks = F::of_count(comm.size());
        let mut fused = Fused {
            buckets: &self.buckets,
            values: &mut *values,
            mean: (op == Reduce::Mean).then_some(ranks),
        };
        F::pipelined(comm, &mut fused, &mut self.bufs)?;
        let cap = self.cap;
        let mut next = 0;
        while next < self.direct.len() {
            // A run of staged variables (on a device): reduced together, so
            // that one's copies overlap another's sums.
            let run = self.direct[next..]
                .iter()
                .take_while(|d| values.staged(d.var))
                .count();
            if run > 0 {
                let vars: Vec<(usize, usize)> = self.direct[next..next + run]
                    .iter()
                    .map(|d| (d.var, d.len))
                    .collect();
                values.reduce_staged(&vars, cap, &mut |send, recv| {
                    let recv = cast_mut::<F>(recv)?;
                    F::sum(comm, cast::<F>(send)?, recv)?;
                    if op == Reduce::Mean {
                        for x in recv.iter_mut() {
                            *x = *x / ranks;
                        }
                    }
                    Ok(())
                })?;
                next += run;
                continue;
            }
            let d = &mut self.direct[next];
            next += 1;
            if d.buf.len() != d.len {
                d.buf = vec![F::zeroed(); d.len];
            }
            let buf = &mut d.buf;
            values.with_bytes(d.var, &mut |bytes| {
                let send = cast::<F>(bytes)?;
                for (s, r) in send.chunks(cap).zip(buf.chunks_mut(cap)) {
                    F::sum(comm, s, r)?;
                }
                Ok(())
            })?;
            if op == Reduce::Mean {
                for x in buf.iter_mut() {
                    *x = *x / ranks;
                }
            }
            values.adopt(d.var, buf)?;
        }
        Ok(())
    }
}

/// The fused buckets of one reduce, as a [`Pipeline`]: each filled from
/// its variables' segments and drained back into them (divided by the
/// ranks for [`Reduce::Mean`]).
struct Fused<'a, F, V> {
    buckets: &'a Buckets,
    values: &'a mut V,
    /// The number of ranks, for a mean.
    mean: Option<F>,
}

impl<F: Float, V: Values> Pipeline<F> for Fused<'_, F, V> {
    fn buckets(&self) -> usize {
        self.buckets.buckets.len()
    }

    fn len(&self, k: usize) -> usize {
        self.buckets.buckets[k].1
    }

    fn fill(&mut self, k: usize, send: &mut [F]) -> Result<(), Error> {
        let size = std::mem::size_of::<F>();
        let (range, _) = &self.buckets.buckets[k];
        let segments = &self.buckets.segments[range.clone()];
        if self.values.spans() {
            let spans = spans(segments, size);
            return (self.values).read_spans(k, &spans, bytemuck::cast_slice_mut(send));
        }
        for s in segments {
            let into = bytemuck::cast_slice_mut(&mut send[s.at..s.at + s.len]);
            self.values.read(s.var, s.start * size, into)?;
        }
        Ok(())
    }

    fn drain(&mut self, k: usize, recv: &mut [F]) -> Result<(), Error> {
        if let Some(ranks) = self.mean {
            for x in recv.iter_mut() {
                *x = *x / ranks;
            }
        }
        let size = std::mem::size_of::<F>();
        let (range, _) = &self.buckets.buckets[k];
        let segments = &self.buckets.segments[range.clone()];
        if self.values.spans() {
            let spans = spans(segments, size);
            return (self.values).write_spans(k, &spans, bytemuck::cast_slice(recv));
        }
        for s in segments {
            let from = bytemuck::cast_slice(&recv[s.at..s.at + s.len]);
            self.values.write(s.var, s.start * size, from)?;
        }
        Ok(())
    }
}

/// A bucket's `segments` of `size`-byte elements as [`Span`]s of bytes.
/// O(segments); allocates (only for values that copy spans together).
fn spans(segments: &[Segment], size: usize) -> Vec<Span> {
    (segments.iter())
        .map(|s| Span {
            var: s.var,
            at: s.start * size,
            len: s.len * size,
            to: s.at * size,
        })
        .collect()
}

/// Copies every variable's bytes on rank `root` to every rank, one bucket
/// of at most `cap` bytes per broadcast; `nbytes` gives the variables'
/// sizes in plan order. Allocates one bucket. O(bytes) per rank.
pub(in crate::ranks) fn broadcast_values<C: Collective + ?Sized>(
    comm: &C,
    root: usize,
    nbytes: impl Iterator<Item = usize>,
    cap: usize,
    values: &mut impl Values,
) -> Result<(), Error> {
    let buckets = Buckets::cut(nbytes.enumerate(), cap);
    let mut buf = vec![0_u8; buckets.longest()];
    let me = comm.rank() == root;
    for (range, len) in &buckets.buckets {
        let segments = &buckets.segments[range.clone()];
        if me {
            for s in segments {
                values.read(s.var, s.start, &mut buf[s.at..s.at + s.len])?;
            }
        }
        comm.broadcast_bytes(root, &mut buf[..*len])?;
        if !me {
            for s in segments {
                values.write(s.var, s.start, &buf[s.at..s.at + s.len])?;
            }
        }
    }
    Ok(())
}
