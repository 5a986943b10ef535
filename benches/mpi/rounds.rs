//! How `ranks_bench` and `candle_bench` measure (included by both with
//! `#[path]`): the gradients' sizes, the order of the configurations in
//! each round, the time of one call (the slowest rank's), the median and
//! spread of a figure, the byte counts in the arguments and the output, and
//! the load average.

use std::time::Instant;

use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};

/// The sizes in elements of `count` tensors growing as i² (as a model's mix
/// of biases and weights), `total` elements in all, each at least 1.
pub fn sizes(total: usize, count: usize) -> Vec<usize> {
    let sum: usize = (1..=count).map(|i| i * i).sum();
    let mut left = total;
    (1..=count)
        .map(|i| {
            let n = if i == count {
                left
            } else {
                (total * i * i / sum).max(1)
            };
            left -= n;
            n
        })
        .collect()
}

/// Times one run of `f`: every rank starts it after a barrier, and the
/// figure is the slowest rank's time, in seconds (an all-reduce of the
/// times after the clock stops, on every rank).
pub fn once(world: &SimpleCommunicator, f: impl FnOnce()) -> f64 {
    world.barrier();
    let t = Instant::now();
    f();
    let mine = t.elapsed().as_secs_f64();
    let mut slowest = 0.0_f64;
    world.all_reduce_into(&mine, &mut slowest, SystemOperation::max());
    slowest
}

/// The order in which round `round` runs `n` configurations: a shuffle
/// seeded by the round (xorshift, Fisher–Yates), the same on every rank, so
/// that the ranks make the same collective calls in the same order.
pub fn order(n: usize, round: usize) -> Vec<usize> {
    let mut state =
        0x9e37_79b9_7f4a_7c15_u64 ^ (round as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut idx: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        idx.swap(i, j);
    }
    idx
}

/// The median and the range of a figure over the rounds.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The median (the mean of the middle two of an even count), minimum
    /// and maximum of `xs` (not empty).
    pub fn of(xs: &[f64]) -> Self {
        let mut xs = xs.to_vec();
        xs.sort_by(f64::total_cmp);
        let mid = xs.len() / 2;
        Spread {
            median: if xs.len() % 2 == 0 {
                (xs[mid - 1] + xs[mid]) / 2.0
            } else {
                xs[mid]
            },
            min: xs[0],
            max: xs[xs.len() - 1],
        }
    }

    /// Seconds, shown as `12.3 ms (11.9–13.0)`.
    pub fn ms(&self) -> String {
        format!(
            "{:.1} ms ({:.1}–{:.1})",
            self.median * 1e3,
            self.min * 1e3,
            self.max * 1e3
        )
    }

    /// A ratio's range, shown as `0.85–0.95x`.
    pub fn range_x(&self) -> String {
        format!("{:.2}–{:.2}x", self.min, self.max)
    }
}

/// `a[r] / b[r]` for every round `r`: ratios of two configurations timed in
/// the same round.
pub fn per_round(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x / y).collect()
}

