//! [`Pinned`]: a page-locked host buffer that stages bytes between the
//! host and a CUDA device, with the one `unsafe` call of the crate (its
//! allocation) and the event that makes reusing it while a copy runs
//! impossible.
//!
//! Copies into or out of the buffer are asynchronous: the device's copy
//! engine reads (or writes) the page-locked memory after the call that
//! started it has returned. The copies queued since the buffer's event was
//! last recorded are pending; [`Pinned::flush`] records the event on their
//! stream after the last of them (one event for a batch of copies, such as
//! a window's pieces or a save's variables), and every access to the bytes
//! from the host ([`Pinned::bytes`], [`Pinned::bytes_mut`], dropping the
//! buffer) first records it for copies still pending, then waits for it.
//! The bytes are only reachable through those methods, so the host can
//! neither read bytes a copy has not yet written nor overwrite bytes a copy
//! is still taking. Copies in one direction are queued back to back; a
//! copy in the other direction, or on another stream, first waits for
//! those before it.

#![allow(unsafe_code)]

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaContext, CudaEvent, CudaStream, CudaView, CudaViewMut, DeviceRepr, DriverError,
    PinnedHostSlice, sys,
};

/// A page-locked host buffer and the event of the last copy into or out of
/// it.
pub(crate) struct Pinned {
    host: PinnedHostSlice<u8>,
    /// Recorded on the stream of every copy into or out of `host`, after
    /// the copy; waited on before the host touches `host`.
    done: CudaEvent,
    /// The direction of the copies queued since the last wait (`true`:
    /// into the buffer, from the device) and their stream (its handle's
    /// address): the event tracks one stream.
    queued: Option<(bool, usize)>,
    /// The stream of copies queued since the event was last recorded.
    pending: Option<Arc<CudaStream>>,
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinned")
            .field("len", &self.host.len())
            .finish_non_exhaustive()
    }
}

