//! Loading: check everything first, then stream tensors one at a time.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use super::error::{Error, Mismatch};
use super::header::{FileTensor, read_header};
use super::tensor::{
    Checkpointable, Codec, Dtype, Old, Source, Types, convert_floats, default_codec,
    is_convertible_float,
};
use super::{Filter, Separator, walk};
use crate::{ScopeId, ScopeTree, VarId, short};
use rustc_hash::FxHashMap;

/// The read buffer: small tensors are read through it, large ones straight
/// into their values.
pub(crate) const READ_BUFFER: usize = 64 * 1024;

/// Whether a load accepts a file tensor of another dtype than the variable.
///
/// ```
/// use scopetree::checkpoint::{DtypePolicy, LoadOptions};
/// let _ = LoadOptions::new().dtype_policy(DtypePolicy::Convert);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DtypePolicy {
    /// The dtypes must be equal (the default).
    #[default]
    Exact,
    /// Float dtypes (`F16`, `BF16`, `F32`, `F64`) convert to the variable's
    /// float dtype, rounding to nearest; any other difference is a mismatch.
    Convert,
}

/// How to load: which disagreements to accept, whether to create variables,
/// the dtype policy, the key separator and extra types.
///
/// ```
/// use scopetree::checkpoint::LoadOptions;
/// let opts = LoadOptions::new().allow_missing(true).allow_unused(true);
/// # let _ = opts;
/// ```
#[derive(Clone)]
pub struct LoadOptions {
    sep: Separator,
    allow_missing: bool,
    allow_unused: bool,
    create: bool,
    create_shaped: bool,
    dtype: DtypePolicy,
    rollback: bool,
    types: Types,
    filter: Option<Filter>,
    /// The codec of the values a load creates, by dtype, when not the
    /// crate's default (`Vec`/`Tensor`); the candle store makes `Var`s.
    pub(crate) create_with: Option<fn(Dtype) -> Option<Codec>>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("separator", &self.sep)
            .field("allow_missing", &self.allow_missing)
            .field("allow_unused", &self.allow_unused)
            .field("create", &self.create)
            .field("create_shaped", &self.create_shaped)
            .field("dtype", &self.dtype)
            .field("rollback", &self.rollback)
            .finish_non_exhaustive()
    }
}

impl LoadOptions {
    /// The codec of a value this load creates for a file tensor of `dtype`.
    fn create_codec(&self, dtype: Dtype) -> Option<Codec> {
        match self.create_with {
            Some(f) => f(dtype),
            None => default_codec(dtype, self.create_shaped),
        }
    }

    /// Strict: every variable in the file, every file key in the tree,
    /// equal shapes and dtypes; `/` keys; rollback on a read error. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new();
    /// ```
    pub fn new() -> Self {
        Self {
            sep: Separator::Slash,
            allow_missing: false,
            allow_unused: false,
            create: false,
            create_shaped: false,
            dtype: DtypePolicy::Exact,
            rollback: true,
            types: Types::builtin(),
            filter: None,
            create_with: None,
        }
    }

    /// The key separator the file uses (`/` by default). O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::{LoadOptions, Separator};
    /// let _ = LoadOptions::new().separator(Separator::Dot);
    /// ```
    pub fn separator(mut self, sep: Separator) -> Self {
        self.sep = sep;
        self
    }

    /// Accept tree variables the file does not hold; they keep their values
    /// and the report lists them as missing. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().allow_missing(true);
    /// ```
    pub fn allow_missing(mut self, allow: bool) -> Self {
        self.allow_missing = allow;
        self
    }

    /// Accept file keys that name no tree variable; they are skipped and the
    /// report lists them as unused. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().allow_unused(true);
    /// ```
    pub fn allow_unused(mut self, allow: bool) -> Self {
        self.allow_unused = allow;
        self
    }

    /// Create the scopes and variables that file keys name and the tree
    /// lacks (loading before the model is built). New variables hold a
    /// `Vec<E>` of the file's dtype, or a [`Tensor<E>`](super::Tensor) with
    /// [`create_shaped`](Self::create_shaped). O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().create(true);
    /// ```
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Variables that [`create`](Self::create) makes, and variables without
    /// a value, get a [`Tensor<E>`](super::Tensor) (keeping the file's
    /// shape) instead of a `Vec<E>`. O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().create(true).create_shaped(true);
    /// ```
    pub fn create_shaped(mut self, shaped: bool) -> Self {
        self.create_shaped = shaped;
        self
    }

    /// The dtype policy ([`DtypePolicy::Exact`] by default). O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::{DtypePolicy, LoadOptions};
    /// let _ = LoadOptions::new().dtype_policy(DtypePolicy::Convert);
    /// ```
    pub fn dtype_policy(mut self, policy: DtypePolicy) -> Self {
        self.dtype = policy;
        self
    }

