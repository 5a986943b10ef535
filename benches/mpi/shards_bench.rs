//! Times checkpoints across ranks under `mpirun` (feature `mpi`): every rank
//! writing a shard ([`SyncPlan::save_shards`]) against one rank writing
//! everything ([`SyncPlan::save_on_root`], root 0), and every rank reading a
//! share ([`SyncPlan::load_shards`]) against every rank reading everything
//! ([`SyncPlan::load_on_all`]).
//!
//! ```text
//! cargo build --release --features mpi --example shards_bench
//! mpirun -np 2 target/release/examples/shards_bench [MIB] [ROUNDS] [DIR] [--cold] [--zero]
//! ```
//!
//! - The state: 300 `f32` tensors of sizes growing as i² (the largest about
//!   1 % of the whole), `MIB` MiB in all (1024 by default), the same on
//!   every rank, in one plan with the default bucket.
//! - Each of `ROUNDS` rounds (5 by default, after one warm-up round) runs
//!   `save_shards`, `load_shards`, `save_on_root`, `load_on_all` in turn
//!   (odd rounds start with the last two), so that load from other
//!   processes and each call's after-effects hit them alike, into new files each
//!   round (as a checkpoint manager writes a directory per step), in a
//!   directory made under `DIR` (default `$TMPDIR`, else `/tmp`); each
//!   round's files are removed after it.
//! - Time: every rank starts the call after a barrier and stops its clock
//!   when the call returns (each call ends with its own exchange of
//!   outcomes); the figure is the slowest rank's. After each save, every
//!   rank that wrote a file flushes it to the disk (`fsync`), timed apart.
//!   `save_shards` flushes its shards itself before the ranks agree they
//!   are written, so its time includes the disk's and its flush here finds
//!   little left; `save_on_root` does not, so its time is the time to hand
//!   the bytes to the page cache: compare the two with the flush
//!   (`with_fsync`).
//! - Bytes: what the call reports (`ShardedSave::bytes`,
//!   `ShardedLoad::bytes`; `save_on_root` writes all on rank 0,
//!   `load_on_all` reads all on every rank), and what the process read and
//!   wrote through system calls (`rchar`, `wchar` of `/proc/self/io`,
//!   headers included), and what came from storage rather than the page
//!   cache (`read_bytes`; with `--cold`, the loads' real reads).
//! - Peak extra memory, two ways. The heap: a counting global allocator
//!   (`tests/support/peak_alloc.rs`) gives the most bytes the calling
//!   thread held during the call above what it held before. The resident
//!   size: before each call every rank resets its high-water mark (writing
//!   `5` to `/proc/self/clear_refs`, Linux 4.0 and later) and reads
//!   `VmRSS`; the figure is `VmHWM` after the call minus `VmRSS` before.
//!   The bench checks at start that the reset works. The resident figure
//!   can fall short of the heap's: glibc's `malloc` keeps freed memory of
//!   earlier calls mapped and hands it out again.
//! - Loads read from the page cache (the files were just written) unless
//!   `--cold`, which has rank 0 flush and drop the page cache
//!   (`/proc/sys/vm/drop_caches`, root only) before each load; the output
//!   says which.
//!
//! - `--zero` measures a ZeRO state instead (`benches/mpi/shards_zero.rs`):
//!   a third of the bytes in 100 replicated `f32` parameters, two thirds in
//!   their Adam moments `@M` and `@V`, which each rank holds only its pieces
//!   of ([`SlicedState`](scopetree::ranks::SlicedState)). `save_shards` and
//!   `load_shards` are the plan's with the sliced state; `save_on_root` and
//!   `load_on_all` are what a ZeRO user has without it: the moments made
//!   whole on every rank (all-gathered for a save), then cut back to the
//!   pieces, all in the call's time. Each load's values are checked.
//!
//! Rank 0 prints one `key=value` line per measurement, each starting with
//! `shards_bench` (with `--zero`, `mode=zero` after the line's kind).

#[path = "../../tests/support/peak_alloc.rs"]
mod peak_alloc;
#[path = "shards_zero.rs"]
mod zero;

use std::path::{Path, PathBuf};
use std::time::Instant;

