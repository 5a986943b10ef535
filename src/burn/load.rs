//! A load: the checkpoint opened and every header checked, the module
//! matched against it (nothing read, nothing changed), then each shard
//! read whole, checked against its checksums and converted (on a second
//! thread, a tensor behind the reads), and applied through burn-store's
//! applier.

use std::sync::Mutex;

use burn_core::tensor::Bytes;
use burn_store::burn_pack::{Error as PackError, Tensor as PackTensor};
use burn_store::{ApplyResult, ModuleSnapshot};

use super::check::{Checker, Step};
use super::error::{Error, cut};
use super::names::{PARAM_ID_PREFIX, remap_all, remap_one};
use super::store::CheckpointStore;
use crate::checkpoint::{Opened, convert_floats, open_checkpoint};
use crate::short;

/// A tensor's bytes in a buffer aligned for its elements, so that burn
/// takes it as the tensor's storage without copying it again.
pub(crate) enum Aligned {
    B1(Vec<u8>),
    B2(Vec<u16>),
    B4(Vec<u32>),
    B8(Vec<u64>),
}

impl Aligned {
    /// `len` zero bytes for elements of `bits` bits (fresh pages from the
    /// allocator: no write). O(1) for large buffers.
    pub(crate) fn zeroed(bits: usize, len: usize) -> Self {
        match bits {
            16 => Self::B2(vec![0; len / 2]),
            32 => Self::B4(vec![0; len / 4]),
            64 => Self::B8(vec![0; len / 8]),
            _ => Self::B1(vec![0; len]),
        }
    }

    /// `bytes` copied into a buffer for elements of `bits` bits. O(len).
    pub(crate) fn copied(bits: usize, bytes: &[u8]) -> Self {
        let mut out = Self::zeroed(bits, bytes.len());
        out.bytes_mut().copy_from_slice(bytes);
        out
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Self::B1(v) => v,
            Self::B2(v) => bytemuck::cast_slice(v),
            Self::B4(v) => bytemuck::cast_slice(v),
            Self::B8(v) => bytemuck::cast_slice(v),
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Self::B1(v) => v,
            Self::B2(v) => bytemuck::cast_slice_mut(v),
            Self::B4(v) => bytemuck::cast_slice_mut(v),
            Self::B8(v) => bytemuck::cast_slice_mut(v),
        }
    }

    /// burn's bytes, owning this buffer. O(1).
    pub(crate) fn into_bytes(self) -> Bytes {
        match self {
            Self::B1(v) => Bytes::from_elems(v),
            Self::B2(v) => Bytes::from_elems(v),
            Self::B4(v) => Bytes::from_elems(v),
            Self::B8(v) => Bytes::from_elems(v),
        }
    }
}

/// Reads tensor `i` of `opened` (its bytes as the file holds them) and
/// checks them against the checksum its file records, if any. O(bytes).
pub(crate) fn read_checked(opened: &Opened, i: usize) -> Result<Aligned, (String, String)> {
    let buf = read_raw(opened, i)?;
    verify(opened, i, &buf)?;
    Ok(buf)
}

/// The name errors give the file of tensor `i`. O(path).
fn file_of(opened: &Opened, i: usize) -> String {
    opened.parts[opened.tensors[i].0]
        .path
        .to_string_lossy()
        .into_owned()
}

/// Reads tensor `i` of `opened`, its bytes as the file holds them, into a
/// buffer aligned for its elements; checks nothing. O(bytes).
fn read_raw(opened: &Opened, i: usize) -> Result<Aligned, (String, String)> {
    let t = &opened.tensors[i].1;
    let len = usize::try_from(t.end - t.begin).map_err(|e| (file_of(opened, i), e.to_string()))?;
    let mut buf = Aligned::zeroed(t.dtype.bitsize(), len);
    if let Err(e) = opened.read_into(i, buf.bytes_mut()) {
        return Err((file_of(opened, i), cut(&e.to_string())));
    }
    Ok(buf)
}

/// Checks the bytes `buf` of tensor `i` against the checksum its file
/// records, if any. O(bytes).
fn verify(opened: &Opened, i: usize, buf: &Aligned) -> Result<(), (String, String)> {
    let want = match opened.checksum(i) {
        Ok(Some((want, _))) => want,
        Ok(None) => return Ok(()),
        Err(e) => return Err((file_of(opened, i), cut(&e.to_string()))),
    };
    let got = xxhash_rust::xxh3::xxh3_128(buf.bytes());
    if got != want {
        return Err((
            file_of(opened, i),
            format!("its bytes have xxh3-128 {got:032x}, the save recorded {want:032x}"),
        ));
    }
    Ok(())
}

