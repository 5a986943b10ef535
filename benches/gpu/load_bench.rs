//! Loading a checkpoint onto a CUDA GPU: scopetree's staged load against
//! candle's `from_mmaped_safetensors`, and against the limit of the
//! machine measured in the same run (the slower of reading the bytes from
//! the page cache with as many threads, and copying them from page-locked
//! memory to the device).
//!
//! ```text
//! cargo build --release --features cuda --example gpu_load_bench
//! target/release/examples/gpu_load_bench [DIR] [--gib 1.07] [--rounds 5] [--cold-rounds 3] [--staging MIB]
//! ```
//!
//! `--staging MIB` sets the loads' staging budget (`LoadOptions::staging_budget`;
//! by default 256 MiB) for `scopetree` and `again`.
//!
//! It writes a bf16 llama-shaped checkpoint of about `--gib` GiB in 4
//! shards under DIR (kept for the next run), then times each way of
//! loading it in a child process of its own (so that each starts with the
//! same CUDA context and its peak host memory is its own), interleaved,
//! page cache warm (one unmeasured run first), and with the page cache
//! dropped before every run where `/proc/sys/vm/drop_caches` can be
//! written. Each child prints one line, `RESULT mode seconds rss_peak_bytes
//! device_bytes`; the parent prints medians and ratios.
//!
//! - `candle`: `VarBuilder::from_mmaped_safetensors(shards, BF16, cuda)`,
//!   then `get_unchecked` of every tensor (candle copies each from the
//!   mapped pages when it is fetched), then a device synchronize.
//! - `scopetree`: `CandleStore::load_on(dir, create, cuda)` with the
//!   staging budget (by default 256 MiB).
//! - `read`: the same byte ranges read from the page cache by as many
//!   threads as the load's readers into two 64 MiB buffers, no copy.
//! - `copy`: the same number of bytes copied from page-locked memory
//!   (128 MiB, reused) to the device on its stream, timed without the
//!   allocations.
//! - `again`: a second `scopetree` load in the same process, timed alone:
//!   the staging buffers the first page-locked are reused.
//!
//! After the timed rounds, two children print what the parts cost alone:
//! `probe` (reads and copies, `PROBE` lines) and `pin` (page-locking,
//! `PIN` lines; see `pin.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use candle_core::{DType, Device};
use scopetree::ScopeTree;
use scopetree::candle::CandleStore;
use scopetree::checkpoint::{self, LoadOptions, SaveOptions, Separator, Tensor};

mod pin;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const HIDDEN: usize = 2048;
const FFN: usize = 5632;
const VOCAB: usize = 32000;

/// Writes the checkpoint: embeddings, a head, and as many layers as make
/// about `gib` GiB, in 4 shards.
fn write_checkpoint(dir: &Path, gib: f64) -> Res<u64> {
    let per_layer = (4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN + 2 * HIDDEN) * 2;
    let fixed = (2 * VOCAB * HIDDEN + HIDDEN) * 2;
    let want = (gib * (1u64 << 30) as f64) as usize;
    let layers = want.saturating_sub(fixed).div_ceil(per_layer).max(1);
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let mut seed = 0x9E37_79B9_u32;
    let mut put = |tree: &mut ScopeTree, path: &str, shape: Vec<usize>| -> Res<()> {
        let mut s = root;
        let comps: Vec<&str> = path.split('.').collect();
        for c in &comps[..comps.len() - 1] {
            s = match tree.kid(s, *c)? {
                Some(k) => k,
                None => tree.new_named_scope(s, *c)?,
            };
        }
        let n: usize = shape.iter().product();
        let data: Vec<half::bf16> = (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                half::bf16::from_f32((seed % 2001) as f32 / 1000.0 - 1.0)
            })
            .collect();
        let v = tree.var(s, comps[comps.len() - 1])?;
        tree.set(v, Tensor::new(shape, data)?)?;
        Ok(())
    };
    put(&mut tree, "model.embed_tokens.weight", vec![VOCAB, HIDDEN])?;
    put(&mut tree, "lm_head.weight", vec![VOCAB, HIDDEN])?;
    put(&mut tree, "model.norm.weight", vec![HIDDEN])?;
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for w in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            put(
                &mut tree,
                &format!("{p}.self_attn.{w}.weight"),
                vec![HIDDEN, HIDDEN],
            )?;
        }
        put(
            &mut tree,
            &format!("{p}.mlp.gate_proj.weight"),
            vec![FFN, HIDDEN],
        )?;
        put(
            &mut tree,
            &format!("{p}.mlp.up_proj.weight"),
            vec![FFN, HIDDEN],
        )?;
        put(
            &mut tree,
            &format!("{p}.mlp.down_proj.weight"),
            vec![HIDDEN, FFN],
        )?;
        put(
            &mut tree,
            &format!("{p}.input_layernorm.weight"),
            vec![HIDDEN],
        )?;
        put(
            &mut tree,
            &format!("{p}.post_attention_layernorm.weight"),
            vec![HIDDEN],
        )?;
    }
    let total = (fixed + layers * per_layer) as u64;
    let opts = SaveOptions::new()
        .separator(Separator::Dot)
        .max_shard_size(total.div_ceil(4));
    checkpoint::save_sharded(&tree, root, dir, &opts)?;
    Ok(total)
}

