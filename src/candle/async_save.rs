//! [`AsyncSaver`]: saves of candle stores beside training. A save queues a
//! copy of every variable into one staging buffer (page-locked when a
//! variable lives on a CUDA device, kept from save to save) and returns; a
//! background thread waits for the copies and writes the sharded
//! checkpoints.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use candle_core::{Device, Var};

use super::error::Error;
use super::store::CandleStore;
use crate::checkpoint::{self, Checkpointable, Dtype, SaveOptions, SaveReport, Staged};

#[cfg(feature = "cuda")]
use super::cuda::{self, Pinned};

/// The staging buffer: plain host memory, or page-locked memory when a
/// variable lives on a CUDA device.
enum Arena {
    Host(Vec<u8>),
    #[cfg(feature = "cuda")]
    Pinned(Pinned),
}

impl Arena {
    fn len(&self) -> usize {
        match self {
            Self::Host(v) => v.len(),
            #[cfg(feature = "cuda")]
            Self::Pinned(p) => p.len(),
        }
    }

    /// The bytes, once every copy into them has ended.
    fn bytes(&mut self) -> Result<&[u8], Error> {
        match self {
            Self::Host(v) => Ok(v),
            #[cfg(feature = "cuda")]
            Self::Pinned(p) => p
                .bytes()
                .map_err(|e| failed(format!("waiting for a staged copy: {e}"))),
        }
    }

    /// Marks the end of the copies queued into the buffer: one event after
    /// the last of a save's copies.
    fn flush(&mut self) -> Result<(), Error> {
        match self {
            Self::Host(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Self::Pinned(p) => p
                .flush()
                .map_err(|e| failed(format!("queueing staged copies: {e}"))),
        }
    }

    /// The bytes, for the host to write, once every copy has ended.
    fn bytes_mut(&mut self) -> Result<&mut [u8], Error> {
        match self {
            Self::Host(v) => Ok(v),
            #[cfg(feature = "cuda")]
            Self::Pinned(p) => p
                .bytes_mut()
                .map_err(|e| failed(format!("waiting for a staged copy: {e}"))),
        }
    }
}

fn failed(reason: String) -> Error {
    Error::Checkpoint(checkpoint::Error::BadTensor { reason })
}

/// One tensor staged: its key, dtype, shape and byte range in the arena.
struct Slot {
    key: String,
    dtype: Dtype,
    shape: Vec<usize>,
    at: usize,
    len: usize,
}

/// What the background thread writes: each store's tensors into its
/// directory.
struct Job {
    dirs: Vec<(PathBuf, Vec<Slot>)>,
    opts: SaveOptions,
    /// Events around the copies from the first device, to time them.
    #[cfg(feature = "cuda")]
    timer: Option<cuda::Timer>,
}

/// The buffer handed back, the copies' time on the device, the outcome.
type Written = (Arena, Option<Duration>, Result<Vec<SaveReport>, Error>);

/// How a save went on the caller's side.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Staging {
    /// The bytes staged.
    pub bytes: u64,
    /// How long the call held the caller (queueing the copies, and
    /// copying the variables on the host).
    pub blocked: Duration,
    /// Whether the save ran beside training (`false`: the state exceeded
    /// the staging budget, or the system refused the writer's thread, and
    /// the save was written before the call returned).
    pub in_background: bool,
}

/// Saves of candle stores beside training, one at a time, with a staging
/// budget. [`save_sharded`](Self::save_sharded) queues a copy of every
/// variable of the stores into one staging buffer (page-locked when a
/// variable is on a CUDA device), on each device's stream, after the work
/// the caller queued there: the copy holds the values as of the call. It
/// returns then; a background thread waits for the copies and writes each
/// store as a sharded checkpoint. The next `save_sharded`, or
/// [`wait`](Self::wait), finishes it and reports its outcome.
///
/// The copies go on the device's own stream: it orders them after the step
/// that made the values and before the next step's writes, so the host
/// never waits for them and the snapshot is whole. (A side stream would let
/// the next step's reads run beside the copy, but candle gives no hook
/// before the optimizer's writes to wait for it.)
///
/// The staging buffer is kept from save to save and never exceeds the
/// budget: state larger than the budget is saved before the call returns,
/// through the stores' own streamed saves (two pieces of host memory per
/// tensor), and [`Staging::in_background`] says so. Megatron's users ran
/// out of host memory with staging that grows with the model; this one
/// does not.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// use candle_core::{DType, Device};
/// use scopetree::candle::{AsyncSaver, CandleStore};
/// use scopetree::checkpoint::{LoadOptions, SaveOptions};
/// let store = CandleStore::new();
/// candle_nn::linear(4, 4, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
/// let mut saver = AsyncSaver::new(64 << 20);
/// let staged = saver.save_sharded(&[(&store, dir.path().join("step-1"))], &SaveOptions::new())?;
/// assert!(staged.in_background);
/// // ... training goes on; the save holds its copy ...
/// let reports = saver.wait()?.expect("a save was under way");
/// assert_eq!(reports[0].keys, ["fc.bias", "fc.weight"]);
/// let back = CandleStore::new();
/// back.load(dir.path().join("step-1"), &LoadOptions::new().create(true))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AsyncSaver {
    budget: usize,
    arena: Option<Arena>,
    writer: Option<JoinHandle<Written>>,
    copy_time: Option<Duration>,
}

