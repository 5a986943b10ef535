//! Saving a tree, a subtree or a store.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use std::io::Write;

use safetensors::tensor::{Metadata, TensorInfo};

use super::checkpointable::Checkpointable;
use super::codec::WriteLe;
use super::dtype::{Dtype, FloatDtype};
use super::error::{Error, NotTensor};
use super::float_convert::{convert_floats_into, is_convertible_float};
use super::index::{INDEX_FILE, SAVE_ID, index_json, read_index, shard_name};
use super::known_types::Types;
use super::{Filter, Separator, walk};
use crate::{ScopeId, ScopeTree, VarId};

/// How to save: the key separator, whether to skip variables that hold no
/// tensor, extra types, and the file's `__metadata__`.
///
/// ```
/// use scopetree::checkpoint::{SaveOptions, Separator};
/// let opts = SaveOptions::new().separator(Separator::Dot).skip_non_tensors(true);
/// # let _ = opts;
/// ```
#[derive(Clone)]
pub struct SaveOptions {
    pub(crate) sep: Separator,
    pub(crate) skip_non_tensors: bool,
    pub(crate) metadata: Option<HashMap<String, String>>,
    pub(crate) types: Types,
    pub(crate) filter: Option<Filter>,
    pub(crate) floats_as: Option<Dtype>,
    pub(crate) max_shard_size: u64,
}

/// The default largest shard of a sharded save, in tensor bytes: 5 GB,
/// the Hugging Face tools' default.
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 5_000_000_000;

impl Default for SaveOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for SaveOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaveOptions")
            .field("separator", &self.sep)
            .field("skip_non_tensors", &self.skip_non_tensors)
            .field("metadata", &self.metadata)
            .field("floats_as", &self.floats_as)
            .field("max_shard_size", &self.max_shard_size)
            .finish_non_exhaustive()
    }
}

impl SaveOptions {
    /// The defaults: `/` keys, fail on non-tensors, no metadata. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::SaveOptions::new();
    /// ```
    pub fn new() -> Self {
        Self {
            sep: Separator::Slash,
            skip_non_tensors: false,
            metadata: None,
            types: Types::builtin(),
            filter: None,
            floats_as: None,
            max_shard_size: DEFAULT_MAX_SHARD_SIZE,
        }
    }

    /// Writes every float tensor (`F16`, `BF16`, `F32`, `F64`) as `dtype`,
    /// rounding each value once to nearest, ties to even:
    /// `floats_as(FloatDtype::BF16)` publishes an `f32` model in bf16.
    /// Other tensors keep their dtype. The tree is not changed. Extra
    /// memory: one shard's converted bytes. O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::{FloatDtype, SaveOptions};
    /// let _ = SaveOptions::new().floats_as(FloatDtype::BF16);
    /// ```
    pub fn floats_as(mut self, dtype: FloatDtype) -> Self {
        self.floats_as = Some(dtype.dtype());
        self
    }

    /// The most tensor bytes a shard of a [sharded
    /// save](super::save_sharded) holds ([`DEFAULT_MAX_SHARD_SIZE`], 5 GB,
    /// by default). A tensor larger than this gets a shard of its own; 0
    /// gives every tensor a shard. Single-file saves ignore it. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::SaveOptions::new().max_shard_size(2 << 30);
    /// ```
    pub fn max_shard_size(mut self, bytes: u64) -> Self {
        self.max_shard_size = bytes;
        self
    }

    /// The separator between scope names in keys (`/` by default; `.` for
    /// PyTorch and candle names). O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::{SaveOptions, Separator};
    /// let _ = SaveOptions::new().separator(Separator::Dot);
    /// ```
    pub fn separator(mut self, sep: Separator) -> Self {
        self.sep = sep;
        self
    }

    /// Skip variables that hold no tensor (or no value) instead of failing;
    /// the report lists them. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::SaveOptions::new().skip_non_tensors(true);
    /// ```
    pub fn skip_non_tensors(mut self, skip: bool) -> Self {
        self.skip_non_tensors = skip;
        self
    }

