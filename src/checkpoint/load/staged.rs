//! Staged reads: a checkpoint's tensors read by parallel readers into a few
//! staging buffers that are reused from window to window (and, kept by the
//! caller, from load to load), their checksums verified on the staged bytes,
//! and each piece handed to a [`Sink`] that copies it to its destination
//! (host memory, or a device). While the copies out of one buffer run, the
//! readers fill the next one, and a hasher thread verifies the last.
//!
//! The memory a run holds is its buffers, whatever the checkpoint's size: a
//! tensor larger than a buffer is read in pieces. A buffer is handed to the
//! readers only through [`Staging::fill`], which waits until every copy out
//! of it has ended, so no read can overwrite bytes a copy is still taking.

use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use xxhash_rust::xxh3::Xxh3;

use crate::checkpoint::error::Error;
use crate::checkpoint::header::FileTensor;
use crate::checkpoint::source::Part;
use crate::short;

/// The smallest buffer a run makes, whatever the budget: 64 KiB.
const MIN_BUFFER: usize = 64 << 10;

/// A reader is given at least this many bytes of a window, so that small
/// windows are read by fewer threads.
const MIN_READ: usize = 1 << 20;

/// Piece starts inside a buffer, and cuts inside a tensor, fall on this
/// many bytes, so that every piece holds whole elements of any dtype, and
/// its bytes are aligned for them.
const ALIGN: usize = 8;

/// A staging buffer: host memory the readers fill and the sink copies out
/// of (pinned for a device, plain for the host).
pub(crate) trait Staging: Send {
    /// Its size in bytes.
    fn capacity(&self) -> usize;

    /// The bytes, to be filled: waits until every copy out of them has
    /// ended.
    ///
    /// # Errors
    /// When waiting for the copies fails (a device error).
    fn fill(&mut self) -> Result<&mut [u8], Error>;

    /// The bytes as filled, to be hashed or written out: waits until every
    /// copy into them has ended.
    ///
    /// # Errors
    /// As [`fill`](Self::fill).
    fn staged(&mut self) -> Result<&[u8], Error>;

    /// Called once the copies out of a window are queued: a device buffer
    /// asks the driver to start them now (some drivers hold queued work
    /// back until it is waited for). The default does nothing.
    fn queued(&mut self) {}
}

/// Staging in plain host memory.
pub(crate) struct HostStaging(Vec<u8>);

impl HostStaging {
    /// A buffer of `len` zero bytes.
    pub(crate) fn new(len: usize) -> Self {
        Self(vec![0; len])
    }
}

impl Staging for HostStaging {
    fn capacity(&self) -> usize {
        self.0.len()
    }
    fn fill(&mut self) -> Result<&mut [u8], Error> {
        Ok(&mut self.0)
    }
    fn staged(&mut self) -> Result<&[u8], Error> {
        Ok(&self.0)
    }
}

/// Where staged bytes go: the destination of each job.
pub(crate) trait Sink<B: Staging> {
    /// Copies `len` bytes at `from` in `buf` into the destination of job
    /// `job`, at byte `at` of it. May return before the copy ends; the copy
    /// must then be tracked by `buf`, so that its next
    /// [`fill`](Staging::fill) waits for it.
    ///
    /// # Errors
    /// When the copy cannot be made.
    fn put(
        &mut self,
        buf: &mut B,
        from: usize,
        len: usize,
        job: usize,
        at: usize,
    ) -> Result<(), Error>;
}

/// One tensor to read: where its bytes lie, and the checksum they must
/// have, if the file carries one.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    /// The part (file) that holds it.
    pub(crate) part: usize,
    /// Where its bytes start in that file (absolute).
    pub(crate) offset: u64,
    /// How many bytes it has.
    pub(crate) len: usize,
    /// Its key, for errors.
    pub(crate) key: String,
    /// The xxh3-128 its bytes must have.
    pub(crate) checksum: Option<u128>,
}

impl Job {
    /// The read of the whole tensor `t`, held by `parts[part]`, with the
    /// checksum that file carries for it. O(1).
    ///
    /// # Errors
    /// As [`Part::checksum`].
    pub(crate) fn of(parts: &[Part], part: usize, t: &FileTensor) -> Result<Self, Error> {
        Ok(Self {
            part,
            offset: parts[part].data_start + t.begin,
            len: usize::try_from(t.end - t.begin).unwrap_or(usize::MAX),
            key: t.key.clone(),
            checksum: parts[part].checksum(&t.key)?,
        })
    }
}

