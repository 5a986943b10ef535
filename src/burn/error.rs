//! The burn layer's error type.

use crate::checkpoint::Mismatch;
use crate::short;

/// Everything that can go wrong in a [`CheckpointStore`](super::CheckpointStore)
/// save or load. Every message names the file (or the index) and the
/// tensors concerned, and says what to do; lists are cut to a few entries
/// in the message (the fields hold them all). A failed load leaves the
/// module as it was, except [`Error::Data`] with `rolled_back: false`,
/// which says so.
///
/// ```
/// use scopetree::burn::{CheckpointStore, Error};
/// let err = CheckpointStore::from_file("m.safetensors")
///     .with_key_remapping("(", "x")
///     .unwrap_err();
/// assert!(matches!(err, Error::BadPattern { .. }));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error of the checkpoint layer: a file or shard that cannot be
    /// read or is not valid safetensors (a truncated shard), an index that
    /// is malformed or names a missing shard, a file that cannot be
    /// written. The module is unchanged.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::Error),

    /// The checkpoint and the module disagree: module tensors the
    /// checkpoint lacks, checkpoint tensors that name no module tensor,
    /// tensors of another shape or dtype, tensors that a shard holds but
    /// the index assigns elsewhere. Nothing was loaded.
    #[error(
        "checkpoint {path} does not match the module: {}; nothing was loaded (see \
         CheckpointStore::allow_missing, allow_unused, dtype_policy, with_key_remapping and filter)",
        parts(missing, unused, mismatched, unassigned)
    )]
    Mismatch {
        /// The file, or the index of a sharded checkpoint.
        path: String,
        /// Module paths the checkpoint holds no tensor for.
        missing: Vec<String>,
        /// Checkpoint names (after remapping) that no module tensor takes.
        unused: Vec<String>,
        /// Names on both sides whose shape or dtype disagree; `tree` is the
        /// module's side.
        mismatched: Vec<Mismatch>,
        /// Tensors a shard holds that the index assigns to another shard or
        /// to none, as `(key, shard file)`: a tensor two shards both hold.
        unassigned: Vec<(String, String)>,
    },

    /// Two names map to one: two checkpoint keys remapped to the same name,
    /// or two module tensors saved under the same key.
    #[error(
        "`{}` and `{}` both map to `{}` in {}; change the key remapping so that every name stays \
         distinct",
        short::name(first),
        short::name(second),
        short::name(name),
        short::path(path)
    )]
    Collision {
        /// The file, the index or the directory.
        path: String,
        /// The name both map to.
        name: String,
        /// The first original name.
        first: String,
        /// The second original name.
        second: String,
    },

    /// A key-remapping pattern is not a valid regular expression.
    #[error(
        "key-remapping pattern `{}` is not a valid regular expression: {reason}",
        short::name(pattern)
    )]
    BadPattern {
        /// The pattern.
        pattern: String,
        /// Why (the regex crate's message, cut).
        reason: String,
    },

    /// A module tensor of a dtype safetensors cannot hold (quantized).
    /// Nothing was written.
    #[error(
        "cannot save `{}`: its dtype {dtype} has no safetensors dtype; dequantize the module \
         first, or leave the tensor out with CheckpointStore::filter",
        short::name(name)
    )]
    Unsupported {
        /// The module path.
        name: String,
        /// The dtype, as burn names it.
        dtype: String,
    },

    /// Reading a tensor failed after every check had passed: the file
    /// changed or the disk failed, or its bytes do not match the checksum
    /// the save recorded.
    #[error(
        "reading tensor `{}` of {} failed: {reason}; {}",
        short::name(key), short::path(file),
        if *rolled_back { "the module is as it was before the load" }
        else { "the tensors of the shards read before it are loaded; load again, or use \
                CheckpointStore::rollback(true) to make such errors leave the module unchanged" }
    )]
    Data {
        /// The shard or file.
        file: String,
        /// The tensor's key.
        key: String,
        /// What went wrong (cut).
        reason: String,
        /// Whether the module is as before the load: always with
        /// [`rollback(true)`](super::CheckpointStore::rollback), and when
        /// the failing shard was the first.
        rolled_back: bool,
    },
}

/// `msg` cut to at most 160 characters.
pub(crate) fn cut(msg: &str) -> String {
    const MAX: usize = 160;
    match msg.char_indices().nth(MAX) {
        None => msg.to_owned(),
        Some((i, _)) => format!("{}…", &msg[..i]),
    }
}

fn parts(
    missing: &[String],
    unused: &[String],
    mismatched: &[Mismatch],
    unassigned: &[(String, String)],
) -> String {
    let names = |v: &[String]| -> Vec<String> { v.iter().map(|k| short::name(k)).collect() };
    let mut out = Vec::new();
    if !missing.is_empty() {
        out.push(format!(
            "missing from the checkpoint [{}]",
            short::list(&names(missing))
        ));
    }
    if !unused.is_empty() {
        out.push(format!(
            "not in the module [{}]",
            short::list(&names(unused))
        ));
    }
    if !mismatched.is_empty() {
        let shown: Vec<String> = mismatched
            .iter()
            .map(|m| {
                format!(
                    "{}: file {}, module {}",
                    short::name(&m.key),
                    m.file,
                    m.tree
                )
            })
            .collect();
        out.push(format!("mismatched [{}]", short::list(&shown)));
    }
    if !unassigned.is_empty() {
        let shown: Vec<String> = unassigned
            .iter()
            .map(|(k, f)| format!("{} in {}", short::name(k), short::name(f)))
            .collect();
        out.push(format!(
            "held by a shard the index does not assign them to [{}]",
            short::list(&shown)
        ));
    }
    out.join("; ")
}