impl std::fmt::Debug for AsyncSaver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncSaver")
            .field("budget", &self.budget)
            .field("staging_bytes", &self.staging_bytes())
            .field("pending", &self.is_pending())
            .finish()
    }
}

impl AsyncSaver {
    /// A saver whose staging buffer never exceeds `budget` bytes. O(1);
    /// the buffer is made by the first save.
    ///
    /// ```
    /// let saver = scopetree::candle::AsyncSaver::new(256 << 20);
    /// assert_eq!(saver.staging_bytes(), 0);
    /// ```
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            arena: None,
            writer: None,
            copy_time: None,
        }
    }

    /// How long the device took to copy the last finished save's
    /// variables into staging (timed with events on its stream, around the
    /// copies only), if it staged any from a CUDA device. O(1).
    ///
    /// ```
    /// assert!(scopetree::candle::AsyncSaver::new(1 << 20).last_copy_time().is_none());
    /// ```
    pub fn last_copy_time(&self) -> Option<Duration> {
        self.copy_time
    }

    /// Whether a save is being written. O(1).
    ///
    /// ```
    /// assert!(!scopetree::candle::AsyncSaver::new(1 << 20).is_pending());
    /// ```
    pub fn is_pending(&self) -> bool {
        self.writer.is_some()
    }

    /// The bytes of the staging buffer kept between saves (not counting
    /// one a save in progress holds). O(1).
    ///
    /// ```
    /// assert_eq!(scopetree::candle::AsyncSaver::new(1 << 20).staging_bytes(), 0);
    /// ```
    pub fn staging_bytes(&self) -> usize {
        self.arena.as_ref().map_or(0, Arena::len)
    }

    /// Saves each `(store, dir)` of `stores` as a sharded checkpoint into
    /// its directory ([`CandleStore::save_sharded`]'s layout, with `opts`),
    /// beside training: finishes the save in progress first, stages every
    /// variable, and returns while a background thread writes. O(variables
    /// + bytes staged) for the caller.
    ///
    /// # Errors
    /// The save in progress's error, if it failed (nothing new is started
    /// then); [`Error::Checkpoint`] or [`Error::Candle`] when a variable
    /// cannot be staged (nothing is written then); as
    /// [`CandleStore::save_sharded`] for a save over the budget; the
    /// write's own error for a save written in the call because the system
    /// refused the writer's thread.
    pub fn save_sharded(
        &mut self,
        stores: &[(&CandleStore, PathBuf)],
        opts: &SaveOptions,
    ) -> Result<Staging, Error> {
        self.wait()?;
        let t0 = Instant::now();
        // Every variable, and where it goes in the buffer.
        let mut listed: Vec<(PathBuf, Vec<(String, Var)>)> = Vec::with_capacity(stores.len());
        let mut total = 0_usize;
        let mut device: Option<Device> = None;
        for (store, dir) in stores {
            let vars = store.named_vars()?;
            for (_, v) in &vars {
                total = total.next_multiple_of(8)
                    + v.elem_count() * v.as_tensor().dtype().size_in_bytes();
                if device.is_none() && v.device().is_cuda() {
                    device = Some(v.device().clone());
                }
            }
            listed.push((dir.clone(), vars));
        }
        if total > self.budget {
            for (store, dir) in stores {
                store.save_sharded(dir, opts)?;
            }
            return Ok(Staging {
                bytes: total as u64,
                blocked: t0.elapsed(),
                in_background: false,
            });
        }
        let mut arena = self.arena_for(device.as_ref(), total)?;
        let mut dirs = Vec::with_capacity(listed.len());
        let mut at = 0_usize;
        #[cfg(feature = "cuda")]
        let timer = match &device {
            Some(Device::Cuda(c)) => cuda::Timer::start(&c.cuda_stream()).ok(),
            _ => None,
        };
        let staged = (|| -> Result<(), Error> {
            for (dir, vars) in listed {
                let mut slots = Vec::with_capacity(vars.len());
                for (key, v) in vars {
                    at = at.next_multiple_of(8);
                    let len = v.elem_count() * v.as_tensor().dtype().size_in_bytes();
                    stage(&mut arena, &key, &v, at)?;
                    slots.push(Slot {
                        key,
                        dtype: Checkpointable::dtype(&v),
                        shape: v.dims().to_vec(),
                        at,
                        len,
                    });
                    at += len;
                }
                dirs.push((dir, slots));
            }
            arena.flush()
        })();
        if let Err(e) = staged {
            // Copies may still be queued into the buffer: it waits for them
            // before it is used again.
            self.arena = Some(arena);
            return Err(e);
        }
        #[cfg(feature = "cuda")]
        let timer = timer.and_then(|t| match &device {
            Some(Device::Cuda(c)) => t.stop(&c.cuda_stream()).ok(),
            _ => None,
        });
        let job = Job {
            dirs,
            opts: opts.clone(),
            #[cfg(feature = "cuda")]
            timer,
        };
        let in_background =
            match crate::threads::spawn("scopetree-save", (arena, job), |(a, j)| write(a, j)) {
                Ok(h) => {
                    self.writer = Some(h);
                    true
                }
                // The system refused the writer's thread: the save is written
                // here, before the call returns.
                Err((arena, job)) => {
                    let (arena, copy_time, done) = write(arena, job);
                    self.arena = Some(arena);
                    self.copy_time = copy_time;
                    done?;
                    false
                }
            };
        Ok(Staging {
            bytes: total as u64,
            blocked: t0.elapsed(),
            in_background,
        })
    }

    /// Finishes the save in progress: waits for its writer and returns the
    /// reports of its stores, in order (`None` when no save was under way).
    /// O(the rest of the writes).
    ///
    /// # Errors
    /// The save's error: a failed copy from a device, or a failed write
    /// (the checkpoint directory then holds no new index).
    ///
    /// ```
    /// assert!(scopetree::candle::AsyncSaver::new(1 << 20).wait()?.is_none());
    /// # Ok::<(), scopetree::candle::Error>(())
    /// ```
    pub fn wait(&mut self) -> Result<Option<Vec<SaveReport>>, Error> {
        let Some(h) = self.writer.take() else {
            return Ok(None);
        };
        let (arena, copy_time, done) = h
            .join()
            .map_err(|_| failed("the background writer of a save panicked".to_owned()))?;
        self.arena = Some(arena);
        self.copy_time = copy_time;
        done.map(Some)
    }

    /// A staging buffer of at least `len` bytes of the kind `device` needs:
    /// the kept one when it fits, else a new one (of the budget, so that
    /// a growing state does not make one per save).
    fn arena_for(&mut self, device: Option<&Device>, len: usize) -> Result<Arena, Error> {
        let want_pinned = device.is_some();
        let kept = self.arena.take();
        let fits = kept.as_ref().is_some_and(|a| {
            a.len() >= len
                && match a {
                    Arena::Host(_) => !want_pinned,
                    #[cfg(feature = "cuda")]
                    Arena::Pinned(_) => want_pinned,
                }
        });
        if fits {
            return kept.ok_or_else(|| failed("a kept buffer vanished".to_owned()));
        }
        drop(kept);
        // A quarter more than the state, in whole MiB, so that a state that
        // grows a little does not page-lock a new buffer at every save.
        let size = (len + len / 4)
            .next_multiple_of(1 << 20)
            .min(self.budget)
            .max(len);
        #[cfg(feature = "cuda")]
        if let Some(Device::Cuda(c)) = device {
            let ctx = c.cuda_stream().context().clone();
            return Pinned::new(&ctx, size)
                .map(Arena::Pinned)
                .map_err(|e| failed(format!("page-locking {size} bytes of save staging: {e}")));
        }
        let _ = device;
        Ok(Arena::Host(vec![0; size]))
    }
}