/// The failure of the `k`-th tensor of a shard: its file and why.
type Failed = (usize, String, String);

/// `buf`, the bytes of `step`'s tensor as the file holds them, in the
/// dtype `step` hands to burn (the raw buffer dropped once converted).
/// O(bytes).
fn converted(opened: &Opened, step: &Step, buf: Aligned) -> Aligned {
    match step.convert_to {
        Some(to) => {
            let from = opened.tensors[step.tensor].1.dtype;
            Aligned::copied(to.bitsize(), &convert_floats(from, to, buf.bytes()))
        }
        None => buf,
    }
}

/// Reads the tensors of `steps` (one shard's, in file order), checks their
/// checksums and converts them ([`converted`]), the checks and conversions
/// on a second thread one tensor behind the reads, so that hashing a
/// tensor overlaps reading the next. Returns the buffers for burn in the
/// order of `steps`, or the first failure in that order. O(bytes); holds
/// the shard's converted buffers (the caller holds them anyway) and at
/// most three raw ones in flight. With nothing to overlap (one tensor, or
/// none to check or convert), or when the system refuses the thread, the
/// caller's thread does it all ([`read_shard_here`]).
fn read_shard(opened: &Opened, steps: &[Step]) -> Result<Vec<Aligned>, Failed> {
    let busy = |s: &Step| s.convert_to.is_some() || !matches!(opened.checksum(s.tensor), Ok(None));
    if steps.len() < 2 || !steps.iter().any(busy) {
        return read_shard_here(opened, steps);
    }
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, Aligned)>(1);
        let check = move |rx: std::sync::mpsc::Receiver<(usize, Aligned)>| {
            let mut out = Vec::with_capacity(steps.len());
            for (k, buf) in rx {
                verify(opened, steps[k].tensor, &buf).map_err(|(f, r)| (k, f, r))?;
                out.push(converted(opened, &steps[k], buf));
            }
            Ok::<_, Failed>(out)
        };
        let Ok(checker) = crate::threads::spawn_scoped(s, "scopetree-burn-check", rx, check) else {
            return read_shard_here(opened, steps);
        };
        let mut unread = None;
        for (k, step) in steps.iter().enumerate() {
            match read_raw(opened, step.tensor) {
                // A closed channel: the checker stopped at a failure.
                Ok(buf) => {
                    if tx.send((k, buf)).is_err() {
                        break;
                    }
                }
                Err((f, r)) => {
                    unread = Some((k, f, r));
                    break;
                }
            }
        }
        drop(tx);
        let checked = checker
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        // The checker saw only tensors before a failed read: its failure
        // comes first.
        let out = checked?;
        unread.map_or(Ok(out), Err)
    })
}

/// [`read_shard`] on the caller's thread alone: each tensor read, checked
/// and converted in turn. O(bytes).
fn read_shard_here(opened: &Opened, steps: &[Step]) -> Result<Vec<Aligned>, Failed> {
    steps
        .iter()
        .enumerate()
        .map(|(k, step)| {
            let buf = read_checked(opened, step.tensor).map_err(|(f, r)| (k, f, r))?;
            Ok(converted(opened, step, buf))
        })
        .collect()
}

/// A tensor whose bytes are in hand, handed to burn once.
fn once(path: String, step: &Step, shape: Vec<usize>, id: Option<u64>, bytes: Bytes) -> PackTensor {
    let len = bytes.len();
    let cell = Mutex::new(Some(bytes));
    PackTensor::deferred(path, step.dtype, shape, id, len, move || {
        cell.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .ok_or_else(|| PackError::ValidationError("a loaded tensor was asked for twice".into()))
    })
}

