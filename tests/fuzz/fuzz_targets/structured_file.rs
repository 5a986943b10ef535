//! Single-file checkpoints built from structured input: headers that are
//! valid JSON, with the model's keys and their neighbours (a scope's name,
//! a path through a variable, empty segments), every dtype, shapes of up to
//! four small dimensions, offsets laid end to end or nudged, metadata, and
//! a data section of about the right length. Byte-level mutation rarely
//! keeps a header well formed; this reaches the checks after the parse.
//! The checks are `checkpoint_file`'s.

#![no_main]

mod common;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

/// A key: the model's, their neighbours, or any text.
#[derive(Arbitrary, Debug)]
enum Key {
    A,
    B,
    C,
    Scope,
    UnderVar,
    Deeper,
    Empty,
    DoubleSlash,
    Metadata,
    Other(String),
}

impl Key {
    fn text(&self) -> &str {
        match self {
            Self::A => "a",
            Self::B => "s/b",
            Self::C => "s/c",
            Self::Scope => "s",
            Self::UnderVar => "a/x",
            Self::Deeper => "s/b/c",
            Self::Empty => "",
            Self::DoubleSlash => "s//c",
            Self::Metadata => "__metadata__",
            Self::Other(s) => s,
        }
    }
}

const DTYPES: [(&str, usize); 14] = [
    ("F16", 2),
    ("BF16", 2),
    ("F32", 4),
    ("F64", 8),
    ("I8", 1),
    ("I16", 2),
    ("I32", 4),
    ("I64", 8),
    ("U8", 1),
    ("U16", 2),
    ("U32", 4),
    ("U64", 8),
    ("BOOL", 1),
    ("F8_E4M3", 1),
];

#[derive(Arbitrary, Debug)]
struct Entry {
    key: Key,
    dtype: u8,
    /// Up to four dimensions of 0 to 7.
    shape: Vec<u8>,
    /// Added to where the tensor begins and ends (0 lays it end to end).
    nudge: (i8, i8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    entries: Vec<Entry>,
    metadata: Option<Vec<(String, String)>>,
    /// Added to the data section's length.
    extra: i8,
    /// The data bytes, repeated to the length.
    data: Vec<u8>,
}

fn file(input: &Input) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut at = 0_i64;
    for e in input.entries.iter().take(8) {
        let (dtype, size) = DTYPES[usize::from(e.dtype) % DTYPES.len()];
        let shape: Vec<u64> = e.shape.iter().take(4).map(|d| u64::from(d % 8)).collect();
        let len = shape.iter().product::<u64>() as i64 * size as i64;
        let begin = at + i64::from(e.nudge.0);
        let end = at + len + i64::from(e.nudge.1);
        at += len;
        let entry = serde_json::json!({
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [begin, end],
        });
        header.insert(e.key.text().to_owned(), entry);
    }
    if let Some(meta) = &input.metadata {
        let meta: serde_json::Map<_, _> = meta
            .iter()
            .take(4)
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        header.insert("__metadata__".to_owned(), meta.into());
    }
    let text = serde_json::to_string(&header).unwrap();
    let len = usize::try_from(at + i64::from(input.extra)).unwrap_or(0);
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend((0..len).map(|i| {
        input
            .data
            .get(i % input.data.len().max(1))
            .copied()
            .unwrap_or(0)
    }));
    out
}

fuzz_target!(|input: Input| common::check_file(&file(&input)));