/// How a run reads: its buffers' count and size, and its readers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// How many buffers (at least 2: one fills while the other's copies run).
    pub(crate) buffers: usize,
    /// Each buffer's size in bytes.
    pub(crate) buffer: usize,
    /// How many threads read a window.
    pub(crate) readers: usize,
}

/// The largest buffer a run makes: 16 MiB. Larger windows only add to the
/// memory a load page-locks (page-locking 128 MiB took 0.06 s on an H200,
/// as long as the rest of a 1 GiB load), not to its speed: the readers
/// fill one while the copies out of the other run.
const MAX_BUFFER: usize = 16 << 20;

impl Shape {
    /// Two buffers of half the budget each, at most 16 MiB (a multiple of
    /// 4 KiB, at least 64 KiB, and no larger than the largest job needs),
    /// and `readers` threads (at least 1).
    pub(crate) fn new(budget: usize, readers: usize, largest_job: usize) -> Self {
        let half = (budget / 2).min(MAX_BUFFER) / 4096 * 4096;
        let need = largest_job.div_ceil(4096) * 4096;
        Self {
            buffers: 2,
            buffer: half.max(MIN_BUFFER).min(need.max(MIN_BUFFER)),
            readers: readers.max(1),
        }
    }
}

/// A piece of a job staged in a window: the job, where the piece starts in
/// the job's bytes, how long it is, and where it lies in the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    job: usize,
    at: usize,
    len: usize,
    from: usize,
}

