//! A counting global allocator for the tests that check that a steady
//! state allocates nothing: it counts the calls to `alloc`, `alloc_zeroed`
//! and `realloc` made by the thread that makes them. Include it with
//! `#[path = "support/count_alloc.rs"] mod count_alloc;` in a test file of
//! its own (it installs the file's global allocator).

// Each test file uses some of these functions.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The allocator: `System`, counting.
pub struct Counting;

thread_local! {
    /// Calls to `alloc`, `alloc_zeroed` and `realloc` on this thread.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees carry over; the counting touches only
// a `const`-initialised thread-local without destructor, which never
// allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The allocations this thread has made so far.
pub fn count() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Allocations made by `f` on this thread.
pub fn allocations(f: impl FnOnce()) -> u64 {
    let before = count();
    f();
    count() - before
}
