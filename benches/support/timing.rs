//! Timing helpers shared by the benches (criterion's `iter_custom`).

#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

/// Times `write`, which replaces the file `target`, each timed run starting
/// after `target`'s dirty pages were flushed to disk (untimed; nothing to
/// flush if it does not exist yet). Without the flush a run pays for
/// whatever writeback earlier runs, of this benchmark or the one before,
/// left pending, and the medians of the checkpoint writers moved by 2x from
/// run to run. With it every writer replaces a clean file in the page
/// cache: the same starting state for all.
pub fn after_sync(b: &mut criterion::Bencher<'_>, target: &Path, mut write: impl FnMut()) {
    b.iter_custom(|iters| {
        let mut timed = Duration::ZERO;
        for _ in 0..iters {
            if let Ok(f) = std::fs::File::open(target) {
                f.sync_all().expect("flush the file about to be replaced");
            }
            let start = Instant::now();
            write();
            timed += start.elapsed();
        }
        timed
    });
}

/// `iters` runs of `timed`, each paired with one untimed run of `other`,
/// the order alternating (`timed` first on even iterations): the time of
/// the `timed` runs alone. Two benchmark functions that each interleave
/// the other's work measure over the same minutes of the machine, so drift
/// between functions cannot show up as a gap between them.
pub fn interleaved(iters: u64, mut timed: impl FnMut(), mut other: impl FnMut()) -> Duration {
    interleaved_timed(
        iters,
        || {
            let start = Instant::now();
            timed();
            start.elapsed()
        },
        || {
            other();
            Duration::ZERO
        },
    )
}

/// As [`interleaved`], for runs that time themselves (to leave their setup
/// and drops out): the sum of the durations `timed` returns.
pub fn interleaved_timed(
    iters: u64,
    mut timed: impl FnMut() -> Duration,
    mut other: impl FnMut() -> Duration,
) -> Duration {
    let mut total = Duration::ZERO;
    for i in 0..iters {
        if i % 2 == 1 {
            other();
        }
        total += timed();
        if i % 2 == 0 {
            other();
        }
    }
    total
}
