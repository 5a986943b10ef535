//! What a load reads: one safetensors file, or the shards that a Hugging
//! Face index names. Every part is opened and its header checked before a
//! load decides anything; the parts stay open until the load ends, so the
//! bytes it reads are those it checked.

use std::fs::File;
use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;

use super::error::{BadFile, BadIndex, Error};
use super::header::{FileTensor, read_header};
use super::index::{CHECKSUM_PREFIX, INDEX_FILE, SAVE_ID, SINGLE_FILE, read_index};
use crate::short;

/// One file of a checkpoint, open, its header read.
pub(crate) struct Part {
    pub(crate) path: PathBuf,
    pub(crate) file: File,
    pub(crate) data_start: u64,
    /// The file's `__metadata__` string pairs, if it has them.
    pub(crate) metadata: Option<std::collections::HashMap<String, String>>,
    /// Whether the metadata records any tensor's checksum: a save that
    /// writes checksums writes one for every tensor of the file.
    checksums: bool,
}

impl Part {
    /// The file at `path`, open as `file`, its data starting at
    /// `data_start`, with its header's `metadata`. O(metadata entries).
    pub(crate) fn new(
        path: PathBuf,
        file: File,
        data_start: u64,
        metadata: Option<std::collections::HashMap<String, String>>,
    ) -> Self {
        let checksums = metadata
            .as_ref()
            .is_some_and(|m| m.keys().any(|k| k.starts_with(CHECKSUM_PREFIX)));
        Self {
            path,
            file,
            data_start,
            metadata,
            checksums,
        }
    }

    /// The checksum this file records for its tensor `key` (see
    /// [`CHECKSUM_PREFIX`]): `None` when the file records no checksum at
    /// all (a file another program wrote). O(1) plus a hash lookup.
    ///
    /// # Errors
    /// [`Error::BadFile`] when the entry is not 32 hex digits, or when the
    /// file records the checksums of other tensors but not of `key` (an
    /// entry lost or a key changed after the save: no tensor of such a
    /// file goes unchecked).
    pub(crate) fn checksum(&self, key: &str) -> Result<Option<u128>, Error> {
        if !self.checksums {
            return Ok(None);
        }
        let entry = format!("{CHECKSUM_PREFIX}{key}");
        let bad = |problem| Error::BadFile {
            path: short::path(&self.path.to_string_lossy()),
            problem,
        };
        let Some(text) = self.metadata.as_ref().and_then(|m| m.get(&entry)) else {
            return Err(bad(BadFile::MissingChecksum {
                key: key.to_owned(),
            }));
        };
        match u128::from_str_radix(text, 16) {
            Ok(sum) if text.len() == 32 => Ok(Some(sum)),
            _ => Err(bad(BadFile::BadEntry {
                key: entry,
                reason: "a checksum is 32 hex digits".to_owned(),
            })),
        }
    }
}

/// A checkpoint, opened: its parts and the tensors a load considers.
pub(crate) struct Opened {
    /// What errors name: the file, or the index.
    pub(crate) shown: String,
    pub(crate) parts: Vec<Part>,
    /// Every tensor the checkpoint holds for the load, with its part, in
    /// part order and, within a part, in data order.
    pub(crate) tensors: Vec<(usize, FileTensor)>,
    /// Tensors that a shard holds and the index assigns to another shard
    /// or to none, as `(key, shard)`: never loaded.
    pub(crate) unassigned: Vec<(String, String)>,
}

fn bad(path: &Path, problem: BadIndex) -> Error {
    Error::BadIndex {
        path: short::path(&path.to_string_lossy()),
        problem,
    }
}

/// Opens the checkpoint at `path`: a safetensors file; an index
/// (a name ending in `.json`); or a directory holding
/// `model.safetensors.index.json` or else `model.safetensors`.
/// O(headers + index).
pub(crate) fn open(path: &Path) -> Result<Opened, Error> {
    if path.is_dir() {
        let index = path.join(INDEX_FILE);
        if index.is_file() {
            return open_index(&index);
        }
        let single = path.join(SINGLE_FILE);
        if single.is_file() {
            return open_file(&single);
        }
        return Err(Error::Io {
            path: short::path(&path.to_string_lossy()),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("the directory holds neither {INDEX_FILE} nor {SINGLE_FILE}"),
            ),
        });
    }
    if path.extension().is_some_and(|e| e == "json") {
        return open_index(path);
    }
    open_file(path)
}

fn open_file(path: &Path) -> Result<Opened, Error> {
    let shown = path.to_string_lossy().into_owned();
    let mut file = File::open(path).map_err(Error::io(&shown))?;
    let header = read_header(&mut file, &shown)?;
    Ok(Opened {
        tensors: header.tensors.into_iter().map(|t| (0, t)).collect(),
        parts: vec![Part::new(
            path.to_owned(),
            file,
            header.data_start,
            header.metadata,
        )],
        shown,
        unassigned: Vec::new(),
    })
}