fn status_kib(field: &str) -> Res<u64> {
    let s = std::fs::read_to_string("/proc/self/status")?;
    let line = s
        .lines()
        .find(|l| l.starts_with(field))
        .ok_or_else(|| format!("no {field} in /proc/self/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .ok_or("a malformed status line")?
        .parse()?)
}

fn shards(dir: &Path) -> Res<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    v.sort();
    Ok(v)
}

/// One measured load in this process: prints `RESULT mode s rss device`.
/// The variable through which the parent hands `--staging` to its children.
const STAGING_VAR: &str = "GPU_LOAD_BENCH_STAGING_MIB";

/// The loads' options: create, with the staging budget the parent was given.
fn load_options() -> Res<LoadOptions> {
    let opts = LoadOptions::new().create(true);
    Ok(match std::env::var(STAGING_VAR) {
        Ok(mib) => opts.staging_budget(mib.parse::<usize>()? << 20),
        Err(_) => opts,
    })
}

fn child(mode: &str, dir: &Path) -> Res<()> {
    let dev = Device::new_cuda(0)?;
    let Device::Cuda(cuda) = &dev else {
        return Err("not a CUDA device".into());
    };
    let ctx = cuda.cuda_stream().context().clone();
    // The context up and a first allocation made, before the start.
    let _warm = candle_core::Tensor::zeros(1024, DType::F32, &dev)?;
    ctx.synchronize()?;
    let (free0, _) = ctx.mem_get_info()?;
    // Reset the peak resident size to the current one (Linux >= 4.0).
    std::fs::write("/proc/self/clear_refs", "5")?;
    let rss0 = status_kib("VmRSS:")?;
    let tensors = checkpoint::inspect(dir)?;
    let t0 = Instant::now();
    let mut keep_candle = Vec::new();
    let keep_store = CandleStore::new();
    match mode {
        "candle" => {
            let files = shards(dir)?;
            // SAFETY: the shards are written before any child runs and
            // nothing changes them while they are mapped.
            let vb = unsafe {
                candle_nn::VarBuilder::from_mmaped_safetensors(&files, DType::BF16, &dev)?
            };
            for t in &tensors {
                keep_candle.push(vb.get_unchecked(&t.key)?);
            }
            ctx.synchronize()?;
        }
        "scopetree" => {
            keep_store.load_on(dir, &load_options()?, &dev)?;
            ctx.synchronize()?;
        }
        "again" => {
            // A second load in the process: the staging buffers the first
            // page-locked are reused (the first is not timed).
            let first = CandleStore::new();
            first.load_on(dir, &load_options()?, &dev)?;
            drop(first);
            ctx.synchronize()?;
            std::fs::write("/proc/self/clear_refs", "5")?;
            let t1 = Instant::now();
            keep_store.load_on(dir, &load_options()?, &dev)?;
            ctx.synchronize()?;
            println!("AGAIN {:.6}", t1.elapsed().as_secs_f64());
        }
        "read" => read_limit(dir, &tensors)?,
        "probe" => probe(&dev, &ctx, dir, &tensors)?,
        "pin" => {
            let first = shards(dir)?.into_iter().next().ok_or("no shard")?;
            pin::pin(&ctx, &cuda.cuda_stream(), &first)?;
        }
        "copy" => copy_limit(&ctx, tensors.iter().map(|t| t.end - t.begin).sum())?,
        other => return Err(format!("unknown mode {other}").into()),
    }
    let s = t0.elapsed().as_secs_f64();
    let (free1, _) = ctx.mem_get_info()?;
    let rss_peak = status_kib("VmHWM:")?.saturating_sub(rss0) * 1024;
    println!(
        "RESULT {mode} {s:.6} {rss_peak} {}",
        free0.saturating_sub(free1)
    );
    drop(keep_candle);
    drop(keep_store);
    Ok(())
}

