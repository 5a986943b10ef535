//! [`InTensors`]: tensors as the [`Values`] of a bucketed broadcast, read
//! from the sending rank's tensors and written into the others' in place,
//! on their devices, a bucket segment at a time: a load's parts, and the
//! pieces of a ZeRO optimizer's moments gathered for a save.

use candle_core::{Tensor, Var};

use super::plan::candle;
use crate::checkpoint::{self, Checkpointable, Dtype};
use crate::ranks::error::Error;
use crate::ranks::vars::values::Values;

/// One entry of a broadcast: its bytes are the elements of `tensor`
/// (flattened) from element `base` on. `None` on a rank that neither sends
/// nor keeps it: what it receives is dropped.
pub(super) struct Entry {
    pub(super) key: String,
    pub(super) tensor: Option<Tensor>,
    pub(super) base: usize,
}

/// The entries of one broadcast (`Values` index them), with what a
/// receiving rank keeps between segments. A segment may end inside an
/// element (the buckets count bytes, over tensors of any dtype); those
/// bytes wait in `carry` for the segment after it, which the buckets send
/// next. No host copy of an entry is made: a segment's at most.
pub(super) struct InTensors {
    entries: Vec<Entry>,
    /// Per entry, the bytes of its element a segment ended in (fewer than
    /// an element's).
    carry: Vec<Vec<u8>>,
    /// Per entry, the bytes received so far.
    received: Vec<usize>,
    /// The first failure to read or write a value on this rank; the
    /// broadcasts go on (every rank makes them alike, a failed read sending
    /// zeros) and it is settled after them.
    pub(super) failed: Option<Error>,
}

impl InTensors {
    /// The entries `entries`. O(entries).
    pub(super) fn new(entries: Vec<Entry>) -> Self {
        let n = entries.len();
        Self {
            entries,
            carry: vec![Vec::new(); n],
            received: vec![0; n],
            failed: None,
        }
    }

    /// Whole variables, by key. O(variables).
    pub(super) fn of_vars(vars: &[(String, Var)]) -> Self {
        Self::new(
            vars.iter()
                .map(|(key, v)| Entry {
                    key: key.clone(),
                    tensor: Some(v.as_tensor().clone()),
                    base: 0,
                })
                .collect(),
        )
    }
}

/// Writes the whole elements of `from` (little-endian bytes of `t`'s
/// dtype) into `t` (flattened) in place from element `first`, `t` on any
/// device. O(bytes).
pub(super) fn set_elements(key: &str, t: &Tensor, first: usize, from: &[u8]) -> Result<(), Error> {
    let size = t.dtype().size_in_bytes();
    let dtype: Dtype = t.dtype().into();
    let n = from.len() / size;
    let piece = <Var as Checkpointable>::from_le_bytes(dtype, &[n], from.to_vec())
        .map_err(|e| bad(key, &e))?;
    (piece.as_tensor().to_device(t.device()))
        .and_then(|p| t.flatten_all()?.slice_set(&p, 0, first))
        .map_err(|e| candle(key, e))
}

/// A checkpoint layer's failure on the tensor `key`, as a candle error
/// naming it.
pub(super) fn bad(key: &str, e: &checkpoint::Error) -> Error {
    candle(key, candle_core::Error::Msg(e.to_string()))
}

impl Values for InTensors {
    /// The entry's bytes `at..at + into.len()`: the elements that cover
    /// them, copied to the host. O(segment).
    fn read(&mut self, entry: usize, at: usize, into: &mut [u8]) -> Result<(), Error> {
        let Entry { key, tensor, base } = &self.entries[entry];
        let Some(t) = tensor else {
            into.fill(0);
            self.failed.get_or_insert(Error::BadBuffers {
                op: "sending tensors",
                reason: format!("`{key}` has no tensor on the sending rank"),
            });
            return Ok(());
        };
        let size = t.dtype().size_in_bytes();
        let (first, end) = (at / size, (at + into.len()).div_ceil(size));
        let bytes = (t.flatten_all())
            .and_then(|f| f.narrow(0, base + first, end - first))
            .and_then(|f| crate::candle::host_bytes(&f));
        let skip = at - first * size;
        match bytes {
            Ok(bytes) => into.copy_from_slice(&bytes[skip..skip + into.len()]),
            Err(e) => {
                into.fill(0);
                self.failed.get_or_insert(candle(key, e));
            }
        }
        Ok(())
    }

    /// Writes the segment's whole elements into the entry's tensor,
    /// keeping the bytes of an element it ends inside for the next
    /// segment; drops them where the entry has no tensor. O(segment).
    fn write(&mut self, entry: usize, at: usize, from: &[u8]) -> Result<(), Error> {
        let Entry { key, tensor, base } = &self.entries[entry];
        let Some(t) = tensor else {
            return Ok(());
        };
        if at != self.received[entry] {
            // The buckets send each entry's bytes in order: a bug here.
            self.failed.get_or_insert(Error::BadBuffers {
                op: "receiving tensors",
                reason: format!("`{key}`: bytes from {at} after {}", self.received[entry]),
            });
            return Ok(());
        }
        self.received[entry] += from.len();
        let size = t.dtype().size_in_bytes();
        let carry = &mut self.carry[entry];
        let mut first = base + (at - carry.len()) / size;
        let mut from = from;
        if !carry.is_empty() {
            // The element the last segment ended inside, completed first.
            let take = (size - carry.len()).min(from.len());
            carry.extend_from_slice(&from[..take]);
            from = &from[take..];
            if carry.len() < size {
                return Ok(());
            }
            if self.failed.is_none() {
                if let Err(e) = set_elements(key, t, first, carry) {
                    self.failed = Some(e);
                }
            }
            carry.clear();
            first += 1;
        }
        // The whole elements straight from the segment; only the bytes of
        // an element it ends inside wait (never more than an element's).
        let whole = from.len() / size * size;
        if whole > 0 && self.failed.is_none() {
            if let Err(e) = set_elements(key, t, first, &from[..whole]) {
                self.failed = Some(e);
            }
        }
        carry.extend_from_slice(&from[whole..]);
        Ok(())
    }
}
