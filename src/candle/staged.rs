//! The store's side of staged loads: the staging buffers (page-locked when
//! a tensor goes to a CUDA device, kept from load to load), each tensor's
//! destination (new memory on its device, or an existing `Var` written in
//! place), and the sink that copies staged pieces there, converting float
//! dtypes on the host.

use std::cell::RefCell;

use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Storage, Tensor, Var};
use half::{bf16, f16};

use crate::checkpoint::staged::{HostStaging, ReadInto, Shape, Sink, Staging};
use crate::checkpoint::{Dtype, Error, convert_floats_into};

#[cfg(feature = "cuda")]
use super::cuda::{self, Pinned};

/// A staging buffer: plain host memory, or page-locked memory when some
/// tensor of the load lives on a CUDA device.
pub(crate) enum Buffer {
    Host(HostStaging),
    #[cfg(feature = "cuda")]
    Pinned(Pinned),
}

fn device_error(what: impl std::fmt::Display) -> Error {
    Error::BadTensor {
        reason: what.to_string(),
    }
}

impl Staging for Buffer {
    fn capacity(&self) -> usize {
        match self {
            Self::Host(h) => h.capacity(),
            #[cfg(feature = "cuda")]
            Self::Pinned(p) => p.len(),
        }
    }
    fn fill(&mut self) -> Result<&mut [u8], Error> {
        match self {
            Self::Host(h) => h.fill(),
            #[cfg(feature = "cuda")]
            Self::Pinned(p) => p
                .bytes_mut()
                .map_err(|e| device_error(format!("waiting for a staged copy: {e}"))),
        }
    }
    fn staged(&mut self) -> Result<&[u8], Error> {
        match self {
            Self::Host(h) => h.staged(),
            #[cfg(feature = "cuda")]
            Self::Pinned(p) => p
                .bytes()
                .map_err(|e| device_error(format!("waiting for a staged copy: {e}"))),
        }
    }
    fn queued(&mut self) {
        #[cfg(feature = "cuda")]
        if let Self::Pinned(p) = self {
            // A failure here is the driver's, and the next access to the
            // buffer, which waits for the copies, reports it.
            let _ = p.flush();
        }
    }
}

/// Which staging memory a load needs: plain, or page-locked in the context
/// of a CUDA device (its ordinal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Host,
    #[cfg(feature = "cuda")]
    Pinned(usize),
}

impl Kind {
    /// The kind for destinations on `devices`: page-locked in the first
    /// CUDA device's context if any is one (the memory is portable across
    /// contexts), else plain.
    pub(crate) fn for_devices<'a>(devices: impl IntoIterator<Item = &'a Device>) -> Self {
        for d in devices {
            #[cfg(feature = "cuda")]
            if let Device::Cuda(c) = d {
                return Self::Pinned(c.cuda_stream().context().ordinal());
            }
            let _ = d;
        }
        Self::Host
    }
}

/// The staging buffers loads keep from load to load, for the whole process
/// (any store's next load reuses them): page-locking memory costs about as
/// much as copying it once. A load takes them out and hands them back, so
/// two loads at once each have their own.
pub(crate) static POOL: std::sync::Mutex<Pool> = std::sync::Mutex::new(Pool::new());

/// The kept buffers, whatever a panic elsewhere left.
pub(crate) fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The staging buffers loads keep from load to load.
pub(crate) struct Pool {
    kind: Option<Kind>,
    bufs: Vec<Buffer>,
    /// Page-locked buffers for float conversions on their way to a device.
    #[cfg(feature = "cuda")]
    scratch: Vec<Pinned>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("kind", &self.kind)
            .field("buffers", &self.bufs.len())
            .field("bytes", &self.bytes())
            .finish()
    }
}

/// The size of each conversion buffer on the way to a device.
#[cfg(feature = "cuda")]
const SCRATCH: usize = 4 << 20;

