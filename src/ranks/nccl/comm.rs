//! [`Nccl`]: NCCL's collectives over CUDA tensors (feature `nccl`), with
//! the communicator started through any [`Collective`] (MPI under
//! `mpirun`): rank 0 makes NCCL's id and broadcasts it. Every call is
//! queued on the device's candle stream and waited for by polling an
//! event, so that a call still waiting when the timeout passes aborts the
//! communicator and ends the process, as PyTorch's NCCL watchdog does.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaDType;
use candle_core::{CpuStorage, CudaStorage, DType, Device, InplaceOp1, Layout, Storage, Tensor};
use cudarc::driver::{CudaStream, DeviceRepr};
use cudarc::nccl::safe::{Comm, Id, NcclType, ReduceOp};

use crate::ranks::error::Error;
use crate::ranks::plan::agree::settle;
use crate::ranks::transport::collective::{Collective, DIGEST_BYTES, check_root};
use crate::ranks::transport::watchdog::{DEFAULT_TIMEOUT, STALL_EXIT_CODE, Watch};

/// The bytes of NCCL's unique id.
const ID_BYTES: usize = 128;

/// NCCL's collectives over CUDA tensors, on one GPU per rank: sum
/// all-reduce, broadcast, sum reduce-scatter and all-gather, each on the
/// device's candle stream. Built once per process by
/// [`new`](Self::new), a collective call over any [`Collective`] (MPI's
/// communicator under `mpirun`, or [`SingleProcess`](crate::ranks::SingleProcess)
/// for a world of one), so that jobs start as they do over MPI.
/// [`CandlePlan`](crate::ranks::CandlePlan) uses it for its gradients
/// ([`all_reduce_nccl`](crate::ranks::CandlePlan::all_reduce_nccl)) and
/// values ([`broadcast_nccl`](crate::ranks::CandlePlan::broadcast_nccl)).
///
/// NCCL needs one GPU per rank: two ranks on one GPU fail at init
/// ("Duplicate GPU detected"). Only a world of one has been run (on one
/// H100 or H200); see `docs/ranks/gpu.md`.
///
/// **Watchdog.** Each call waits for its work on the stream, polling an
/// event. A call still waiting when the [timeout](Self::with_timeout)
/// (10 minutes by default, NCCL's and [`Watch`]'s) has passed prints which
/// call waited and how long, aborts the communicator (`ncclCommAbort`, so
/// that the kernels waiting on a dead or stalled peer end) and exits with
/// [`STALL_EXIT_CODE`], so that `mpirun` ends the job.
///
/// The communicator-level calls here do not agree first: a call that one
/// rank makes and another does not, or with other lengths, waits until the
/// watchdog ends the job. The plan's calls agree on their arguments over
/// the bootstrap [`Collective`] before anything moves.
///
/// ```no_run
/// use candle_core::{Device, Tensor};
/// use scopetree::ranks::{Nccl, SingleProcess};
/// let device = Device::new_cuda(0)?;
/// let nccl = Nccl::new(&SingleProcess, &device)?; // `universe.world()` under MPI
/// let g = Tensor::new(&[1.0_f32, 2.0], &device)?;
/// assert_eq!(nccl.all_reduce_sum(&g)?.to_vec1::<f32>()?, [1.0, 2.0]); // a world of one
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Nccl {
    /// `None` once the watchdog aborted it (the process then exits).
    comm: RefCell<Option<Comm>>,
    device: Device,
    stream: Arc<CudaStream>,
    rank: usize,
    size: usize,
    timeout: Option<Duration>,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device.location())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// One NCCL call, run by candle on the output tensor's storage.
#[derive(Clone, Copy)]
enum Call<'a> {
    /// Sums the output over the ranks, in place.
    AllReduceSum,
    /// Copies the root's output to every rank's, in place.
    Broadcast(usize),
    /// Sums the source over the ranks and gives rank `r` block `r`.
    ReduceScatterSum(&'a Tensor),
    /// Concatenates every rank's source, in rank order.
    AllGather(&'a Tensor),
}

impl Call<'_> {
    fn name(self) -> &'static str {
        match self {
            Call::AllReduceSum => "NCCL all-reduce",
            Call::Broadcast(_) => "NCCL broadcast",
            Call::ReduceScatterSum(_) => "NCCL reduce-scatter",
            Call::AllGather(_) => "NCCL all-gather",
        }
    }
}