/// Cuts the jobs into windows that each fill one buffer of `capacity`
/// bytes: pieces in job order, each starting on [`ALIGN`] bytes, a job cut
/// where a window ends (on [`ALIGN`] bytes of the job) unless less than
/// 1/16 of the buffer is left, which starts a new window instead.
fn windows(jobs: &[Job], capacity: usize) -> Vec<Vec<Piece>> {
    let mut out = Vec::new();
    let mut cur: Vec<Piece> = Vec::new();
    let mut used = 0_usize;
    for (j, job) in jobs.iter().enumerate() {
        let mut at = 0;
        while at < job.len || (job.len == 0 && at == 0) {
            let start = used.next_multiple_of(ALIGN);
            let room = capacity.saturating_sub(start);
            let left = job.len - at;
            let take = if left <= room {
                left
            } else if room >= capacity / 16 && room >= ALIGN {
                room / ALIGN * ALIGN
            } else {
                0
            };
            if take == 0 && left > 0 {
                out.push(std::mem::take(&mut cur));
                used = 0;
                continue;
            }
            cur.push(Piece {
                job: j,
                at,
                len: take,
                from: start,
            });
            used = start + take;
            at += take;
            if job.len == 0 {
                break;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The first error of a staged read, and the job it met (for a read
/// error, the first job of the window being read).
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) job: usize,
    pub(crate) error: Box<Error>,
}

impl Failed {
    fn new(job: usize, error: Error) -> Self {
        Self {
            job,
            error: Box::new(error),
        }
    }
}

/// Reads `jobs` from `parts` through the buffers `bufs` (made by the caller
/// and handed back in it, for the next run), verifies the checksums the jobs
/// carry on the staged bytes, and hands every piece to `sink`. Pieces of a
/// job reach the sink in order. Returns the first error; the sink may then
/// have received some pieces. O(bytes read); memory: the buffers.
pub(crate) fn read_staged<B: Staging, S: Sink<B>>(
    parts: &[Part],
    jobs: &[Job],
    bufs: &mut Vec<B>,
    readers: usize,
    sink: &mut S,
) -> Result<(), Failed> {
    let Some(capacity) = bufs.iter().map(Staging::capacity).min() else {
        return Err(Failed::new(
            0,
            Error::BadTensor {
                reason: "a staged read needs at least one buffer".to_owned(),
            },
        ));
    };
    let plan = windows(jobs, capacity);
    let verify = jobs.iter().any(|j| j.checksum.is_some());
    let mut trace = Trace::new();
    let failed = AtomicBool::new(false);
    // The window being read, and the end of the run, for the read-ahead.
    let reached = std::sync::atomic::AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // First in, first out: the buffer refilled next is the one whose copies
    // were queued longest ago (a stack would hand back the one just queued,
    // and every window would wait for its own copies).
    let mut free: std::collections::VecDeque<B> = std::mem::take(bufs).into();
    let n_bufs = free.len();
    let outcome = std::thread::scope(|s| {
        let (to_hasher, hasher_rx) = mpsc::channel::<(B, Vec<Piece>)>();
        let (back, back_rx) = mpsc::channel::<B>();
        // The checksums are checked on a thread of their own, beside the
        // reads; if the system refuses it, here, after each window's reads
        // (`hash_here` then holds the hash of the tensor under way).
        let failed_ref = &failed;
        let hash = move |(rx, back)| hash_windows(jobs, parts, rx, back, failed_ref);
        let (hasher, mut hash_here) = if !verify {
            (None, None)
        } else {
            match crate::threads::spawn_scoped(s, "scopetree-hash", (hasher_rx, back), hash) {
                Ok(h) => (Some(h), None),
                Err(_) => (None, Some(None::<(usize, Xxh3)>)),
            }
        };
        let mut first_err: Option<Failed> = None;
        let mut out_at_hasher = 0_usize;
        // A slow first window means the files come from the disk: a
        // thread then reads ahead of the windows (into the page cache,
        // through a small buffer), so that the disk never idles while a
        // window's copies are queued or its slowest reader finishes.
        let mut prefetch = None;
        for (w, window) in plan.iter().enumerate() {
            reached.store(w, Ordering::Relaxed);
            if failed.load(Ordering::Relaxed) {
                break;
            }
            let mut buf = match free.pop_front() {
                Some(b) => b,
                None => match back_rx.recv() {
                    Ok(b) => {
                        out_at_hasher -= 1;
                        b
                    }
                    Err(_) => break,
                },
            };
            let step = (|| {
                let first = window.first().map_or(0, |p| p.job);
                let t = trace.now();
                let bytes = buf.fill().map_err(|error| Failed::new(first, error))?;
                trace.add(0, t);
                let t = trace.now();
                let t_read = std::time::Instant::now();
                read_window(parts, jobs, window, bytes, readers)
                    .map_err(|error| Failed::new(first, error))?;
                trace.add(1, t);
                let used = window.last().map_or(0, |p| p.from + p.len);
                let rate = used as f64 / t_read.elapsed().as_secs_f64().max(1e-9);
                if w == 0 && prefetch.is_none() && plan.len() > 2 && rate < COLD_RATE {
                    let (plan, reached, stop) = (&plan, &reached, &stop);
                    // Refused a thread, the load reads without one.
                    prefetch =
                        crate::threads::spawn_scoped(s, "scopetree-read-ahead", (), move |()| {
                            read_ahead(parts, jobs, plan, reached, stop);
                        })
                        .ok();
                }
                let t = trace.now();
                for p in window {
                    if p.len > 0 {
                        sink.put(&mut buf, p.from, p.len, p.job, p.at)
                            .map_err(|error| Failed::new(p.job, error))?;
                    }
                }
                buf.queued();
                trace.add(2, t);
                trace.bytes += window.last().map_or(0, |p| p.from + p.len);
                trace.windows += 1;
                Ok(())
            })();
            if let Err(e) = step {
                first_err = Some(e);
                free.push_back(buf);
                break;
            }
            let checked = verify && window.iter().any(|p| jobs[p.job].checksum.is_some());
            if let (true, Some(state)) = (checked, hash_here.as_mut()) {
                let hashed = hash_window(jobs, parts, &mut buf, window, state);
                free.push_back(buf);
                if let Err(e) = hashed {
                    first_err = Some(e);
                    break;
                }
            } else if checked {
                out_at_hasher += 1;
                if let Err(mpsc::SendError((b, _))) = to_hasher.send((buf, window.clone())) {
                    out_at_hasher -= 1;
                    free.push_back(b);
                    break;
                }
            } else {
                free.push_back(buf);
            }
        }
        stop.store(true, Ordering::Relaxed);
        if let Some(p) = prefetch {
            let _ = p.join();
        }
        drop(to_hasher);
        for _ in 0..out_at_hasher {
            if let Ok(b) = back_rx.recv() {
                free.push_back(b);
            }
        }
        let hashed = match hasher {
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err(Failed::new(0, panicked("the checksum thread")))),
            None => Ok(()),
        };
        match (first_err, hashed) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(()),
        }
    });
    debug_assert_eq!(free.len(), n_bufs, "every buffer comes back");
    *bufs = free.into();
    trace.report(capacity, readers);
    outcome
}

/// Where a staged read's time went, printed to stderr when the
/// environment sets `SCOPETREE_TRACE_LOADS` (for the GPU benchmarks).
struct Trace {
    on: bool,
    /// Waiting for a buffer's copies, reading, handing pieces to the sink.
    secs: [f64; 3],
    bytes: usize,
    windows: usize,
    start: std::time::Instant,
}

impl Trace {
    fn new() -> Self {
        Self {
            on: std::env::var_os("SCOPETREE_TRACE_LOADS").is_some(),
            secs: [0.0; 3],
            bytes: 0,
            windows: 0,
            start: std::time::Instant::now(),
        }
    }
    fn now(&self) -> Option<std::time::Instant> {
        self.on.then(std::time::Instant::now)
    }
    fn add(&mut self, k: usize, t: Option<std::time::Instant>) {
        if let Some(t) = t {
            self.secs[k] += t.elapsed().as_secs_f64();
        }
    }
    fn report(&self, capacity: usize, readers: usize) {
        if self.on {
            eprintln!(
                "scopetree staged read: {} B in {} windows of {capacity} B, {readers} readers: \
                 {:.4} s in all; waiting for copies {:.4} s, reading {:.4} s, queueing copies {:.4} s",
                self.bytes,
                self.windows,
                self.start.elapsed().as_secs_f64(),
                self.secs[0],
                self.secs[1],
                self.secs[2]
            );
        }
    }
}

/// A first window read slower than this (bytes per second) came from the
/// disk, not the page cache: 4 GB/s.
const COLD_RATE: f64 = 4e9;

/// How many windows the read-ahead thread runs ahead of the readers.
const LEAD: usize = 3;

/// Reads the windows after the one being read, `LEAD` ahead at most,
/// through a 4 MiB buffer whose bytes are dropped: the page cache keeps
/// them for the readers. Stops at the end, at `stop`, or on any error (the
/// readers will meet it themselves).
fn read_ahead(
    parts: &[Part],
    jobs: &[Job],
    plan: &[Vec<Piece>],
    reached: &std::sync::atomic::AtomicUsize,
    stop: &AtomicBool,
) {
    let mut buf = vec![0_u8; 4 << 20];
    for (w, window) in plan.iter().enumerate().skip(1) {
        while w > reached.load(Ordering::Relaxed) + LEAD {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        for p in window {
            let job = &jobs[p.job];
            let file = &parts[job.part].file;
            let mut done = 0;
            while done < p.len {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let n = (p.len - done).min(buf.len());
                if read_at(file, &mut buf[..n], job.offset + (p.at + done) as u64).is_err() {
                    return;
                }
                done += n;
            }
        }
    }
}

fn panicked(what: &str) -> Error {
    Error::BadTensor {
        reason: format!("{what} of a staged read panicked"),
    }
}

/// Reads the pieces of `window` into `bytes`, split among up to `readers`
/// threads by byte range.
fn read_window(
    parts: &[Part],
    jobs: &[Job],
    window: &[Piece],
    bytes: &mut [u8],
    readers: usize,
) -> Result<(), Error> {
    let used = window.last().map_or(0, |p| p.from + p.len);
    let n = readers.min(used.div_ceil(MIN_READ)).max(1);
    if n == 1 {
        return read_range(parts, jobs, window, 0..used, &mut bytes[..used]);
    }
    // Pieces of about a quarter of a reader's share (at least 1 MiB), taken
    // by whichever reader is free: no reader waits for a slow one's share.
    let per = used.div_ceil(n * 4).max(MIN_READ).next_multiple_of(4096);
    let Some(pool) = readers_pool(n) else {
        // Refused the reader threads, this one reads the window.
        return read_range(parts, jobs, window, 0..used, &mut bytes[..used]);
    };
    pool.install(|| {
        use rayon::prelude::*;
        bytes[..used]
            .par_chunks_mut(per)
            .enumerate()
            .try_for_each(|(i, mine)| {
                let start = i * per;
                read_range(parts, jobs, window, start..start + mine.len(), mine)
            })
    })
}

/// A pool of `n` reader threads, made once per thread count and kept for
/// the process (making threads per window costs more than a window's
/// reads); `None` when the system refuses the threads.
fn readers_pool(n: usize) -> Option<std::sync::Arc<rayon::ThreadPool>> {
    use std::sync::{Arc, Mutex, PoisonError};
    static POOLS: Mutex<Vec<(usize, Arc<rayon::ThreadPool>)>> = Mutex::new(Vec::new());
    if crate::threads::refused() {
        return None;
    }
    let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, p)) = pools.iter().find(|(k, _)| *k == n) {
        return Some(Arc::clone(p));
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("scopetree-reader-{i}"))
        .build()
        .ok()?;
    let p = Arc::new(p);
    pools.push((n, Arc::clone(&p)));
    Some(p)
}