/// Copies `v`'s bytes into the arena at `at`: queued on the device's
/// stream for a CUDA tensor, at once for a host one.
fn stage(arena: &mut Arena, key: &str, v: &Var, at: usize) -> Result<(), Error> {
    let candle = |source: candle_core::Error| Error::Candle {
        name: key.to_owned(),
        source,
    };
    let t = if v.is_contiguous() {
        v.as_tensor().clone()
    } else {
        v.as_tensor().contiguous().map_err(candle)?
    };
    #[cfg(feature = "cuda")]
    if let (Arena::Pinned(p), Device::Cuda(_)) = (&mut *arena, t.device()) {
        let (storage, layout) = t.storage_and_layout();
        let candle_core::Storage::Cuda(s) = &*storage else {
            return Err(failed(format!("{key}: a CUDA tensor without CUDA storage")));
        };
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| failed(format!("{key}: a contiguous tensor without offsets")))?;
        return cuda::read_range(s, start, end - start, p, at).map_err(candle);
    }
    let bytes = arena.bytes_mut()?;
    let mut k = at;
    super::var::write_var(&t, 8 << 20, &mut |piece| {
        bytes[k..k + piece.len()].copy_from_slice(piece);
        k += piece.len();
        Ok(())
    })
    .map_err(Error::Checkpoint)
}