impl Pool {
    /// No buffers.
    const fn new() -> Self {
        Self {
            kind: None,
            bufs: Vec::new(),
            #[cfg(feature = "cuda")]
            scratch: Vec::new(),
        }
    }

    /// The bytes the pool holds.
    pub(crate) fn bytes(&self) -> usize {
        let bufs: usize = self.bufs.iter().map(Staging::capacity).sum();
        #[cfg(feature = "cuda")]
        let bufs = bufs + self.scratch.iter().map(Pinned::len).sum::<usize>();
        bufs
    }

    /// Drops every buffer.
    pub(crate) fn clear(&mut self) {
        self.bufs.clear();
        #[cfg(feature = "cuda")]
        self.scratch.clear();
        self.kind = None;
    }

    /// `shape.buffers` buffers of `shape.buffer` bytes of `kind`: the kept
    /// ones when they fit, else new ones (the kept ones are dropped first,
    /// so the pool never holds more than one shape's worth).
    pub(crate) fn take(&mut self, kind: Kind, shape: Shape) -> Result<Vec<Buffer>, Error> {
        let fits = self.kind == Some(kind)
            && self.bufs.len() == shape.buffers
            && self.bufs.iter().all(|b| b.capacity() == shape.buffer);
        if fits {
            return Ok(std::mem::take(&mut self.bufs));
        }
        self.bufs.clear();
        self.kind = Some(kind);
        (0..shape.buffers)
            .map(|_| new_buffer(kind, shape.buffer))
            .collect()
    }

    /// The conversion buffers on the way to a device, made in the context
    /// of `device` when there are none.
    #[cfg(feature = "cuda")]
    fn take_scratch(&mut self, device: &candle_core::CudaDevice) -> Result<Vec<Pinned>, Error> {
        if self.scratch.len() >= 2 {
            return Ok(std::mem::take(&mut self.scratch));
        }
        let ctx = device.cuda_stream().context().clone();
        (0..2)
            .map(|_| {
                Pinned::new(&ctx, SCRATCH)
                    .map_err(|e| device_error(format!("page-locking conversion buffers: {e}")))
            })
            .collect()
    }

    /// Keeps `bufs` for the next load (unless a load that ran at the same
    /// time handed its own back first: then `bufs` are freed).
    pub(crate) fn give(&mut self, bufs: Vec<Buffer>) {
        if self.bufs.is_empty() {
            self.bufs = bufs;
        }
    }
}

fn new_buffer(kind: Kind, len: usize) -> Result<Buffer, Error> {
    match kind {
        Kind::Host => Ok(Buffer::Host(HostStaging::new(len))),
        #[cfg(feature = "cuda")]
        Kind::Pinned(ordinal) => {
            let ctx = candle_core::cuda_backend::cudarc::driver::CudaContext::new(ordinal)
                .map_err(|e| device_error(format!("opening CUDA device {ordinal}: {e}")))?;
            Pinned::new(&ctx, len)
                .map(Buffer::Pinned)
                .map_err(|e| device_error(format!("page-locking {len} bytes of staging: {e}")))
        }
    }
}

/// New memory for a tensor of a load, on its device.
pub(crate) enum Fresh {
    Cpu(CpuStorage),
    #[cfg(feature = "cuda")]
    Cuda(candle_core::CudaStorage),
}

impl Fresh {
    /// `n` zeros of `dtype` on `device`.
    ///
    /// # Errors
    /// candle's, when the memory cannot be had or the device is not one
    /// the crate was built for.
    pub(crate) fn new(device: &Device, dtype: DType, n: usize) -> candle_core::Result<Self> {
        match device {
            Device::Cpu => Ok(Self::Cpu(cpu_zeros(dtype, n)?)),
            #[cfg(feature = "cuda")]
            Device::Cuda(c) => cuda::fresh(c, dtype, n).map(Self::Cuda),
            other => Err(candle_core::Error::Msg(format!(
                "scopetree cannot load into {:?}: build with the `cuda` feature for CUDA devices",
                other.location()
            ))),
        }
    }

