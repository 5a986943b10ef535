//! Panic safety of the sharing layer, against a model: random programs of
//! scope entries (named, default-named, re-entered), `get_variable` calls and
//! template calls, with panics injected into scope bodies, initializers,
//! custom getters and template functions. Each top-level operation runs
//! under `catch_unwind` on one store; a second store (the model) runs the
//! same program without the operations that panicked. Everything observable
//! must then agree: the full names every later operation saw, the scopes and
//! variables of the tree with their values, the collections in order, the
//! templates' state, and the next default name under every scope.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

use proptest::prelude::*;
use scopetree::sharing::Error;
use scopetree::sharing::{
    CustomGetter, Initializer, Reuse, ScopeOpts, Template, VarScope, VarSpec, VariableStore,
};

const NAMES: [&str; 3] = ["layer", "layer_1", "a"];
const VARS: [&str; 3] = ["w", "b", "x/y"];

/// Where a `Get` panics.
#[derive(Copy, Clone, Debug)]
enum Fault {
    None,
    /// In the initializer (before anything is created).
    Init,
    /// In a custom getter, after it created two variables.
    Getter,
}

#[derive(Clone, Debug)]
enum Op {
    /// `variable_scope(NAMES[i])`; the body, then a panic if `bool`.
    Named(usize, Vec<Op>, bool),
    /// `variable_scope_unique(NAMES[i])`.
    Default(usize, Vec<Op>, bool),
    /// Re-enter the k-th captured scope (if any).
    Reenter(usize, Vec<Op>, bool),
    /// `get_variable(VARS[j])` with `AutoReuse`.
    Get(usize, Fault),
    /// Call template `t`; its function panics after creating its variable if
    /// `bool`.
    Tpl(usize, bool),
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        3 => Just(Fault::None),
        1 => Just(Fault::Init),
        1 => Just(Fault::Getter),
    ]
}

fn program() -> impl Strategy<Value = Vec<Op>> {
    let leaf = prop_oneof![
        ((0..3usize), any::<bool>()).prop_map(|(i, p)| Op::Named(i, vec![], p)),
        ((0..3usize), any::<bool>()).prop_map(|(i, p)| Op::Default(i, vec![], p)),
        ((0..4usize), any::<bool>()).prop_map(|(k, p)| Op::Reenter(k, vec![], p)),
        ((0..3usize), fault()).prop_map(|(j, f)| Op::Get(j, f)),
        ((0..2usize), any::<bool>()).prop_map(|(t, p)| Op::Tpl(t, p)),
    ];
    let op = leaf.prop_recursive(3, 30, 4, |inner| {
        let body = prop::collection::vec(inner, 0..4);
        let panic = prop::bool::weighted(0.25);
        prop_oneof![
            ((0..3usize), body.clone(), panic).prop_map(|(i, b, p)| Op::Named(i, b, p)),
            ((0..3usize), body.clone(), panic).prop_map(|(i, b, p)| Op::Default(i, b, p)),
            ((0..4usize), body, panic).prop_map(|(k, b, p)| Op::Reenter(k, b, p)),
        ]
    });
    prop::collection::vec(op, 1..10)
}

type TplFn = Box<dyn FnMut(&mut VariableStore, &mut VarScope, bool) -> Result<(), Error> + Send>;

/// What a program keeps beside its store: captured scopes, templates, log.
struct Ctx {
    captured: Vec<VarScope>,
    templates: Vec<Template<TplFn>>,
    log: Vec<String>,
    counter: u8,
}

/// One store with its context.
struct World {
    store: VariableStore,
    ctx: Ctx,
}

fn template(name: &str) -> Template<TplFn> {
    let f: TplFn = Box::new(|s, vs, panic| {
        s.get_variable(
            vs,
            VarSpec::new("t").initializer(Initializer::constant(7_u8)),
        )?;
        if panic {
            panic!("injected in a template");
        }
        Ok(())
    });
    Template::new(name, f).expect("valid template name")
}

fn two_then_panic() -> CustomGetter {
    CustomGetter::new(|store, args, next| {
        let mut a = args.clone();
        a.name.push_str("_0");
        next.get(store, a)?;
        let mut b = args;
        b.name.push_str("_1");
        next.get(store, b)?;
        panic!("injected in a custom getter")
    })
}

impl Ctx {
    fn template_states(&self) -> Vec<(bool, Option<String>)> {
        self.templates
            .iter()
            .map(|t| {
                (
                    t.variables_created(),
                    t.variable_scope().map(|v| v.name().to_owned()),
                )
            })
            .collect()
    }

    fn note<T>(&mut self, r: &Result<T, Error>, ok: impl FnOnce(&T) -> String) {
        let line = match r {
            Ok(v) => ok(v),
            Err(e) => format!("error: {e}"),
        };
        self.log.push(line);
    }
}