/// A [`Call`] on a communicator, as a candle in-place op.
struct Queue<'a> {
    call: Call<'a>,
    comm: &'a Comm,
}

impl InplaceOp1 for Queue<'_> {
    fn name(&self) -> &'static str {
        self.call.name()
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        Err(candle_core::Error::Msg(format!(
            "{} runs on CUDA tensors only",
            self.call.name()
        )))
    }

    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
        match storage.dtype() {
            DType::F32 => self.run::<f32>(storage, layout),
            DType::F64 => self.run::<f64>(storage, layout),
            DType::BF16 => self.run::<half::bf16>(storage, layout),
            DType::F16 => self.run::<half::f16>(storage, layout),
            DType::U8 => self.run::<u8>(storage, layout),
            DType::U32 => self.run::<u32>(storage, layout),
            DType::I64 => self.run::<i64>(storage, layout),
            d => Err(candle_core::Error::Msg(format!(
                "{} moves F32, F64, BF16, F16, U8, U32 and I64 tensors, not {d:?}",
                self.call.name()
            ))),
        }
    }
}

/// The element range of a contiguous layout.
fn span(layout: &Layout) -> candle_core::Result<std::ops::Range<usize>> {
    layout
        .contiguous_offsets()
        .map(|(a, b)| a..b)
        .ok_or_else(|| candle_core::Error::Msg("NCCL moves contiguous tensors only".into()))
}

impl Queue<'_> {
    fn run<T: CudaDType + NcclType + DeviceRepr>(
        &self,
        storage: &mut CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<()> {
        let out = span(layout)?;
        let dst = storage.as_cuda_slice_mut::<T>()?;
        let mut dst = dst.slice_mut(out);
        let nccl = |e: cudarc::nccl::result::NcclError| {
            candle_core::Error::Msg(format!("{}: {e:?}", self.call.name()))
        };
        let with_source = |src: &Tensor,
                           f: &mut dyn FnMut(
            &cudarc::driver::CudaView<'_, T>,
        ) -> candle_core::Result<()>| {
            let (guard, l) = src.storage_and_layout();
            let Storage::Cuda(s) = &*guard else {
                return Err(candle_core::Error::Msg(format!(
                    "{}: the source is not a CUDA tensor",
                    self.call.name()
                )));
            };
            let view = s.as_cuda_slice::<T>()?.slice(span(l)?);
            f(&view)
        };
        match self.call {
            Call::AllReduceSum => self
                .comm
                .all_reduce_in_place(&mut dst, &ReduceOp::Sum)
                .map(drop)
                .map_err(nccl),
            Call::Broadcast(root) => {
                let root = i32::try_from(root).map_err(|_| nccl_count(self.call))?;
                self.comm
                    .broadcast_in_place(&mut dst, root)
                    .map(drop)
                    .map_err(nccl)
            }
            Call::ReduceScatterSum(src) => with_source(src, &mut |send| {
                self.comm
                    .reduce_scatter(send, &mut dst, &ReduceOp::Sum)
                    .map(drop)
                    .map_err(nccl)
            }),
            Call::AllGather(src) => with_source(src, &mut |send| {
                self.comm.all_gather(send, &mut dst).map(drop).map_err(nccl)
            }),
        }
    }
}

fn nccl_count(call: Call<'_>) -> candle_core::Error {
    candle_core::Error::Msg(format!("{}: a rank past i32", call.name()))
}

/// How a wait for the stream ended.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::ranks) enum Waited {
    /// The work is done.
    Done,
    /// The timeout passed first, after this long.
    Stalled(Duration),
}

