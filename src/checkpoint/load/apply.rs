//! Applying a checked load: the values read into new memory first, then
//! those that fit overwritten in place, then the new ones put in; an undo
//! log puts the tree back when a step fails.

use super::cursor::Cursor;
use super::options::LoadOptions;
use super::plan::{Plan, Step};
use super::report::LoadReport;
use crate::checkpoint::codec::{Codec, Old};
use crate::checkpoint::error::Error;
use crate::checkpoint::header::FileTensor;
use crate::{ScopeId, ScopeTree, VarId, short};

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
    let mut cur = Cursor::new(&parts);
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

/// The commit of a load made elsewhere (a candle store's staged load):
/// variables created and values put in with the same undo log as
/// [`apply`]'s, undone together if a later step fails.
#[cfg_attr(not(feature = "candle"), allow(dead_code))]
pub(crate) struct Commit<'t> {
    tree: &'t mut ScopeTree,
    scope: ScopeId,
    log: Vec<Undo>,
}

#[cfg_attr(not(feature = "candle"), allow(dead_code))]
impl<'t> Commit<'t> {
    /// A commit into the variables below `scope`.
    pub(crate) fn new(tree: &'t mut ScopeTree, scope: ScopeId) -> Self {
        Self {
            tree,
            scope,
            log: Vec::new(),
        }
    }

    /// Finds or creates the scopes of the key's components and creates the
    /// variable; logged.
    pub(crate) fn create(&mut self, comps: &[String]) -> Result<VarId, Error> {
        create(self.tree, self.scope, comps, &mut self.log)
    }

    /// Puts `value` in `var` (replacing any value); logged.
    pub(crate) fn put<T: crate::checkpoint::Checkpointable>(
        &mut self,
        var: VarId,
        value: T,
    ) -> Result<(), Error> {
        let codec = Codec::of::<T>().1;
        let old = (codec.put)(self.tree, var, Box::new(value))?;
        self.log.push(Undo::Value(var, codec, old));
        Ok(())
    }

    /// The tree, for reads.
    pub(crate) fn tree(&self) -> &ScopeTree {
        self.tree
    }

    /// Undoes every logged change, newest first.
    pub(crate) fn undo(self) {
        undo_all(self.tree, self.log);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::load::plan::plan;
    use crate::checkpoint::{SaveOptions, save};

    /// A tree of three `Vec<f32>` variables `a`, `b`, `c` of 1,000 values
    /// each, saved to a file; then the values are set to zero.
    fn saved(name: &str) -> (ScopeTree, [VarId; 3], std::path::PathBuf, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
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
        (tree, vars, path, dir)
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
        let (mut tree, [a, b, c], path, _dir) = saved("partial.safetensors");
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
        let (mut tree, vars, path, _dir) = saved("rollback.safetensors");
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
        let (mut tree, vars, path, _dir) = saved("staged.safetensors");
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

        type Saved = (
            ScopeTree,
            [VarId; 3],
            [Var; 3],
            std::path::PathBuf,
            tempfile::TempDir,
        );

        fn saved(name: &str) -> Saved {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(name);
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
            (tree, vars, held, path, dir)
        }

        fn first(v: &Var) -> f32 {
            v.as_tensor().get(0).unwrap().to_scalar::<f32>().unwrap()
        }

        #[test]
        fn a_load_assigns_each_var_in_place_and_the_held_var_sees_it() {
            let (mut tree, vars, held, path, _dir) = saved("vars.safetensors");
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
                let (mut tree, _, held, path, _dir) =
                    saved(&format!("vars-{rollback}.safetensors"));
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