/// The readers of a staged load, reading every tensor's bytes into two
/// 64 MiB buffers per thread set: the page cache's side of the limit.
fn read_limit(dir: &Path, tensors: &[checkpoint::FileTensor]) -> Res<()> {
    use std::os::unix::fs::FileExt;
    let readers = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let mut by_shard: Vec<(PathBuf, Vec<(u64, u64)>)> = Vec::new();
    for t in tensors {
        let f = dir.join(t.shard.as_deref().ok_or("a tensor without a shard")?);
        match by_shard.last_mut() {
            Some((p, v)) if *p == f => v.push((t.begin, t.end)),
            _ => by_shard.push((f, vec![(t.begin, t.end)])),
        }
    }
    // The byte ranges of every shard's data, cut into 8 MiB reads.
    let mut reads: Vec<(usize, u64, usize)> = Vec::new();
    let mut files = Vec::new();
    for (i, (p, ranges)) in by_shard.iter().enumerate() {
        let file = std::fs::File::open(p)?;
        let mut len8 = [0_u8; 8];
        file.read_exact_at(&mut len8, 0)?;
        let start = 8 + u64::from_le_bytes(len8);
        for (b, e) in ranges {
            let mut at = *b;
            while at < *e {
                let n = (e - at).min(8 << 20) as usize;
                reads.push((i, start + at, n));
                at += n as u64;
            }
        }
        files.push(file);
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..readers {
            s.spawn(|| {
                let mut buf = vec![0_u8; 8 << 20];
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(f, at, n)) = reads.get(k) else {
                        return;
                    };
                    files[f].read_exact_at(&mut buf[..n], at).expect("read");
                }
            });
        }
    });
    Ok(())
}

