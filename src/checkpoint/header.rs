//! Reading and validating a safetensors header from the first 8 + N bytes of
//! a file, with every size checked against the file's length before
//! anything is allocated.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::Read;

use safetensors::tensor::TensorInfo;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::error::Category;

use super::dtype::Dtype;
use super::error::{BadFile, Error, cut};
use crate::short;

/// The largest header safetensors accepts (its `MAX_HEADER_SIZE`).
const MAX_HEADER: u64 = 100_000_000;

/// One tensor as the file's header declares it.
///
/// ```
/// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
/// use scopetree::{ScopeTree, checkpoint};
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// tree.set(w, vec![1.0_f32; 3])?;
/// let path = dir.join("a.safetensors");
/// checkpoint::save(&tree, tree.root(), &path, &checkpoint::SaveOptions::new())?;
/// let t = &checkpoint::inspect(&path)?[0];
/// assert_eq!((t.key.as_str(), t.dtype, t.shape.as_slice(), t.end - t.begin), ("w", checkpoint::Dtype::F32, &[3][..], 12));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileTensor {
    /// The key.
    pub key: String,
    /// The element type.
    pub dtype: Dtype,
    /// The shape.
    pub shape: Vec<usize>,
    /// Where its bytes begin, within the data section.
    pub begin: u64,
    /// Where its bytes end, within the data section.
    pub end: u64,
    /// The shard that holds it, as the index names it; `None` for a
    /// single-file checkpoint.
    pub shard: Option<String>,
}

/// A validated header: the tensors in file order, and where data starts.
pub(crate) struct Header {
    pub(crate) tensors: Vec<FileTensor>,
    pub(crate) data_start: u64,
    /// The `__metadata__` string pairs, if the file has them.
    pub(crate) metadata: Option<HashMap<String, String>>,
}

/// Reads the header's entries in file order, duplicates kept, in one pass:
/// a tensor's description straight into a `TensorInfo`, the metadata
/// (an entry `Err`) as a map of strings. The first entry whose
/// value does not read is left in `fault` with its key, so that a value of
/// the wrong form is reported as that entry's problem and not as bad JSON.
struct EntriesSeed<'f> {
    fault: &'f mut Option<(String, String)>,
}

type Entries = Vec<(String, Result<TensorInfo, HashMap<String, String>>)>;

impl<'de> DeserializeSeed<'de> for EntriesSeed<'_> {
    type Value = Entries;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Entries, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EntriesSeed<'_> {
    type Value = Entries;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of tensor entries")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
        let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(key) = map.next_key::<String>()? {
            let value = if key == "__metadata__" {
                map.next_value::<HashMap<String, String>>().map(Err)
            } else {
                map.next_value::<TensorInfo>().map(Ok)
            };
            match value {
                Ok(v) => out.push((key, v)),
                Err(e) => {
                    *self.fault = Some((key, e.to_string()));
                    return Err(e);
                }
            }
        }
        Ok(out)
    }
}

fn bad(path: &str, problem: BadFile) -> Error {
    Error::BadFile {
        path: short::path(path),
        problem,
    }
}

/// Reads and validates the header of `file` (positioned at its start).
/// Leaves the file positioned at the start of the data section.
pub(crate) fn read_header(file: &mut File, path: &str) -> Result<Header, Error> {
    let file_len = file.metadata().map_err(Error::io(path))?.len();
    if file_len == 0 {
        return Err(bad(path, BadFile::Empty));
    }
    if file_len < 8 {
        return Err(bad(path, BadFile::TooShort { len: file_len }));
    }
    let mut len_bytes = [0_u8; 8];
    file.read_exact(&mut len_bytes).map_err(Error::io(path))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > file_len - 8 {
        return Err(bad(
            path,
            BadFile::HeaderPastEnd {
                header_len,
                file_len,
            },
        ));
    }
    if header_len > MAX_HEADER {
        return Err(bad(path, BadFile::HeaderTooLarge { header_len }));
    }
    // Bounded by the file's length and by 100 MB, both checked above.
    #[allow(clippy::cast_possible_truncation)]
    let mut raw = vec![0_u8; header_len as usize];
    file.read_exact(&mut raw).map_err(Error::io(path))?;
    let text = std::str::from_utf8(&raw).map_err(|e| {
        bad(
            path,
            BadFile::NotUtf8 {
                at: e.valid_up_to(),
            },
        )
    })?;
    let mut fault = None;
    let mut json = serde_json::Deserializer::from_str(text);
    let parsed = EntriesSeed { fault: &mut fault }
        .deserialize(&mut json)
        .and_then(|entries| json.end().map(|()| entries));
    let entries = parsed.map_err(|e| {
        // A value of the wrong form is that entry's problem; broken JSON
        // (a syntax error, an early end) is the header's.
        let problem = match fault.take() {
            Some((key, reason)) if e.classify() == Category::Data => BadFile::BadEntry {
                key,
                reason: cut(&reason),
            },
            _ => BadFile::BadJson {
                reason: cut(&e.to_string()),
            },
        };
        bad(path, problem)
    })?;
    drop(raw);
    let data_start = 8 + header_len;
    let data_len = file_len - data_start;

    // A key twice: sorted, no key copied.
    let mut keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        let key = w[0].to_owned();
        return Err(bad(path, BadFile::DuplicateKey { key }));
    }
    drop(keys);
    let mut tensors = Vec::with_capacity(entries.len());
    let mut metadata = None;
    for (key, info) in entries {
        let info = match info {
            Ok(info) => info,
            Err(meta) => {
                metadata = Some(meta); // `__metadata__`
                continue;
            }
        };
        let (begin, end) = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
        if end < begin || end > data_len {
            return Err(bad(
                path,
                BadFile::OutOfRange {
                    key,
                    begin,
                    end,
                    data_len,
                },
            ));
        }
        let bits = info
            .shape
            .iter()
            .try_fold(1_u128, |a, &d| a.checked_mul(d as u128))
            .and_then(|n| n.checked_mul(info.dtype.bitsize() as u128));
        let fits = bits.is_some_and(|b| b % 8 == 0 && b / 8 == u128::from(end - begin));
        if !fits {
            return Err(bad(
                path,
                BadFile::SizeMismatch {
                    key,
                    dtype: format!("{:?}", info.dtype),
                    shape: info.shape.iter().map(|&d| d as u64).collect(),
                    bytes: end - begin,
                },
            ));
        }
        tensors.push(FileTensor {
            key,
            dtype: info.dtype,
            shape: info.shape,
            begin,
            end,
            shard: None,
        });
    }

    tensors.sort_by_key(|t| (t.begin, t.end));
    let mut cursor = 0_u64;
    let mut prev: Option<&str> = None;
    for t in &tensors {
        if t.begin < cursor {
            return Err(bad(
                path,
                BadFile::Overlap {
                    key: t.key.clone(),
                    other: prev.unwrap_or_default().to_owned(),
                },
            ));
        }
        if t.begin > cursor {
            return Err(bad(
                path,
                BadFile::Hole {
                    at: cursor,
                    len: t.begin - cursor,
                },
            ));
        }
        cursor = t.end;
        prev = Some(&t.key);
    }
    if cursor < data_len {
        return Err(bad(
            path,
            BadFile::Hole {
                at: cursor,
                len: data_len - cursor,
            },
        ));
    }
    Ok(Header {
        tensors,
        data_start,
        metadata,
    })
}