    /// String pairs stored in the file's `__metadata__`. O(1).
    ///
    /// ```
    /// let meta = [("epoch".to_string(), "3".to_string())].into_iter().collect();
    /// let _ = scopetree::checkpoint::SaveOptions::new().metadata(meta);
    /// ```
    pub fn metadata(mut self, metadata: HashMap<String, String>) -> Self {
        self.metadata = Some(metadata);
        self
    }

    /// Only keys for which `keep` returns `true` are saved. O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::SaveOptions;
    /// // Only the parameters and the optimizer state, not scratch buffers.
    /// let _ = SaveOptions::new().filter(|key| !key.contains('/') || key.starts_with("optim/"));
    /// ```
    pub fn filter(mut self, keep: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.filter = Some(std::sync::Arc::new(keep));
        self
    }

    /// Saves values of a [`Checkpointable`] type of your own too. O(1).
    ///
    /// ```
    /// # use scopetree::checkpoint::{Checkpointable, Dtype, Error, SaveOptions};
    /// # use std::borrow::Cow;
    /// struct Scalar(f32);
    /// impl Checkpointable for Scalar {
    ///     fn dtype(&self) -> Dtype { Dtype::F32 }
    ///     fn shape(&self) -> Cow<'_, [usize]> { Cow::Borrowed(&[]) }
    ///     fn le_bytes(&self) -> Cow<'_, [u8]> { Cow::Owned(self.0.to_le_bytes().to_vec()) }
    ///     fn from_le_bytes(_: Dtype, _: &[usize], b: Vec<u8>) -> Result<Self, Error> {
    ///         let a: [u8; 4] = b.try_into().map_err(|_| Error::BadTensor { reason: "4 bytes".into() })?;
    ///         Ok(Scalar(f32::from_le_bytes(a)))
    ///     }
    /// }
    /// let _ = SaveOptions::new().with_type::<Scalar>();
    /// ```
    pub fn with_type<T: Checkpointable>(mut self) -> Self {
        self.types.add::<T>();
        self
    }
}

/// What a save wrote and left out.
///
/// ```
/// # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
/// use scopetree::{ScopeTree, checkpoint};
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// tree.set(w, vec![0_u8; 2])?;
/// let r = checkpoint::save(&tree, tree.root(), dir.join("r.safetensors"), &checkpoint::SaveOptions::new())?;
/// assert_eq!(r.keys, ["w"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SaveReport {
    /// The keys written, sorted.
    pub keys: Vec<String>,
    /// Variables left out because they hold no tensor (with
    /// [`SaveOptions::skip_non_tensors`]).
    pub skipped: Vec<NotTensor>,
    /// Paths of unnamed scopes below the saved scope: they have no stable
    /// name, so neither they nor what is below them are saved.
    pub unnamed_scopes: Vec<String>,
    /// The shard files a [sharded save](super::save_sharded) wrote, in
    /// order (empty for a single-file save); the index names them.
    pub shards: Vec<String>,
}

/// One tensor to write: its dtype and shape as held, and where its bytes
/// come from.
struct Item<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Data<'a>,
}

