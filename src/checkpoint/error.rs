//! The checkpoint layer's errors.

use std::fmt;
use std::io;

use crate::short;

/// How many entries of each list an error message shows (dimensions of a
/// shape too); the fields hold them all.
const SHOWN: usize = short::LIST_SHOWN;

/// Why a save or a load failed. Every message names the file, the keys or
/// variables concerned and what to do; lists are cut to a few entries in the
/// message (the fields hold them all). A failed call changes nothing.
///
/// ```
/// use scopetree::{ScopeTree, checkpoint};
/// let mut tree = ScopeTree::new();
/// let root = tree.root();
/// let err = checkpoint::load(&mut tree, root, "/nonexistent/x.safetensors",
///                            &checkpoint::LoadOptions::new()).unwrap_err();
/// assert!(matches!(err, checkpoint::Error::Io { .. }));
/// ```
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error of the tree (a stale or foreign scope, an invalid name, …).
    #[error(transparent)]
    Tree(#[from] crate::Error),

    /// The file could not be opened, read or written.
    #[error("cannot use checkpoint file {path}: {source}; check the path and its permissions")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The file is not a well-formed safetensors file. Nothing was loaded.
    #[error("{path} is not a valid safetensors file: {problem}; nothing was loaded")]
    BadFile {
        /// The file.
        path: String,
        /// What is wrong with it.
        problem: BadFile,
    },

    /// A save met variables whose values are not tensors (or that have no
    /// value). Nothing was written.
    #[error(
        "cannot save: {} variable(s) hold no tensor: {}; store a Vec, Box<[_]> or checkpoint::Tensor \
         of a numeric type, register your type with SaveOptions::with_type, or pass \
         SaveOptions::skip_non_tensors(true)",
        vars.len(), short::list(vars)
    )]
    NotTensors {
        /// Each such variable: its key and what it holds (`None`: no value).
        vars: Vec<NotTensor>,
    },

    /// A sharded checkpoint's index (`model.safetensors.index.json`) is
    /// malformed, or disagrees with its shards. Nothing was loaded.
    #[error("{path} is not a usable checkpoint index: {problem}; nothing was loaded")]
    BadIndex {
        /// The index file.
        path: String,
        /// What is wrong with it.
        problem: BadIndex,
    },

    /// The file and the tree disagree: names the tree lacks, names the file
    /// lacks, or tensors of another shape or dtype; for a sharded
    /// checkpoint, also tensors stored in a shard that the index does not
    /// assign them to. Nothing was loaded.
    #[error(
        "checkpoint {path} does not match the tree: {}; nothing was loaded (see \
         LoadOptions::allow_missing, allow_unused, create and dtype_policy)",
        mismatch_parts(missing, unexpected, mismatched, unassigned)
    )]
    Mismatch {
        /// The file, or the index of a sharded checkpoint.
        path: String,
        /// Keys of tree variables the file does not hold.
        missing: Vec<String>,
        /// Keys of the file that name no variable of the tree.
        unexpected: Vec<String>,
        /// Keys present on both sides that disagree.
        mismatched: Vec<Mismatch>,
        /// Tensors a shard holds that the index assigns to another shard or
        /// to none, as `(key, shard file)`: never loaded, whatever the
        /// options; only [`LoadOptions::allow_unused`](super::LoadOptions::allow_unused)
        /// accepts them.
        unassigned: Vec<(String, String)>,
    },

    /// Two variables would be saved (or loaded) under one key, e.g. `a.b` in
    /// the root and `b` in scope `a` with the `.` separator.
    #[error(
        "variables {} and {} both map to the key {}; rename one or use the '/' separator",
        short::path(first),
        short::path(second),
        short::path(key)
    )]
    KeyCollision {
        /// The key.
        key: String,
        /// The first variable's path (with `/`).
        first: String,
        /// The second variable's path (with `/`).
        second: String,
    },

    /// Bytes, dtype and shape that do not make a value of the type (from
    /// [`Tensor::new`](super::Tensor::new) or a
    /// [`Checkpointable`](super::Checkpointable) constructor).
    #[error("bad tensor: {reason}")]
    BadTensor {
        /// What does not fit.
        reason: String,
    },

    /// The safetensors writer failed. Nothing was written at `path`.
    #[error("cannot write checkpoint {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The writer's error.
        #[source]
        source: safetensors::SafeTensorError,
    },

    /// A tensor's bytes do not match the checksum its save wrote beside them
    /// (`scopetree_xxh3/<key>` in the file's metadata): the file was
    /// corrupted after the save. Checked on the bytes as read, before the
    /// load changes anything.
    #[error(
        "the bytes of `{}` in {path} do not match the checksum its save wrote (the file is \
         corrupted); restore it or load an earlier checkpoint",
        short::path(key)
    )]
    Corrupted {
        /// The tensor's key.
        key: String,
        /// The file that holds it.
        path: String,
    },

    /// Reading a tensor's bytes failed after every check had passed (the
    /// file changed or the disk failed while loading).
    #[error(
        "reading tensor {} of {path} failed: {source}; {}",
        short::path(key),
        if *rolled_back { "the tree is as it was before the load" }
        else { "values read in place before it hold the file's bytes; load again, or use \
                LoadOptions::rollback(true) to make read errors leave the tree unchanged" }
    )]
    Data {
        /// The file.
        path: String,
        /// The tensor being read.
        key: String,
        /// Whether the tree is as before the load; `false` only when the
        /// disk failed while values were read in place (never with
        /// [`LoadOptions::rollback(true)`](super::LoadOptions::rollback)).
        rolled_back: bool,
        /// The underlying error.
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// A closure that wraps an IO error with the file's path.
    pub(crate) fn io(path: &str) -> impl FnOnce(io::Error) -> Self + '_ {
        move |source| Self::Io {
            path: short::path(path),
            source,
        }
    }
}