impl Pinned {
    /// `len` zero bytes of page-locked memory, usable with every context
    /// (`CU_MEMHOSTALLOC_PORTABLE`), cached for the host's reads (not
    /// write-combined: the host hashes and writes out what it stages).
    ///
    /// # Errors
    /// The driver's, when the memory cannot be page-locked.
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, DriverError> {
        let len = len.max(1);
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE;
        // `alloc_pinned_with_flags` is unsafe only because the memory it
        // returns is not initialised. The slice is not exposed until this
        // function returns, and no copy has been queued on it yet.
        // SAFETY: nothing reads the memory before `write_bytes` below zeroes all `len` bytes.
        let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(len, flags)? };
        let ptr = host.as_mut_ptr()?;
        // `ptr` is the start of the `len` bytes `host` owns; `host` is
        // borrowed mutably and no copy uses it yet.
        // SAFETY: valid for `len` writes, not aliased; `u8` has no invalid bit patterns.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        let done = ctx.new_event(None)?;
        Ok(Self {
            host,
            done,
            queued: None,
            pending: None,
        })
    }

    /// Its size in bytes. O(1).
    pub(crate) fn len(&self) -> usize {
        self.host.len()
    }

    /// The bytes, for the host to read, once every copy into or out of
    /// them has ended.
    ///
    /// # Errors
    /// The driver's, when waiting fails.
    pub(crate) fn bytes(&mut self) -> Result<&[u8], DriverError> {
        self.wait()?;
        self.host.as_slice()
    }

    /// Waits for every copy queued into or out of the buffer, recording
    /// the event first for those still pending.
    fn wait(&mut self) -> Result<(), DriverError> {
        self.record()?;
        if self.queued.is_some() {
            self.done.synchronize()?;
            self.queued = None;
        }
        Ok(())
    }

    /// Before a copy in direction `into` on `stream`: waits for the copies
    /// queued in the other direction or on another stream.
    fn turn(&mut self, into: bool, stream: &CudaStream) -> Result<(), DriverError> {
        let on = stream.cu_stream() as usize;
        if self.queued.is_some_and(|q| q != (into, on)) {
            self.wait()?;
        }
        Ok(())
    }

    /// The bytes, for the host to write, once every copy into or out of
    /// them has ended.
    ///
    /// # Errors
    /// The driver's, when waiting fails.
    pub(crate) fn bytes_mut(&mut self) -> Result<&mut [u8], DriverError> {
        self.wait()?;
        self.host.as_mut_slice()
    }

    /// Queues a copy of `self[from..from + dst.len() * size_of::<T>()]` to
    /// `dst` on `stream`, pending until the buffer's event is recorded
    /// after it ([`flush`](Self::flush), or the next access). `from` is a
    /// multiple of `T`'s alignment.
    ///
    /// # Errors
    /// The driver's; [`DriverError`] `CUDA_ERROR_INVALID_VALUE` when the
    /// range is outside the buffer or misaligned for `T`.
    pub(crate) fn copy_to_device<T: DeviceRepr + bytemuck::Pod>(
        &mut self,
        from: usize,
        dst: &mut CudaViewMut<'_, T>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), DriverError> {
        let n = dst.len() * std::mem::size_of::<T>();
        self.turn(false, stream)?;
        // Other copies out of the buffer may run: they only read it.
        let bytes = self.host.as_slice()?;
        let src: &[T] = bytes
            .get(from..from + n)
            .and_then(|b| bytemuck::try_cast_slice(b).ok())
            .ok_or(invalid())?;
        stream.memcpy_htod(src, dst)?;
        self.pend(stream, false);
        Ok(())
    }

    /// Queues a copy of `src` into `self[at..at + src.len() *
    /// size_of::<T>()]` on `stream`, pending as in
    /// [`copy_to_device`](Self::copy_to_device). `at` is a multiple of
    /// `T`'s alignment.
    ///
    /// # Errors
    /// As [`copy_to_device`](Self::copy_to_device).
    pub(crate) fn copy_from_device<T: DeviceRepr + bytemuck::Pod>(
        &mut self,
        src: &CudaView<'_, T>,
        at: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<(), DriverError> {
        let n = src.len() * std::mem::size_of::<T>();
        self.turn(true, stream)?;
        // Other copies into the buffer may run: each writes its own range.
        let bytes = self.host.as_mut_slice()?;
        let dst: &mut [T] = bytes
            .get_mut(at..at + n)
            .and_then(|b| bytemuck::try_cast_slice_mut(b).ok())
            .ok_or(invalid())?;
        stream.memcpy_dtoh(src, dst)?;
        self.pend(stream, true);
        Ok(())
    }

    /// Records the buffer's event after the copies queued so far, and asks
    /// the driver to start them (an event query submits the work before
    /// it, where a driver holds work back). Call it after the last copy of
    /// a batch.
    ///
    /// # Errors
    /// The driver's, when the event cannot be recorded (the copies have
    /// then been waited for).
    pub(crate) fn flush(&mut self) -> Result<(), DriverError> {
        self.record()?;
        let _ = self.done.try_is_complete();
        Ok(())
    }

    /// Notes a copy just queued on `stream` in direction `into` as pending.
    fn pend(&mut self, stream: &Arc<CudaStream>, into: bool) {
        self.queued = Some((into, stream.cu_stream() as usize));
        if self.pending.is_none() {
            self.pending = Some(Arc::clone(stream));
        }
    }

    /// Records the event after the pending copies (one stream: `turn`
    /// waits before a copy on another); if that fails, waits for their
    /// stream instead, so that no copy is left untracked (and if that fails
    /// too, they stay pending).
    fn record(&mut self) -> Result<(), DriverError> {
        let Some(stream) = self.pending.take() else {
            return Ok(());
        };
        let Err(e) = self.done.record(&stream) else {
            return Ok(());
        };
        if let Err(s) = stream.synchronize() {
            self.pending = Some(stream); // still untracked: tried again
            return Err(s);
        }
        self.queued = None;
        Err(e)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // The memory is freed after this: no copy may still use it. An
        // error here means the context is gone, and its copies with it.
        let _ = self.wait();
    }
}

fn invalid() -> DriverError {
    DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE)
}