/// Reads the bytes of `window` that fall in `range` of the buffer into
/// `into` (which is that range).
fn read_range(
    parts: &[Part],
    jobs: &[Job],
    window: &[Piece],
    range: Range<usize>,
    into: &mut [u8],
) -> Result<(), Error> {
    for p in window {
        let (a, b) = (p.from.max(range.start), (p.from + p.len).min(range.end));
        if a >= b {
            continue;
        }
        let job = &jobs[p.job];
        let part = &parts[job.part];
        let at = job.offset + (p.at + (a - p.from)) as u64;
        read_at(&part.file, &mut into[a - range.start..b - range.start], at)
            .map_err(Error::io(&part.path.to_string_lossy()))?;
    }
    Ok(())
}

/// A read into lent bytes.
pub(crate) type ReadInto<'a> = &'a mut dyn FnMut(&mut [u8]) -> Result<(), Error>;

/// Destinations in host memory that a read fills directly, with no
/// staging: each job's bytes, lent for the time of its read.
pub(crate) trait Direct {
    /// Lends the bytes of job `job`'s destination to `read`.
    ///
    /// # Errors
    /// `read`'s, or the destination's when it cannot lend its bytes.
    fn with_bytes(&mut self, job: usize, read: ReadInto<'_>) -> Result<(), Error>;
}

/// Reads each of `jobs` straight into its destination in host memory, a
/// large one split among up to `readers` threads by byte range, and checks
/// its checksum on the bytes read. Returns the first error; destinations
/// before it hold their bytes. O(bytes read); memory: none beyond the
/// destinations.
pub(crate) fn read_direct(
    parts: &[Part],
    jobs: &[Job],
    readers: usize,
    dst: &mut dyn Direct,
) -> Result<(), Failed> {
    for (j, job) in jobs.iter().enumerate() {
        let part = &parts[job.part];
        let shown = part.path.to_string_lossy();
        let mut read = |bytes: &mut [u8]| -> Result<(), Error> {
            if bytes.len() != job.len {
                return Err(Error::BadTensor {
                    reason: format!(
                        "a destination of {} bytes for `{}` of {} bytes",
                        bytes.len(),
                        short::path(&job.key),
                        job.len
                    ),
                });
            }
            read_split(&part.file, bytes, job.offset, readers).map_err(Error::io(&shown))?;
            if let Some(want) = job.checksum {
                if xxhash_rust::xxh3::xxh3_128(bytes) != want {
                    return Err(Error::Corrupted {
                        key: job.key.clone(),
                        path: short::path(&shown),
                    });
                }
            }
            Ok(())
        };
        dst.with_bytes(j, &mut read)
            .map_err(|error| Failed::new(j, error))?;
    }
    Ok(())
}

/// Reads `buf.len()` bytes of `file` at `at` into `buf`, split among up to
/// `readers` threads when it is large.
fn read_split(file: &File, buf: &mut [u8], at: u64, readers: usize) -> std::io::Result<()> {
    let n = readers.min(buf.len() / MIN_READ).max(1);
    if n == 1 {
        return read_at(file, buf, at);
    }
    let per = buf
        .len()
        .div_ceil(n * 4)
        .max(MIN_READ)
        .next_multiple_of(4096);
    let Some(pool) = readers_pool(n) else {
        // Refused the reader threads, this one reads it all.
        return read_at(file, buf, at);
    };
    pool.install(|| {
        use rayon::prelude::*;
        buf.par_chunks_mut(per)
            .enumerate()
            .try_for_each(|(i, piece)| read_at(file, piece, at + (i * per) as u64))
    })
}

/// Checks the checksums `jobs` carry against their bytes in the files,
/// reading each through a 1 MiB buffer, jobs spread over up to `readers`
/// threads: what a load verifies before it writes anything in place.
/// O(bytes of the jobs with a checksum); memory: 1 MiB per thread.
pub(crate) fn verify(parts: &[Part], jobs: &[Job], readers: usize) -> Result<(), Failed> {
    let todo: Vec<usize> = (0..jobs.len())
        .filter(|&j| jobs[j].checksum.is_some())
        .collect();
    let n = readers.max(1).min(todo.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let check = || -> Result<(), Failed> {
        let mut buf = vec![0_u8; MIN_READ];
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            let Some(&j) = todo.get(k) else {
                return Ok(());
            };
            let job = &jobs[j];
            let part = &parts[job.part];
            let shown = part.path.to_string_lossy();
            let mut h = Xxh3::new();
            let mut done = 0;
            while done < job.len {
                let m = (job.len - done).min(buf.len());
                read_at(&part.file, &mut buf[..m], job.offset + done as u64)
                    .map_err(|e| Failed::new(j, Error::io(&shown)(e)))?;
                h.update(&buf[..m]);
                done += m;
            }
            if Some(h.digest128()) != job.checksum {
                return Err(Failed::new(
                    j,
                    Error::Corrupted {
                        key: job.key.clone(),
                        path: short::path(&shown),
                    },
                ));
            }
        }
    };
    std::thread::scope(|s| {
        // This thread and `n - 1` helpers take the jobs in turn; a helper
        // the system refuses leaves its share to the others.
        let helpers: Vec<_> = (1..n)
            .filter_map(|_| {
                crate::threads::spawn_scoped(s, "scopetree-verify", (), |()| check()).ok()
            })
            .collect();
        let mut first = check().err();
        for h in helpers {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(Failed::new(0, panicked("a checksum thread"))));
            if let (Err(e), None) = (r, &first) {
                first = Some(e);
            }
        }
        first.map_or(Ok(()), Err)
    })
}