/// A tensor's bytes: held (staged by the ranks layer), or streamed from
/// the variable's value while the file is written.
enum Data<'a> {
    Bytes(Cow<'a, [u8]>),
    Value(&'a dyn std::any::Any, WriteLe),
}

/// The pieces a value's bytes are streamed in: 8 MiB.
const WRITE_CHUNK: usize = 8 << 20;

/// The tensors to write, keyed and sorted, with the report so far. Reads
/// no bytes: they are streamed from the values while the file is written.
fn collect<'t>(
    tree: &'t ScopeTree,
    scope: ScopeId,
    opts: &SaveOptions,
    shape_of: &dyn Fn(VarId) -> Option<Vec<usize>>,
) -> Result<(Vec<(String, Item<'t>)>, SaveReport), Error> {
    let walked = walk(tree, scope, opts.sep, opts.filter.as_ref())?;
    let mut report = SaveReport {
        unnamed_scopes: walked.unnamed_scopes,
        ..SaveReport::default()
    };
    let mut items = Vec::with_capacity(walked.vars.len());
    let mut not_tensors = Vec::new();
    for (key, var) in walked.vars {
        let found = tree.value_any(var).and_then(|v| {
            let codec = opts.types.get(v.type_id())?;
            Some(((codec.meta)(v), v, codec.write))
        });
        let Some((Some((dtype, mut shape, flat)), value, write)) = found else {
            not_tensors.push(NotTensor {
                key,
                holds: tree.type_name(var)?,
            });
            continue;
        };
        if flat {
            if let Some(s) = shape_of(var) {
                if s.iter().product::<usize>() == shape.iter().product::<usize>() {
                    shape = s;
                }
            }
        }
        report.keys.push(key.clone());
        items.push((
            key,
            Item {
                dtype,
                shape,
                data: Data::Value(value, write),
            },
        ));
    }
    if !not_tensors.is_empty() {
        if !opts.skip_non_tensors {
            return Err(Error::NotTensors { vars: not_tensors });
        }
        report.skipped = not_tensors;
    }
    report.keys.sort_unstable();
    Ok((items, report))
}

impl Item<'_> {
    /// The dtype the item is written in under `floats_as`.
    fn written_dtype(&self, floats_as: Option<Dtype>) -> Dtype {
        match floats_as {
            Some(to) if is_convertible_float(self.dtype) => to,
            _ => self.dtype,
        }
    }

    /// The bytes the item holds as held.
    fn len(&self) -> u64 {
        let n: u64 = self.shape.iter().map(|&d| d as u64).product();
        n * self.dtype.bitsize() as u64 / 8
    }

    /// The bytes written under `floats_as`.
    fn written_len(&self, floats_as: Option<Dtype>) -> u64 {
        let to = self.written_dtype(floats_as);
        self.len() * to.bitsize() as u64 / self.dtype.bitsize() as u64
    }

    /// Writes the item's bytes to `w`, converted to `to` when it differs
    /// from the held dtype (in pieces: memory is one converted piece).
    /// Fails if the value hands over another number of bytes than its
    /// shape holds.
    fn write(&self, key: &str, to: Dtype, w: &mut dyn Write, shown: &str) -> Result<(), Error> {
        let mut converted = Vec::new();
        let mut n = 0_u64;
        let mut put = |piece: &[u8]| -> Result<(), Error> {
            n += piece.len() as u64;
            let out = if to == self.dtype {
                piece
            } else {
                converted.resize(
                    piece.len() / (self.dtype.bitsize() / 8) * (to.bitsize() / 8),
                    0,
                );
                convert_floats_into(self.dtype, to, piece, &mut converted);
                &converted
            };
            w.write_all(out).map_err(Error::io(shown))
        };
        match &self.data {
            Data::Bytes(b) => b.chunks(WRITE_CHUNK).try_for_each(&mut put)?,
            Data::Value(v, write) => write(*v, WRITE_CHUNK, &mut put).map_err(|e| match e {
                Error::BadTensor { reason } => Error::BadTensor {
                    reason: format!("cannot read {}: {reason}", crate::short::path(key)),
                },
                other => other,
            })?,
        }
        if n != self.len() {
            return Err(Error::BadTensor {
                reason: format!(
                    "{} handed over {n} bytes for a {:?} tensor of shape {:?} ({} bytes)",
                    crate::short::path(key),
                    self.dtype,
                    self.shape,
                    self.len()
                ),
            });
        }
        Ok(())
    }
}

/// The JSON header of a file of the tensors `infos` (in their order) with
/// `metadata`, as `safetensors::serialize` makes it but with the metadata's
/// entries sorted by key (`serialize` writes them in a `HashMap`'s order,
/// which differs from map to map): the same tensors and metadata
/// give the same bytes. O(tensors + metadata entries × log).
fn header_json(
    metadata: Option<HashMap<String, String>>,
    infos: Vec<(String, TensorInfo)>,
) -> Result<Vec<u8>, safetensors::SafeTensorError> {
    let json_err = safetensors::SafeTensorError::JsonError;
    let tensors = serde_json::to_string(&Metadata::new(None, infos)?).map_err(json_err)?;
    let Some(metadata) = metadata else {
        return Ok(tensors.into_bytes());
    };
    let sorted: std::collections::BTreeMap<String, String> = metadata.into_iter().collect();
    let mut out = String::from("{\"__metadata__\":");
    out.push_str(&serde_json::to_string(&sorted).map_err(json_err)?);
    // `tensors` is `{` then the tensors' entries, or `{}` with none.
    if tensors.len() > 2 {
        out.push(',');
    }
    out.push_str(&tensors[1..]);
    Ok(out.into_bytes())
}

