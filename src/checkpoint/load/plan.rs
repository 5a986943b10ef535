//! Planning a load: every header read and matched against the tree, every
//! name, shape and dtype checked, one step decided per tensor; all problems
//! in one [`Error::Mismatch`]. Changes nothing.

use std::path::Path;

use super::options::{DtypePolicy, LoadOptions};
use super::report::LoadReport;
use crate::checkpoint::codec::Codec;
use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::error::{Error, Mismatch};
use crate::checkpoint::float_convert::is_convertible_float;
use crate::checkpoint::header::FileTensor;
use crate::checkpoint::source::{Part, open};
use crate::checkpoint::walk;
use crate::{ScopeId, ScopeTree, VarId, short};
use rustc_hash::FxHashMap;

/// What a load does with one file tensor.
pub(crate) enum Step {
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

/// A checked load: its files, open, and a step for each tensor.
pub(crate) struct Plan {
    /// The checkpoint's files, open.
    pub(crate) parts: Vec<Part>,
    /// Each tensor with its part, in part order, then data order.
    pub(crate) steps: Vec<(usize, FileTensor, Step)>,
    /// The report so far: missing, unused, unassigned and not-tensor keys.
    pub(crate) report: LoadReport,
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