fn body(
    s: &mut VariableStore,
    c: &mut Ctx,
    vs: &mut VarScope,
    ops: &[Op],
    panic: bool,
) -> Result<(), Error> {
    c.log.push(format!("in {}", vs.name()));
    c.captured.push(vs.clone());
    for op in ops {
        run(s, c, vs, op);
    }
    if panic {
        panic!("injected in a scope body");
    }
    Ok(())
}

fn run(store: &mut VariableStore, c: &mut Ctx, vs: &VarScope, op: &Op) {
    match op {
        Op::Named(i, ops, panic) => {
            let r = store.variable_scope(vs, NAMES[*i], ScopeOpts::new(), |s, cvs| {
                body(s, c, cvs, ops, *panic)
            });
            c.note(&r, |_| "named done".into());
        }
        Op::Default(i, ops, panic) => {
            let r = store.variable_scope_unique(vs, NAMES[*i], ScopeOpts::new(), |s, cvs| {
                body(s, c, cvs, ops, *panic)
            });
            c.note(&r, |_| "default done".into());
        }
        Op::Reenter(k, ops, panic) => {
            let Some(target) = c.captured.get(*k).cloned() else {
                return;
            };
            let r = store.reenter_scope(&target, ScopeOpts::new(), |s, cvs| {
                body(s, c, cvs, ops, *panic)
            });
            c.note(&r, |_| "reenter done".into());
        }
        Op::Get(j, f) => {
            c.counter = c.counter.wrapping_add(1);
            let value = c.counter;
            let mut spec = VarSpec::new(VARS[*j]).reuse(Reuse::AutoReuse);
            spec = match f {
                Fault::None | Fault::Getter => spec.initializer(Initializer::constant(value)),
                Fault::Init => spec.initializer(Initializer::from_fn(|| -> u8 {
                    panic!("injected in an initializer")
                })),
            };
            if let Fault::Getter = f {
                spec = spec.custom_getter(two_then_panic());
            }
            let r = store.get_variable(vs, spec);
            let full = r.as_ref().ok().and_then(|v| store.full_name(*v).ok());
            c.note(&r, |_| format!("got {full:?}"));
        }
        Op::Tpl(t, panic) => {
            let r = c.templates[*t].call(store, vs, *panic);
            c.note(&r, |_| "template done".into());
        }
    }
}

impl World {
    fn new() -> Self {
        World {
            store: VariableStore::new(),
            ctx: Ctx {
                captured: Vec::new(),
                templates: vec![template("tpl"), template("layer")],
                log: Vec::new(),
                counter: 0,
            },
        }
    }

    fn step(&mut self, op: &Op) {
        let root = self.store.root_scope();
        run(&mut self.store, &mut self.ctx, &root, op);
    }

    /// Everything observable, as text.
    fn observe(&mut self) -> Result<Vec<String>, Error> {
        let mut out = Vec::new();
        let tree = self.store.tree();
        let mut scopes = Vec::new();
        for (s, _) in tree.descendants(tree.root())? {
            let mut vars = Vec::new();
            for (_, v) in tree.local_vars(s)? {
                vars.push(format!(
                    "{}={:?}",
                    tree.var_path(v)?,
                    tree.get::<u8>(v).ok().copied()
                ));
            }
            scopes.push(format!("scope {} vars {vars:?}", tree.path(s)?));
        }
        out.extend(scopes);
        out.push(format!(
            "counts {} {}",
            tree.scope_count(),
            tree.var_count()
        ));
        for key in self.store.collection_names() {
            let names: Vec<String> = self
                .store
                .collection(key, None)?
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            out.push(format!("collection {key} {names:?}"));
        }
        for t in &self.ctx.templates {
            out.push(format!(
                "template {} created {} scope {:?}",
                t.name(),
                t.variables_created(),
                t.variable_scope().map(VarScope::name)
            ));
        }
        // The next default names: probing changes both worlds alike.
        let root = self.store.root_scope();
        let mut probes = vec![root];
        probes.extend(self.ctx.captured.iter().cloned());
        for vs in probes {
            for prefix in NAMES {
                let r = self
                    .store
                    .variable_scope_unique(&vs, prefix, ScopeOpts::new(), |_, c| {
                        Ok(c.name().to_owned())
                    });
                out.push(format!("next {prefix} under {}: {r:?}", vs.name()));
            }
        }
        Ok(out)
    }
}

/// Flags of the injected-panic hook (so the test's output stays readable).
static QUIET: AtomicBool = AtomicBool::new(false);

fn quiet_panics() {
    if !QUIET.swap(true, Ordering::SeqCst) {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let injected = info
                .payload()
                .downcast_ref::<&str>()
                .is_some_and(|m| m.starts_with("injected"));
            if !injected {
                default(info);
            }
        }));
    }
}