/// Polls `done` until it says so, or until `timeout` (if any) has passed
/// since the first poll: yields the thread for the first millisecond, then
/// sleeps 50 µs between polls. O(time waited).
pub(in crate::ranks) fn poll<E>(
    mut done: impl FnMut() -> Result<bool, E>,
    timeout: Option<Duration>,
) -> Result<Waited, E> {
    let since = Instant::now();
    loop {
        if done()? {
            return Ok(Waited::Done);
        }
        let waited = since.elapsed();
        if timeout.is_some_and(|t| waited >= t) {
            return Ok(Waited::Stalled(waited));
        }
        if waited < Duration::from_millis(1) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// The line the watchdog prints before it aborts the communicator.
pub(in crate::ranks) fn stall_message(
    rank: usize,
    op: &str,
    waited: Duration,
    timeout: Duration,
) -> String {
    format!(
        "scopetree watchdog: rank {rank} waited {:.1} s in {op} on the GPU; timeout {} s passed: \
         aborting the NCCL communicator and exiting with status {STALL_EXIT_CODE} \
         (a rank stalled, died or skipped this call)\n",
        waited.as_secs_f64(),
        timeout.as_secs_f64()
    )
}

/// A failure of NCCL or the CUDA driver in the call `op`.
fn failed(op: &'static str, reason: impl std::fmt::Debug) -> Error {
    Error::Nccl {
        op,
        reason: format!("{reason:?}"),
    }
}

impl Nccl {
    /// Starts NCCL on `device` (a CUDA device, one per rank) for the ranks
    /// of `bootstrap`: rank 0 makes NCCL's unique id, broadcasts it over
    /// `bootstrap`, and every rank joins the communicator with its rank and
    /// the world's size. A collective call over `bootstrap`; the NCCL init
    /// is watched by [`Watch`] with the default timeout. O(ranks) for the
    /// agreement, plus NCCL's init.
    ///
    /// # Errors
    /// On every rank: [`Error::Nccl`] on the rank where `device` is not a
    /// CUDA device, or NCCL cannot make the id or start the communicator
    /// (no libnccl, two ranks on one GPU), and [`Error::PeerFailed`] on the
    /// others. Errors of `bootstrap`'s transport as its calls give them.
    ///
    /// ```no_run
    /// use candle_core::Device;
    /// use scopetree::ranks::{Nccl, SingleProcess};
    /// let nccl = Nccl::new(&SingleProcess, &Device::new_cuda(0)?)?;
    /// assert_eq!((nccl.rank(), nccl.size()), (0, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new<C: Collective + ?Sized>(bootstrap: &C, device: &Device) -> Result<Self, Error> {
        let (rank, size) = (bootstrap.rank(), bootstrap.size());
        let mut gathered = vec![[0_u8; DIGEST_BYTES]; size];
        let stream = match device {
            Device::Cuda(d) => Ok(d.cuda_stream()),
            other => Err(Error::Nccl {
                op: "NCCL init",
                reason: format!(
                    "{:?} is not a CUDA device; pass Device::new_cuda(gpu)",
                    other.location()
                ),
            }),
        };
        let mut id = [0_u8; ID_BYTES];
        let local = stream.and_then(|s| {
            if rank == 0 {
                let made = Id::new().map_err(|e| failed("NCCL init (ncclGetUniqueId)", e))?;
                for (b, c) in id.iter_mut().zip(made.internal()) {
                    *b = c.to_ne_bytes()[0];
                }
            }
            Ok(s)
        });
        let stream = settle(bootstrap, &mut gathered, "NCCL init", local, None)?;
        bootstrap.broadcast_bytes(0, &mut id)?;
        let internal = id.map(|b| std::ffi::c_char::from_ne_bytes([b]));
        let watched: Arc<str> = "NCCL's communicator".into();
        let comm = {
            let _watch = Watch::arm(rank, "NCCL init", &watched, Some(DEFAULT_TIMEOUT));
            // NCCL starts on the thread's current device: the stream's.
            (stream.context().bind_to_thread())
                .map_err(|e| failed("NCCL init (binding the device)", e))
                .and_then(|()| {
                    Comm::from_rank(Arc::clone(&stream), rank, size, Id::uninit(internal))
                        .map_err(|e| failed("NCCL init (ncclCommInitRank)", e))
                })
        };
        let comm = settle(bootstrap, &mut gathered, "NCCL init", comm, None)?;
        Ok(Self {
            comm: RefCell::new(Some(comm)),
            device: device.clone(),
            stream,
            rank,
            size,
            timeout: Some(DEFAULT_TIMEOUT),
        })
    }

    /// Sets how long a call may wait for its work before the watchdog
    /// aborts the communicator and ends the process (`None`: never).
    /// O(1).
    ///
    /// # Errors
    /// [`Error::BadOption`] for a zero timeout.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use candle_core::Device;
    /// use scopetree::ranks::{Nccl, SingleProcess};
    /// let nccl = Nccl::new(&SingleProcess, &Device::new_cuda(0)?)?.with_timeout(Some(Duration::from_secs(60)))?;
    /// assert_eq!(nccl.timeout(), Some(Duration::from_secs(60)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Result<Self, Error> {
        if timeout == Some(Duration::ZERO) {
            return Err(Error::BadOption {
                reason: "an NCCL timeout of 0 s; pass a positive duration, or None to wait forever"
                    .into(),
            });
        }
        self.timeout = timeout;
        Ok(self)
    }

    /// The watchdog's timeout. O(1).
    ///
    /// ```no_run
    /// use candle_core::Device;
    /// use scopetree::ranks::{Nccl, SingleProcess, DEFAULT_TIMEOUT};
    /// let nccl = Nccl::new(&SingleProcess, &Device::new_cuda(0)?)?;
    /// assert_eq!(nccl.timeout(), Some(DEFAULT_TIMEOUT));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// This process's rank. O(1).
    ///
    /// ```no_run
    /// use candle_core::Device;
    /// use scopetree::ranks::{Nccl, SingleProcess};
    /// assert_eq!(Nccl::new(&SingleProcess, &Device::new_cuda(0)?)?.rank(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks. O(1).
    ///
    /// ```no_run
    /// use candle_core::Device;
    /// use scopetree::ranks::{Nccl, SingleProcess};
    /// assert_eq!(Nccl::new(&SingleProcess, &Device::new_cuda(0)?)?.size(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn size(&self) -> usize {
        self.size
    }

    /// The CUDA device of this rank's communicator. O(1).
    ///
    /// ```no_run
    /// use candle_core::Device;
    /// use scopetree::ranks::{Nccl, SingleProcess};
    /// let nccl = Nccl::new(&SingleProcess, &Device::new_cuda(0)?)?;
    /// assert!(nccl.device().is_cuda());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The sum of `t` over the ranks, in a new tensor of `t`'s shape on
    /// every rank. Waits for the result. O(elements) on the device, plus
    /// NCCL's transfer.
    ///
    /// # Errors
    /// [`Error::Nccl`] when `t` is not on this communicator's device, or
    /// of a dtype NCCL does not move, or NCCL fails.
    ///
    /// ```no_run
    /// use candle_core::{Device, Tensor};
    /// use scopetree::ranks::{Nccl, SingleProcess};
    /// let device = Device::new_cuda(0)?;
    /// let nccl = Nccl::new(&SingleProcess, &device)?;
    /// let g = Tensor::new(&[[1.5_f32, 2.0]], &device)?;
    /// assert_eq!(nccl.all_reduce_sum(&g)?.to_vec2::<f32>()?, [[1.5, 2.0]]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor, Error> {
        let out = self.fresh(t, "NCCL all-reduce")?;
        self.queue(Call::AllReduceSum, &out)?;
        self.wait("NCCL all-reduce")?;
        Ok(out)
    }

    /// Rank `root`'s `t` on every rank, in a new tensor (the other ranks'
    /// `t` gives only the shape and dtype, which must be the root's).
    /// Waits for the result. O(elements), plus NCCL's transfer.
    ///
    /// # Errors
    /// [`Error::BadRank`] for a root outside the world; as
    /// [`all_reduce_sum`](Self::all_reduce_sum) otherwise.
    ///
    /// ```no_run
    /// use candle_core::{Device, Tensor};
    /// use scopetree::ranks::{Nccl, SingleProcess};
    /// let device = Device::new_cuda(0)?;
    /// let nccl = Nccl::new(&SingleProcess, &device)?;
    /// let w = Tensor::new(&[7_u32, 8], &device)?;
    /// assert_eq!(nccl.broadcast(0, &w)?.to_vec1::<u32>()?, [7, 8]);
    /// assert!(nccl.broadcast(1, &w).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn broadcast(&self, root: usize, t: &Tensor) -> Result<Tensor, Error> {
        check_root(root, self.size)?;
        let out = self.fresh(t, "NCCL broadcast")?;
        self.queue(Call::Broadcast(root), &out)?;
        self.wait("NCCL broadcast")?;
        Ok(out)
    }

    /// The sum of `t` over the ranks, cut into `size()` equal blocks of its
    /// elements (in row-major order), rank `r` receiving block `r` as a
    /// 1-D tensor: the first half of a ZeRO exchange. O(elements), plus
    /// NCCL's transfer.
    ///
    /// # Errors
    /// [`Error::BadBuffers`] when `t`'s elements do not divide by the
    /// ranks; as [`all_reduce_sum`](Self::all_reduce_sum) otherwise.
    ///
    /// ```no_run
    /// use candle_core::{Device, Tensor};
    /// use scopetree::ranks::{Nccl, SingleProcess};
    /// let device = Device::new_cuda(0)?;
    /// let nccl = Nccl::new(&SingleProcess, &device)?;
    /// let g = Tensor::new(&[[1.0_f64, 2.0], [3.0, 4.0]], &device)?;
    /// assert_eq!(nccl.reduce_scatter_sum(&g)?.to_vec1::<f64>()?, [1.0, 2.0, 3.0, 4.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce_scatter_sum(&self, t: &Tensor) -> Result<Tensor, Error> {
        const OP: &str = "NCCL reduce-scatter";
        let n = t.elem_count();
        if n % self.size != 0 {
            return Err(Error::BadBuffers {
                op: OP,
                reason: format!(
                    "{n} elements do not cut into {} equal blocks; pad the tensor",
                    self.size
                ),
            });
        }
        let src = self.source(t, OP)?;
        let out = self.zeros(n / self.size, t.dtype(), OP)?;
        self.queue(Call::ReduceScatterSum(&src), &out)?;
        self.wait(OP)?;
        Ok(out)
    }

    /// Every rank's `t` (all of one shape and dtype), concatenated in rank
    /// order into a 1-D tensor of `size()` × its elements: the second half
    /// of a ZeRO exchange. O(elements × ranks), plus NCCL's transfer.
    ///
    /// # Errors
    /// As [`all_reduce_sum`](Self::all_reduce_sum).
    ///
    /// ```no_run
    /// use candle_core::{Device, Tensor};
    /// use scopetree::ranks::{Nccl, SingleProcess};
    /// let device = Device::new_cuda(0)?;
    /// let nccl = Nccl::new(&SingleProcess, &device)?;
    /// let piece = Tensor::new(&[5.0_f32, 6.0], &device)?;
    /// assert_eq!(nccl.all_gather(&piece)?.to_vec1::<f32>()?, [5.0, 6.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_gather(&self, t: &Tensor) -> Result<Tensor, Error> {
        const OP: &str = "NCCL all-gather";
        let src = self.source(t, OP)?;
        let out = self.zeros(t.elem_count() * self.size, t.dtype(), OP)?;
        self.queue(Call::AllGather(&src), &out)?;
        self.wait(OP)?;
        Ok(out)
    }

    /// Checks that `t` is on this communicator's device.
    fn on_device(&self, t: &Tensor, op: &'static str) -> Result<(), Error> {
        if t.device().same_device(&self.device) {
            Ok(())
        } else {
            Err(Error::Nccl {
                op,
                reason: format!(
                    "the tensor is on {:?}, the communicator on {:?}; move the tensor to the \
                     communicator's device",
                    t.device().location(),
                    self.device.location()
                ),
            })
        }
    }

    /// `t` as a contiguous tensor on this device (itself when it is one).
    fn source(&self, t: &Tensor, op: &'static str) -> Result<Tensor, Error> {
        self.on_device(t, op)?;
        t.contiguous().map_err(|e| failed(op, e))
    }

    /// A contiguous copy of `t` in a storage of its own (of `t`'s
    /// elements only), detached from candle's graph, for an in-place call.
    fn fresh(&self, t: &Tensor, op: &'static str) -> Result<Tensor, Error> {
        self.on_device(t, op)?;
        t.force_contiguous()
            .map(|c| c.detach())
            .map_err(|e| failed(op, e))
    }

    /// `n` zeros of `dtype` on this device.
    fn zeros(&self, n: usize, dtype: DType, op: &'static str) -> Result<Tensor, Error> {
        Tensor::zeros(n, dtype, &self.device).map_err(|e| failed(op, e))
    }

    fn queue(&self, call: Call<'_>, out: &Tensor) -> Result<(), Error> {
        (self.stream.context().bind_to_thread()).map_err(|e| failed(call.name(), e))?;
        let comm = self.comm.borrow();
        let comm = comm
            .as_ref()
            .ok_or_else(|| failed(call.name(), "the communicator was aborted"))?;
        out.inplace_op1(&Queue { call, comm })
            .map_err(|e| failed(call.name(), e))
    }

    /// Waits for the work queued on the stream; a wait past the timeout
    /// aborts the communicator and exits the process (see [`Nccl`]).
    /// O(time waited).
    fn wait(&self, op: &'static str) -> Result<(), Error> {
        let event = self.stream.record_event(None).map_err(|e| failed(op, e))?;
        match poll(|| event.try_is_complete(), self.timeout).map_err(|e| failed(op, e))? {
            Waited::Done => Ok(()),
            Waited::Stalled(waited) => {
                let line = stall_message(self.rank, op, waited, self.timeout.unwrap_or_default());
                // One write, so that ranks' lines do not interleave.
                let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
                // cudarc's `Comm` aborts its communicator when dropped.
                drop(self.comm.borrow_mut().take());
                std::process::exit(STALL_EXIT_CODE);
            }
        }
    }
}