    /// The new memory as a `Var` of `shape` (no copy).
    pub(crate) fn into_var(self, shape: &[usize]) -> candle_core::Result<Var> {
        let storage = match self {
            Self::Cpu(s) => Storage::Cpu(s),
            #[cfg(feature = "cuda")]
            Self::Cuda(s) => Storage::Cuda(s),
        };
        let t = Tensor::from_storage(storage, shape, BackpropOp::none(), true);
        Var::from_tensor(&t)
    }
}

/// Runs `$body` with `$v` bound to the typed vector of a `CpuStorage` for
/// the dtypes checkpoints hold; `$other` for the rest.
macro_rules! cpu_typed {
    ($storage:expr, $v:ident => $body:expr, $other:ident => $fallback:expr) => {
        match $storage {
            CpuStorage::U8($v) => $body,
            CpuStorage::U32($v) => $body,
            CpuStorage::I16($v) => $body,
            CpuStorage::I32($v) => $body,
            CpuStorage::I64($v) => $body,
            CpuStorage::BF16($v) => $body,
            CpuStorage::F16($v) => $body,
            CpuStorage::F32($v) => $body,
            CpuStorage::F64($v) => $body,
            $other => $fallback,
        }
    };
}

fn cpu_zeros(dtype: DType, n: usize) -> candle_core::Result<CpuStorage> {
    Ok(match dtype {
        DType::U8 => CpuStorage::U8(vec![0; n]),
        DType::U32 => CpuStorage::U32(vec![0; n]),
        DType::I16 => CpuStorage::I16(vec![0; n]),
        DType::I32 => CpuStorage::I32(vec![0; n]),
        DType::I64 => CpuStorage::I64(vec![0; n]),
        DType::BF16 => CpuStorage::BF16(vec![bf16::ZERO; n]),
        DType::F16 => CpuStorage::F16(vec![f16::ZERO; n]),
        DType::F32 => CpuStorage::F32(vec![0.0; n]),
        DType::F64 => CpuStorage::F64(vec![0.0; n]),
        other => {
            return Err(candle_core::Error::Msg(format!(
                "scopetree checkpoints do not store {other:?}"
            )));
        }
    })
}

/// The bytes of the elements of `s` from element `first` on, as one
/// little-endian byte slice per dtype.
fn cpu_bytes_mut(s: &mut CpuStorage, first: usize) -> candle_core::Result<(&mut [u8], usize)> {
    cpu_typed!(s, v => {
        let size = elem_size(v);
        let len = v.len();
        let v = v.get_mut(first..).ok_or_else(|| {
            candle_core::Error::Msg(format!("element {first} past a storage of {len}"))
        })?;
        Ok((bytemuck::cast_slice_mut(v), size))
    }, other => Err(candle_core::Error::Msg(format!(
        "scopetree checkpoints do not store {:?}",
        candle_core::backend::BackendStorage::dtype(other)
    ))))
}

fn elem_size<T>(_: &[T]) -> usize {
    std::mem::size_of::<T>()
}

/// Where one tensor of a load goes, and the conversion on the way.
pub(crate) struct Dest {
    pub(crate) to: To,
    /// The file's dtype and the destination's, when they differ.
    pub(crate) convert: Option<(Dtype, Dtype)>,
}

/// New memory, or an existing `Var` (contiguous) written in place.
pub(crate) enum To {
    Fresh(Fresh),
    InPlace(Var),
}

/// The bytes a piece of `len` staged bytes of `convert.0` makes at the
/// destination, and where a piece at byte `at` of the file's tensor lands.
fn scaled(convert: Option<(Dtype, Dtype)>, at: usize, len: usize) -> (usize, usize) {
    match convert {
        Some((from, to)) => {
            let (f, t) = (from.bitsize() / 8, to.bitsize() / 8);
            (at / f * t, len / f * t)
        }
        None => (at, len),
    }
}