fn check(ops: &[Op]) -> Result<(), TestCaseError> {
    quiet_panics();
    let mut real = World::new();
    let mut model = World::new();
    let fail = |e: Error| TestCaseError::fail(e.to_string());
    for op in ops {
        let (log, captured, counter) = (
            real.ctx.log.len(),
            real.ctx.captured.len(),
            real.ctx.counter,
        );
        let before = real.ctx.template_states();
        let panicked = catch_unwind(AssertUnwindSafe(|| real.step(op))).is_err();
        if panicked {
            // The panicking operation never happened: drop what it logged
            // and captured, and skip it in the model. What the caller keeps
            // outside the store cannot be undone by it: a template first
            // called by a nested call that returned before the panic holds
            // an undone scope, so it is replaced by a fresh one, as captured
            // scopes are dropped. (A template whose own call panicked puts
            // itself back: its state must not have changed.)
            real.ctx.log.truncate(log);
            real.ctx.captured.truncate(captured);
            real.ctx.counter = counter;
            for (t, state) in before.iter().enumerate() {
                if real.ctx.template_states()[t] != *state && !state.0 {
                    let name = real.ctx.templates[t].name().to_owned();
                    real.ctx.templates[t] = template(&name);
                }
            }
            prop_assert_eq!(real.ctx.template_states(), model.ctx.template_states());
            continue;
        }
        let model_panicked = catch_unwind(AssertUnwindSafe(|| model.step(op))).is_err();
        prop_assert!(!model_panicked, "the model panicked on {op:?}");
    }
    prop_assert_eq!(&real.ctx.log, &model.ctx.log);
    let (seen, want) = (
        real.observe().map_err(fail)?,
        model.observe().map_err(fail)?,
    );
    prop_assert_eq!(seen, want);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_panicking_call_leaves_the_store_as_if_it_had_not_been_made(ops in program()) {
        check(&ops)?;
    }
}

/// The case of the issue, spelled out: a panic in a scope body must not
/// advance the default-name counters.
#[test]
fn a_panic_in_a_body_does_not_advance_default_names() -> Result<(), Error> {
    quiet_panics();
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let caught = catch_unwind(AssertUnwindSafe(|| {
        let _ = store.variable_scope(&root, "outer", ScopeOpts::new(), |s, vs| {
            s.variable_scope_unique(
                vs,
                "layer",
                ScopeOpts::new(),
                |s, inner| -> Result<(), Error> {
                    s.get_variable(
                        inner,
                        VarSpec::new("w").initializer(Initializer::constant(1_u8)),
                    )?;
                    panic!("injected in a scope body")
                },
            )
        });
    }));
    assert!(caught.is_err());
    assert_eq!(
        store.tree().scope_count(),
        1,
        "scopes the call created are gone"
    );
    assert_eq!(store.tree().var_count(), 0);
    assert!(store.global_variables(None)?.is_empty());
    assert_eq!(store.collection_names().count(), 0);
    let name = store.variable_scope(&root, "outer", ScopeOpts::new(), |s, vs| {
        s.variable_scope_unique(vs, "layer", ScopeOpts::new(), |_, inner| {
            Ok(inner.name().to_owned())
        })
    })?;
    assert_eq!(name, "outer/layer");
    Ok(())
}

/// A template whose first call panics captures no scope and can be called
/// again; its variables are created then.
#[test]
fn a_template_whose_first_call_panics_starts_afresh() -> Result<(), Error> {
    quiet_panics();
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let mut t = template("tpl");
    let caught = catch_unwind(AssertUnwindSafe(|| {
        let _ = t.call(&mut store, &root, true);
    }));
    assert!(caught.is_err());
    assert!(!t.variables_created());
    assert!(t.variable_scope().is_none());
    assert_eq!(store.tree().var_count(), 0);
    t.call(&mut store, &root, false)?;
    assert_eq!(t.variable_scope().map(VarScope::name), Some("tpl"));
    assert_eq!(store.global_variables(None)?.len(), 1);
    Ok(())
}

/// A custom getter that creates variables and then panics leaves none of
/// them behind, at the top level and inside a scope.
#[test]
fn a_custom_getter_panic_undoes_its_variables() -> Result<(), Error> {
    quiet_panics();
    let mut store = VariableStore::new();
    let root = store.root_scope();
    let spec = || {
        VarSpec::new("v")
            .initializer(Initializer::constant(0_u8))
            .custom_getter(two_then_panic())
    };
    let caught = catch_unwind(AssertUnwindSafe(|| {
        let _ = store.get_variable(&root, spec());
    }));
    assert!(caught.is_err());
    assert_eq!(store.tree().var_count(), 0);
    assert_eq!(store.variable("v_0")?, None);
    let caught = catch_unwind(AssertUnwindSafe(|| {
        let _ = store.variable_scope(&root, "s", ScopeOpts::new(), |s, vs| {
            s.get_variable(vs, spec())
        });
    }));
    assert!(caught.is_err());
    assert_eq!(
        (store.tree().scope_count(), store.tree().var_count()),
        (1, 0)
    );
    assert!(store.global_variables(None)?.is_empty());
    Ok(())
}