use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};
use scopetree::checkpoint::{SaveOptions, Tensor};
use scopetree::ranks::{DEFAULT_BUCKET_BYTES, Digest, PlanOptions, SyncPlan};
use scopetree::{ScopeId, ScopeTree};

/// The four calls, in the order a round runs them.
const OPS: [&str; 4] = ["save_shards", "load_shards", "save_on_root", "load_on_all"];

/// `count` `f32` tensors of sizes growing as i², `total` elements in all,
/// with values that differ between tensors and elements (the same on every
/// rank).
fn state(total: usize, count: usize) -> (ScopeTree, ScopeId, Vec<u64>) {
    let mut tree = ScopeTree::new();
    let scope = tree.new_named_scope(tree.root(), "model").unwrap();
    let weights: Vec<usize> = (1..=count).map(|i| i * i).collect();
    let sum: usize = weights.iter().sum();
    let mut left = total;
    let mut sizes = Vec::with_capacity(count);
    for (i, w) in weights.iter().enumerate() {
        let n = if i + 1 == weights.len() {
            left
        } else {
            (total * w / sum).max(1)
        };
        left -= n;
        let values: Vec<f32> = (0..n).map(|j| (i * 7 + j % 1000) as f32 * 0.25).collect();
        let v = tree.var(scope, format!("t{i:03}")).unwrap();
        tree.set(v, Tensor::new(vec![n], values).unwrap()).unwrap();
        sizes.push(n as u64 * 4);
    }
    (tree, scope, sizes)
}

/// A field of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`: kB there).
fn status_bytes(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// `rchar`, `wchar` and `read_bytes` of `/proc/self/io`: the bytes read
/// and written through system calls, from the page cache or not, and the
/// bytes read from storage.
fn io_chars() -> (u64, u64, u64) {
    let text = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("rchar:"), field("wchar:"), field("read_bytes:"))
}

/// Resets the high-water mark `VmHWM` to the resident size.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Whether the reset works here: a peak of 64 MiB touched and freed must
/// vanish from `VmHWM` after it.
fn reset_works() -> bool {
    let big = vec![1_u8; 64 << 20];
    std::hint::black_box(&big);
    drop(big);
    let before = status_bytes("VmHWM");
    reset_peak() && status_bytes("VmHWM") + (32 << 20) < before
}

