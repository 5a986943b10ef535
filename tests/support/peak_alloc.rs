//! A counting global allocator for tests of peak memory: it counts the
//! bytes allocated and freed by the thread that allocates them, so the tests
//! of one file can run in parallel. Include it with
//! `#[path = "support/peak_alloc.rs"] mod peak_alloc;` in a test file of its
//! own (it installs the file's global allocator).

// Each test file uses some of these functions.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The allocator: `System`, counting.
pub struct Counting;

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

/// Bytes this thread holds now: allocated minus freed since it started.
pub fn live() -> i64 {
    LIVE.with(Cell::get)
}

/// Starts a new peak at the bytes this thread holds now.
pub fn reset_peak() {
    PEAK.with(|p| p.set(live()));
}

/// The most bytes this thread held since the last [`reset_peak`].
pub fn peak() -> i64 {
    PEAK.with(Cell::get)
}

/// Runs `f` and returns (live bytes before, peak during, live after).
pub fn measure(f: impl FnOnce()) -> (i64, i64, i64) {
    let start = live();
    reset_peak();
    f();
    (start, peak(), live())
}
