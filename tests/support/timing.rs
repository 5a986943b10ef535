//! Complexity-ratio timing for the release-mode scaling tests (issue 9).
//!
//! A [`Scaling`] times one operation per unit of work (per call, per level,
//! per item) at a small size (10^3–10^4) and a large one (10^5), keeps the
//! minimum over several runs of each, and fails when the large figure passes
//! [`MAX_RATIO`] times the small one. Runs of the two sizes alternate, so a
//! burst of load on the machine hits both.
//!
//! # Same memory footprint at both sizes
//!
//! The small size is measured on `large / small` independent copies of its
//! state, and consecutive operations go to different copies. Both sizes then
//! touch the same amount of memory, so what the ratio shows is how the cost
//! grows with the size of one structure (the complexity), not how it grows
//! once a working set of 10^5 items no longer fits the caches: measured on
//! a single copy, a hash probe at 10^5 costs 3–5x the probe at 10^4 on the
//! 2-core build machine under load, with nothing quadratic about it.
//!
//! # The allocator
//!
//! glibc serves a request above its mmap threshold (128 KiB in a fresh
//! process) with a mapping of its own and unmaps it on free, and trims the
//! heap top past twice the threshold; it raises the threshold as large
//! chunks are freed. So in a fresh process an operation that allocates a few
//! MiB per call at 10^5 (a worker split does) pays page faults on every call
//! that the same operation at 10^4 does not: measured, 52 ns per variable
//! against 14 for `split_workers`, depending only on which test ran first.
//! Before its first measurement a binary allocates and frees one 30 MiB
//! block, which raises the threshold to that size as a long-running process
//! does by itself, so that every test sees the allocator in the same state.
//!
//! Every `check` of a test binary holds one lock while it measures, so the
//! timed tests of a binary run one at a time even though libtest runs tests
//! on several threads; tests that do not time anything still run alongside.
//!
//! Include it with `#[path = "support/timing.rs"] mod timing;`.

#![allow(dead_code)]

use std::sync::{Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

/// The most the cost per unit may grow from the small size to the large one.
pub const MAX_RATIO: f64 = 3.0;

/// Rounds (one run of each size) done before a passing ratio is accepted.
const MIN_ROUNDS: usize = 5;
/// Rounds done at most: a ratio above [`MAX_RATIO`] after [`MIN_ROUNDS`] gets
/// more runs before the test fails, in case load on the machine caused it.
const MAX_ROUNDS: usize = 10;
/// After this much time in one `check`, no new round starts (once two rounds
/// are done): a quadratic operation at 10^5 must not hold CI for minutes.
const BUDGET: Duration = Duration::from_secs(3);
/// A run stops early once it has taken this long, and its cost per unit is
/// taken over the operations done so far. Only an operation far slower than
/// its documented cost gets near it.
const RUN_CAP: Duration = Duration::from_millis(300);
/// Operations between two reads of the clock inside a run, once the run is
/// under way: the first reads come after 1, 2, 4, … operations, so that an
/// operation far slower than its documented cost ends its run after one
/// call rather than after `CHUNK`.
const CHUNK: usize = 64;

static SERIAL: Mutex<()> = Mutex::new(());

/// Raises glibc's mmap threshold once per binary (see the module doc).
fn settle_allocator() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let block = vec![1_u8; 30 << 20];
        drop(std::hint::black_box(block));
    });
}

/// One operation timed at two sizes. Build it with [`Scaling::new`], adjust
/// it, then [`check`](Scaling::check) it.
#[derive(Clone, Debug)]
pub struct Scaling {
    what: String,
    unit: &'static str,
    sizes: [usize; 2],
    /// Independent states measured at each size (see the module doc).
    copies: [usize; 2],
    /// Operations per run at each size, over all copies.
    ops: [usize; 2],
    units_per_op: [f64; 2],
    fresh: bool,
}

/// What a [`Scaling::check`] measured.
#[derive(Copy, Clone, Debug)]
pub struct Measured {
    /// Nanoseconds per unit at the small size (minimum over runs).
    pub small_ns: f64,
    /// Nanoseconds per unit at the large size (minimum over runs).
    pub large_ns: f64,
    /// `large_ns / small_ns`.
    pub ratio: f64,
    /// Runs of each size.
    pub rounds: usize,
    /// Time spent measuring, builds included.
    pub elapsed: Duration,
}