/// A variable that a save cannot write: its key and the type it holds.
///
/// ```
/// let n = scopetree::checkpoint::NotTensor { key: "w".into(), holds: None };
/// assert_eq!(n.to_string(), "w (no value)");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotTensor {
    /// The key it would have had.
    pub key: String,
    /// The type name of its value; `None` when it has no value.
    pub holds: Option<&'static str>,
}

impl fmt::Display for NotTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.holds {
            Some(t) => write!(f, "{} ({})", short::path(&self.key), short::name(t)),
            None => write!(f, "{} (no value)", short::path(&self.key)),
        }
    }
}

/// One key whose tensor in the file disagrees with the tree's variable:
/// both sides, as text (`F32 [3, 4]`).
///
/// ```
/// let m = scopetree::checkpoint::Mismatch {
///     key: "w".into(), file: "F32 [3, 4]".into(), tree: "F32 [2, 4]".into() };
/// assert_eq!(m.to_string(), "w: file F32 [3, 4], tree F32 [2, 4]");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The key.
    pub key: String,
    /// The file's side.
    pub file: String,
    /// The tree's side.
    pub tree: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: file {}, tree {}",
            short::path(&self.key),
            self.file,
            self.tree
        )
    }
}

/// What is wrong with a file that is not valid safetensors.
///
/// ```
/// use scopetree::checkpoint::BadFile;
/// assert_eq!(BadFile::Empty.to_string(), "the file is empty");
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BadFile {
    /// Zero bytes.
    Empty,
    /// Fewer than the 8 bytes of the header length.
    TooShort {
        /// The file's length.
        len: u64,
    },
    /// The header length points past the end of the file.
    HeaderPastEnd {
        /// The declared header length.
        header_len: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The header is longer than safetensors allows (100 MB).
    HeaderTooLarge {
        /// The declared header length.
        header_len: u64,
    },
    /// The header is not UTF-8.
    NotUtf8 {
        /// The byte offset of the first bad byte, within the header.
        at: usize,
    },
    /// The header is not the JSON object safetensors expects.
    BadJson {
        /// The parser's message (cut short).
        reason: String,
    },
    /// A tensor's entry lacks or misspells `dtype`, `shape` or
    /// `data_offsets`.
    BadEntry {
        /// The key.
        key: String,
        /// The parser's message (cut short).
        reason: String,
    },
    /// A key appears twice.
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A tensor's byte range ends past the data, or ends before it begins.
    OutOfRange {
        /// The key.
        key: String,
        /// Its declared range.
        begin: u64,
        /// Its declared range's end.
        end: u64,
        /// The length of the data section.
        data_len: u64,
    },
    /// Two tensors' byte ranges overlap.
    Overlap {
        /// The key.
        key: String,
        /// The key whose range it overlaps.
        other: String,
    },
    /// Bytes of the data section belong to no tensor.
    Hole {
        /// Where the unused bytes start, within the data section.
        at: u64,
        /// How many there are.
        len: u64,
    },
    /// The shape's element count does not match the byte range (this covers
    /// shapes too large to exist, such as 10^12 elements).
    SizeMismatch {
        /// The key.
        key: String,
        /// The declared dtype.
        dtype: String,
        /// The declared shape.
        shape: Vec<u64>,
        /// The length of the declared byte range.
        bytes: u64,
    },
    /// The metadata records the checksums of the file's other tensors
    /// (`scopetree_xxh3/<key>`) but not this one's: a save that writes
    /// checksums writes one for every tensor, so an entry was lost or a key
    /// changed after the save, and the tensor cannot be checked.
    MissingChecksum {
        /// The tensor's key.
        key: String,
    },
}

impl fmt::Display for BadFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "the file is empty"),
            Self::TooShort { len } => {
                write!(f, "{len} bytes, too short for the 8-byte header length")
            }
            Self::HeaderPastEnd {
                header_len,
                file_len,
            } => write!(
                f,
                "the header length {header_len} points past the end of the file ({file_len} bytes)"
            ),
            Self::HeaderTooLarge { header_len } => write!(
                f,
                "the header length {header_len} is over the 100 MB safetensors allows"
            ),
            Self::NotUtf8 { at } => write!(f, "the header is not UTF-8 (bad byte at {at})"),
            Self::BadJson { reason } => write!(f, "the header is not valid JSON: {reason}"),
            Self::BadEntry { key, reason } => {
                write!(
                    f,
                    "the entry of {} is malformed: {reason}",
                    short::path(key)
                )
            }
            Self::DuplicateKey { key } => write!(f, "the key {} appears twice", short::path(key)),
            Self::OutOfRange {
                key,
                begin,
                end,
                data_len,
            } => write!(
                f,
                "tensor {} has byte range [{begin}, {end}), outside the {data_len} data bytes",
                short::path(key)
            ),
            Self::Overlap { key, other } => write!(
                f,
                "the byte ranges of tensors {} and {} overlap",
                short::path(key),
                short::path(other)
            ),
            Self::Hole { at, len } => {
                write!(f, "{len} data bytes at offset {at} belong to no tensor")
            }
            Self::SizeMismatch {
                key,
                dtype,
                shape,
                bytes,
            } => {
                let shown: Vec<_> = shape.iter().take(SHOWN).collect();
                write!(
                    f,
                    "tensor {} is declared {dtype} {shown:?}{}, which does not fill its {bytes} bytes",
                    short::path(key),
                    if shape.len() > SHOWN { " (cut)" } else { "" }
                )
            }
            Self::MissingChecksum { key } => write!(
                f,
                "it records the checksums of its other tensors but not of {} (changed after its \
                 save); restore it or load an earlier checkpoint",
                short::path(key)
            ),
        }
    }
}