impl CheckpointStore {
    /// The load behind `apply_to`. See the type's documentation.
    pub(crate) fn load_into<M: ModuleSnapshot>(
        &mut self,
        module: &mut M,
    ) -> Result<ApplyResult, Error> {
        let opened = open_checkpoint(&self.path)?;
        let shown = opened.shown.clone();
        let names = remap_all(
            &self.remapper,
            opened.tensors.iter().map(|(_, t)| t.key.as_str()),
            &shown,
        )?;
        let mut checker = Checker::new(
            &names,
            &opened.tensors,
            self.from_adapter.as_deref(),
            self.filter.as_ref(),
            self.skip_enum_variants,
            self.dtype_policy,
        );
        module.visit(&mut checker);
        let Checker {
            used,
            mut steps,
            mut missing,
            mut skipped,
            mut mismatched,
            ..
        } = checker;

        let accepted = |name: &str| self.filter.as_ref().is_none_or(|f| f.matches(name));
        let mut unused: Vec<String> = names
            .iter()
            .filter(|&(n, &i)| !used[i] && accepted(n))
            .map(|(n, _)| n.clone())
            .collect();
        unused.sort_unstable();
        let unassigned: Vec<(String, String)> = opened
            .unassigned
            .iter()
            .filter(|(k, _)| accepted(&remap_one(&self.remapper, k)))
            .cloned()
            .collect();
        missing.sort_unstable();
        skipped.sort_unstable();
        mismatched.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        let missing_bad = !self.allow_missing && !missing.is_empty();
        let unused_bad = !self.allow_unused && (!unused.is_empty() || !unassigned.is_empty());
        if missing_bad || unused_bad || !mismatched.is_empty() {
            return Err(Error::Mismatch {
                path: short::path(&shown),
                missing: if missing_bad {
                    missing.into_iter().map(|(p, _)| p).collect()
                } else {
                    Vec::new()
                },
                unused: if unused_bad { unused } else { Vec::new() },
                mismatched,
                unassigned: if unused_bad { unassigned } else { Vec::new() },
            });
        }
        unused.extend(unassigned.into_iter().map(|(k, _)| k));

        // The changes: shard by shard, in file order.
        steps.sort_unstable_by_key(|s| s.tensor);
        let old = self
            .rollback
            .then(|| module.collect(None, None, self.skip_enum_variants));
        let mut applied = Vec::with_capacity(steps.len());
        let mut changed = false;
        let mut at = 0;
        while at < steps.len() {
            let part = opened.tensors[steps[at].tensor].0;
            let end = at
                + steps[at..]
                    .iter()
                    .take_while(|s| opened.tensors[s.tensor].0 == part)
                    .count();
            let bufs = match read_shard(&opened, &steps[at..end]) {
                Ok(bufs) => bufs,
                Err((k, file, reason)) => {
                    let key = opened.tensors[steps[at + k].tensor].1.key.clone();
                    return Err(self.fail(module, old, changed, file, key, reason));
                }
            };
            let batch: Vec<PackTensor> = (steps[at..end].iter().zip(bufs))
                .map(|(step, buf)| self.prepare(&opened, step, buf))
                .collect();
            let adapter = self.from_adapter.as_ref().map(|a| a.clone_box());
            let result = module.apply(batch, None, adapter, self.skip_enum_variants);
            changed = changed || !result.applied.is_empty();
            if let Some(e) = result.errors.first() {
                let file = opened.parts[part].path.to_string_lossy().into_owned();
                let key = opened.tensors[steps[at].tensor].1.key.clone();
                return Err(self.fail(module, old, changed, file, key, cut(&e.to_string())));
            }
            applied.extend(result.applied);
            at = end;
        }
        Ok(ApplyResult {
            applied,
            skipped,
            missing,
            unused,
            errors: Vec::new(),
        })
    }

    /// The tensor of `step` for burn, its bytes `buf` read, checked and
    /// converted ([`read_shard`]).
    fn prepare(&self, opened: &Opened, step: &Step, buf: Aligned) -> PackTensor {
        let (part, t) = &opened.tensors[step.tensor];
        let id = if self.param_ids {
            opened.parts[*part]
                .metadata
                .as_ref()
                .and_then(|m| m.get(&format!("{PARAM_ID_PREFIX}{}", t.key)))
                .and_then(|v| v.parse::<u64>().ok())
        } else {
            None
        };
        once(
            step.path.clone(),
            step,
            t.shape.clone(),
            id,
            buf.into_bytes(),
        )
    }