/// What each part of a staged load costs alone on this machine: reads
/// into page-locked memory against plain memory, and copies to the device
/// from page-locked memory (cached or write-combined, in large or small
/// pieces, on the device's stream or the null stream) and from plain
/// memory. Prints `PROBE what seconds GB/s`.
fn probe(
    dev: &Device,
    ctx: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaContext>,
    dir: &Path,
    tensors: &[checkpoint::FileTensor],
) -> Res<()> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    use std::os::unix::fs::FileExt;
    let Device::Cuda(cuda) = dev else {
        return Err("not a CUDA device".into());
    };
    let total: u64 = tensors.iter().map(|t| t.end - t.begin).sum();
    let gb = total as f64 / 1e9;
    let say = |what: &str, s: f64| println!("PROBE {what:48} {s:8.4} s {:7.2} GB/s", gb / s);
    // Reads of the shards' data, 8 threads, 8 MiB each, into page-locked
    // or plain memory.
    let files: Vec<(std::fs::File, u64, u64)> = shards(dir)?
        .iter()
        .map(|p| -> Res<_> {
            let f = std::fs::File::open(p)?;
            let mut len8 = [0_u8; 8];
            f.read_exact_at(&mut len8, 0)?;
            let start = 8 + u64::from_le_bytes(len8);
            let end = f.metadata()?.len();
            Ok((f, start, end))
        })
        .collect::<Res<_>>()?;
    let mut reads = Vec::new();
    for (i, (_, start, end)) in files.iter().enumerate() {
        let mut at = *start;
        while at < *end {
            let n = (end - at).min(8 << 20) as usize;
            reads.push((i, at, n));
            at += n as u64;
        }
    }
    let chunk = 8 << 20;
    // SAFETY: every byte read below is first written by a read.
    let mut pinned =
        unsafe { ctx.alloc_pinned_with_flags::<u8>(8 * chunk, sys::CU_MEMHOSTALLOC_PORTABLE)? };
    let mut plain = vec![0_u8; 8 * chunk];
    for (what, buf) in [
        ("read into page-locked memory", pinned.as_mut_slice()?),
        ("read into plain memory", &mut plain[..]),
    ] {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for part in buf.chunks_mut(chunk) {
                let (next, reads, files) = (&next, &reads, &files);
                s.spawn(move || {
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(f, at, n)) = reads.get(k) else {
                            return;
                        };
                        files[f].0.read_exact_at(&mut part[..n], at).expect("read");
                    }
                });
            }
        });
        say(what, t0.elapsed().as_secs_f64());
    }
    // Copies of `total` bytes to the device.
    let big = 128 << 20;
    let stream = cuda.cuda_stream();
    let mut dst = stream.alloc_zeros::<u8>(big)?;
    // SAFETY: the copies read it; what they carry is only timed.
    let cached = unsafe { ctx.alloc_pinned_with_flags::<u8>(big, sys::CU_MEMHOSTALLOC_PORTABLE)? };
    let host = cached.as_slice()?;
    for piece in [big, chunk] {
        ctx.synchronize()?;
        let t0 = Instant::now();
        let mut left = total as usize;
        while left > 0 {
            let n = left.min(piece);
            stream.memcpy_htod(&host[..n], &mut dst.slice_mut(..n))?;
            left -= n;
        }
        stream.synchronize()?;
        say(
            &format!("copy from page-locked, {} MiB pieces", piece >> 20),
            t0.elapsed().as_secs_f64(),
        );
    }
    // SAFETY: as above.
    let wc = unsafe { ctx.alloc_pinned::<u8>(big)? };
    let null = ctx.default_stream();
    let mut dst2 = null.alloc_zeros::<u8>(big)?;
    ctx.synchronize()?;
    let t0 = Instant::now();
    let mut left = total as usize;
    while left > 0 {
        null.memcpy_htod(&wc, &mut dst2)?;
        left = left.saturating_sub(big);
    }
    null.synchronize()?;
    say(
        "copy from write-combined page-locked, null stream",
        t0.elapsed().as_secs_f64(),
    );
    // Copies queued, then reads on the host: do they overlap?
    for flush in [false, true] {
        ctx.synchronize()?;
        let t0 = Instant::now();
        let mut left = total as usize;
        while left > 0 {
            let n = left.min(big);
            stream.memcpy_htod(&host[..n], &mut dst.slice_mut(..n))?;
            left -= n;
        }
        if flush {
            let e = ctx.new_event(None)?;
            e.record(&stream)?;
            let _ = e.try_is_complete();
        }
        let queued = t0.elapsed().as_secs_f64();
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for part in plain.chunks_mut(chunk) {
                let (next, reads, files) = (&next, &reads, &files);
                s.spawn(move || {
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(f, at, n)) = reads.get(k) else {
                            return;
                        };
                        files[f].0.read_exact_at(&mut part[..n], at).expect("read");
                    }
                });
            }
        });
        let read_done = t0.elapsed().as_secs_f64();
        stream.synchronize()?;
        let all = t0.elapsed().as_secs_f64();
        println!(
            "PROBE copies queued ({queued:.4} s{}), then reads done at {read_done:.4} s, copies done at {all:.4} s",
            if flush { ", an event queried" } else { "" }
        );
    }
    let pageable = vec![1_u8; big];
    ctx.synchronize()?;
    let t0 = Instant::now();
    let mut left = total as usize;
    while left > 0 {
        let n = left.min(big);
        stream.memcpy_htod(&pageable[..n], &mut dst.slice_mut(..n))?;
        left -= n;
    }
    stream.synchronize()?;
    say("copy from plain memory", t0.elapsed().as_secs_f64());
    Ok(())
}