    /// Whether a read error after the checks restores the tree (the
    /// default). Restoring keeps each replaced value until the load ends,
    /// so the extra memory is about the file's size; `rollback(false)`
    /// reads each tensor into the variable's value in place when its type
    /// and size already fit, else drops the old value as soon as the new
    /// one is read (extra memory at most about one tensor), at the price of
    /// a partly loaded tree if the file fails mid-read ([`Error::Data`]
    /// says so). O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().rollback(false);
    /// ```
    pub fn rollback(mut self, rollback: bool) -> Self {
        self.rollback = rollback;
        self
    }

    /// Only keys for which `keep` returns `true` are loaded; on both sides of the load, other keys are neither missing nor unused. O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::LoadOptions;
    /// // Only the parameters and the optimizer state, not scratch buffers.
    /// let _ = LoadOptions::new().filter(|key| !key.contains('/') || key.starts_with("optim/"));
    /// ```
    pub fn filter(mut self, keep: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.filter = Some(std::sync::Arc::new(keep));
        self
    }

    /// Loads into values of a [`Checkpointable`] type of your own too. O(1).
    ///
    /// ```
    /// // See `SaveOptions::with_type` for a whole custom type.
    /// let _ = scopetree::checkpoint::LoadOptions::new().with_type::<Vec<f32>>();
    /// ```
    pub fn with_type<T: Checkpointable>(mut self) -> Self {
        self.types.add::<T>();
        self
    }
}

/// What a load did: keys loaded, created, missing from the file and unused.
/// Each list is sorted.
///
/// ```
/// let r = scopetree::checkpoint::LoadReport::default();
/// assert!(r.loaded.is_empty() && r.missing.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadReport {
    /// Keys whose tensors were loaded (including created ones).
    pub loaded: Vec<String>,
    /// Keys of variables the load created ([`LoadOptions::create`]).
    pub created: Vec<String>,
    /// Keys of tree variables the file does not hold (kept as they were).
    pub missing: Vec<String>,
    /// File keys that name no tree variable (skipped).
    pub unused: Vec<String>,
    /// Keys of tree variables that hold no tensor (or no value) and that the
    /// file does not name: left as they are, and not counted as missing.
    pub not_tensors: Vec<String>,
}

enum Step {
    Set {
        var: VarId,
        codec: Codec,
        convert_to: Option<Dtype>,
    },
    Create {
        comps: Vec<String>,
        codec: Codec,
    },
    Skip,
}

pub(crate) struct Plan {
    steps: Vec<(FileTensor, Step)>,
    data_start: u64,
    report: LoadReport,
}

fn describe(dtype: Dtype, shape: &[usize]) -> String {
    let shown: Vec<_> = shape.iter().take(8).collect();
    let cut = if shape.len() > 8 { " (cut)" } else { "" };
    format!("{dtype:?} {shown:?}{cut}")
}

/// Reads the header, matches it against the tree and decides every step;
/// changes nothing.
pub(crate) fn plan(
    tree: &ScopeTree,
    scope: ScopeId,
    path: &Path,
    opts: &LoadOptions,
    shape_of: &dyn Fn(VarId) -> Option<Vec<usize>>,
) -> Result<(Plan, File), Error> {
    tree.path(scope)?;
    let shown = path.to_string_lossy();
    let mut file = File::open(path).map_err(Error::io(&shown))?;
    let header = read_header(&mut file, &shown)?;
    let walked = walk(tree, scope, opts.sep, opts.filter.as_ref())?;
    let mut targets: FxHashMap<&str, VarId> =
        walked.vars.iter().map(|(k, v)| (k.as_str(), *v)).collect();

    let mut report = LoadReport::default();
    let mut unexpected = Vec::new();
    let mut mismatched = Vec::new();
    let mut steps = Vec::with_capacity(header.tensors.len());
    for t in header.tensors {
        if opts.filter.as_ref().is_some_and(|f| !f(&t.key)) {
            continue;
        }
        let file_side = describe(t.dtype, &t.shape);
        let step = if let Some(var) = targets.remove(t.key.as_str()) {
            match check_var(tree, var, &t, opts, shape_of) {
                Ok(step) => step,
                Err(tree_side) => {
                    mismatched.push(Mismatch {
                        key: t.key.clone(),
                        file: file_side,
                        tree: tree_side,
                    });
                    Step::Skip
                }
            }
        } else if opts.create {
            match check_create(&t, opts) {
                Ok(step) => step,
                Err(why) => {
                    mismatched.push(Mismatch {
                        key: t.key.clone(),
                        file: file_side,
                        tree: why,
                    });
                    Step::Skip
                }
            }
        } else {
            unexpected.push(t.key.clone());
            Step::Skip
        };
        steps.push((t, step));
    }
    // Variables that hold no tensor (or no value) could not have been
    // saved: absent from the file, they are not missing, only reported.
    let (mut missing, mut not_tensors): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    for (key, var) in targets {
        let is_tensor = tree
            .value_any(var)
            .is_some_and(|v| opts.types.get(v.type_id()).is_some());
        if is_tensor {
            missing.push(key.to_owned());
        } else {
            not_tensors.push(key.to_owned());
        }
    }
    missing.sort_unstable();
    not_tensors.sort_unstable();
    report.not_tensors = not_tensors;
    unexpected.sort_unstable();
    mismatched.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    let missing_bad = !opts.allow_missing && !missing.is_empty();
    let unexpected_bad = !opts.allow_unused && !unexpected.is_empty();
    if missing_bad || unexpected_bad || !mismatched.is_empty() {
        return Err(Error::Mismatch {
            path: short::path(&shown),
            missing: if missing_bad { missing } else { Vec::new() },
            unexpected: if unexpected_bad {
                unexpected
            } else {
                Vec::new()
            },
            mismatched,
        });
    }
    report.missing = missing;
    report.unused = unexpected;
    Ok((
        Plan {
            steps,
            data_start: header.data_start,
            report,
        },
        file,
    ))
}

