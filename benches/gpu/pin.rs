//! Where a process's first staged load spends its page-locking (child mode
//! `pin` of `gpu_load_bench`): the first load page-locks its two 16 MiB
//! staging buffers before it reads anything, about 17 ms of its 0.06 s
//! (`docs/gpu.md`), and misses issue 33's 0.6× goal by that. Each line,
//! `PIN what value`, answers one question about how that could be
//! hidden or made cheaper:
//!
//! - is most of it a one-time cost of the context's first page-locked
//!   allocation (then it could be paid earlier, beside other work)?
//! - is it the driver's allocation, or the zeroing after it?
//! - does it scale with the bytes (then locking in pieces lets reads start
//!   sooner)?
//! - is registering memory the process already has (`cuMemHostRegister`)
//!   cheaper, on 4 KiB pages or on transparent huge pages (2 MiB-aligned
//!   memory, and anonymous memory advised with `madvise(MADV_HUGEPAGE)`)?
//! - are copies from registered memory as fast as from `cuMemHostAlloc`'s?
//! - while one thread page-locks, do another thread's copies to the device
//!   and reads from the page cache go on, or does the driver hold them?
//!
//! The raw driver calls are `unsafe`; this is a measuring tool outside the
//! crate (which forbids `unsafe` but for `src/candle/cuda/pinned.rs`).

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use candle_core::cuda_backend::cudarc::driver::{CudaContext, CudaStream, DevicePtrMut, sys};

use super::{Res, median};

const MIB: usize = 1 << 20;

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn say(what: &str, value: f64, unit: &str) {
    println!("PIN {what:56} {value:9.3} {unit}");
}

/// Memory from `cuMemHostAlloc` (portable, cached, as `Pinned::new`
/// makes it), freed on drop.
struct HostAlloc {
    ptr: *mut u8,
    len: usize,
}

impl HostAlloc {
    fn new(len: usize) -> Res<Self> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid place for the driver to write the address
        // of the `len` bytes it allocates.
        unsafe { sys::cuMemHostAlloc(&mut p, len, sys::CU_MEMHOSTALLOC_PORTABLE) }.result()?;
        Ok(Self { ptr: p.cast(), len })
    }

    fn zero(&mut self) {
        // SAFETY: `ptr` holds `len` bytes this value owns; nothing else
        // reads or writes them now (no copy is queued from them here).
        unsafe { std::ptr::write_bytes(self.ptr, 0, self.len) };
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `zero`; the bytes are initialised by `zero` or by
        // the driver's allocation before any read of them is used.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `cuMemHostAlloc`; every copy from it was
        // synchronised before the value is dropped.
        let _ = unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
    }
}

/// Bytes registered with the driver (`cuMemHostRegister`, portable);
/// unregistered on drop.
struct Registered<'a> {
    bytes: &'a mut [u8],
}

impl<'a> Registered<'a> {
    fn new(bytes: &'a mut [u8]) -> Res<Self> {
        // SAFETY: the range is `bytes`, borrowed for as long as it stays
        // registered.
        unsafe {
            sys::cuMemHostRegister_v2(
                bytes.as_mut_ptr().cast(),
                bytes.len(),
                sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        }
        .result()?;
        Ok(Self { bytes })
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        // SAFETY: the range was registered by `new`; every copy from it
        // was synchronised before the value is dropped.
        let _ = unsafe { sys::cuMemHostUnregister(self.bytes.as_mut_ptr().cast()) };
    }
}

/// `count` asynchronous copies of `src` to `dst` on `stream`, then one
/// synchronize: seconds.
fn copies(stream: &CudaStream, dst: sys::CUdeviceptr, src: &[u8], count: usize) -> Res<f64> {
    let t0 = Instant::now();
    for _ in 0..count {
        // SAFETY: `dst` holds at least `src.len()` bytes; `src` is
        // page-locked and outlives the synchronize below.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), stream.cu_stream())
        }
        .result()?;
    }
    stream.synchronize()?;
    Ok(t0.elapsed().as_secs_f64())
}

/// `once`, again and again until `until` (given how many ran) says to
/// stop: each run's milliseconds.
fn repeat_until(until: &dyn Fn(usize) -> bool, once: &mut dyn FnMut() -> Res<()>) -> Res<Vec<f64>> {
    let mut out = Vec::new();
    while !until(out.len()) {
        let t = Instant::now();
        once()?;
        out.push(ms(t));
    }
    Ok(out)
}

