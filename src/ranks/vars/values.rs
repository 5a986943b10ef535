//! How a plan reads and writes its variables: one [`Slot`] per variable,
//! the [`Values`] seen as native bytes (the tree's variables or a candle
//! store's tensors), and the float types a plan reduces ([`Float`]).

use std::any::Any;

use bytemuck::Pod;

use super::access::Access;
use crate::checkpoint::Dtype;
use crate::ranks::error::Error;
use crate::ranks::transport::collective::Collective;
use crate::ranks::transport::pipeline::Pipeline;
use crate::{ScopeTree, VarId};

/// One variable of a plan.
#[derive(Clone, Copy)]
pub(in crate::ranks) struct Slot {
    pub(in crate::ranks) id: VarId,
    pub(in crate::ranks) access: Access,
    pub(in crate::ranks) nbytes: usize,
}

/// A float type a plan reduces.
pub(in crate::ranks) trait Float: Pod + std::ops::Div<Output = Self> {
    const DTYPE: Dtype;
    fn sum<C: Collective + ?Sized>(comm: &C, send: &[Self], recv: &mut [Self])
    -> Result<(), Error>;
    fn scatter<C: Collective + ?Sized>(
        comm: &C,
        send: &[Self],
        recv: &mut [Self],
    ) -> Result<(), Error>;
    fn pipelined<C: Collective + ?Sized>(
        comm: &C,
        pipe: &mut dyn Pipeline<Self>,
        bufs: &mut [(Vec<Self>, Vec<Self>)],
    ) -> Result<(), Error>;
    fn reduce_to<C: Collective + ?Sized>(
        comm: &C,
        root: usize,
        send: &[Self],
        recv: &mut [Self],
    ) -> Result<(), Error>;
    fn of_count(n: usize) -> Self;
}

impl Float for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn sum<C: Collective + ?Sized>(comm: &C, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        comm.all_reduce_sum_f32(send, recv)
    }
    fn scatter<C: Collective + ?Sized>(
        comm: &C,
        send: &[f32],
        recv: &mut [f32],
    ) -> Result<(), Error> {
        comm.reduce_scatter_sum_f32(send, recv)
    }
    fn reduce_to<C: Collective + ?Sized>(
        comm: &C,
        root: usize,
        send: &[f32],
        recv: &mut [f32],
    ) -> Result<(), Error> {
        comm.reduce_sum_f32(root, send, recv)
    }
    fn pipelined<C: Collective + ?Sized>(
        comm: &C,
        pipe: &mut dyn Pipeline<f32>,
        bufs: &mut [(Vec<f32>, Vec<f32>)],
    ) -> Result<(), Error> {
        comm.all_reduce_sum_f32_pipelined(pipe, bufs)
    }
    #[allow(clippy::cast_precision_loss)]
    fn of_count(n: usize) -> f32 {
        n as f32
    }
}

impl Float for f64 {
    const DTYPE: Dtype = Dtype::F64;
    fn sum<C: Collective + ?Sized>(comm: &C, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        comm.all_reduce_sum_f64(send, recv)
    }
    fn scatter<C: Collective + ?Sized>(
        comm: &C,
        send: &[f64],
        recv: &mut [f64],
    ) -> Result<(), Error> {
        comm.reduce_scatter_sum_f64(send, recv)
    }
    fn reduce_to<C: Collective + ?Sized>(
        comm: &C,
        root: usize,
        send: &[f64],
        recv: &mut [f64],
    ) -> Result<(), Error> {
        comm.reduce_sum_f64(root, send, recv)
    }
    fn pipelined<C: Collective + ?Sized>(
        comm: &C,
        pipe: &mut dyn Pipeline<f64>,
        bufs: &mut [(Vec<f64>, Vec<f64>)],
    ) -> Result<(), Error> {
        comm.all_reduce_sum_f64_pipelined(pipe, bufs)
    }
    #[allow(clippy::cast_precision_loss)]
    fn of_count(n: usize) -> f64 {
        n as f64
    }
}

/// Where a plan's values live, seen as native bytes: the tree's variables,
/// or a candle store's tensors. `var` is the variable's index in the plan,
/// `at` a byte offset within it.
pub(in crate::ranks) trait Values {
    /// Copies the bytes `at..at + into.len()` of variable `var` into `into`.
    fn read(&mut self, var: usize, at: usize, into: &mut [u8]) -> Result<(), Error>;
    /// Copies `from` over the bytes `at..at + from.len()` of variable `var`.
    fn write(&mut self, var: usize, at: usize, from: &[u8]) -> Result<(), Error>;
    /// Whether the values copy a bucket's pieces together
    /// ([`read_spans`](Self::read_spans), [`write_spans`](Self::write_spans):
    /// a device's, through staging); else the caller reads and writes them
    /// one at a time.
    fn spans(&self) -> bool {
        false
    }
    /// Copies the pieces `spans` of a bucket (the `k`th of its call) into
    /// `into`: each piece's [`read`](Self::read), unless the values copy
    /// them together.
    ///
    /// # Errors
    /// The first failed copy.
    fn read_spans(&mut self, k: usize, spans: &[Span], into: &mut [u8]) -> Result<(), Error> {
        let _ = k;
        for s in spans {
            self.read(s.var, s.at, &mut into[s.to..s.to + s.len])?;
        }
        Ok(())
    }
    /// Copies the pieces `spans` of a bucket (the `k`th of its call) from
    /// `from` into their variables: each piece's [`write`](Self::write),
    /// unless the values copy them together.
    ///
    /// # Errors
    /// The first failed copy.
    fn write_spans(&mut self, k: usize, spans: &[Span], from: &[u8]) -> Result<(), Error> {
        let _ = k;
        for s in spans {
            self.write(s.var, s.at, &from[s.to..s.to + s.len])?;
        }
        Ok(())
    }
}