    /// The error of a load that failed reading `key` of `file`: the module
    /// put back from `old` if it changed and the store keeps it.
    fn fail<M: ModuleSnapshot>(
        &self,
        module: &mut M,
        old: Option<Vec<PackTensor>>,
        changed: bool,
        file: String,
        key: String,
        reason: String,
    ) -> Error {
        let rolled_back = match (changed, old) {
            (false, _) => true,
            (true, Some(old)) => {
                let result = module.apply(old, None, None, self.skip_enum_variants);
                result.errors.is_empty()
            }
            (true, None) => false,
        };
        Error::Data {
            file: short::path(&file),
            key,
            reason,
            rolled_back,
        }
    }
}

#[cfg(all(test, feature = "burn-ndarray"))]
mod tests {
    use burn_core as burn;
    use burn_core::module::{Module, Param, ParamId};
    use burn_core::tensor::{Device, Tensor, TensorData};
    use burn_store::ModuleSnapshot;

    use crate::burn::{CheckpointStore, Error};

    #[derive(Module, Debug)]
    struct Three {
        a: Param<Tensor<1>>,
        b: Param<Tensor<1>>,
        c: Param<Tensor<1>>,
    }

    fn three(x: f32) -> Three {
        let d = Device::default();
        let p = |k: f32| {
            let v: Vec<f32> = (0..64).map(|i| x * (k + i as f32)).collect();
            Param::initialized(
                ParamId::new(),
                Tensor::from_data(TensorData::new(v, [64]), &d),
            )
        };
        Three {
            a: p(1.0),
            b: p(2.0),
            c: p(3.0),
        }
    }

    fn values(m: &Three) -> Vec<Vec<f32>> {
        [&m.a, &m.b, &m.c]
            .map(|p| p.val().into_data().try_to_vec::<f32>().unwrap())
            .to_vec()
    }

    /// Where each tensor's bytes start in the file, in file order.
    fn starts(bytes: &[u8]) -> Vec<(String, usize)> {
        let (n, meta) = safetensors::SafeTensors::read_metadata(bytes).unwrap();
        let mut at: Vec<_> = (meta.tensors().into_iter())
            .map(|(k, info)| (k, 8 + n + info.data_offsets.0))
            .collect();
        at.sort_by_key(|(_, a)| *a);
        at
    }

    #[test]
    fn a_load_refused_its_checking_thread_reads_and_checks_on_the_callers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("three.safetensors");
        three(1.0)
            .save_into(&mut CheckpointStore::from_file(&path))
            .unwrap();
        let load = |m: &mut Three| {
            crate::threads::refusing(|| m.load_from(&mut CheckpointStore::from_file(&path)))
        };
        let mut m = three(0.0);
        load(&mut m).unwrap();
        assert_eq!(values(&m), values(&three(1.0)));

        // Two bad tensors: the first in the file is named, nothing changes.
        let mut bytes = std::fs::read(&path).unwrap();
        let at = starts(&bytes);
        for (_, a) in &at[1..] {
            bytes[*a] ^= 0x40;
        }
        std::fs::write(&path, bytes).unwrap();
        let mut m = three(0.0);
        let err = load(&mut m).unwrap_err();
        let Error::Data { key, reason, .. } = &err else {
            panic!("{err}")
        };
        assert_eq!(key, &at[1].0, "{err}");
        assert!(reason.contains("xxh3"), "{err}");
        assert_eq!(values(&m), values(&three(0.0)));
    }

    /// A file that records the checksums of its other tensors but not of
    /// one (its entry's name changed after the save) is refused, naming
    /// that tensor, and nothing changes.
    #[test]
    fn a_tensor_whose_checksum_entry_is_gone_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("three.safetensors");
        three(1.0)
            .save_into(&mut CheckpointStore::from_file(&path))
            .unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let at = starts(&bytes);
        let (key, start) = at[1].clone();
        let entry = format!("scopetree_xxh3/{key}\"");
        let e = (bytes.windows(entry.len()))
            .position(|w| w == entry.as_bytes())
            .unwrap();
        bytes[e + 1] = b'C';
        bytes[start] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        let mut m = three(0.0);
        let err = m
            .load_from(&mut CheckpointStore::from_file(&path))
            .unwrap_err();
        let Error::Data {
            key: named, reason, ..
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!(named, &key, "{err}");
        assert!(reason.contains("checksums of its other tensors"), "{err}");
        assert_eq!(values(&m), values(&three(0.0)));
    }
}