/// Flushes the page cache's dirty pages, then drops the page cache.
fn drop_caches() -> bool {
    let synced = std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// One call's figures on one rank.
#[derive(Clone, Copy, Default)]
struct Sample {
    /// Seconds from the barrier to the call's return.
    secs: f64,
    /// Seconds to flush the files this rank wrote (saves only).
    fsync_secs: f64,
    /// Bytes the call reports read or written on this rank.
    bytes: f64,
    /// `VmHWM` after the call minus `VmRSS` before, in bytes.
    peak_extra: f64,
    /// The heap's peak during the call above its size before, in bytes.
    heap_extra: f64,
    /// `rchar` and `wchar` during the call.
    rchar: f64,
    wchar: f64,
    /// Of `bytes`, those of sliced state (`--zero`).
    state_bytes: f64,
    /// Seconds of `secs` spent before and after the library's call, making
    /// the moments whole and cutting them back (`--zero`'s one-rank calls).
    before_secs: f64,
    after_secs: f64,
    /// Bytes read from storage during the call (`read_bytes`).
    read_bytes: f64,
}

const FIELDS: usize = 11;

impl Sample {
    fn to_array(self) -> [f64; FIELDS] {
        [
            self.secs,
            self.fsync_secs,
            self.bytes,
            self.peak_extra,
            self.rchar,
            self.wchar,
            self.heap_extra,
            self.state_bytes,
            self.before_secs,
            self.after_secs,
            self.read_bytes,
        ]
    }
}

/// Runs `f` on every rank after a barrier, with the high-water mark reset;
/// `f` returns the bytes it reports.
fn measure(world: &SimpleCommunicator, f: impl FnOnce() -> u64) -> Sample {
    world.barrier();
    reset_peak();
    let rss = status_bytes("VmRSS");
    let (r0, w0, s0) = io_chars();
    let heap = peak_alloc::live();
    peak_alloc::reset_peak();
    let t = Instant::now();
    let bytes = f();
    let secs = t.elapsed().as_secs_f64();
    let heap_extra = (peak_alloc::peak() - heap).max(0);
    let peak = status_bytes("VmHWM");
    let (r1, w1, s1) = io_chars();
    Sample {
        secs,
        bytes: bytes as f64,
        peak_extra: peak.saturating_sub(rss) as f64,
        rchar: (r1 - r0) as f64,
        wchar: (w1 - w0) as f64,
        read_bytes: s1.saturating_sub(s0) as f64,
        heap_extra: heap_extra as f64,
        ..Sample::default()
    }
}

/// Flushes `files` to the disk after a barrier, in seconds.
fn flush(world: &SimpleCommunicator, files: &[PathBuf]) -> f64 {
    world.barrier();
    let t = Instant::now();
    for f in files {
        std::fs::File::open(f).unwrap().sync_all().unwrap();
    }
    t.elapsed().as_secs_f64()
}

/// Every rank's sample, gathered on every rank: `[rank][field]`.
fn gather(world: &SimpleCommunicator, s: Sample) -> Vec<[f64; FIELDS]> {
    let mut all = vec![0.0_f64; FIELDS * world.size() as usize];
    world.all_gather_into(&s.to_array()[..], &mut all[..]);
    all.chunks(FIELDS).map(|c| c.try_into().unwrap()).collect()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn min_max(xs: &[f64]) -> (f64, f64) {
    xs.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// `DIR/shards_bench-<rank 0's pid>`, the same on every rank.
fn work_dir(world: &SimpleCommunicator, base: &Path) -> PathBuf {
    let mut pid = [u64::from(std::process::id())];
    world.process_at_rank(0).broadcast_into(&mut pid[..]);
    base.join(format!("shards_bench-{}", pid[0]))
}

/// A state and its four calls ([`OPS`]), each measured on every rank.
trait Calls {
    /// The keys the start line gives the state.
    fn describe(&self) -> String;
    /// The state's bytes.
    fn total(&self) -> u64;
    /// Runs call `op` (an index into [`OPS`]) into or from `shards` (a
    /// directory) or `single` (a file), measured on every rank.
    fn call(
        &mut self,
        world: &SimpleCommunicator,
        op: usize,
        shards: &Path,
        single: &Path,
    ) -> Sample;
    /// Checks the state after the last round (panics when it is wrong).
    fn finish(&mut self);
    /// The key each line carries after its kind (`mode=zero `), if any.
    fn mode(&self) -> &'static str {
        ""
    }
    /// The names of the parts of call `op`'s time spent before and after
    /// the library's call, for calls that have them.
    fn phases(&self, _op: usize) -> Option<(&'static str, &'static str)> {
        None
    }
}

/// The replicated state: 300 `f32` tensors, the same on every rank, in one
/// plan.
struct Replicated {
    tree: ScopeTree,
    plan: SyncPlan,
    total: u64,
    largest: u64,
    tensors: usize,
    /// The plan's digest before the first call.
    before: Digest,
}

impl Replicated {
    fn new(world: &SimpleCommunicator, mib: usize) -> Self {
        let (tree, scope, sizes) = state(mib * (1 << 20) / 4, 300);
        let mut plan = SyncPlan::new(world, &tree, scope, &PlanOptions::new()).unwrap();
        let before = plan.digest(&tree).unwrap();
        Self {
            tree,
            plan,
            total: sizes.iter().sum(),
            largest: sizes.iter().copied().max().unwrap_or(0),
            tensors: sizes.len(),
            before,
        }
    }
}

impl Calls for Replicated {
    fn describe(&self) -> String {
        format!(
            "tensors={} state_bytes={} largest_tensor_bytes={}",
            self.tensors, self.total, self.largest
        )
    }

    fn total(&self) -> u64 {
        self.total
    }

    fn call(
        &mut self,
        world: &SimpleCommunicator,
        op: usize,
        shards: &Path,
        single: &Path,
    ) -> Sample {
        let (tree, plan, total) = (&mut self.tree, &mut self.plan, self.total);
        let me = world.rank() == 0;
        match op {
            0 => {
                let mut saved = None;
                let mut s = measure(world, || {
                    let s = plan
                        .save_shards(world, tree, shards, &SaveOptions::new())
                        .unwrap();
                    let bytes = s.bytes;
                    saved = Some(s);
                    bytes
                });
                let mine: Vec<PathBuf> = saved
                    .and_then(|s| s.mine)
                    .map(|m| shards.join(m))
                    .into_iter()
                    .collect();
                s.fsync_secs = flush(world, &mine);
                s
            }
            1 => measure(world, || {
                plan.load_shards(world, tree, shards).unwrap().bytes
            }),
            2 => {
                let mut s = measure(world, || {
                    let report = plan
                        .save_on_root(world, tree, single, 0, &SaveOptions::new())
                        .unwrap();
                    report.map_or(0, |_| total)
                });
                let mine: Vec<PathBuf> = if me { vec![single.to_owned()] } else { vec![] };
                s.fsync_secs = flush(world, &mine);
                s
            }
            _ => measure(world, || {
                plan.load_on_all(world, tree, single).unwrap();
                total
            }),
        }
    }

    fn finish(&mut self) {
        let after = self.plan.digest(&self.tree).unwrap();
        assert_eq!(self.before, after, "the loads changed the state");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cold = args.iter().any(|a| a == "--cold");
    let zero = args.iter().any(|a| a == "--zero");
    let args: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let mib: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let base: PathBuf = args.get(2).map_or_else(std::env::temp_dir, PathBuf::from);
    let universe = mpi::initialize().expect("MPI initialises once");
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let me = rank == 0;

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let resets = reset_works();
    let mut calls: Box<dyn Calls> = if zero {
        Box::new(zero::Zero::new(&world, mib))
    } else {
        Box::new(Replicated::new(&world, mib))
    };
    let (total, mode) = (calls.total(), calls.mode());
    let dir = work_dir(&world, &base);
    if me {
        println!(
            "shards_bench start {mode}ranks={size} mib={mib} {} \
             bucket_bytes={DEFAULT_BUCKET_BYTES} rounds={rounds} \
             warmup_rounds=1 loadavg={} dir={} hwm_reset={} page_cache={}",
            calls.describe(),
            load.join(","),
            dir.display(),
            if resets { "works" } else { "FAILS" },
            if cold {
                "dropped_before_each_load"
            } else {
                "warm"
            },
        );
    }

    // samples[op][round][rank]
    let mut samples: Vec<Vec<Vec<[f64; FIELDS]>>> = vec![Vec::new(); OPS.len()];
    let mut cold_ok = true;
    let (mut shard_bytes, mut single_bytes) = (0, 0);
    for round in 0..=rounds {
        // Fresh files every round, as a checkpoint manager makes (a
        // directory per step): on ext4, a file renamed over an existing one
        // is flushed to the disk during the rename, which would fold the
        // disk's time into the call's.
        let here = dir.join(format!("round-{round}"));
        let shards = here.join("shards");
        let single = here.join("model.safetensors");
        if me {
            std::fs::create_dir_all(&here).unwrap();
        }
        let mut got = [Sample::default(); 4];
        // Odd rounds start with the one-rank pair, so that neither pair
        // always follows the other's file removal or page-cache traffic.
        let order: [usize; 4] = if round % 2 == 0 {
            [0, 1, 2, 3]
        } else {
            [2, 3, 0, 1]
        };
        for op in order {
            if cold && me && (op == 1 || op == 3) {
                cold_ok &= drop_caches();
            }
            got[op] = calls.call(&world, op, &shards, &single);
        }

        for (op, s) in got.into_iter().enumerate() {
            let all = gather(&world, s);
            if round > 0 {
                samples[op].push(all);
            }
        }
        if me {
            let file_bytes = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
            shard_bytes = std::fs::read_dir(&shards)
                .unwrap()
                .filter_map(Result::ok)
                .map(|e| file_bytes(&e.path()))
                .sum();
            single_bytes = file_bytes(&single);
            std::fs::remove_dir_all(&here).unwrap();
        }
    }
    calls.finish();

    if me {
        println!(
            "shards_bench files {mode}ranks={size} sharded_dir_bytes={shard_bytes} \
             single_file_bytes={single_bytes} state_bytes={total}"
        );
        if cold {
            println!(
                "shards_bench cold {mode}ranks={size} drop_caches={}",
                if cold_ok { "worked" } else { "FAILED" }
            );
        }
        for (op, name) in OPS.iter().enumerate() {
            let rounds_of = &samples[op];
            // The slowest rank's time in each round.
            let slowest = |f: usize| -> Vec<f64> {
                rounds_of
                    .iter()
                    .map(|r| r.iter().map(|s| s[f]).fold(0.0, f64::max))
                    .collect()
            };
            let secs = slowest(0);
            let fsync = slowest(1);
            let (lo, hi) = min_max(&secs);
            let (flo, fhi) = min_max(&fsync);
            // The call and the flush after it: a save that is on the disk.
            let durable: Vec<f64> = secs.iter().zip(&fsync).map(|(a, b)| a + b).collect();
            let (dlo, dhi) = min_max(&durable);
            // Bytes per round summed over the ranks (the same every round).
            let sum_of = |f: usize| -> f64 { rounds_of[0].iter().map(|s| s[f]).sum() };
            // `--zero`'s keys: the state's bytes, and the parts of the
            // one-rank calls' time outside the library's call.
            let mut extra = String::new();
            if !mode.is_empty() {
                extra += &format!(" state_bytes_all_ranks={:.0}", sum_of(7));
            }
            if let Some((before, after)) = calls.phases(op) {
                for (what, f) in [(before, 8), (after, 9)] {
                    let part = slowest(f);
                    let (plo, phi) = min_max(&part);
                    extra += &format!(
                        " {what}_ms_median={:.1} {what}_ms_min={:.1} {what}_ms_max={:.1}",
                        median(part) * 1e3,
                        plo * 1e3,
                        phi * 1e3
                    );
                }
            }
            println!(
                "shards_bench op={name} {mode}ranks={size} mib={mib} time_ms_median={:.1} \
                 time_ms_min={:.1} time_ms_max={:.1} fsync_ms_median={:.1} fsync_ms_min={:.1} \
                 fsync_ms_max={:.1} with_fsync_ms_median={:.1} with_fsync_ms_min={:.1} \
                 with_fsync_ms_max={:.1} bytes_all_ranks={:.0} bytes_all_ranks_over_state={:.3} \
                 rchar_all_ranks={:.0} wchar_all_ranks={:.0} read_bytes_all_ranks={:.0}{extra}",
                median(secs) * 1e3,
                lo * 1e3,
                hi * 1e3,
                median(fsync) * 1e3,
                flo * 1e3,
                fhi * 1e3,
                median(durable) * 1e3,
                dlo * 1e3,
                dhi * 1e3,
                sum_of(2),
                sum_of(2) / total as f64,
                sum_of(4),
                sum_of(5),
                sum_of(10),
            );
            for r in 0..size {
                let of = |f: usize| -> Vec<f64> { rounds_of.iter().map(|x| x[r][f]).collect() };
                let (peaks, heaps) = (of(3), of(6));
                let (plo, phi) = min_max(&peaks);
                let (hlo, hhi) = min_max(&heaps);
                let bytes = rounds_of[0][r][2];
                let bound = bytes + DEFAULT_BUCKET_BYTES as f64;
                let extra = if mode.is_empty() {
                    String::new()
                } else {
                    format!(" state_bytes={:.0}", rounds_of[0][r][7])
                };
                println!(
                    "shards_bench op={name} {mode}ranks={size} rank={r} bytes={bytes:.0} \
                     time_ms_median={:.1} heap_extra_bytes_median={:.0} \
                     heap_extra_bytes_min={hlo:.0} heap_extra_bytes_max={hhi:.0} \
                     rss_extra_bytes_median={:.0} rss_extra_bytes_min={plo:.0} \
                     rss_extra_bytes_max={phi:.0} part_plus_bucket_bytes={bound:.0} \
                     heap_max_over_part_plus_bucket={:.3} rss_max_over_part_plus_bucket={:.3} \
                     rchar={:.0} wchar={:.0}{extra}",
                    median(of(0)) * 1e3,
                    median(heaps.clone()),
                    median(peaks.clone()),
                    hhi / bound,
                    phi / bound,
                    median(of(4)),
                    median(of(5)),
                );
            }
        }
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        println!(
            "shards_bench end {mode}ranks={size} loadavg={}",
            load.join(",")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
