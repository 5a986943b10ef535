//! The watchdog: a rank that waits too long in a collective call ends its
//! process, so that the launcher (`mpirun`) ends the job instead of letting
//! it hang. A blocking MPI call cannot be interrupted from its own thread,
//! but another thread can end the process.
//!
//! One process-wide thread, started by the first [`Watch`] armed with a
//! timeout, looks every so often at what each thread of the process waits
//! in. A [`Watch`] is armed for the whole of a collective call and disarmed
//! when dropped, restoring the watch it replaced (calls nest). Arming costs
//! one uncontended lock, a clock read and a reference count; no allocation
//! after a thread's first arm.
//!
//! This file imports nothing of the plans: they arm a [`Watch`] around each
//! of their collective calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, PoisonError, Weak};
use std::time::{Duration, Instant};

/// The default timeout of a plan's collective calls: 10 minutes, as
/// PyTorch's for NCCL (the NCCL watchdog's).
///
/// ```
/// assert_eq!(scopetree::ranks::DEFAULT_TIMEOUT.as_secs(), 600);
/// ```
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The status a process exits with when the watchdog ends it: 3. Under
/// `mpirun`, the job then ends with it.
///
/// ```
/// assert_eq!(scopetree::ranks::STALL_EXIT_CODE, 3);
/// ```
pub const STALL_EXIT_CODE: i32 = 3;

/// The step [`Watch::set_step`] set last; `u64::MAX` while none was set.
static STEP: AtomicU64 = AtomicU64::new(u64::MAX);

/// The shortest timeout armed so far, in milliseconds: the watchdog looks
/// twenty times per such timeout (at most every second, at least every 10
/// ms).
static SHORTEST_MS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Every thread's slot, weakly (a thread's slot dies with the thread).
static SLOTS: Mutex<Vec<Weak<Slot>>> = Mutex::new(Vec::new());

/// Starts the watchdog's thread once.
static STARTED: Once = Once::new();

thread_local! {
    /// This thread's slot, registered with the watchdog on first use.
    static SLOT: Arc<Slot> = register();
}

/// What one thread waits in, if anything.
#[derive(Default)]
struct Slot(Mutex<Option<Armed>>);

/// A collective call being watched: what to print, and when to end.
#[derive(Clone)]
struct Armed {
    rank: usize,
    op: &'static str,
    of: Arc<str>,
    since: Instant,
    deadline: Instant,
    timeout: Duration,
}

/// Locks `m`, whatever a panic left in it (the data is plain values).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A new slot for this thread, registered with the watchdog.
fn register() -> Arc<Slot> {
    let slot = Arc::new(Slot::default());
    lock(&SLOTS).push(Arc::downgrade(&slot));
    slot
}

/// A collective call watched from [`arm`](Self::arm) until the `Watch`
/// drops: if the call is still running when its timeout has passed, the
/// process prints one line to stderr naming the rank, the call, the scope,
/// the step (see [`set_step`](Self::set_step)) and the time waited, and
/// exits with [`STALL_EXIT_CODE`]. The plans ([`SyncPlan`](crate::ranks::SyncPlan),
/// `CandlePlan`) arm one around each of their collective calls, with the
/// timeout of their [`PlanOptions`](crate::ranks::PlanOptions); arm one around
/// collective calls of your own.
///
/// Watches are per thread and nest: a watch armed while another is armed
/// on the same thread replaces it, and restores it on drop (the outer
/// call's deadline stays the one it was armed with). Drop watches in the
/// reverse order of arming, as scopes do.
///
/// The process ends from the watchdog's thread with
/// `std::process::exit`: no destructor runs, and MPI is not finalised
/// (Open MPI's `mpirun` then ends every rank of the job, a stopped one
/// included, and exits with this status).
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use scopetree::ranks::{Collective, SingleProcess, Watch};
/// let world = SingleProcess;
/// let of: Arc<str> = "the training statistics".into();
/// let mut sum = [0.0_f64; 2];
/// {
///     let _watch = Watch::arm(world.rank(), "all-reduce", &of, Some(Duration::from_secs(60)));
///     world.all_reduce_sum_f64(&[1.0, 2.0], &mut sum)?;
/// } // disarmed here
/// assert_eq!(sum, [1.0, 2.0]);
/// # Ok::<(), scopetree::ranks::Error>(())
/// ```
#[must_use = "a watch is disarmed when dropped: bind it to a variable for the call's duration"]
pub struct Watch {
    slot: Arc<Slot>,
    /// The watch this one replaced, restored on drop.
    outer: Option<Armed>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("nested", &self.outer.is_some())
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// Watches the collective call `op` (for example `"all-reduce"`) of
    /// `of` (what it synchronises, for example ``"scope `optim`"``) on
    /// rank `rank`, for `timeout` from now; `None` (or a timeout past the
    /// clock's range) watches nothing until the watch drops, the replaced
    /// watch included. The first watch with a timeout starts the watchdog's
    /// thread. O(1): one uncontended lock, a clock read, a reference count;
    /// allocates only on the thread's first call.
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use scopetree::ranks::Watch;
    /// let of: Arc<str> = "scope `grads`".into();
    /// let outer = Watch::arm(0, "all-reduce", &of, Some(Duration::from_secs(600)));
    /// let inner = Watch::arm(0, "consistency check", &of, None); // unwatched meanwhile
    /// drop(inner); // the all-reduce is watched again
    /// drop(outer);
    /// ```
    pub fn arm(rank: usize, op: &'static str, of: &Arc<str>, timeout: Option<Duration>) -> Self {
        let armed = timeout.and_then(|timeout| {
            let since = Instant::now();
            let deadline = since.checked_add(timeout)?;
            Some(Armed {
                rank,
                op,
                of: Arc::clone(of),
                since,
                deadline,
                timeout,
            })
        });
        if let Some(a) = &armed {
            let ms = u64::try_from(a.timeout.as_millis()).unwrap_or(u64::MAX);
            if ms < SHORTEST_MS.load(Ordering::Relaxed) {
                SHORTEST_MS.fetch_min(ms, Ordering::Relaxed);
            }
            start();
        }
        let slot = SLOT.with(Arc::clone);
        let outer = std::mem::replace(&mut *lock(&slot.0), armed);
        Watch { slot, outer }
    }