/// The background writer: waits for the copies, writes every store's
/// checkpoint, hands the buffer back.
fn write(mut arena: Arena, job: Job) -> Written {
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    let mut copy_time = None;
    let result = (|| {
        let bytes = arena.bytes()?;
        #[cfg(feature = "cuda")]
        {
            copy_time = job.timer.as_ref().and_then(|t| t.elapsed().ok());
        }
        let mut reports = Vec::with_capacity(job.dirs.len());
        for (dir, slots) in &job.dirs {
            let staged: Vec<Staged<'_>> = slots
                .iter()
                .map(|s| Staged {
                    key: &s.key,
                    dtype: s.dtype,
                    shape: &s.shape,
                    bytes: &bytes[s.at..s.at + s.len],
                })
                .collect();
            reports.push(save_dir(&staged, dir, &job.opts)?);
        }
        Ok(reports)
    })();
    (arena, copy_time, result)
}

fn save_dir(staged: &[Staged<'_>], dir: &Path, opts: &SaveOptions) -> Result<SaveReport, Error> {
    let opts = opts.clone().separator(checkpoint::Separator::Dot);
    Ok(checkpoint::save_staged_sharded(staged, dir, &opts)?)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::AsyncSaver;
    use crate::candle::CandleStore;
    use crate::checkpoint::{LoadOptions, SaveOptions};

    fn values(store: &CandleStore) -> Vec<(String, Vec<f32>)> {
        let vars = store.named_vars().unwrap();
        vars.into_iter()
            .map(|(k, v)| (k, v.as_tensor().flatten_all().unwrap().to_vec1().unwrap()))
            .collect()
    }

    #[test]
    fn a_save_refused_its_writers_thread_is_written_in_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let store = CandleStore::new();
        let vb = store.var_builder(DType::F32, &Device::Cpu);
        candle_nn::linear(4, 3, vb.pp("fc")).unwrap();
        let mut saver = AsyncSaver::new(64 << 20);
        let save = |saver: &mut AsyncSaver, to: &str| {
            let stores = [(&store, dir.path().join(to))];
            crate::threads::refusing(|| saver.save_sharded(&stores, &SaveOptions::new()))
        };

        let staged = save(&mut saver, "one").unwrap();
        assert!(!staged.in_background);
        assert!(!saver.is_pending());
        assert!(saver.wait().unwrap().is_none());
        assert!(
            saver.staging_bytes() > 0,
            "the buffer is kept for the next save"
        );
        let back = CandleStore::new();
        back.load(dir.path().join("one"), &LoadOptions::new().create(true))
            .unwrap();
        assert_eq!(values(&back), values(&store));

        // A write that fails in the call is the call's error.
        std::fs::write(dir.path().join("file"), b"not a directory").unwrap();
        assert!(save(&mut saver, "file").is_err());
        assert!(!saver.is_pending());
        assert!(!save(&mut saver, "two").unwrap().in_background);
        assert!(dir.path().join("two/model.safetensors.index.json").exists());
    }
}
