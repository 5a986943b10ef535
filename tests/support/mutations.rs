//! Byte mutations of checkpoint files for the bad-file proptests: cut the
//! file, flip bits of a byte, splice bytes in, the flips and splices
//! biased toward the header (its first ~260 bytes) and the spliced bytes
//! there toward JSON's punctuation and digits.
#![allow(dead_code)]

use proptest::prelude::*;

/// One change to a file's bytes.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Cut the file at this offset (modulo its length + 1).
    Truncate(usize),
    /// XOR the byte at this offset (modulo the length) with the mask (at
    /// least 1).
    Flip(usize, u8),
    /// Replace up to `.1` bytes at `.0` with `.2`.
    Splice(usize, usize, Vec<u8>),
}

/// `f` with `m` applied.
pub fn apply(mut f: Vec<u8>, m: &Mutation) -> Vec<u8> {
    match m {
        Mutation::Truncate(at) => f.truncate(at % (f.len() + 1)),
        Mutation::Flip(_, _) if f.is_empty() => {}
        Mutation::Flip(at, mask) => {
            let i = at % f.len();
            f[i] ^= mask.max(&1);
        }
        Mutation::Splice(at, del, ins) => {
            let i = at % (f.len() + 1);
            let j = (i + del).min(f.len());
            f.splice(i..j, ins.iter().copied());
        }
    }
    f
}

/// `f` with each of `ms` applied in turn.
pub fn apply_all(f: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    ms.iter().fold(f, apply)
}

/// Any mutation, header-heavy.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(a, m)| Mutation::Flip(a, m)),
        // Bias flips and splices toward the header (the first ~250 bytes).
        (0..260_usize, any::<u8>()).prop_map(|(a, m)| Mutation::Flip(a, m)),
        (
            any::<usize>(),
            0..16_usize,
            prop::collection::vec(any::<u8>(), 0..16)
        )
            .prop_map(|(a, d, i)| Mutation::Splice(a, d, i)),
        (
            0..260_usize,
            0..8_usize,
            prop::collection::vec(
                prop::sample::select(b"{}[]\":,0123456789ae ".to_vec()),
                0..8
            )
        )
            .prop_map(|(a, d, i)| Mutation::Splice(a, d, i)),
    ]
}

/// The files of the checkpoint directory `dir`: each one's name and bytes,
/// the index (`.json`) first, then by name.
pub fn read_files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort_by(|a, b| (!a.0.ends_with(".json"), &a.0).cmp(&(!b.0.ends_with(".json"), &b.0)));
    files
}

/// Writes `files` (names and bytes) into `dir`.
pub fn write_files(dir: &std::path::Path, files: &[(String, Vec<u8>)]) {
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