impl Scaling {
    /// `what` is timed per `unit` at sizes `small` and `large`. By default a
    /// run does `size` operations of one unit each on every copy of the
    /// state (so `large` operations at each size), on states built once per
    /// size and reused by every run.
    pub fn new(what: impl Into<String>, unit: &'static str, small: usize, large: usize) -> Self {
        let copies = [(large / small.max(1)).max(1), 1];
        Scaling {
            what: what.into(),
            unit,
            sizes: [small, large],
            copies,
            ops: [small * copies[0], large],
            units_per_op: [1.0, 1.0],
            fresh: false,
        }
    }

    /// Operations per run at each size (over all copies), as a function of
    /// the size.
    pub fn ops(mut self, f: impl Fn(usize) -> usize) -> Self {
        self.ops = self.sizes.map(|n| f(n).max(1));
        self
    }

    /// One operation per copy and run: for an operation that consumes the
    /// whole state in one call.
    pub fn once_per_copy(mut self) -> Self {
        self.ops = self.copies;
        self
    }

    /// Units of work in one operation, as a function of the size (for
    /// example the size itself when one call walks every item).
    pub fn units_per_op(mut self, f: impl Fn(usize) -> f64) -> Self {
        self.units_per_op = self.sizes.map(f);
        self
    }

    /// Builds a new state before every run (for operations that consume it,
    /// such as removals). Building and dropping it are not timed.
    pub fn fresh(mut self) -> Self {
        self.fresh = true;
        self
    }

    /// Times `op(state, i)` on states made by `build(size)`, and fails if
    /// the cost per unit at the large size passes [`MAX_RATIO`] times the
    /// cost at the small size. Operation `j` of a run goes to copy
    /// `j % copies` with `i = j / copies`, so each copy sees `i = 0, 1, …`.
    pub fn check<S>(
        &self,
        build: impl FnMut(usize) -> S,
        op: impl FnMut(&mut S, usize),
    ) -> Measured {
        let m = self.measure(build, op);
        eprintln!(
            "scaling: {}: {:.1} ns/{} at {} (x{}), {:.1} ns/{} at {}: ratio {:.2} ({} runs each, {:.1?})",
            self.what,
            m.small_ns,
            self.unit,
            self.sizes[0],
            self.copies[0],
            m.large_ns,
            self.unit,
            self.sizes[1],
            m.ratio,
            m.rounds,
            m.elapsed
        );
        assert!(
            m.ratio <= MAX_RATIO,
            "{}: {:.1} ns per {} at size {} against {:.1} ns at size {}: {:.2}x, more than \
             {MAX_RATIO}x (minimum of {} runs each; issue 9)",
            self.what,
            m.large_ns,
            self.unit,
            self.sizes[1],
            m.small_ns,
            self.sizes[0],
            m.ratio,
            m.rounds
        );
        m
    }

    /// [`check`](Self::check) without the assertion.
    pub fn measure<S>(
        &self,
        mut build: impl FnMut(usize) -> S,
        mut op: impl FnMut(&mut S, usize),
    ) -> Measured {
        let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        settle_allocator();
        let start = Instant::now();
        let mut kept: [Option<Vec<S>>; 2] = [None, None];
        let mut best = [f64::INFINITY; 2];
        let mut rounds = 0;
        loop {
            for k in 0..2 {
                let mut state = match kept[k].take() {
                    Some(s) => s,
                    None => (0..self.copies[k]).map(|_| build(self.sizes[k])).collect(),
                };
                let ns = time_run(&mut state, self.ops[k], &mut op);
                best[k] = best[k].min(ns / self.units_per_op[k]);
                if !self.fresh {
                    kept[k] = Some(state);
                }
            }
            rounds += 1;
            let ratio = best[1] / best[0];
            let passing = ratio <= MAX_RATIO;
            let done = (passing && rounds >= MIN_ROUNDS)
                || rounds >= MAX_ROUNDS
                || (rounds >= 2 && (start.elapsed() > BUDGET || ratio > 4.0 * MAX_RATIO));
            if done {
                return Measured {
                    small_ns: best[0],
                    large_ns: best[1],
                    ratio,
                    rounds,
                    elapsed: start.elapsed(),
                };
            }
        }
    }
}

/// Runs `op` for `0..ops`, spread over the copies (stopping early past
/// [`RUN_CAP`]), and returns the nanoseconds per operation done.
fn time_run<S>(copies: &mut [S], ops: usize, op: &mut impl FnMut(&mut S, usize)) -> f64 {
    let c = copies.len();
    let start = Instant::now();
    let mut done = 0;
    let mut chunk = 1;
    while done < ops {
        let end = (done + chunk).min(ops);
        for j in done..end {
            op(&mut copies[j % c], j / c);
        }
        done = end;
        if start.elapsed() > RUN_CAP {
            break;
        }
        chunk = (chunk * 2).min(CHUNK);
    }
    start.elapsed().as_nanos() as f64 / done as f64
}