/// A byte count as `16 KiB`, `25 MiB` or `1.50 MiB`.
pub fn bytes_label(bytes: usize) -> String {
    if bytes == usize::MAX {
        "off".to_owned()
    } else if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 20 {
        format!("{:.2} MiB", bytes as f64 / f64::from(1 << 20))
    } else if bytes % (1 << 10) == 0 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// A byte count from the command line: a number of bytes, with an optional
/// suffix `K`/`KiB` or `M`/`MiB`, or `off` (or `usize::MAX`'s digits):
/// `usize::MAX`.
pub fn parse_bytes(arg: &str) -> Option<usize> {
    if arg == "off" {
        return Some(usize::MAX);
    }
    let (digits, unit) = match arg.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => arg.split_at(i),
        None => (arg, ""),
    };
    let shift = match unit {
        "" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        _ => return None,
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// The value that follows `--flag` among `args`, removed from them with
/// the flag; `None` without the flag. Exits with a message if the value is
/// missing or not a byte count.
pub fn take_bytes_flag(args: &mut Vec<String>, flag: &str) -> Option<usize> {
    let i = args.iter().position(|a| a == flag)?;
    let value = args.get(i + 1).and_then(|v| parse_bytes(v));
    let Some(value) = value else {
        eprintln!("{flag} takes a byte count: BYTES, BYTESK, BYTESM or off");
        std::process::exit(2);
    };
    args.drain(i..i + 2);
    Some(value)
}

/// The load average (1, 5 and 15 minutes) from `/proc/loadavg`, or `?`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

/// One line of a plan's all-reduce against raw MPI over the same bytes, in
/// the samples of the same rounds: `label (N calls): NAME 43.4 ms (41.0–47.2);
/// raw MPI in chunks of 25 MiB 39.8 ms (…); ratio to one raw call 1.42x, to
/// raw chunks 0.92x (rounds: 1.30–1.50x, 0.88–0.97x)`. The ratios are those
/// of the medians; the ranges after `rounds:` are those of the ratios within
/// each round.
pub fn compare_line(
    label: &str,
    calls: usize,
    name: &str,
    ours: &[f64],
    chunks: &[f64],
    chunk_bytes: usize,
    whole: &[f64],
) -> String {
    let (o, c, w) = (Spread::of(ours), Spread::of(chunks), Spread::of(whole));
    format!(
        "{label} ({calls:>3} calls): {name} {}; raw MPI in chunks of {} {}; ratio to one raw \
         call {:.2}x, to raw chunks {:.2}x (rounds: {}, {})",
        o.ms(),
        bytes_label(chunk_bytes),
        c.ms(),
        w.median / o.median,
        c.median / o.median,
        Spread::of(&per_round(whole, ours)).range_x(),
        Spread::of(&per_round(chunks, ours)).range_x(),
    )
}

/// The line of one raw `MPI_Allreduce` of the whole buffer of `mb` MB.
pub fn whole_line(mb: usize, whole: &[f64]) -> String {
    let w = Spread::of(whole);
    format!(
        "raw MPI_Allreduce of one flat buffer of {mb} MB: {} ({:.2} GB/s)",
        w.ms(),
        mb as f64 / 1e3 / w.median
    )
}

/// Raw MPI over a flat `f32` buffer of the gradients' bytes: what a plan's
/// all-reduce is measured against.
pub struct RawMpi {
    send: Vec<f32>,
    recv: Vec<f32>,
}

impl RawMpi {
    /// Buffers of `total` elements.
    pub fn new(total: usize) -> Self {
        RawMpi {
            send: vec![0.5; total],
            recv: vec![0.0; total],
        }
    }

    /// One `MPI_Allreduce` (sum) of the whole buffer.
    pub fn whole(&mut self, world: &SimpleCommunicator) {
        world.all_reduce_into(&self.send[..], &mut self.recv[..], SystemOperation::sum());
    }

    /// `MPI_Allreduce`s (sum) of the buffer in chunks of `bytes` bytes, one
    /// after the other: the calls a bucketed all-reduce makes, without its
    /// copies and checks.
    pub fn chunks(&mut self, world: &SimpleCommunicator, bytes: usize) {
        let n = (bytes / 4).max(1);
        for (s, r) in self.send.chunks(n).zip(self.recv.chunks_mut(n)) {
            world.all_reduce_into(s, r, SystemOperation::sum());
        }
    }

    /// ZeRO stage 1's exchange over the buffer, cut into one contiguous
    /// slice per rank: each slice summed to its owner by `MPI_Reduce`s of
    /// `bytes`, then every slice gathered to every rank by `MPI_Allgather`s
    /// of `bytes` per rank (the last slice padded): the calls of a plan's
    /// `reduce_scatter` and `all_gather`, without their copies and checks.
    #[allow(
        dead_code,
        reason = "candle_bench's --zero only; ranks_bench includes this file too"
    )]
    pub fn zero(&mut self, world: &SimpleCommunicator, bytes: usize) {
        let n = (bytes / 4).max(1);
        let ranks = world.size() as usize;
        let me = world.rank() as usize;
        let slice = self.send.len().div_ceil(ranks);
        for r in 0..ranks {
            let lo = (r * slice).min(self.send.len());
            let hi = ((r + 1) * slice).min(self.send.len());
            let root = world.process_at_rank(r as i32);
            for (at, s) in (lo..hi).step_by(n).zip(self.send[lo..hi].chunks(n)) {
                if r == me {
                    let out = &mut self.recv[at..at + s.len()];
                    root.reduce_into_root(s, out, SystemOperation::sum());
                } else {
                    root.reduce_into(s, SystemOperation::sum());
                }
            }
        }
        let lo = (me * slice).min(self.send.len());
        let mine_len = ((me + 1) * slice).min(self.send.len()) - lo;
        let mut block = vec![0.0_f32; n];
        let mut all = vec![0.0_f32; n * ranks];
        for at in (0..slice).step_by(n) {
            let len = n.min(slice - at);
            block.fill(0.0);
            let have = mine_len.saturating_sub(at).min(len);
            block[..have].copy_from_slice(&self.recv[lo + at..lo + at + have]);
            world.all_gather_into(&block[..len], &mut all[..len * ranks]);
            for r in (0..ranks).filter(|&r| r != me) {
                let to = r * slice + at;
                let have = self.send.len().saturating_sub(to).min(len);
                self.recv[to..to + have].copy_from_slice(&all[r * len..r * len + have]);
            }
        }
    }
}