/// Writes `items` to `path` as safetensors, atomically (a temporary file,
/// then a rename), keeping the permissions of the file it replaces: the
/// header as `safetensors::serialize` makes it (tensors by dtype, largest
/// alignment first, then by key; the JSON padded with spaces to 8 bytes),
/// its metadata sorted by key ([`header_json`]),
/// then each tensor's bytes streamed from its value, converted to
/// `floats_as` where they convert. O(bytes); memory: the header and one
/// piece of a value.
fn write_file(
    mut items: Vec<(String, Item<'_>)>,
    metadata: Option<HashMap<String, String>>,
    floats_as: Option<Dtype>,
    path: &Path,
) -> Result<(), Error> {
    let shown = crate::short::path(&path.to_string_lossy());
    let write_err = |source| Error::Write {
        path: shown.clone(),
        source,
    };
    items.sort_by(|(ka, a), (kb, b)| {
        b.written_dtype(floats_as)
            .cmp(&a.written_dtype(floats_as))
            .then_with(|| ka.cmp(kb))
    });
    let mut infos = Vec::with_capacity(items.len());
    let mut offset = 0_usize;
    for (key, item) in &items {
        let len = usize::try_from(item.written_len(floats_as))
            .map_err(|_| write_err(safetensors::SafeTensorError::ValidationOverflow))?;
        infos.push((
            key.clone(),
            TensorInfo {
                dtype: item.written_dtype(floats_as),
                shape: item.shape.clone(),
                data_offsets: (offset, offset + len),
            },
        ));
        offset += len;
    }
    let mut header = header_json(metadata, infos).map_err(write_err)?;
    header.resize(header.len().next_multiple_of(8), b' ');
    if header.len() > MAX_HEADER {
        return Err(write_err(safetensors::SafeTensorError::HeaderTooLarge));
    }
    let old_permissions = std::fs::metadata(path).ok().map(|m| m.permissions());
    write_atomic_with(path, false, &mut |w| {
        w.write_all(&(header.len() as u64).to_le_bytes())
            .and_then(|()| w.write_all(&header))
            .map_err(Error::io(&shown))?;
        for (key, item) in &items {
            item.write(key, item.written_dtype(floats_as), w, &shown)?;
        }
        Ok(())
    })
    // The file's own IO (its temporary file, writes, rename) fails as the
    // safetensors writer's did.
    .map_err(|e| match e {
        Error::Io { source, .. } => write_err(safetensors::SafeTensorError::IoError(source)),
        other => other,
    })?;
    set_permissions(path, old_permissions)
}

/// The largest header safetensors reads: 100 MB.
const MAX_HEADER: usize = 100_000_000;

/// One tensor held outside a tree (a copy staged for a write in the
/// background), for [`write_tensors`].
pub(crate) struct Staged<'a> {
    pub(crate) key: &'a str,
    pub(crate) dtype: Dtype,
    pub(crate) shape: &'a [usize],
    pub(crate) bytes: &'a [u8],
}