/// Writes `src` (bytes of the file's dtype) into host storage `s` whose
/// tensor starts at element `first`, at byte `at` of the file's tensor.
fn host_write(
    s: &mut CpuStorage,
    first: usize,
    at: usize,
    src: &[u8],
    convert: Option<(Dtype, Dtype)>,
) -> candle_core::Result<()> {
    let (bytes, size) = cpu_bytes_mut(s, first)?;
    let (dst_at, n) = scaled(convert, at, src.len());
    let have = bytes.len();
    let dst = bytes.get_mut(dst_at..dst_at + n).ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "a piece of {n} bytes at {dst_at} past a tensor of {have} bytes"
        ))
    })?;
    match convert {
        Some((from, to)) => convert_floats_into(from, to, src, dst),
        None => dst.copy_from_slice(src),
    }
    if cfg!(target_endian = "big") {
        for e in dst.chunks_exact_mut(size) {
            e.reverse();
        }
    }
    Ok(())
}

/// The page-locked buffer behind `buf`, for a copy to a device.
#[cfg(feature = "cuda")]
fn pinned(buf: &mut Buffer) -> candle_core::Result<&mut Pinned> {
    match buf {
        Buffer::Pinned(p) => Ok(p),
        Buffer::Host(_) => Err(candle_core::Error::Msg(
            "a copy to a CUDA device from unpinned staging".into(),
        )),
    }
}

/// Page-locked buffers for conversions on their way to a device, used in
/// turn.
#[cfg(feature = "cuda")]
struct Scratch {
    bufs: Vec<Pinned>,
    next: usize,
}

/// One staged piece on its way: `len` bytes at `from` in the buffer, for
/// byte `at` of the file's tensor, converted on the way when asked.
#[derive(Clone, Copy)]
struct Piece {
    from: usize,
    len: usize,
    at: usize,
    convert: Option<(Dtype, Dtype)>,
}

/// Writes a staged piece of `buf` into device storage `s` whose tensor
/// starts at element `first`; converts through `scratch` on the host first
/// when the piece asks.
#[cfg(feature = "cuda")]
fn device_write(
    s: &mut candle_core::CudaStorage,
    first: usize,
    buf: &mut Buffer,
    piece: Piece,
    scratch: &mut Option<Scratch>,
) -> candle_core::Result<()> {
    let Piece {
        from,
        len,
        at,
        convert,
    } = piece;
    let size = candle_core::backend::BackendStorage::dtype(s).size_in_bytes();
    let Some((src_dt, dst_dt)) = convert else {
        return cuda::write_range(s, first + at / size, pinned(buf)?, from, len);
    };
    let scratch = scratch.as_mut().ok_or_else(|| {
        candle_core::Error::Msg("a conversion to a device without conversion buffers".into())
    })?;
    let (f, t) = (src_dt.bitsize() / 8, dst_dt.bitsize() / 8);
    // Source elements per turn: as many as a scratch buffer holds converted.
    let per = SCRATCH / t;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(per * f);
        let src = &buf
            .staged()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?[from + done..from + done + n];
        let k = scratch.next % scratch.bufs.len();
        scratch.next += 1;
        let out = &mut scratch.bufs[k];
        let out_len = n / f * t;
        let bytes = out.bytes_mut().map_err(|e| {
            candle_core::Error::Msg(format!("waiting for a conversion buffer: {e}"))
        })?;
        convert_floats_into(src_dt, dst_dt, src, &mut bytes[..out_len]);
        cuda::write_range(s, first + (at + done) / f, out, 0, out_len)?;
        out.flush()
            .map_err(|e| candle_core::Error::Msg(format!("queueing a converted copy: {e}")))?;
        done += n;
    }
    Ok(())
}

