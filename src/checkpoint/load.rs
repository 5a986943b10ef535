//! Loading: check everything first, then stream tensors one at a time.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use super::checkpointable::Checkpointable;
use super::codec::{Codec, Old, Source};
use super::dtype::{Dtype, FloatDtype};
use super::error::{Error, Mismatch};
use super::float_convert::{convert_floats, is_convertible_float};
use super::header::FileTensor;
use super::known_types::{Types, default_codec};
use super::source::{Part, open};
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
    /// float dtype, rounding to nearest, ties to even; any other difference
    /// is a mismatch.
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
    create_floats: Option<Dtype>,
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
            .field("create_floats_as", &self.create_floats)
            .finish_non_exhaustive()
    }
}

impl LoadOptions {
    /// The codec of a value this load creates for a file tensor of `dtype`,
    /// and the float dtype to convert it to first, if any.
    fn create_codec(&self, dtype: Dtype) -> Option<(Codec, Option<Dtype>)> {
        let convert_to = self
            .create_floats
            .filter(|&to| to != dtype && is_convertible_float(dtype));
        let made = convert_to.unwrap_or(dtype);
        let codec = match self.create_with {
            Some(f) => f(made),
            None => default_codec(made, self.create_shaped),
        };
        codec.map(|c| (c, convert_to))
    }

    /// Strict: every variable in the file, every file key in the tree,
    /// equal shapes and dtypes; `/` keys; values that fit overwritten in
    /// place (see [`rollback`](Self::rollback)). O(1).
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
            rollback: false,
            create_floats: None,
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

    /// Whether a read error of the disk, after every check has passed,
    /// must leave the tree as it was (`false` by default).
    ///
    /// Every load first checks the whole header against the tree (names,
    /// shapes, dtypes, byte ranges against the file's length), then reads
    /// every value that needs new memory (created variables, converted
    /// dtypes, types of your own) before changing anything: a bad file or a
    /// value its type rejects changes nothing, whatever this option says.
    /// By default a value of the crate's types whose dtype and size already
    /// fit is then overwritten in place, with no extra memory; only a read
    /// error in that pass (the disk failing, not the file's content) can
    /// leave the tree partly loaded, and [`Error::Data`] says so.
    /// `rollback(true)` reads every tensor into new memory first, so even
    /// that leaves the tree unchanged, at the price of about the file's
    /// size in extra memory and the time to fault it in (see
    /// `docs/checkpoints.md`). O(1).
    ///
    /// ```
    /// let _ = scopetree::checkpoint::LoadOptions::new().rollback(true);
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

    /// Values this load makes (variables it [creates](Self::create), and
    /// variables that had no value) for a float tensor of the file hold
    /// `dtype` instead of the file's dtype: a `BF16` or `F16` checkpoint
    /// loads into `f32` values with `create_floats_as(FloatDtype::F32)`.
    /// Values that already exist convert under [`DtypePolicy::Convert`].
    /// Rounds to nearest, ties to even; non-float tensors keep their dtype.
    /// O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::{FloatDtype, LoadOptions};
    /// let _ = LoadOptions::new().create(true).create_floats_as(FloatDtype::F32);
    /// ```
    pub fn create_floats_as(mut self, dtype: FloatDtype) -> Self {
        self.create_floats = Some(dtype.dtype());
        self
    }