/// The step for a file tensor that names an existing variable, or the
/// tree's side of the mismatch.
fn check_var(
    tree: &ScopeTree,
    var: VarId,
    t: &FileTensor,
    opts: &LoadOptions,
    shape_of: &dyn Fn(VarId) -> Option<Vec<usize>>,
) -> Result<Step, String> {
    let (codec, dtype, shape, flat) = match tree.value_any(var) {
        Some(v) => {
            let Some(codec) = opts.types.get(v.type_id()) else {
                let held = tree.type_name(var).ok().flatten().unwrap_or("?");
                return Err(format!(
                    "holds a {}, not a checkpointable type",
                    short::name(held)
                ));
            };
            let (d, s, f) = (codec.meta)(v).ok_or_else(|| "unreadable value".to_owned())?;
            (*codec, d, s, f)
        }
        None => {
            let codec = opts
                .create_codec(t.dtype)
                .ok_or_else(|| format!("no value, and no Rust element type for {:?}", t.dtype))?;
            return Ok(Step::Set {
                var,
                codec,
                convert_to: None,
            });
        }
    };
    let recorded = shape_of(var);
    let shape_ok = match &recorded {
        Some(r) if flat => *r == t.shape,
        _ if flat => t.shape.iter().product::<usize>() == shape.iter().product::<usize>(),
        _ => t.shape == shape,
    };
    let (dtype_ok, convert_to) = if t.dtype == dtype {
        (true, None)
    } else if opts.dtype == DtypePolicy::Convert
        && is_convertible_float(t.dtype)
        && is_convertible_float(dtype)
    {
        (true, Some(dtype))
    } else {
        (false, None)
    };
    if shape_ok && dtype_ok {
        return Ok(Step::Set {
            var,
            codec,
            convert_to,
        });
    }
    let shown = recorded.as_deref().unwrap_or(&shape);
    let mut side = describe(dtype, shown);
    if flat && recorded.is_none() {
        side.push_str(" (flat: any shape of as many elements)");
    }
    if !dtype_ok && opts.dtype == DtypePolicy::Convert {
        side.push_str(" (only float dtypes convert)");
    }
    Err(side)
}

/// The step for a file tensor the tree lacks, under `create`.
fn check_create(t: &FileTensor, opts: &LoadOptions) -> Result<Step, String> {
    let codec = opts
        .create_codec(t.dtype)
        .ok_or_else(|| format!("cannot create: no Rust element type for {:?}", t.dtype))?;
    let comps: Vec<String> = t.key.split(opts.sep.as_str()).map(str::to_owned).collect();
    for c in &comps {
        if let Err(e) = crate::validate_name(c) {
            return Err(format!("cannot create: {e}"));
        }
    }
    Ok(Step::Create { comps, codec })
}

/// One change made by a load, to undo on failure.
enum Undo {
    /// A value replaced (`Some`) or set where there was none (`None`).
    Value(VarId, Codec, Option<Old>),
    /// A variable created.
    Var(VarId),
    /// A scope created.
    Scope(ScopeId),
}

fn undo_all(tree: &mut ScopeTree, log: Vec<Undo>) {
    for u in log.into_iter().rev() {
        // The undo log only names what this load made or changed; failures
        // here could only come from handles already removed with a created
        // parent scope, which need nothing more.
        let _ = match u {
            Undo::Value(var, codec, Some(old)) => (codec.restore)(tree, var, old),
            Undo::Value(var, _, None) => tree.clear(var).map(drop),
            Undo::Var(var) => tree.remove_var(var),
            Undo::Scope(s) if tree.contains_scope(s) => tree.delete_scope(s),
            Undo::Scope(_) => Ok(()),
        };
    }
}