    /// Sets the training step that the watchdog's message names (the step
    /// in which a call stalled), for every thread of the process: call it
    /// once per step of the training loop. O(1).
    ///
    /// ```
    /// scopetree::ranks::Watch::set_step(1234);
    /// ```
    pub fn set_step(step: u64) {
        STEP.store(step, Ordering::Relaxed);
    }

    /// The operation this thread's innermost armed watch watches, if any.
    #[cfg(test)]
    fn current() -> Option<&'static str> {
        SLOT.with(|s| lock(&s.0).as_ref().map(|a| a.op))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        *lock(&self.slot.0) = self.outer.take();
    }
}

/// Starts the watchdog's thread, once. If the system cannot start a
/// thread, says so once on stderr; the calls then run unwatched.
fn start() {
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("scopetree-watchdog".into())
            .spawn(watch_forever);
        if let Err(e) = spawned {
            eprintln!("scopetree watchdog: could not start its thread ({e}); collective calls run unwatched");
        }
    });
}

/// How long the watchdog sleeps between looks: a twentieth of the shortest
/// timeout armed so far, within 10 ms and 1 s.
fn interval() -> Duration {
    let ms = SHORTEST_MS.load(Ordering::Relaxed) / 20;
    Duration::from_millis(ms.clamp(10, 1000))
}

/// The watchdog's thread: looks at every thread's slot, ends the process on
/// the first call past its deadline.
fn watch_forever() {
    loop {
        std::thread::sleep(interval());
        let now = Instant::now();
        let late = {
            let mut slots = lock(&SLOTS);
            slots.retain(|s| s.strong_count() > 0);
            slots
                .iter()
                .filter_map(Weak::upgrade)
                .find_map(|s| lock(&s.0).as_ref().filter(|a| now >= a.deadline).cloned())
        };
        if let Some(a) = late {
            let step = STEP.load(Ordering::Relaxed);
            let line = message(&a, now - a.since, (step != u64::MAX).then_some(step));
            // One write, so that ranks' lines do not interleave.
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            std::process::exit(STALL_EXIT_CODE);
        }
    }
}

/// The line the watchdog prints before it ends the process.
fn message(a: &Armed, waited: Duration, step: Option<u64>) -> String {
    let step = step.map_or(String::new(), |s| format!(" (step {s})"));
    format!(
        "scopetree watchdog: rank {} waited {:.1} s in {} of {}{step}; timeout {} passed: \
         exiting with status {STALL_EXIT_CODE} (a rank stalled, died or skipped this call)\n",
        a.rank,
        waited.as_secs_f64(),
        a.op,
        a.of,
        seconds(a.timeout),
    )
}

/// A duration as `600 s` or `1.5 s` (the shortest decimal that reads back).
fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_watches_restore_the_outer_one() {
        let of: Arc<str> = "scope `w`".into();
        let long = Some(Duration::from_secs(3600));
        assert_eq!(Watch::current(), None);
        let outer = Watch::arm(0, "all-reduce", &of, long);
        assert_eq!(Watch::current(), Some("all-reduce"));
        {
            let _inner = Watch::arm(0, "consistency check", &of, long);
            assert_eq!(Watch::current(), Some("consistency check"));
            let _off = Watch::arm(0, "broadcast", &of, None);
            assert_eq!(Watch::current(), None);
        }
        assert_eq!(Watch::current(), Some("all-reduce"));
        drop(outer);
        assert_eq!(Watch::current(), None);
        // A timeout past the clock's range watches nothing.
        let _never = Watch::arm(0, "barrier", &of, Some(Duration::MAX));
        assert_eq!(Watch::current(), None);
    }

    #[test]
    fn the_message_names_the_rank_call_scope_step_and_times() {
        let since = Instant::now();
        let a = Armed {
            rank: 1,
            op: "all-reduce",
            of: "scope `optim`".into(),
            since,
            deadline: since,
            timeout: Duration::from_secs(600),
        };
        assert_eq!(
            message(&a, Duration::from_millis(600_049), Some(1234)),
            "scopetree watchdog: rank 1 waited 600.0 s in all-reduce of scope `optim` (step 1234); \
             timeout 600 s passed: exiting with status 3 (a rank stalled, died or skipped this call)\n"
        );
        assert!(!message(&a, Duration::from_secs(1), None).contains("step"));
        assert_eq!(seconds(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(seconds(Duration::from_millis(250)), "0.25 s");
        assert_eq!(seconds(Duration::from_secs(5)), "5 s");
    }
}