/// What `CandlePlan`'s calls over NCCL need of a device communicator:
/// [`Nccl`], or a stand-in on the CPU in the unit tests, so that the plan's
/// buckets, views and means are tested without a GPU.
pub(in crate::ranks) trait DeviceCollective {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// The device the calls work on.
    fn device(&self) -> &Device;
    /// A contiguous copy of `t` in a storage of its own.
    fn fresh(&self, t: &Tensor, op: &'static str) -> Result<Tensor, Error>;
    /// Queues an in-place sum of `out` over the ranks.
    fn queue_all_reduce(&self, out: &Tensor) -> Result<(), Error>;
    /// Queues an in-place broadcast of `out` from `root`.
    fn queue_broadcast(&self, root: usize, out: &Tensor) -> Result<(), Error>;
    /// Queues the sum of `src` over the ranks, block `rank` of it (of
    /// `out`'s length) into `out`.
    fn queue_reduce_scatter(&self, src: &Tensor, out: &Tensor) -> Result<(), Error>;
    /// Queues every rank's `src` into `out`, in rank order.
    fn queue_all_gather(&self, src: &Tensor, out: &Tensor) -> Result<(), Error>;
    /// Waits for the queued calls.
    fn wait(&self, op: &'static str) -> Result<(), Error>;
}

impl DeviceCollective for Nccl {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn fresh(&self, t: &Tensor, op: &'static str) -> Result<Tensor, Error> {
        Nccl::fresh(self, t, op)
    }

    fn queue_all_reduce(&self, out: &Tensor) -> Result<(), Error> {
        self.queue(Call::AllReduceSum, out)
    }

    fn queue_broadcast(&self, root: usize, out: &Tensor) -> Result<(), Error> {
        check_root(root, self.size)?;
        self.queue(Call::Broadcast(root), out)
    }

    fn queue_reduce_scatter(&self, src: &Tensor, out: &Tensor) -> Result<(), Error> {
        self.queue(Call::ReduceScatterSum(src), out)
    }

    fn queue_all_gather(&self, src: &Tensor, out: &Tensor) -> Result<(), Error> {
        self.queue(Call::AllGather(src), out)
    }

    fn wait(&self, op: &'static str) -> Result<(), Error> {
        Nccl::wait(self, op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_returns_when_done_and_stalls_past_the_timeout() {
        let mut n = 0;
        let got = poll::<()>(
            || {
                n += 1;
                Ok(n == 5)
            },
            Some(Duration::from_secs(60)),
        );
        assert_eq!((got, n), (Ok(Waited::Done), 5));
        let t = Duration::from_millis(20);
        let Ok(Waited::Stalled(waited)) = poll::<()>(|| Ok(false), Some(t)) else {
            panic!("a wait that never ends must stall");
        };
        assert!(waited >= t && waited < Duration::from_secs(5), "{waited:?}");
        assert_eq!(poll(|| Err::<bool, _>("driver"), None), Err("driver"));
    }

    #[test]
    fn the_stall_line_names_the_rank_call_and_times() {
        assert_eq!(
            stall_message(
                1,
                "NCCL all-reduce",
                Duration::from_millis(5049),
                Duration::from_secs(5)
            ),
            "scopetree watchdog: rank 1 waited 5.0 s in NCCL all-reduce on the GPU; timeout 5 s \
             passed: aborting the NCCL communicator and exiting with status 3 (a rank stalled, \
             died or skipped this call)\n"
        );
    }
}