#[cfg(unix)]
pub(crate) fn read_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

#[cfg(windows)]
pub(crate) fn read_at(file: &File, mut buf: &mut [u8], mut at: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, at) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The hasher thread: hashes each window's pieces in order, job by job,
/// checks every job that ends against its checksum, and hands each buffer
/// back. Stops at the first mismatch (setting `failed`), still handing
/// back every buffer it receives.
fn hash_windows<B: Staging>(
    jobs: &[Job],
    parts: &[Part],
    rx: mpsc::Receiver<(B, Vec<Piece>)>,
    back: mpsc::Sender<B>,
    failed: &AtomicBool,
) -> Result<(), Failed> {
    let mut state: Option<(usize, Xxh3)> = None;
    let mut outcome = Ok(());
    for (mut buf, window) in rx {
        if outcome.is_ok() {
            outcome = hash_window(jobs, parts, &mut buf, &window, &mut state);
            if outcome.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
        }
        if back.send(buf).is_err() {
            break;
        }
    }
    outcome
}

fn hash_window<B: Staging>(
    jobs: &[Job],
    parts: &[Part],
    buf: &mut B,
    window: &[Piece],
    state: &mut Option<(usize, Xxh3)>,
) -> Result<(), Failed> {
    let first = window.first().map_or(0, |p| p.job);
    let bytes = buf.staged().map_err(|error| Failed::new(first, error))?;
    for p in window {
        let job = &jobs[p.job];
        let Some(want) = job.checksum else {
            continue;
        };
        if p.at == 0 {
            *state = Some((p.job, Xxh3::new()));
        }
        let Some((j, h)) = state.as_mut().filter(|(j, _)| *j == p.job) else {
            unreachable!("the pieces of a job come in order, its first first")
        };
        debug_assert_eq!(*j, p.job);
        h.update(&bytes[p.from..p.from + p.len]);
        if p.at + p.len == job.len {
            if h.digest128() != want {
                return Err(Failed::new(
                    p.job,
                    Error::Corrupted {
                        key: job.key.clone(),
                        path: short::path(&parts[job.part].path.to_string_lossy()),
                    },
                ));
            }
            *state = None;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(len: usize) -> Job {
        Job {
            part: 0,
            offset: 0,
            len,
            key: String::new(),
            checksum: None,
        }
    }

    /// Every byte of every job is in exactly one piece, pieces of a job in
    /// order, every piece inside its buffer and starting on ALIGN bytes.
    #[test]
    fn windows_cover_every_byte_once_aligned_and_in_order() {
        let lens = [3, 0, 100, 7, 4096, 1, 65_536, 10_000, 2];
        let jobs: Vec<Job> = lens.iter().map(|&l| job(l)).collect();
        for capacity in [64, 256, 1000, 4096, 1 << 20] {
            let ws = windows(&jobs, capacity);
            let mut next = vec![0_usize; jobs.len()];
            let mut seen_empty = vec![false; jobs.len()];
            for w in &ws {
                assert!(!w.is_empty());
                let mut end = 0;
                for p in w {
                    assert_eq!(p.from % ALIGN, 0, "{p:?}");
                    assert!(p.from >= end, "{p:?} overlaps");
                    assert!(p.from + p.len <= capacity, "{p:?} past {capacity}");
                    assert_eq!(p.at, next[p.job], "{p:?} out of order");
                    if p.at + p.len < jobs[p.job].len {
                        assert_eq!((p.at + p.len) % ALIGN, 0, "{p:?} cut off ALIGN");
                    }
                    next[p.job] += p.len;
                    seen_empty[p.job] |= jobs[p.job].len == 0;
                    end = p.from + p.len;
                }
            }
            for (j, l) in lens.iter().enumerate() {
                assert_eq!(next[j], *l, "job {j} at capacity {capacity}");
                if *l == 0 {
                    assert!(seen_empty[j], "the empty job {j} gets a piece");
                }
            }
        }
    }

    /// A buffer that knows which it is.
    struct Tagged(usize, Vec<u8>);

    impl Staging for Tagged {
        fn capacity(&self) -> usize {
            self.1.len()
        }
        fn fill(&mut self) -> Result<&mut [u8], Error> {
            Ok(&mut self.1)
        }
        fn staged(&mut self) -> Result<&[u8], Error> {
            Ok(&self.1)
        }
    }

    /// Which buffer each piece came from, in order.
    struct Record(Vec<usize>);

    impl Sink<Tagged> for Record {
        fn put(
            &mut self,
            buf: &mut Tagged,
            _: usize,
            _: usize,
            _: usize,
            _: usize,
        ) -> Result<(), Error> {
            self.0.push(buf.0);
            Ok(())
        }
    }

    /// Windows take the buffers in turn: the one refilled is the one whose
    /// copies were queued longest ago, never the one just queued.
    #[test]
    fn windows_take_the_buffers_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, vec![7_u8; 6 * MIN_BUFFER]).unwrap();
        let parts = [Part::new(path.clone(), File::open(&path).unwrap(), 0, None)];
        let jobs: Vec<Job> = (0..6)
            .map(|i| Job {
                part: 0,
                offset: (i * MIN_BUFFER) as u64,
                len: MIN_BUFFER,
                key: format!("t{i}"),
                checksum: None,
            })
            .collect();
        let mut bufs = vec![
            Tagged(0, vec![0; MIN_BUFFER]),
            Tagged(1, vec![0; MIN_BUFFER]),
        ];
        let mut rec = Record(Vec::new());
        read_staged(&parts, &jobs, &mut bufs, 2, &mut rec).unwrap();
        assert_eq!(rec.0, [0, 1, 0, 1, 0, 1]);
        assert_eq!(bufs.len(), 2);
    }

    #[test]
    fn the_shape_halves_the_budget_and_never_exceeds_what_the_jobs_need() {
        let s = Shape::new(256 << 20, 8, 1 << 30);
        assert_eq!((s.buffers, s.buffer, s.readers), (2, 16 << 20, 8));
        assert_eq!(Shape::new(16 << 20, 8, 1 << 30).buffer, 8 << 20);
        let small = Shape::new(256 << 20, 0, 10_000);
        assert_eq!((small.buffer, small.readers), (MIN_BUFFER, 1));
        assert_eq!(Shape::new(1000, 2, 1 << 30).buffer, MIN_BUFFER);
    }
}