fn anon_huge_kib() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("AnonHugePages:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// A 2 MiB-aligned window of `len` bytes inside `v` (which must hold
/// `len` + 2 MiB).
fn aligned(v: &mut [u8], len: usize) -> &mut [u8] {
    let off = v.as_ptr().align_offset(2 * MIB);
    &mut v[off..off + len]
}

/// Runs every probe; the context was made and used just before, as a
/// load's child does.
pub fn pin(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, shard: &Path) -> Res<()> {
    ctx.bind_to_thread()?;
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .unwrap_or_else(|_| "unknown".into());
    println!("PIN transparent huge pages: {}", thp.trim());
    let n16 = 16 * MIB;

    // 1. The first page-locked allocation of the process, 4 KiB.
    let t = Instant::now();
    let first = HostAlloc::new(4096)?;
    say("first cuMemHostAlloc of the process, 4 KiB", ms(t), "ms");
    drop(first);

    // 2. Two 16 MiB buffers as `Pinned::new` makes them: allocation, then
    // zeroing, timed apart.
    let mut kept = Vec::new();
    for k in 0..2 {
        let t = Instant::now();
        let mut b = HostAlloc::new(n16)?;
        let alloc = ms(t);
        let t = Instant::now();
        b.zero();
        say(&format!("cuMemHostAlloc 16 MiB, buffer {k}"), alloc, "ms");
        say(&format!("  zeroing it, buffer {k}"), ms(t), "ms");
        kept.push(b);
    }

    // 3. The same bytes in smaller pieces: does the cost scale with them?
    for (pieces, size) in [(4, 4 * MIB), (16, MIB)] {
        let t = Instant::now();
        let v: Vec<HostAlloc> = (0..pieces)
            .map(|_| HostAlloc::new(size))
            .collect::<Res<_>>()?;
        say(
            &format!("cuMemHostAlloc {pieces} x {} MiB", size / MIB),
            ms(t),
            "ms",
        );
        drop(v);
    }

    // 4. Registering memory the process already has, 4 KiB pages (or
    // huge pages where the kernel gives them unasked).
    let t = Instant::now();
    let mut plain = vec![1_u8; n16];
    say("Vec of 16 MiB, written (faulted in)", ms(t), "ms");
    let t = Instant::now();
    let reg = Registered::new(&mut plain)?;
    say("cuMemHostRegister 16 MiB of it", ms(t), "ms");
    let t = Instant::now();
    drop(reg);
    say("  cuMemHostUnregister", ms(t), "ms");
    let t = Instant::now();
    let pieces: Vec<Registered> = plain
        .chunks_mut(4 * MIB)
        .map(Registered::new)
        .collect::<Res<_>>()?;
    say("cuMemHostRegister 16 MiB in 4 pieces", ms(t), "ms");
    drop(pieces);

    // 5. The same on 2 MiB-aligned memory (huge pages where the kernel's
    // setting is `always`).
    let mut big = vec![0_u8; n16 + 2 * MIB];
    let huge0 = anon_huge_kib();
    let t = Instant::now();
    let window = aligned(&mut big, n16);
    window.fill(1);
    say("2 MiB-aligned 16 MiB, written", ms(t), "ms");
    say(
        "  of it on huge pages",
        (anon_huge_kib().saturating_sub(huge0)) as f64 / 1024.0,
        "MiB",
    );
    let t = Instant::now();
    let reg_huge = Registered::new(window)?;
    say("cuMemHostRegister 16 MiB of it", ms(t), "ms");

    // 5b. Anonymous memory advised onto huge pages (`madvise`, as a
    // kernel set to `madvise` wants).
    let mut map = memmap2::MmapMut::map_anon(n16)?;
    let advised = map.advise(memmap2::Advice::HugePage).is_ok();
    let huge0 = anon_huge_kib();
    let t = Instant::now();
    map.fill(1);
    say(
        &format!("anonymous 16 MiB, huge pages advised ({advised}), written"),
        ms(t),
        "ms",
    );
    say(
        "  of it on huge pages",
        (anon_huge_kib().saturating_sub(huge0)) as f64 / 1024.0,
        "MiB",
    );
    let t = Instant::now();
    let reg_map = Registered::new(&mut map)?;
    say("cuMemHostRegister 16 MiB of it", ms(t), "ms");
    let t = Instant::now();
    let mut map2 = memmap2::MmapMut::map_anon(n16)?;
    let _ = map2.advise(memmap2::Advice::HugePage);
    let reg_map2 = Registered::new(&mut map2)?;
    say(
        "the same, registered unwritten (the driver faults it in)",
        ms(t),
        "ms",
    );
    drop(reg_map2);
    let t = Instant::now();
    let mut map3 = memmap2::MmapMut::map_anon(n16)?;
    let _ = map3.advise(memmap2::Advice::HugePage);
    let populated = map3.advise(memmap2::Advice::PopulateWrite).is_ok();
    let faulted = ms(t);
    let reg_map3 = Registered::new(&mut map3)?;
    say(
        &format!(
            "the same, prefaulted by MADV_POPULATE_WRITE ({populated}) in {faulted:.3} ms, then registered"
        ),
        ms(t),
        "ms",
    );
    drop(reg_map3);

    // 6. Copies to the device from each kind, 64 x 16 MiB (1 GiB).
    let mut dst = stream.alloc_zeros::<u8>(n16)?;
    let (dptr, guard) = dst.device_ptr_mut(stream);
    let speed = |s: f64| (64 * n16) as f64 / s / 1e9;
    copies(stream, dptr, kept[0].bytes_mut(), 4)?; // warm-up, not timed
    let s = copies(stream, dptr, kept[0].bytes_mut(), 64)?;
    say("copy 1 GiB from cuMemHostAlloc memory", speed(s), "GB/s");
    let s = copies(stream, dptr, reg_huge.bytes, 64)?;
    say(
        "copy 1 GiB from registered aligned memory",
        speed(s),
        "GB/s",
    );
    let s = copies(stream, dptr, reg_map.bytes, 64)?;
    say(
        "copy 1 GiB from registered advised memory",
        speed(s),
        "GB/s",
    );
    drop(reg_map);
    let reg = Registered::new(&mut plain)?;
    let s = copies(stream, dptr, reg.bytes, 64)?;
    say("copy 1 GiB from registered Vec memory", speed(s), "GB/s");
    drop(reg);
    drop(reg_huge);

    // 7. While a thread page-locks 4 x 16 MiB: this thread's copies (16
    // MiB, each synchronised), then its reads from the page cache.
    let (copy_src, read_into) = kept.split_at_mut(1);
    let (copy_src, read_into) = (copy_src[0].bytes_mut(), read_into[0].bytes_mut());
    let mut copy_once = || copies(stream, dptr, copy_src, 1).map(drop);
    let file = std::fs::File::open(shard)?;
    let mut read_once = || -> Res<()> { Ok(file.read_exact_at(read_into, 4096)?) };
    let sixteen = |n: usize| n >= 16;
    let base = median(&mut repeat_until(&sixteen, &mut copy_once)?);
    say("one 16 MiB copy alone (median of 16)", base, "ms");
    let base = median(&mut repeat_until(&sixteen, &mut read_once)?);
    say("one 16 MiB read from the page cache alone", base, "ms");
    for what in ["copies", "reads"] {
        let done = AtomicBool::new(false);
        let (mut lat, locked) = std::thread::scope(|s| -> Res<(Vec<f64>, f64)> {
            let locker = s.spawn(|| -> Result<f64, String> {
                let t = Instant::now();
                let locked = ctx
                    .bind_to_thread()
                    .map_err(|e| e.to_string())
                    .and_then(|()| {
                        (0..4)
                            .map(|_| {
                                let mut b = HostAlloc::new(n16).map_err(|e| e.to_string())?;
                                b.zero();
                                Ok(b)
                            })
                            .collect::<Result<Vec<_>, String>>()
                    });
                let took = ms(t);
                // Stops the other thread's loop whether or not it worked.
                done.store(true, Ordering::Release);
                locked.map(|_| took)
            });
            let stop = |n: usize| done.load(Ordering::Acquire) || n >= 10_000;
            let lat = if what == "copies" {
                repeat_until(&stop, &mut copy_once)
            } else {
                repeat_until(&stop, &mut read_once)
            };
            let locked = locker.join().map_err(|_| "the locking thread panicked")??;
            Ok((lat?, locked))
        })?;
        say(
            &format!("4 x 16 MiB page-locked on a thread beside {what}"),
            locked,
            "ms",
        );
        let max = lat.iter().copied().fold(0.0, f64::max);
        say(
            &format!(
                "  the {} {what} meanwhile, median (max {max:.3})",
                lat.len()
            ),
            median(&mut lat),
            "ms",
        );
    }
    drop(guard);
    drop(dst);
    Ok(())
}
