//! Checkpoints: the peak extra memory of a load, measured with a counting
//! global allocator (this file's own: it counts the allocations of the
//! thread that makes them, so the tests of this file can run in parallel).
//!
//! A load streams the file: it holds the header, its plan and at most one
//! tensor being read (plus a 64 KiB read buffer); by default
//! (`rollback(false)`) a value of the right type and size takes its tensor
//! in place. With `rollback(true)` it reads every tensor into new memory
//! before changing anything, so that a read error leaves the tree as it
//! was: extra memory about the file's size. Print the figures with
//! `cargo test --release --test checkpoint_memory -- --nocapture`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use scopetree::checkpoint::{self, LoadOptions, SaveOptions};
use scopetree::{ScopeTree, VarId};

struct Counting;

thread_local! {
    /// Bytes allocated minus bytes freed on this thread.
    static LIVE: Cell<i64> = const { Cell::new(0) };
    /// The highest `LIVE` since the last reset.
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn note(bytes: i64) {
    let _ = LIVE.try_with(|c| {
        let v = c.get() + bytes;
        c.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees carry over; the counting touches only
// `const`-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as i64);
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as i64);
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as i64));
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as i64 - layout.size() as i64);
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns (live bytes before, peak during, live after).
fn measure(f: impl FnOnce()) -> (i64, i64, i64) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    f();
    (start, PEAK.with(Cell::get), LIVE.with(Cell::get))
}

const TENSORS: usize = 16;
const ELEMS: usize = 256 * 1024; // 1 MiB of f32 each
const TENSOR_BYTES: i64 = (ELEMS * 4) as i64;
/// Header, plan, report, key strings, read buffer: well under this.
const OVERHEAD: i64 = 256 * 1024;

fn model(v: f32) -> (ScopeTree, Vec<VarId>) {
    let mut t = ScopeTree::new();
    let s = t.new_named_scope(t.root(), "layers").unwrap();
    let vars = (0..TENSORS)
        .map(|i| {
            let w = t.var(s, format!("w{i:02}")).unwrap();
            t.set(w, vec![v + i as f32; ELEMS]).unwrap();
            w
        })
        .collect();
    (t, vars)
}

fn saved() -> (tempfile::TempDir, std::path::PathBuf, u64) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.safetensors");
    let (t, _) = model(1.0);
    checkpoint::save(&t, t.root(), &p, &SaveOptions::new()).unwrap();
    let len = std::fs::metadata(&p).unwrap().len();
    (d, p, len)
}

#[test]
fn a_streamed_load_needs_about_one_tensor() {
    let (_d, p, file_len) = saved();
    let (mut t, vars) = model(0.0);
    let root = t.root();
    let (start, peak, end) = measure(|| {
        checkpoint::load(&mut t, root, &p, &LoadOptions::new()).unwrap();
    });
    let extra = peak - start;
    println!(
        "default (in place): file {file_len} B, tensor {TENSOR_BYTES} B, peak extra {extra} B ({:.2} tensors), live change {} B",
        extra as f64 / TENSOR_BYTES as f64,
        end - start
    );
    assert!(extra <= TENSOR_BYTES + OVERHEAD, "peak extra {extra} B");
    assert_eq!(t.get::<Vec<f32>>(vars[3]).unwrap()[0], 4.0);
}

#[test]
fn an_atomic_load_needs_at_most_the_file_plus_one_tensor() {
    let (_d, p, file_len) = saved();
    let (mut t, vars) = model(0.0);
    let root = t.root();
    let (start, peak, end) = measure(|| {
        checkpoint::load(&mut t, root, &p, &LoadOptions::new().rollback(true)).unwrap();
    });
    let extra = peak - start;
    println!(
        "rollback(true): file {file_len} B, peak extra {extra} B ({:.3} x file), live change {} B",
        extra as f64 / file_len as f64,
        end - start
    );
    assert!(
        extra <= file_len as i64 + TENSOR_BYTES,
        "peak extra {extra} B"
    );
    assert_eq!(t.get::<Vec<f32>>(vars[15]).unwrap()[ELEMS - 1], 16.0);
}

#[test]
fn creating_from_a_file_holds_nothing_beyond_the_values_it_makes() {
    let (_d, p, file_len) = saved();
    let mut t = ScopeTree::new();
    let root = t.root();
    let (start, peak, end) = measure(|| {
        checkpoint::load(
            &mut t,
            root,
            &p,
            &LoadOptions::new().create(true).rollback(false),
        )
        .unwrap();
    });
    let kept = end - start;
    println!(
        "create: file {file_len} B, values kept {kept} B, transient peak above them {} B",
        peak - end
    );
    assert!(kept >= (TENSORS as i64) * TENSOR_BYTES);
    assert!(
        peak - end <= TENSOR_BYTES + OVERHEAD,
        "transient {} B",
        peak - end
    );
}