/// Writes tensors held outside a tree to `path` as [`save`](super::save)
/// writes a tree's: floats converted to `floats_as` where they convert,
/// atomically (a temporary file, then a rename), with `metadata`. O(bytes);
/// memory: one converted piece under `floats_as`.
pub(crate) fn write_tensors(
    tensors: &[Staged<'_>],
    floats_as: Option<Dtype>,
    metadata: Option<HashMap<String, String>>,
    path: &Path,
) -> Result<(), Error> {
    let items = tensors
        .iter()
        .map(|t| {
            let item = Item {
                dtype: t.dtype,
                shape: t.shape.to_vec(),
                data: Data::Bytes(Cow::Borrowed(t.bytes)),
            };
            (t.key.to_owned(), item)
        })
        .collect();
    write_file(items, metadata, floats_as, path)
}

pub(crate) fn save_with(
    tree: &ScopeTree,
    scope: ScopeId,
    path: &Path,
    opts: &SaveOptions,
    shape_of: &dyn Fn(VarId) -> Option<Vec<usize>>,
) -> Result<SaveReport, Error> {
    let (items, report) = collect(tree, scope, opts, shape_of)?;
    write_file(items, opts.metadata.clone(), opts.floats_as, path)?;
    Ok(report)
}

/// A sharded save into `dir`: the tensors in key order, cut into shards of
/// at most `opts.max_shard_size` tensor bytes, each shard written
/// atomically, then the index, atomically, last; shards of the index it
/// replaces that it does not name are removed after it.
pub(crate) fn save_sharded_with(
    tree: &ScopeTree,
    scope: ScopeId,
    dir: &Path,
    opts: &SaveOptions,
    shape_of: &dyn Fn(VarId) -> Option<Vec<usize>>,
) -> Result<SaveReport, Error> {
    let (items, report) = collect(tree, scope, opts, shape_of)?;
    write_sharded(items, report, dir, opts)
}

/// Saves tensors held outside a tree (staged by a save beside training) as
/// [`save_sharded`](super::save_sharded) saves a tree's: shards of at most
/// `opts.max_shard_size` tensor bytes in key order, `floats_as` and the
/// metadata applied, the index last. O(bytes); memory: one converted piece.
#[cfg_attr(not(feature = "candle"), allow(dead_code))]
pub(crate) fn save_staged_sharded(
    tensors: &[Staged<'_>],
    dir: &Path,
    opts: &SaveOptions,
) -> Result<SaveReport, Error> {
    let mut items: Vec<(String, Item<'_>)> = tensors
        .iter()
        .map(|t| {
            (
                t.key.to_owned(),
                Item {
                    dtype: t.dtype,
                    shape: t.shape.to_vec(),
                    data: Data::Bytes(Cow::Borrowed(t.bytes)),
                },
            )
        })
        .collect();
    items.sort_by(|a, b| a.0.cmp(&b.0));
    let report = SaveReport {
        keys: items.iter().map(|(k, _)| k.clone()).collect(),
        ..SaveReport::default()
    };
    write_sharded(items, report, dir, opts)
}

/// One tensor held outside a tree whose bytes `write` streams from
/// `value` while its file is written (a burn module's tensor, read back
/// from its device only then), for [`save_streamed`].
#[cfg(any(feature = "burn", feature = "candle"))]
pub(crate) struct Streamed<'a> {
    pub(crate) key: String,
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    pub(crate) value: &'a dyn std::any::Any,
    pub(crate) write: WriteLe,
}

/// Saves streamed tensors as one file at `path` or, with `sharded`, as a
/// sharded checkpoint in the directory `path`, as [`save`](super::save)
/// and [`save_sharded`](super::save_sharded) save a tree's variables:
/// `floats_as` and the metadata applied (with `"format": "pt"`), shards
/// cut in key order, every file atomic, the index last. With `checksums`,
/// every file's metadata holds the xxh3-128 of every tensor's bytes as
/// written (under [`CHECKSUM_PREFIX`](super::index::CHECKSUM_PREFIX)): the
/// header comes first, so each tensor is streamed twice, once to hash it.
/// O(bytes); memory: one piece of one tensor, plus what `write` holds.
#[cfg(any(feature = "burn", feature = "candle"))]
pub(crate) fn save_streamed(
    mut tensors: Vec<Streamed<'_>>,
    path: &Path,
    sharded: bool,
    checksums: bool,
    opts: &SaveOptions,
) -> Result<SaveReport, Error> {
    tensors.sort_by(|a, b| a.key.cmp(&b.key));
    let report = SaveReport {
        keys: tensors.iter().map(|t| t.key.clone()).collect(),
        ..SaveReport::default()
    };
    let items: Vec<(String, Item<'_>)> = tensors
        .into_iter()
        .map(|t| {
            let item = Item {
                dtype: t.dtype,
                shape: t.shape,
                data: Data::Value(t.value, t.write),
            };
            (t.key, item)
        })
        .collect();
    let mut opts = opts.clone();
    let mut meta = opts.metadata.take().unwrap_or_default();
    meta.entry("format".to_owned())
        .or_insert_with(|| "pt".to_owned());
    if checksums {
        let shown = path.to_string_lossy();
        for (key, item) in &items {
            let mut hash = xxhash_rust::xxh3::Xxh3::new();
            let mut sink = HashSink(&mut hash);
            item.write(key, item.written_dtype(opts.floats_as), &mut sink, &shown)?;
            let entry = format!("{}{key}", super::index::CHECKSUM_PREFIX);
            meta.insert(entry, format!("{:032x}", hash.digest128()));
        }
    }
    opts.metadata = Some(meta);
    if sharded {
        write_sharded(items, report, path, &opts)
    } else {
        write_file(items, opts.metadata.clone(), opts.floats_as, path)?;
        Ok(report)
    }
}

/// A writer that hashes what it is given.
#[cfg(any(feature = "burn", feature = "candle"))]
struct HashSink<'h>(&'h mut xxhash_rust::xxh3::Xxh3);

#[cfg(any(feature = "burn", feature = "candle"))]
impl Write for HashSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes `items` (in key order) as shards and an index into `dir`.
fn write_sharded(
    items: Vec<(String, Item<'_>)>,
    mut report: SaveReport,
    dir: &Path,
    opts: &SaveOptions,
) -> Result<SaveReport, Error> {
    let shown = dir.to_string_lossy();
    std::fs::create_dir_all(dir).map_err(Error::io(&shown))?;

    // Greedy, in key order, as the Hugging Face tools cut.
    let mut groups: Vec<Vec<(String, Item<'_>)>> = Vec::new();
    let mut room = 0_u64;
    let mut total = 0_u64;
    for (key, item) in items {
        let len = item.written_len(opts.floats_as);
        total += len;
        match groups.last_mut() {
            Some(g) if len <= room => {
                room -= len;
                g.push((key, item));
            }
            _ => {
                room = opts.max_shard_size.saturating_sub(len);
                groups.push(vec![(key, item)]);
            }
        }
    }
    if groups.is_empty() {
        groups.push(Vec::new());
    }
    let n = groups.len();
    let save_id = new_save_id();
    let mut meta = opts.metadata.clone().unwrap_or_default();
    // The Hugging Face loaders refuse a safetensors file without it.
    meta.entry("format".to_owned())
        .or_insert_with(|| "pt".to_owned());
    meta.insert(SAVE_ID.to_owned(), save_id.clone());

    let index_path = dir.join(INDEX_FILE);
    let mut old_shards: Vec<String> = read_index(&index_path)
        .map(|i| i.entries.into_iter().map(|(_, f)| f).collect())
        .unwrap_or_default();
    old_shards.sort_unstable();
    old_shards.dedup();
    let mut weight_map: Vec<(String, String)> = Vec::with_capacity(report.keys.len());
    for (k, group) in groups.into_iter().enumerate() {
        let name = shard_name(k + 1, n);
        for (key, _) in &group {
            weight_map.push((key.clone(), name.clone()));
        }
        write_file(group, Some(meta.clone()), opts.floats_as, &dir.join(&name))?;
        report.shards.push(name);
    }
    let entries: Vec<(&str, &str)> = weight_map
        .iter()
        .map(|(k, f)| (k.as_str(), f.as_str()))
        .collect();
    let text = index_json(&entries, total, &save_id);
    write_atomic(&index_path, text.as_bytes())?;
    for old in old_shards {
        // The old index's shard names are plain file names (`read_index`
        // checks them).
        if !report.shards.contains(&old) && old != INDEX_FILE {
            // Left by the save this one replaces; a file already gone is fine.
            let _ = std::fs::remove_file(dir.join(old));
        }
    }
    Ok(report)
}

/// A new id for a save: the time, the process and a counter.
pub(crate) fn new_save_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{nanos:x}-{:x}-{n:x}", std::process::id())
}

/// Writes `bytes` to a temporary file beside `path`, flushes it to the
/// disk, then renames it to `path`; nothing is left at `path` or beside it
/// on an error.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let shown = path.to_string_lossy().into_owned();
    let old_permissions = std::fs::metadata(path).ok().map(|m| m.permissions());
    write_atomic_with(path, true, &mut |w| {
        w.write_all(bytes).map_err(Error::io(&shown))
    })?;
    set_permissions(path, old_permissions)
}

/// Writes what `fill` writes into a temporary file beside `path` (through
/// a 1 MiB buffer), flushes it to the disk when `sync`, then renames it to
/// `path`; nothing is left at `path` or beside it on an error.
fn write_atomic_with(
    path: &Path,
    sync: bool,
    fill: &mut dyn FnMut(&mut dyn Write) -> Result<(), Error>,
) -> Result<(), Error> {
    let shown = path.to_string_lossy();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let (tmp, file) = tempfile_in(dir).map_err(Error::io(&shown))?;
    let written = (|| {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, &file);
        fill(&mut w)?;
        w.flush().map_err(Error::io(&shown))?;
        drop(w);
        if sync {
            file.sync_all().map_err(Error::io(&shown))?;
        }
        std::fs::rename(&tmp, path).map_err(Error::io(&shown))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A new file beside the index, named for this process and a counter.
fn tempfile_in(dir: &Path) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = dir.join(format!(".{INDEX_FILE}.{}.{n}.tmp", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => return Ok((p, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
}

/// The safetensors writer renames a temporary file made with mode 0600 into
/// place; give the checkpoint the permissions of the file it replaced, or
/// 0644 on Unix for a new file, like a file written with `std::fs::write`
/// under the usual umask.
fn set_permissions(path: &Path, old: Option<std::fs::Permissions>) -> Result<(), Error> {
    let shown = path.to_string_lossy();
    let perms = match old {
        Some(p) => p,
        None => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::Permissions::from_mode(0o644)
            }
            #[cfg(not(unix))]
            {
                return Ok(());
            }
        }
    };
    std::fs::set_permissions(path, perms).map_err(Error::io(&shown))
}

/// Flushes the file at `path` to the disk, so that an index written
/// after it never names bytes a power loss can take back. O(the file's dirty pages).
pub(crate) fn sync_file(path: &Path) -> Result<(), Error> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(Error::io(&path.to_string_lossy()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infos() -> Vec<(String, TensorInfo)> {
        let info = |dtype, shape: Vec<usize>, at: (usize, usize)| TensorInfo {
            dtype,
            shape,
            data_offsets: at,
        };
        vec![
            (
                "w".to_owned(),
                info(safetensors::Dtype::F32, vec![2], (0, 8)),
            ),
            (
                "b".to_owned(),
                info(safetensors::Dtype::U8, vec![3], (8, 11)),
            ),
        ]
    }

    /// With one metadata entry (or none) the header is byte for byte what
    /// `safetensors` writes; with many, the entries come sorted, whatever
    /// the map's order. With no tensor and an empty metadata map it is
    /// `{"__metadata__":{}}`, where `safetensors` 0.8 writes the invalid
    /// `{},"__metadata__":{}}`.
    #[test]
    fn headers_are_safetensors_own_with_the_metadata_sorted() {
        let ours = |meta: Option<HashMap<String, String>>, infos| {
            String::from_utf8(header_json(meta, infos).unwrap()).unwrap()
        };
        let theirs = |meta: Option<HashMap<String, String>>, infos| {
            serde_json::to_string(&Metadata::new(meta, infos).unwrap()).unwrap()
        };
        let one = HashMap::from([("format".to_owned(), "pt".to_owned())]);
        for meta in [None, Some(one)] {
            assert_eq!(ours(meta.clone(), infos()), theirs(meta.clone(), infos()));
            assert_eq!(ours(meta.clone(), Vec::new()), theirs(meta, Vec::new()));
        }
        let empty = Some(HashMap::new());
        assert_eq!(ours(empty.clone(), infos()), theirs(empty.clone(), infos()));
        assert_eq!(ours(empty, Vec::new()), r#"{"__metadata__":{}}"#);
        let many: Vec<(String, String)> = (0..40)
            .map(|i| (format!("k{:02}", (i * 7) % 40), i.to_string()))
            .collect();
        let text = ours(Some(many.iter().cloned().collect()), infos());
        let keys: Vec<usize> = (0..40)
            .map(|k| text.find(&format!("\"k{k:02}\"")).unwrap())
            .collect();
        assert!(keys.is_sorted(), "{text}");
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["__metadata__"].as_object().unwrap().len(), 40);
        assert_eq!(parsed["b"]["data_offsets"], serde_json::json!([8, 11]));
    }
}