/// What is wrong with a sharded checkpoint's index, or between the index
/// and its shards.
///
/// ```
/// use scopetree::checkpoint::BadIndex;
/// let p = BadIndex::MissingShard { file: "model-00002-of-00002.safetensors".into(), keys: vec!["lm_head.weight".into()] };
/// assert!(p.to_string().contains("model-00002-of-00002.safetensors"));
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BadIndex {
    /// The index is not a JSON object of the expected form.
    BadJson {
        /// The parser's message (cut short).
        reason: String,
    },
    /// The index has no `weight_map` object.
    NoWeightMap,
    /// The `weight_map` names one tensor twice, with two shards.
    DuplicateName {
        /// The tensor's name.
        key: String,
        /// The first shard named for it.
        first: String,
        /// The second shard named for it.
        second: String,
    },
    /// A shard's name is not a plain file name beside the index (it is
    /// empty, or holds a path separator or `..`).
    BadShardName {
        /// A tensor the index assigns to it.
        key: String,
        /// The shard's name as the index gives it.
        file: String,
    },
    /// A shard the index names does not exist.
    MissingShard {
        /// The shard's file name.
        file: String,
        /// The tensors the index assigns to it.
        keys: Vec<String>,
    },
    /// A shard lacks tensors that the index assigns to it.
    ShardLacks {
        /// The shard's file name.
        file: String,
        /// The tensors it lacks.
        keys: Vec<String>,
    },
    /// A shard was written by another save than the index (a save that
    /// stopped between its shards and its index): the index's and the
    /// shard's save ids differ.
    TornSave {
        /// The shard's file name.
        file: String,
    },
}

