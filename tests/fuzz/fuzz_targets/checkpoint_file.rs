//! Any bytes as a single-file checkpoint: `inspect`, a strict load into a
//! model, and two creating loads into it (floats as they are, and floats
//! converted to f32). Each load fails, leaving the tree as it was, with a
//! short message, or holds exactly what the file declares. No input
//! panics, and none allocates more than libFuzzer's `-malloc_limit_mb`.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|file: &[u8]| common::check_file(file));