    /// Registers `T`, a type the crate implements [`Checkpointable`] for
    /// (candle's `Var`), as one of its own: by default a load assigns it in
    /// the in-place pass, one tensor at a time (see
    /// [`rollback`](Self::rollback)).
    #[cfg(feature = "candle")]
    pub(crate) fn with_crate_type<T: Checkpointable>(mut self) -> Self {
        self.types.add_builtin::<T>();
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
    /// Tensors of a sharded checkpoint that a shard holds but the index
    /// assigns to another shard or to none, as `(key, shard file)`: never
    /// loaded (accepted only with [`LoadOptions::allow_unused`]).
    pub unassigned: Vec<(String, String)>,
}

enum Step {
    Set {
        var: VarId,
        codec: Codec,
        convert_to: Option<Dtype>,
        /// The variable's value is a crate type of the file's dtype and
        /// byte size: its bytes can be overwritten where they are (a shared
        /// `Var` is assigned from a value read just before).
        in_place: bool,
    },
    Create {
        comps: Vec<String>,
        codec: Codec,
        /// The float dtype the value is made in, when not the file's
        /// ([`LoadOptions::create_floats_as`]).
        convert_to: Option<Dtype>,
    },
    Skip,
}

pub(crate) struct Plan {
    /// The checkpoint's files, open.
    parts: Vec<Part>,
    /// Each tensor with its part, in part order, then data order.
    steps: Vec<(usize, FileTensor, Step)>,
    report: LoadReport,
}

fn describe(dtype: Dtype, shape: &[usize]) -> String {
    let shown: Vec<_> = shape.iter().take(8).collect();
    let cut = if shape.len() > 8 { " (cut)" } else { "" };
    format!("{dtype:?} {shown:?}{cut}")
}

/// Opens the checkpoint (a file, an index or a directory), reads every
/// header, matches them against the tree and decides every step; changes
/// nothing.
pub(crate) fn plan(
    tree: &ScopeTree,
    scope: ScopeId,
    path: &Path,
    opts: &LoadOptions,
    shape_of: &dyn Fn(VarId) -> Option<Vec<usize>>,
) -> Result<Plan, Error> {
    tree.path(scope)?;
    let opened = open(path)?;
    let shown = opened.shown;
    let walked = walk(tree, scope, opts.sep, opts.filter.as_ref())?;
    let mut targets: FxHashMap<&str, VarId> =
        walked.vars.iter().map(|(k, v)| (k.as_str(), *v)).collect();

    let mut report = LoadReport::default();
    let mut unexpected = Vec::new();
    let mut mismatched = Vec::new();
    let mut steps = Vec::with_capacity(opened.tensors.len());
    for (part, t) in opened.tensors {
        if opts.filter.as_ref().is_some_and(|f| !f(&t.key)) {
            continue;
        }
        // The file's side of a mismatch is only written for a mismatch: a
        // load that matches formats nothing per tensor.
        let step = if let Some(var) = targets.remove(t.key.as_str()) {
            match check_var(tree, var, &t, opts, shape_of) {
                Ok(step) => step,
                Err(tree_side) => {
                    mismatched.push(Mismatch {
                        key: t.key.clone(),
                        file: describe(t.dtype, &t.shape),
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
                        file: describe(t.dtype, &t.shape),
                        tree: why,
                    });
                    Step::Skip
                }
            }
        } else {
            unexpected.push(t.key.clone());
            Step::Skip
        };
        steps.push((part, t, step));
    }
    let unassigned: Vec<(String, String)> = opened
        .unassigned
        .into_iter()
        .filter(|(k, _)| opts.filter.as_ref().is_none_or(|f| f(k)))
        .collect();
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
    let unassigned_bad = !opts.allow_unused && !unassigned.is_empty();
    if missing_bad || unexpected_bad || unassigned_bad || !mismatched.is_empty() {
        return Err(Error::Mismatch {
            path: short::path(&shown),
            missing: if missing_bad { missing } else { Vec::new() },
            unexpected: if unexpected_bad {
                unexpected
            } else {
                Vec::new()
            },
            mismatched,
            unassigned: if unassigned_bad {
                unassigned
            } else {
                Vec::new()
            },
        });
    }
    report.missing = missing;
    report.unused = unexpected;
    report.unassigned = unassigned;
    Ok(Plan {
        parts: opened.parts,
        steps,
        report,
    })
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
            let (codec, convert_to) = opts
                .create_codec(t.dtype)
                .ok_or_else(|| format!("no value, and no Rust element type for {:?}", t.dtype))?;
            return Ok(Step::Set {
                var,
                codec,
                convert_to,
                in_place: false,
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
            in_place: codec.builtin && convert_to.is_none(),
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
    let (codec, convert_to) = opts
        .create_codec(t.dtype)
        .ok_or_else(|| format!("cannot create: no Rust element type for {:?}", t.dtype))?;
    let comps: Vec<String> = t.key.split(opts.sep.as_str()).map(str::to_owned).collect();
    for c in &comps {
        if let Err(e) = crate::validate_name(c) {
            return Err(format!("cannot create: {e}"));
        }
    }
    Ok(Step::Create {
        comps,
        codec,
        convert_to,
    })
}

/// One change made by a load's commit, to undo on failure.
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

/// The checkpoint's files, each read forward tensor by tensor; one is
/// open for reading at a time.
struct Cursor<'p> {
    parts: &'p [Part],
    /// The part being read, its reader and the reader's position.
    open: Option<(usize, BufReader<&'p File>, u64)>,
}

impl<'p> Cursor<'p> {
    /// Moves to the start of `t`'s bytes in `part`; returns the reader and
    /// the bytes' length.
    fn seek_to(
        &mut self,
        part: usize,
        t: &FileTensor,
    ) -> Result<(&mut BufReader<&'p File>, usize), Error> {
        let p = &self.parts[part];
        let at = p.data_start + t.begin;
        let parts = self.parts;
        let io = |e: std::io::Error| Error::io(&parts[part].path.to_string_lossy())(e);
        let same = matches!(&self.open, Some((cur, ..)) if *cur == part);
        if !same {
            let mut reader = BufReader::with_capacity(READ_BUFFER, &p.file);
            reader.seek(SeekFrom::Start(at)).map_err(io)?;
            self.open = Some((part, reader, at));
        }
        let Some((_, reader, pos)) = &mut self.open else {
            unreachable!("a part was opened just above")
        };
        if at != *pos {
            let delta = i64::try_from(i128::from(at) - i128::from(*pos))
                .map_err(|e| io(std::io::Error::other(e)))?;
            reader.seek_relative(delta).map_err(io)?;
        }
        // Bounded by the file's length (checked with the header).
        #[allow(clippy::cast_possible_truncation)]
        let nbytes = (t.end - t.begin) as usize;
        *pos = at + nbytes as u64;
        Ok((reader, nbytes))
    }

    /// Builds the staged value of `t` with `codec` (converting floats to
    /// `convert_to`), touching no variable.
    fn stage(
        &mut self,
        part: usize,
        t: &FileTensor,
        codec: &Codec,
        convert_to: Option<Dtype>,
    ) -> Result<Old, Error> {
        let parts = self.parts;
        let shown = || parts[part].path.to_string_lossy();
        let (reader, nbytes) = self.seek_to(part, t)?;
        let src = match convert_to {
            None => Source::Reader {
                dtype: t.dtype,
                shape: &t.shape,
                nbytes,
                reader,
            },
            Some(to) => {
                let mut raw = vec![0_u8; nbytes];
                reader
                    .read_exact(&mut raw)
                    .map_err(|e| Error::io(&shown())(e))?;
                Source::Bytes {
                    dtype: to,
                    shape: &t.shape,
                    bytes: convert_floats(t.dtype, to, &raw),
                }
            }
        };
        (codec.stage)(src).map_err(|e| with_path(e, &shown()))
    }

    /// Reads `t` into `var`'s value in place; the replaced value if the
    /// value declined (then it was replaced).
    fn in_place(
        &mut self,
        tree: &mut ScopeTree,
        part: usize,
        t: &FileTensor,
        var: VarId,
        codec: &Codec,
    ) -> Result<Option<Old>, Error> {
        let parts = self.parts;
        let (reader, nbytes) = self.seek_to(part, t)?;
        let src = Source::Reader {
            dtype: t.dtype,
            shape: &t.shape,
            nbytes,
            reader,
        };
        (codec.read_into)(tree, var, src)
            .map_err(|e| with_path(e, &parts[part].path.to_string_lossy()))
    }
}

/// An IO error of a codec, with the file's path.
fn with_path(e: Error, shown: &str) -> Error {
    match e {
        Error::Io { source, .. } => Error::Io {
            path: short::path(shown),
            source,
        },
        other => other,
    }
}

/// Loads the planned tensors, in three passes:
///
/// 1. every value that is not overwritten in place (all of them with
///    [`LoadOptions::rollback`]) is read into new memory, the tree
///    untouched: a read error or a value its type rejects changes nothing;
/// 2. values of the crate's types whose dtype and size already fit are
///    overwritten in place, and candle `Var`s in a candle store's load are
///    assigned from a value read just before, one tensor at a time (only a
///    read error of the disk can fail here, every check having passed);
/// 3. the values of pass 1 go in: created variables, replaced values, and
///    shared values (candle `Var`s) assigned in place.
pub(crate) fn apply(
    tree: &mut ScopeTree,
    scope: ScopeId,
    plan: Plan,
    opts: &LoadOptions,
) -> Result<LoadReport, Error> {
    let mut report = plan.report;
    let parts = plan.parts;
    let mut cur = Cursor {
        parts: &parts,
        open: None,
    };
    let fail = |part: usize, key: &str, rolled_back: bool, e: Error| Error::Data {
        path: short::path(&parts[part].path.to_string_lossy()),
        key: key.to_owned(),
        rolled_back,
        source: Box::new(e),
    };
    let stage_all = opts.rollback;
    let steps: Vec<(usize, FileTensor, Step)> = plan
        .steps
        .into_iter()
        .filter(|(_, _, s)| !matches!(s, Step::Skip))
        .collect();

    // Pass 1: new values, the tree untouched.
    let mut staged: Vec<Option<Old>> = Vec::with_capacity(steps.len());
    for (part, t, step) in &steps {
        let new = match step {
            Step::Set { in_place: true, .. } if !stage_all => None,
            Step::Set {
                codec, convert_to, ..
            } => Some(cur.stage(*part, t, codec, *convert_to)),
            Step::Create {
                codec, convert_to, ..
            } => Some(cur.stage(*part, t, codec, *convert_to)),
            Step::Skip => None,
        };
        staged.push(match new {
            Some(Ok(v)) => Some(v),
            Some(Err(e)) => return Err(fail(*part, &t.key, true, e)),
            None => None,
        });
    }

    // Pass 2: in place.
    let mut log: Vec<Undo> = Vec::new();
    let mut touched = false;
    for ((part, t, step), new) in steps.iter().zip(&staged) {
        if let (Step::Set { var, codec, .. }, None) = (step, new) {
            touched = true;
            match cur.in_place(tree, *part, t, *var, codec) {
                // A value that declined after all was replaced: undoable.
                Ok(Some(old)) => log.push(Undo::Value(*var, *codec, Some(old))),
                Ok(None) => {}
                Err(e) => {
                    undo_all(tree, log);
                    return Err(fail(*part, &t.key, false, e));
                }
            }
        }
    }

    // Pass 3: the staged values go in.
    for ((part, t, step), new) in steps.into_iter().zip(staged) {
        let Some(new) = new else {
            report.loaded.push(t.key);
            continue;
        };
        let result = (|| -> Result<(), Error> {
            match step {
                Step::Set { var, codec, .. } if codec.shared && tree.value_any(var).is_some() => {
                    touched = true;
                    (codec.assign)(tree, var, new)
                }
                Step::Set { var, codec, .. } => {
                    let old = (codec.put)(tree, var, new)?;
                    log.push(Undo::Value(var, codec, old));
                    Ok(())
                }
                Step::Create { comps, codec, .. } => {
                    let var = create(tree, scope, &comps, &mut log)?;
                    (codec.put)(tree, var, new)?;
                    report.created.push(t.key.clone());
                    Ok(())
                }
                Step::Skip => Ok(()),
            }
        })();
        if let Err(e) = result {
            undo_all(tree, log);
            return Err(fail(part, &t.key, !touched, e));
        }
        report.loaded.push(t.key);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{SaveOptions, save};

    /// A tree of three `Vec<f32>` variables `a`, `b`, `c` of 1,000 values
    /// each, saved to a file; then the values are set to zero.
    fn saved(name: &str) -> (ScopeTree, [VarId; 3], std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("st-load-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        let mut tree = ScopeTree::new();
        let root = tree.root();
        let vars = ["a", "b", "c"].map(|n| tree.var(root, n).unwrap());
        for (i, v) in vars.iter().enumerate() {
            tree.set(*v, vec![i as f32 + 1.0; 1000]).unwrap();
        }
        save(&tree, root, &path, &SaveOptions::new()).unwrap();
        for v in vars {
            tree.set(v, vec![0.0_f32; 1000]).unwrap();
        }
        (tree, vars, path)
    }

    /// Cuts the last `by` bytes off the file (the disk "failing" after the
    /// checks: the data ranges no longer fit).
    fn shrink(path: &std::path::Path, by: u64) {
        let len = std::fs::metadata(path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len - by)
            .unwrap();
    }

    /// The disk fails mid-read (the file shrinks between the checks and the
    /// reads): by default the values read in place before the failure keep
    /// the file's bytes and the error says the tree changed.
    #[test]
    fn a_read_error_after_the_checks_is_reported_as_a_partial_load() {
        let (mut tree, [a, b, c], path) = saved("partial.safetensors");
        let root = tree.root();
        let opts = LoadOptions::new();
        let plan = plan(&tree, root, &path, &opts, &|_| None).unwrap();
        shrink(&path, 2000);
        let err = apply(&mut tree, root, plan, &opts).unwrap_err();
        assert!(
            matches!(&err, Error::Data { key, rolled_back: false, .. } if key == "c"),
            "{err:?}"
        );
        assert!(err.to_string().contains("rollback(true)"), "{err}");
        assert_eq!(tree.get::<Vec<f32>>(a).unwrap(), &vec![1.0; 1000]);
        assert_eq!(tree.get::<Vec<f32>>(b).unwrap(), &vec![2.0; 1000]);
        assert_eq!(tree.get::<Vec<f32>>(c).unwrap().len(), 1000);
    }

    /// With `rollback(true)` the same failure leaves every value as it was.
    #[test]
    fn with_rollback_a_read_error_changes_nothing() {
        let (mut tree, vars, path) = saved("rollback.safetensors");
        let root = tree.root();
        let opts = LoadOptions::new().rollback(true);
        let plan = plan(&tree, root, &path, &opts, &|_| None).unwrap();
        shrink(&path, 2000);
        let err = apply(&mut tree, root, plan, &opts).unwrap_err();
        assert!(
            matches!(&err, Error::Data { key, rolled_back: true, .. } if key == "c"),
            "{err:?}"
        );
        for v in vars {
            assert_eq!(tree.get::<Vec<f32>>(v).unwrap(), &vec![0.0; 1000]);
        }
    }

    /// Values that need new memory (here: variables without a value) are
    /// all read before any variable changes, so a read error among them
    /// changes nothing even by default.
    #[test]
    fn staged_values_are_read_before_anything_changes() {
        let (mut tree, vars, path) = saved("staged.safetensors");
        for v in vars {
            tree.clear(v).unwrap();
        }
        let root = tree.root();
        let opts = LoadOptions::new();
        let plan = plan(&tree, root, &path, &opts, &|_| None).unwrap();
        shrink(&path, 2000);
        let err = apply(&mut tree, root, plan, &opts).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Data {
                    rolled_back: true,
                    ..
                }
            ),
            "{err:?}"
        );
        for v in vars {
            assert!(tree.value_any(v).is_none());
        }
    }

    /// Candle `Var`s in a candle store's load (`with_crate_type`): each is
    /// assigned in the in-place pass from a value read just before, so a
    /// load holds one tensor of extra memory; the `Var` a model holds keeps
    /// its identity and sees the file's values.
    #[cfg(feature = "candle")]
    mod candle_vars {
        use super::*;
        use candle_core::{Device, Var};

        fn saved(name: &str) -> (ScopeTree, [VarId; 3], [Var; 3], std::path::PathBuf) {
            let dir = std::env::temp_dir().join(format!("st-load-var-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(name);
            let mut tree = ScopeTree::new();
            let root = tree.root();
            let vars = ["a", "b", "c"].map(|n| tree.var(root, n).unwrap());
            let held = [1.0_f32, 2.0, 3.0]
                .map(|x| Var::from_vec(vec![x; 1000], 1000, &Device::Cpu).unwrap());
            for (v, h) in vars.iter().zip(&held) {
                tree.set(*v, h.clone()).unwrap();
            }
            let opts = SaveOptions::new().with_type::<Var>();
            save(&tree, root, &path, &opts).unwrap();
            for h in &held {
                h.set(
                    &candle_core::Tensor::zeros(1000, candle_core::DType::F32, &Device::Cpu)
                        .unwrap(),
                )
                .unwrap();
            }
            (tree, vars, held, path)
        }

        fn first(v: &Var) -> f32 {
            v.as_tensor().get(0).unwrap().to_scalar::<f32>().unwrap()
        }

        #[test]
        fn a_load_assigns_each_var_in_place_and_the_held_var_sees_it() {
            let (mut tree, vars, held, path) = saved("vars.safetensors");
            let root = tree.root();
            let opts = LoadOptions::new().with_crate_type::<Var>();
            let plan = plan(&tree, root, &path, &opts, &|_| None).unwrap();
            assert!(
                plan.steps
                    .iter()
                    .all(|(_, _, s)| matches!(s, Step::Set { in_place: true, .. })),
                "every Var is assigned in the in-place pass"
            );
            apply(&mut tree, root, plan, &opts).unwrap();
            for ((v, h), x) in vars.iter().zip(&held).zip([1.0, 2.0, 3.0]) {
                assert_eq!(first(h), x);
                assert_eq!(
                    tree.get::<Var>(*v).unwrap().as_tensor().id(),
                    h.as_tensor().id()
                );
            }
        }

        /// The disk fails mid-read: by default the Vars assigned before
        /// the failure keep the file's values and the error says so; with
        /// `rollback(true)` every Var is read first and none changes.
        #[test]
        fn a_read_error_is_a_partial_load_by_default_and_changes_nothing_with_rollback() {
            for rollback in [false, true] {
                let (mut tree, _, held, path) = saved(&format!("vars-{rollback}.safetensors"));
                let root = tree.root();
                let opts = LoadOptions::new()
                    .with_crate_type::<Var>()
                    .rollback(rollback);
                let plan = plan(&tree, root, &path, &opts, &|_| None).unwrap();
                shrink(&path, 2000);
                let err = apply(&mut tree, root, plan, &opts).unwrap_err();
                assert!(
                    matches!(&err, Error::Data { key, rolled_back, .. } if key == "c" && *rolled_back == rollback),
                    "{err:?}"
                );
                let expect = if rollback { [0.0, 0.0] } else { [1.0, 2.0] };
                assert_eq!(
                    [first(&held[0]), first(&held[1])],
                    expect,
                    "rollback {rollback}"
                );
                assert_eq!(first(&held[2]), 0.0);
            }
        }
    }
}