impl fmt::Display for BadIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadJson { reason } => write!(
                f,
                "not the JSON object {{\"metadata\": .., \"weight_map\": {{name: shard}}}} expected: {reason}"
            ),
            Self::NoWeightMap => write!(f, "it has no \"weight_map\" object"),
            Self::DuplicateName { key, first, second } => write!(
                f,
                "its weight_map names {} twice, in shards {} and {}",
                short::path(key),
                short::name(first),
                short::name(second)
            ),
            Self::BadShardName { key, file } => write!(
                f,
                "tensor {} is assigned to {}, which is not a plain file name beside the index",
                short::path(key),
                short::name(file)
            ),
            Self::MissingShard { file, keys } => write!(
                f,
                "shard {} does not exist; the index assigns it {} tensor(s): {}",
                short::name(file),
                keys.len(),
                short::list(&short_keys(keys))
            ),
            Self::ShardLacks { file, keys } => write!(
                f,
                "shard {} lacks {} tensor(s) the index assigns to it: {}",
                short::name(file),
                keys.len(),
                short::list(&short_keys(keys))
            ),
            Self::TornSave { file } => write!(
                f,
                "shard {} was written by another save than the index (a save stopped half-way); save again",
                short::name(file)
            ),
        }
    }
}

/// The non-empty lists of a mismatch, labelled.
fn mismatch_parts(
    missing: &[String],
    unexpected: &[String],
    mismatched: &[Mismatch],
    unassigned: &[(String, String)],
) -> String {
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!(
            "missing from the file [{}]",
            short::list(&short_keys(missing))
        ));
    }
    if !unexpected.is_empty() {
        parts.push(format!(
            "not in the tree [{}]",
            short::list(&short_keys(unexpected))
        ));
    }
    if !mismatched.is_empty() {
        parts.push(format!("mismatched [{}]", short::list(mismatched)));
    }
    if !unassigned.is_empty() {
        let shown: Vec<_> = unassigned
            .iter()
            .map(|(k, f)| format!("{} in {}", short::path(k), short::name(f)))
            .collect();
        parts.push(format!(
            "in shards the index does not assign them to [{}]",
            short::list(&shown)
        ));
    }
    parts.join("; ")
}

/// A key list entry shown through [`short::path`].
pub(crate) fn short_keys(keys: &[String]) -> Vec<ShortKey<'_>> {
    keys.iter().map(|k| ShortKey(k)).collect()
}

/// A key, displayed shortened.
pub(crate) struct ShortKey<'a>(&'a str);

impl fmt::Display for ShortKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&short::path(self.0))
    }
}

/// Cuts a parser message to a bounded length.
pub(crate) fn cut(msg: &str) -> String {
    const MAX: usize = 160;
    match msg.char_indices().nth(MAX) {
        None => msg.to_owned(),
        Some((i, _)) => format!("{}…", &msg[..i]),
    }
}