/// `total` bytes copied from page-locked memory to the device, 128 MiB at
/// a time, on the device's stream: the bus's side of the limit (the
/// staging's memory and stream, without its reads).
fn copy_limit(
    ctx: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaContext>,
    total: u64,
) -> Res<()> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let chunk = 128 << 20;
    let stream = ctx.per_thread_stream();
    // SAFETY: the memory is not read before it is written: the copies
    // below read it, and what they read is only timed, never used.
    let host = unsafe { ctx.alloc_pinned_with_flags::<u8>(chunk, sys::CU_MEMHOSTALLOC_PORTABLE)? };
    let host = host.as_slice()?;
    let mut dst = stream.alloc_zeros::<u8>(chunk)?;
    stream.synchronize()?;
    // Timed without the allocations (the parent reads this line first).
    let t0 = Instant::now();
    let mut left = total as usize;
    while left > 0 {
        let n = left.min(chunk);
        stream.memcpy_htod(&host[..n], &mut dst.slice_mut(..n))?;
        left -= n;
    }
    stream.synchronize()?;
    println!("AGAIN {:.6}", t0.elapsed().as_secs_f64());
    Ok(())
}

/// The median of `v` (the upper one of an even count); NaN when empty.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn drop_caches() -> bool {
    // SAFETY-free: a write to procfs, as root.
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// A child that runs `mode` over `dir`, with the staging budget `staging`
/// (MiB) if one was given.
fn child_command(mode: &str, dir: &Path, staging: Option<usize>) -> Res<Command> {
    let mut c = Command::new(std::env::current_exe()?);
    c.args(["--child", mode]).arg(dir);
    if let Some(mib) = staging {
        c.env(STAGING_VAR, mib.to_string());
    }
    Ok(c)
}