/// Streams the planned tensors into the tree, one at a time.
pub(crate) fn apply(
    tree: &mut ScopeTree,
    scope: ScopeId,
    plan: Plan,
    file: File,
    path: &Path,
    opts: &LoadOptions,
) -> Result<LoadReport, Error> {
    let shown = path.to_string_lossy();
    let mut report = plan.report;
    let mut reader = BufReader::with_capacity(READ_BUFFER, file);
    let mut pos = reader.stream_position().map_err(Error::io(&shown))?;
    let mut log: Vec<Undo> = Vec::new();
    // New values of shared types (candle `Var`s), assigned once every read
    // has succeeded.
    let mut staged: Vec<(VarId, Codec, Old, String)> = Vec::new();
    for (t, step) in plan.steps {
        let (target, codec, convert_to) = match step {
            Step::Skip => continue,
            Step::Set {
                var,
                codec,
                convert_to,
            } => (Ok(var), codec, convert_to),
            Step::Create { comps, codec } => (Err(comps), codec, None),
        };
        let at = plan.data_start + t.begin;
        let result = (|| -> Result<(), Error> {
            if at != pos {
                // Tensors come in file order without overlap, so `at > pos`.
                let delta = at
                    .checked_sub(pos)
                    .and_then(|d| i64::try_from(d).ok())
                    .ok_or_else(|| {
                        Error::io(&shown)(std::io::Error::other("tensor before the read position"))
                    })?;
                reader.seek_relative(delta).map_err(Error::io(&shown))?;
            }
            pos = at;
            // Bounded by the file's length (checked with the header).
            #[allow(clippy::cast_possible_truncation)]
            let nbytes = (t.end - t.begin) as usize;
            let var = match target {
                Ok(var) => var,
                Err(comps) => {
                    let var = create(tree, scope, &comps, &mut log)?;
                    report.created.push(t.key.clone());
                    var
                }
            };
            let src = match convert_to {
                None => Source::Reader {
                    dtype: t.dtype,
                    shape: &t.shape,
                    nbytes,
                    reader: &mut reader,
                },
                Some(to) => {
                    let mut raw = vec![0_u8; nbytes];
                    reader.read_exact(&mut raw).map_err(Error::io(&shown))?;
                    Source::Bytes {
                        dtype: to,
                        shape: &t.shape,
                        bytes: convert_floats(t.dtype, to, &raw),
                    }
                }
            };
            let with_path = |e| match e {
                Error::Io { source, .. } => Error::Io {
                    path: short::path(&shown),
                    source,
                },
                other => other,
            };
            if codec.shared && tree.value_any(var).is_some() {
                let new = (codec.stage)(src).map_err(with_path)?;
                pos += nbytes as u64;
                staged.push((var, codec, new, t.key.clone()));
                return Ok(());
            }
            let old = (codec.read_into)(tree, var, src, !opts.rollback).map_err(with_path)?;
            pos += nbytes as u64;
            if opts.rollback {
                log.push(Undo::Value(var, codec, old));
            }
            Ok(())
        })();
        if let Err(e) = result {
            let rolled_back = opts.rollback;
            if rolled_back {
                undo_all(tree, log);
            }
            return Err(Error::Data {
                path: short::path(&shown),
                key: t.key,
                rolled_back,
                source: Box::new(e),
            });
        }
        report.loaded.push(t.key);
    }
    // Every read succeeded; the checks made each assignment fit (same
    // dtype and shape), so none fails for a value the crate made.
    for (var, codec, new, key) in staged {
        if let Err(e) = (codec.assign)(tree, var, new) {
            return Err(Error::Data {
                path: short::path(&shown),
                key,
                rolled_back: false,
                source: Box::new(e),
            });
        }
    }
    report.loaded.sort_unstable();
    report.created.sort_unstable();
    Ok(report)
}

/// Finds or creates the scopes of `comps[..len-1]` below `scope` and
/// creates the variable `comps[len-1]` there.
fn create(
    tree: &mut ScopeTree,
    scope: ScopeId,
    comps: &[String],
    log: &mut Vec<Undo>,
) -> Result<VarId, Error> {
    let Some((name, dirs)) = comps.split_last() else {
        return Err(crate::Error::InvalidName {
            name: String::new(),
            reason: crate::InvalidNameReason::Empty,
        }
        .into());
    };
    let mut s = scope;
    for d in dirs {
        s = match tree.kid(s, d.as_str())? {
            Some(k) => k,
            None => {
                let k = tree.new_named_scope(s, d.as_str())?;
                log.push(Undo::Scope(k));
                k
            }
        };
    }
    let var = tree.create_var(s, name.as_str())?;
    log.push(Undo::Var(var));
    Ok(var)
}