/// The in-place write of one staged piece into a `Var`'s storage, through
/// candle's `InplaceOp1` (the only way to reach a tensor's memory for
/// writing).
struct Put<'a> {
    buf: RefCell<&'a mut Buffer>,
    piece: Piece,
    #[cfg(feature = "cuda")]
    scratch: RefCell<&'a mut Option<Scratch>>,
}

/// The first element of a contiguous layout.
fn start_of(layout: &Layout) -> candle_core::Result<usize> {
    layout
        .contiguous_offsets()
        .map(|(start, _)| start)
        .ok_or_else(|| candle_core::Error::Msg("an in-place load into a strided tensor".into()))
}

impl InplaceOp1 for Put<'_> {
    fn name(&self) -> &'static str {
        "scopetree-staged-load"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let first = start_of(layout)?;
        let mut buf = self.buf.borrow_mut();
        let src = buf
            .staged()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let p = self.piece;
        host_write(
            storage,
            first,
            p.at,
            &src[p.from..p.from + p.len],
            p.convert,
        )
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &mut candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<()> {
        let first = start_of(layout)?;
        device_write(
            storage,
            first,
            &mut self.buf.borrow_mut(),
            self.piece,
            &mut self.scratch.borrow_mut(),
        )
    }
}

/// Whether `d` is filled by a direct read: host memory that takes the
/// file's bytes as they are.
pub(crate) fn is_direct(d: &Dest) -> bool {
    d.convert.is_none()
        && match &d.to {
            To::Fresh(Fresh::Cpu(_)) => true,
            To::InPlace(v) => v.device().is_cpu(),
            #[cfg(feature = "cuda")]
            To::Fresh(Fresh::Cuda(_)) => false,
        }
}

/// The host destinations of a load, lent to direct reads.
pub(crate) struct HostDirect<'d> {
    pub(crate) dests: &'d mut [Dest],
    /// The destination of each job of the read.
    pub(crate) dest_of: &'d [usize],
    /// Whether a read went into an existing `Var`.
    pub(crate) touched: bool,
}

/// A direct read into a CPU `Var`'s storage, through `InplaceOp1`.
struct Fill<'a> {
    read: RefCell<ReadInto<'a>>,
    /// The read's own error, carried out of candle's.
    failed: RefCell<Option<Error>>,
}

impl InplaceOp1 for Fill<'_> {
    fn name(&self) -> &'static str {
        "scopetree-direct-load"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let first = start_of(layout)?;
        let (bytes, size) = cpu_bytes_mut(storage, first)?;
        let n = layout.shape().elem_count() * size;
        let bytes = bytes
            .get_mut(..n)
            .ok_or_else(|| candle_core::Error::Msg("a layout past its storage".into()))?;
        (self.read.borrow_mut())(bytes).map_err(|e| {
            let shown = e.to_string();
            *self.failed.borrow_mut() = Some(e);
            candle_core::Error::Msg(shown)
        })
    }
}

impl crate::checkpoint::staged::Direct for HostDirect<'_> {
    fn with_bytes(&mut self, job: usize, read: ReadInto<'_>) -> Result<(), Error> {
        match &mut self.dests[self.dest_of[job]].to {
            To::Fresh(Fresh::Cpu(s)) => {
                let (bytes, _) = cpu_bytes_mut(s, 0).map_err(device_error)?;
                read(bytes)
            }
            To::InPlace(var) => {
                self.touched = true;
                let fill = Fill {
                    read: RefCell::new(read),
                    failed: RefCell::new(None),
                };
                match var.inplace_op1(&fill) {
                    Ok(()) => Ok(()),
                    Err(e) => Err(fill.failed.take().unwrap_or_else(|| device_error(e))),
                }
            }
            #[cfg(feature = "cuda")]
            To::Fresh(Fresh::Cuda(_)) => Err(device_error("a direct read into a device tensor")),
        }
    }
}