/// A piece of a variable in a bucket: `len` bytes from byte `at` of
/// variable `var`, at byte `to` of the bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::ranks) struct Span {
    pub(in crate::ranks) var: usize,
    pub(in crate::ranks) at: usize,
    pub(in crate::ranks) len: usize,
    pub(in crate::ranks) to: usize,
}

/// Values that a reduce can send from their own buffers, and whose
/// results it can hand over without a copy (the variables at least
/// [`PlanOptions::direct_bytes`](crate::ranks::PlanOptions::direct_bytes) long).
pub(in crate::ranks) trait Direct: Values {
    /// Runs `f` on the bytes of variable `var` as held, in place (no copy).
    fn with_bytes(
        &mut self,
        var: usize,
        f: &mut dyn FnMut(&[u8]) -> Result<(), Error>,
    ) -> Result<(), Error>;
    /// Makes the `Vec` behind `spare` (of variable `var`'s element type and
    /// length, the reduced elements) the variable's elements, leaving in
    /// `spare` a buffer to reuse (the old elements) or an empty one.
    fn adopt(&mut self, var: usize, spare: &mut dyn Any) -> Result<(), Error>;
    /// Whether variable `var` is reduced through staging
    /// ([`reduce_staged`](Self::reduce_staged)): its elements are not in
    /// host memory (a device tensor). Else the caller reduces it with
    /// [`with_bytes`](Self::with_bytes) and [`adopt`](Self::adopt).
    fn staged(&self, var: usize) -> bool {
        let _ = var;
        false
    }
    /// Reduces the variables `vars` (plan index and element count, each
    /// [`staged`](Self::staged)) through staging, in order, `per` elements
    /// a call of `sum` (the calls [`with_bytes`](Self::with_bytes) would
    /// make), and sets their results.
    ///
    /// # Errors
    /// [`Error::BadBuffers`] where no variable is staged (a bug); a failed
    /// copy or sum.
    fn reduce_staged(
        &mut self,
        vars: &[(usize, usize)],
        per: usize,
        sum: &mut SumChunk<'_>,
    ) -> Result<(), Error> {
        let _ = (vars, per, sum);
        Err(Error::BadBuffers {
            op: "all-reduce",
            reason: "values that stage no variable".into(),
        })
    }
}

/// The sum of one chunk of a variable over the ranks: the chunk's bytes as
/// this rank holds them, and the buffer of the same length its sums (or
/// means) go to.
pub(in crate::ranks) type SumChunk<'a> = dyn FnMut(&[u8], &mut [u8]) -> Result<(), Error> + 'a;

/// The variables of a tree plan.
pub(in crate::ranks) struct InTree<'a> {
    pub(in crate::ranks) tree: &'a mut ScopeTree,
    pub(in crate::ranks) slots: &'a [Slot],
}

impl Values for InTree<'_> {
    fn read(&mut self, var: usize, at: usize, into: &mut [u8]) -> Result<(), Error> {
        let slot = self.slots[var];
        let bytes = (slot.access.bytes)(self.tree, slot.id)?;
        into.copy_from_slice(&bytes[at..at + into.len()]);
        Ok(())
    }
    fn write(&mut self, var: usize, at: usize, from: &[u8]) -> Result<(), Error> {
        let slot = self.slots[var];
        let bytes = (slot.access.bytes_mut)(self.tree, slot.id)?;
        bytes[at..at + from.len()].copy_from_slice(from);
        Ok(())
    }
}

impl Direct for InTree<'_> {
    fn with_bytes(
        &mut self,
        var: usize,
        f: &mut dyn FnMut(&[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let slot = self.slots[var];
        f((slot.access.bytes)(self.tree, slot.id)?)
    }
    fn adopt(&mut self, var: usize, spare: &mut dyn Any) -> Result<(), Error> {
        let slot = self.slots[var];
        if (slot.access.swap)(self.tree, slot.id, spare)? {
            return Ok(());
        }
        // A value that cannot take the buffer as it is: a copy.
        let bytes: &[u8] = if let Some(v) = spare.downcast_ref::<Vec<f32>>() {
            bytemuck::cast_slice(v)
        } else if let Some(v) = spare.downcast_ref::<Vec<f64>>() {
            bytemuck::cast_slice(v)
        } else {
            &[]
        };
        let into = (slot.access.bytes_mut)(self.tree, slot.id)?;
        if into.len() != bytes.len() {
            return Err(Error::BadBuffers {
                op: "all-reduce",
                reason: format!("{} bytes for a variable of {}", bytes.len(), into.len()),
            });
        }
        into.copy_from_slice(bytes);
        Ok(())
    }
}

/// `bytes` as a slice of `F`; [`Error::BadBuffers`] if they do not fit
/// (never for the plan's own, aligned buffers). O(1).
pub(in crate::ranks) fn cast<F: Pod>(bytes: &[u8]) -> Result<&[F], Error> {
    bytemuck::try_cast_slice(bytes).map_err(|e| Error::BadBuffers {
        op: "all-reduce",
        reason: e.to_string(),
    })
}

/// As [`cast`], mutable. O(1).
pub(in crate::ranks) fn cast_mut<F: Pod>(bytes: &mut [u8]) -> Result<&mut [F], Error> {
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| Error::BadBuffers {
        op: "all-reduce",
        reason: e.to_string(),
    })
}
