//! Saving a tree, a subtree or a store.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::View;

use super::error::{Error, NotTensor};
use super::tensor::{Checkpointable, Dtype, Types};
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
}

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
        }
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
/// # let dir = std::env::temp_dir().join(format!("st-doc-sr-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
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
}

/// One tensor handed to the safetensors writer.
struct Item<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Cow<'a, [u8]>,
}

impl View for Item<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

pub(crate) fn save_with(
    tree: &ScopeTree,
    scope: ScopeId,
    path: &Path,
    opts: &SaveOptions,
    shape_of: &dyn Fn(VarId) -> Option<Vec<usize>>,
) -> Result<SaveReport, Error> {
    let walked = walk(tree, scope, opts.sep, opts.filter.as_ref())?;
    let mut report = SaveReport {
        unnamed_scopes: walked.unnamed_scopes,
        ..SaveReport::default()
    };
    let mut items = Vec::with_capacity(walked.vars.len());
    let mut not_tensors = Vec::new();
    for (key, var) in walked.vars {
        let parts = tree.value_any(var).and_then(|v| {
            let codec = opts.types.get(v.type_id())?;
            (codec.parts)(v)
        });
        let parts = match parts {
            Some(Err(e)) => {
                return Err(Error::BadTensor {
                    reason: format!("cannot read {}: {e}", crate::short::path(&key)),
                });
            }
            Some(Ok(p)) => Some(p),
            None => None,
        };
        let Some(parts) = parts else {
            not_tensors.push(NotTensor {
                key,
                holds: tree.type_name(var)?,
            });
            continue;
        };
        let mut shape = parts.shape.into_owned();
        if parts.flat {
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
                dtype: parts.dtype,
                shape,
                bytes: parts.bytes,
            },
        ));
    }
    if !not_tensors.is_empty() {
        if !opts.skip_non_tensors {
            return Err(Error::NotTensors { vars: not_tensors });
        }
        report.skipped = not_tensors;
    }
    let old_permissions = std::fs::metadata(path).ok().map(|m| m.permissions());
    safetensors::serialize_to_file(items, opts.metadata.clone(), path).map_err(|source| {
        Error::Write {
            path: crate::short::path(&path.to_string_lossy()),
            source,
        }
    })?;
    set_permissions(path, old_permissions)?;
    report.keys.sort_unstable();
    Ok(report)
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