/// Opens every shard the index names, in order of shard name, and keeps,
/// of each shard's tensors, those the index assigns to it.
fn open_index(index_path: &Path) -> Result<Opened, Error> {
    let index = read_index(index_path)?;
    let dir = index_path.parent().unwrap_or(Path::new("."));
    // The shards, sorted by name, each with the names assigned to it.
    let mut shards: Vec<&str> = index.entries.iter().map(|(_, f)| f.as_str()).collect();
    shards.sort_unstable();
    shards.dedup();
    let shard_of: FxHashMap<&str, usize> = index
        .entries
        .iter()
        .map(|(k, f)| {
            let at = shards.binary_search(&f.as_str()).unwrap_or_else(|_| {
                unreachable!("every shard of the index is in the list of its shards")
            });
            (k.as_str(), at)
        })
        .collect();
    let keys_of = |at: usize| -> Vec<String> {
        let mut keys: Vec<String> = index
            .entries
            .iter()
            .filter(|(_, f)| f == shards[at])
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort_unstable();
        keys
    };

    let mut assigned = vec![0_usize; shards.len()];
    for &at in shard_of.values() {
        assigned[at] += 1;
    }

    let mut parts = Vec::with_capacity(shards.len());
    let mut tensors = Vec::with_capacity(index.entries.len());
    let mut unassigned = Vec::new();
    for (at, &name) in shards.iter().enumerate() {
        let path = dir.join(name);
        let shown = path.to_string_lossy();
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let problem = BadIndex::MissingShard {
                    file: name.to_owned(),
                    keys: keys_of(at),
                };
                return Err(bad(index_path, problem));
            }
            Err(e) => return Err(Error::io(&shown)(e)),
        };
        let header = read_header(&mut file, &shown)?;
        if let Some(id) = &index.save_id {
            let shard_id = header.metadata.as_ref().and_then(|m| m.get(SAVE_ID));
            if shard_id != Some(id) {
                let problem = BadIndex::TornSave {
                    file: name.to_owned(),
                };
                return Err(bad(index_path, problem));
            }
        }
        let mut held = 0;
        for mut t in header.tensors {
            if shard_of.get(t.key.as_str()) == Some(&at) {
                held += 1;
                t.shard = Some(name.to_owned());
                tensors.push((at, t));
            } else {
                unassigned.push((t.key, name.to_owned()));
            }
        }
        if held < assigned[at] {
            let have: rustc_hash::FxHashSet<&str> = tensors
                .iter()
                .filter(|(p, _)| *p == at)
                .map(|(_, t)| t.key.as_str())
                .collect();
            let keys = keys_of(at)
                .into_iter()
                .filter(|k| !have.contains(k.as_str()))
                .collect();
            let problem = BadIndex::ShardLacks {
                file: name.to_owned(),
                keys,
            };
            return Err(bad(index_path, problem));
        }
        parts.push(Part::new(path, file, header.data_start, header.metadata));
    }
    unassigned.sort_unstable();
    Ok(Opened {
        shown: index_path.to_string_lossy().into_owned(),
        parts,
        tensors,
        unassigned,
    })
}

impl Opened {
    /// Reads the bytes of tensor `i` (a position in
    /// [`tensors`](Self::tensors)), as the file holds them, into `into`,
    /// which must be exactly as long. O(its bytes).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read (a file cut short) or
    /// `into` is not the tensor's length.
    pub(crate) fn read_into(&self, i: usize, into: &mut [u8]) -> Result<(), Error> {
        use std::io::Read;
        let (mut file, shown, len) = self.seek_to(i)?;
        if len != into.len() as u64 {
            let problem = format!(
                "tensor `{}` holds {len} bytes, {} asked for",
                short::name(&self.tensors[i].1.key),
                into.len()
            );
            return Err(Error::io(&shown)(std::io::Error::other(problem)));
        }
        file.read_exact(into).map_err(Error::io(&shown))
    }

    /// The file of tensor `i`, positioned at its first byte, with the path
    /// errors name and the tensor's length in bytes. O(1).
    fn seek_to(&self, i: usize) -> Result<(&File, String, u64), Error> {
        use std::io::{Seek, SeekFrom};
        let (part, t) = &self.tensors[i];
        let part = &self.parts[*part];
        let shown = part.path.to_string_lossy().into_owned();
        let mut file = &part.file;
        file.seek(SeekFrom::Start(part.data_start + t.begin))
            .map_err(Error::io(&shown))?;
        Ok((file, shown, t.end - t.begin))
    }

    /// The xxh3-128 of the bytes of tensor `i` as the file holds them,
    /// read through `buf` a buffer at a time (`buf` grows to at most 8
    /// MiB, and is kept for the next call). O(its bytes); holds no more
    /// than `buf`.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read (a file cut short).
    pub(crate) fn hash_of(&self, i: usize, buf: &mut Vec<u8>) -> Result<u128, Error> {
        use std::io::Read;
        let (mut file, shown, mut left) = self.seek_to(i)?;
        let chunk = usize::try_from(left).unwrap_or(usize::MAX).min(8 << 20);
        if buf.len() < chunk {
            buf.resize(chunk, 0);
        }
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        while left > 0 {
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            file.read_exact(&mut buf[..n]).map_err(Error::io(&shown))?;
            h.update(&buf[..n]);
            left -= n as u64;
        }
        Ok(h.digest128())
    }

    /// The checksum the file of tensor `i` records for it, with that
    /// file's path; `None` when that file records no checksum at all (see
    /// [`Part::checksum`]). O(1) plus a hash lookup.
    ///
    /// # Errors
    /// As [`Part::checksum`].
    pub(crate) fn checksum(&self, i: usize) -> Result<Option<(u128, &Path)>, Error> {
        let (part, t) = &self.tensors[i];
        let part = &self.parts[*part];
        Ok(part.checksum(&t.key)?.map(|sum| (sum, part.path.as_path())))
    }
}
