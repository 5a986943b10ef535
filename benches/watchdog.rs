//! The watchdog's cost on the hot path: arming a `ranks::Watch` and
//! dropping it, as every collective call of a plan does.
//!
//! Group `watchdog`: `arm_drop` arms a watch with the default timeout and
//! drops it; `arm_drop_nested` does so inside an armed watch (a plan call
//! inside a call of one's own); `arm_drop_none` arms one without a timeout
//! (`PlanOptions::without_timeout`). Compare with a 1 MB all-reduce under
//! `mpirun -np 2` (`ranks_bench`'s last line, `docs/ranks/watchdog.md`).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use scopetree::ranks::{DEFAULT_TIMEOUT, Watch};

fn watchdog(c: &mut Criterion) {
    let of: Arc<str> = "scope `optim`".into();
    let mut g = c.benchmark_group("watchdog");
    g.bench_function("arm_drop", |b| {
        b.iter(|| {
            drop(Watch::arm(
                0,
                "all-reduce",
                black_box(&of),
                Some(DEFAULT_TIMEOUT),
            ))
        })
    });
    g.bench_function("arm_drop_nested", |b| {
        let _outer = Watch::arm(0, "outer", &of, Some(DEFAULT_TIMEOUT));
        b.iter(|| {
            drop(Watch::arm(
                0,
                "all-reduce",
                black_box(&of),
                Some(DEFAULT_TIMEOUT),
            ))
        })
    });
    g.bench_function("arm_drop_none", |b| {
        b.iter(|| drop(Watch::arm(0, "all-reduce", black_box(&of), None)))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = watchdog
}
criterion_main!(benches);
