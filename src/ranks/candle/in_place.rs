//! Gradients reduced in place for [`CandlePlan::all_reduce_in_place`]
//! (feature `candle`): a spare buffer of reduced elements swapped into a
//! gradient tensor's own CPU storage by a candle in-place op, and the
//! check that no two of the tensors involved share a storage (on any
//! device).
//!
//! [`CandlePlan::all_reduce_in_place`]: crate::ranks::CandlePlan::all_reduce_in_place

use std::any::Any;
use std::cell::{Cell, RefCell};

use candle_core::{CpuStorage, InplaceOp1, Layout, Storage, Tensor};

/// Swaps the `Vec` behind a spare (`Vec<f32>` or `Vec<f64>`) with a
/// tensor's CPU storage, when the tensor is all of its storage: contiguous,
/// from offset 0, of the spare's length and element type.
pub(in crate::ranks) struct SwapIn<'a> {
    spare: RefCell<&'a mut dyn Any>,
    swapped: Cell<bool>,
}

impl<'a> SwapIn<'a> {
    /// The swap of `spare`'s buffer. O(1).
    pub(in crate::ranks) fn new(spare: &'a mut dyn Any) -> Self {
        Self {
            spare: RefCell::new(spare),
            swapped: Cell::new(false),
        }
    }

    /// Runs the swap on `t`; whether it took place (else both stay as they
    /// were). O(1).
    pub(in crate::ranks) fn into(self, t: &Tensor) -> candle_core::Result<bool> {
        t.inplace_op1(&self)?;
        Ok(self.swapped.get())
    }
}

impl InplaceOp1 for SwapIn<'_> {
    fn name(&self) -> &'static str {
        "scopetree-swap-in"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let whole = |len: usize| {
            layout.start_offset() == 0
                && layout.is_contiguous()
                && layout.shape().elem_count() == len
        };
        let mut spare = self.spare.borrow_mut();
        let swapped = match storage {
            CpuStorage::F32(v) => match spare.downcast_mut::<Vec<f32>>() {
                Some(s) if s.len() == v.len() && whole(v.len()) => {
                    std::mem::swap(v, s);
                    true
                }
                _ => false,
            },
            CpuStorage::F64(v) => match spare.downcast_mut::<Vec<f64>>() {
                Some(s) if s.len() == v.len() && whole(v.len()) => {
                    std::mem::swap(v, s);
                    true
                }
                _ => false,
            },
            _ => false,
        };
        self.swapped.set(swapped);
        Ok(())
    }
}

/// Which storage `t` is a view of, on any device: the address of candle's
/// storage object, the same for every tensor that shares it. O(1).
pub(in crate::ranks) fn storage_at(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    std::ptr::from_ref::<Storage>(&*storage) as usize
}

/// Whether the storages at `starts` are all distinct; sorts `starts`.
/// O(n log n).
pub(in crate::ranks) fn all_distinct(starts: &mut [usize]) -> bool {
    starts.sort_unstable();
    starts.windows(2).all(|w| w[0] != w[1])
}