fn run(mode: &str, dir: &Path, staging: Option<usize>) -> Res<(f64, u64, u64)> {
    let out = child_command(mode, dir, staging)?.output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let again = text
        .lines()
        .find_map(|l| l.strip_prefix("AGAIN "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    let line = text
        .lines()
        .find(|l| l.starts_with("RESULT"))
        .ok_or_else(|| {
            format!(
                "{mode}: no result ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let f: Vec<&str> = line.split_whitespace().collect();
    Ok((again.unwrap_or(f[2].parse()?), f[3].parse()?, f[4].parse()?))
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(&args[1], Path::new(&args[2]));
    }
    let mut dir = std::env::temp_dir().join("scopetree-gpu-load-bench");
    let (mut gib, mut rounds, mut cold_rounds) = (1.07, 5, 3);
    let mut staging: Option<usize> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--gib" => gib = it.next().ok_or("--gib N")?.parse()?,
            "--rounds" => rounds = it.next().ok_or("--rounds N")?.parse()?,
            "--cold-rounds" => cold_rounds = it.next().ok_or("--cold-rounds N")?.parse()?,
            "--staging" => staging = Some(it.next().ok_or("--staging MIB")?.parse()?),
            other => dir = PathBuf::from(other),
        }
    }
    std::fs::create_dir_all(&dir)?;
    let bytes: u64 = match checkpoint::inspect(&dir) {
        Ok(t) if !t.is_empty() => t.iter().map(|t| t.end - t.begin).sum(),
        _ => {
            let t0 = Instant::now();
            let b = write_checkpoint(&dir, gib)?;
            println!(
                "wrote {b} B in 4 shards to {} ({:.1} s)",
                dir.display(),
                t0.elapsed().as_secs_f64()
            );
            b
        }
    };
    let gb = bytes as f64 / 1e9;
    println!(
        "checkpoint: {} ({bytes} B of bf16 tensors, {:.3} GiB)",
        dir.display(),
        bytes as f64 / (1u64 << 30) as f64
    );
    let modes = ["candle", "scopetree", "read", "copy", "again"];
    for m in modes {
        run(m, &dir, staging)?; // warm-up, page cache filled
    }
    let mut warm: Vec<Vec<(f64, u64, u64)>> = vec![Vec::new(); modes.len()];
    for r in 0..rounds {
        for k in 0..modes.len() {
            let m = (k + r) % modes.len();
            warm[m].push(run(modes[m], &dir, staging)?);
        }
    }
    println!("\npage cache warm, {rounds} rounds interleaved (medians):");
    let mut med = Vec::new();
    for (m, v) in modes.iter().zip(&warm) {
        let mut s: Vec<f64> = v.iter().map(|x| x.0).collect();
        let t = median(&mut s);
        let rss = v.iter().map(|x| x.1).max().unwrap_or(0);
        let devb = v.iter().map(|x| x.2).max().unwrap_or(0);
        println!(
            "  {m:10} {t:8.4} s  {:6.2} GB/s  peak RSS above start {:7.1} MiB  device {:7.1} MiB ({:.3}x the tensors)",
            gb / t,
            rss as f64 / 1048576.0,
            devb as f64 / 1048576.0,
            devb as f64 / bytes as f64
        );
        med.push(t);
    }
    let limit = med[2].max(med[3]);
    println!(
        "FIGURE warm: scopetree {:.4} s, candle {:.4} s: {:.2}x faster than candle; limit {:.4} s (the slower of read {:.4} s and copy {:.4} s): {:.2}x the limit's speed",
        med[1],
        med[0],
        med[0] / med[1],
        limit,
        med[2],
        med[3],
        limit / med[1]
    );
    // What each part costs alone, and where a load's time goes.
    for (mode, tag) in [("probe", "PROBE"), ("pin", "PIN")] {
        let out = child_command(mode, &dir, staging)?.output()?;
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            if l.starts_with(tag) {
                println!("{l}");
            }
        }
        if !out.status.success() {
            println!(
                "{tag} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    let traced = child_command("scopetree", &dir, staging)?
        .env("SCOPETREE_TRACE_LOADS", "1")
        .output()?;
    print!("{}", String::from_utf8_lossy(&traced.stderr));
    let rss_ours = warm[1].iter().map(|x| x.1).max().unwrap_or(0);
    println!(
        "FIGURE host: scopetree peak RSS above start {:.1} MiB (budget {} MiB + 64 MiB allowed); candle {:.1} MiB",
        rss_ours as f64 / 1048576.0,
        staging.unwrap_or(256),
        warm[0].iter().map(|x| x.1).max().unwrap_or(0) as f64 / 1048576.0
    );
    let dev_ours = warm[1].iter().map(|x| x.2).max().unwrap_or(0);
    println!(
        "FIGURE device: scopetree {:.3}x the tensors' bytes",
        dev_ours as f64 / bytes as f64
    );
    if cold_rounds > 0 {
        if drop_caches() {
            let mut cold: Vec<Vec<f64>> = vec![Vec::new(); 2];
            for r in 0..cold_rounds {
                for k in 0..2 {
                    let m = (k + r) % 2;
                    drop_caches();
                    cold[m].push(run(modes[m], &dir, staging)?.0);
                }
            }
            let (c, s) = (median(&mut cold[0]), median(&mut cold[1]));
            println!(
                "FIGURE cold: scopetree {s:.4} s ({:.2} GB/s), candle {c:.4} s ({:.2} GB/s): {:.2}x",
                gb / s,
                gb / c,
                c / s
            );
        } else {
            println!("FIGURE cold: not measured: /proc/sys/vm/drop_caches cannot be written here");
        }
    }
    Ok(())
}