/// The sink of a store's staged load: each job's destination.
pub(crate) struct StoreSink<'d> {
    pub(crate) dests: &'d mut [Dest],
    /// The destination of each job of the read.
    pub(crate) dest_of: &'d [usize],
    /// Whether a piece went into an existing `Var`.
    pub(crate) touched: bool,
    #[cfg(feature = "cuda")]
    scratch: Option<Scratch>,
}

impl<'d> StoreSink<'d> {
    /// A sink into `dests`, with the pool's conversion buffers when some
    /// destination on a device converts (handed back by
    /// [`finish`](Self::finish)).
    pub(crate) fn new(dests: &'d mut [Dest], dest_of: &'d [usize]) -> Result<Self, Error> {
        #[cfg(feature = "cuda")]
        let scratch = {
            let device_convert = dests.iter().find_map(|d| {
                let device = match &d.to {
                    To::Fresh(Fresh::Cuda(s)) => Some(s.device.clone()),
                    To::InPlace(v) => match v.device() {
                        Device::Cuda(c) => Some(c.clone()),
                        _ => None,
                    },
                    _ => None,
                };
                device.filter(|_| d.convert.is_some())
            });
            match device_convert {
                Some(dev) => Some(Scratch {
                    bufs: pool().take_scratch(&dev)?,
                    next: 0,
                }),
                None => None,
            }
        };
        Ok(Self {
            dests,
            dest_of,
            touched: false,
            #[cfg(feature = "cuda")]
            scratch,
        })
    }

    /// Hands the conversion buffers back to the pool; returns whether a
    /// piece went into an existing `Var`.
    pub(crate) fn finish(self) -> bool {
        #[cfg(feature = "cuda")]
        if let Some(s) = self.scratch {
            let mut p = pool();
            if p.scratch.is_empty() {
                p.scratch = s.bufs;
            }
        }
        self.touched
    }
}

impl Sink<Buffer> for StoreSink<'_> {
    fn put(
        &mut self,
        buf: &mut Buffer,
        from: usize,
        len: usize,
        job: usize,
        at: usize,
    ) -> Result<(), Error> {
        let dest = &mut self.dests[self.dest_of[job]];
        let convert = dest.convert;
        let piece = Piece {
            from,
            len,
            at,
            convert,
        };
        let done = match &mut dest.to {
            To::Fresh(Fresh::Cpu(s)) => {
                let src = &buf.staged()?[from..from + len];
                host_write(s, 0, at, src, convert)
            }
            #[cfg(feature = "cuda")]
            To::Fresh(Fresh::Cuda(s)) => device_write(s, 0, buf, piece, &mut self.scratch),
            To::InPlace(var) => {
                self.touched = true;
                let put = Put {
                    buf: RefCell::new(buf),
                    piece,
                    #[cfg(feature = "cuda")]
                    scratch: RefCell::new(&mut self.scratch),
                };
                var.inplace_op1(&put)
            }
        };
        done.map_err(|e| device_error(format!("copying a staged piece to its tensor: {e}")))
    }
}

/// Waits until every copy queued into the destinations has ended (the
/// devices' streams), so that a `Var` handed out is whole on any stream.
pub(crate) fn synchronize(dests: &[Dest]) -> Result<(), Error> {
    #[cfg(feature = "cuda")]
    {
        let mut seen: Vec<usize> = Vec::new();
        for d in dests {
            let stream = match &d.to {
                To::Fresh(Fresh::Cuda(s)) => s.device.cuda_stream(),
                To::InPlace(v) => match v.device() {
                    Device::Cuda(c) => c.cuda_stream(),
                    _ => continue,
                },
                _ => continue,
            };
            let id = stream.cu_stream() as usize;
            if !seen.contains(&id) {
                seen.push(id);
                stream
                    .synchronize()
                    .map_err(|e| device_error(format!("waiting for copies to the device: {e}")))?;
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    let _ = dests;
    Ok(())
}
