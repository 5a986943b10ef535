//! Model test: default-name counting against a direct transcription of
//! TensorFlow 1.15's `_VariableScopeStore` (a dict from full name to count,
//! zeroed under a named scope when it exits, restored from a snapshot when a
//! re-entered scope exits). Random programs of scope entries and exits must
//! give the same full names in both.

use std::collections::HashMap;

use proptest::prelude::*;
use scopetree::sharing::{ScopeOpts, VarScope, VariableStore};

#[derive(Clone, Debug)]
enum Op {
    /// `variable_scope(NAMES[i])`, then the body, then exit.
    Named(usize, Vec<Op>),
    /// `variable_scope(None, default_name=NAMES[i])`.
    Default(usize, Vec<Op>),
    /// Re-enter the k-th scope captured so far (if any).
    Reenter(usize, Vec<Op>),
}

const NAMES: [&str; 3] = ["layer", "layer_1", "a"];

fn program() -> impl Strategy<Value = Vec<Op>> {
    let leaf = prop_oneof![
        (0..3usize).prop_map(|i| Op::Named(i, vec![])),
        (0..3usize).prop_map(|i| Op::Default(i, vec![])),
        (0..4usize).prop_map(|k| Op::Reenter(k, vec![])),
    ];
    let op = leaf.prop_recursive(4, 40, 4, |inner| {
        prop_oneof![
            ((0..3usize), prop::collection::vec(inner.clone(), 0..4))
                .prop_map(|(i, b)| Op::Named(i, b)),
            ((0..3usize), prop::collection::vec(inner.clone(), 0..4))
                .prop_map(|(i, b)| Op::Default(i, b)),
            ((0..4usize), prop::collection::vec(inner, 0..4)).prop_map(|(k, b)| Op::Reenter(k, b)),
        ]
    });
    prop::collection::vec(op, 1..8)
}

/// TensorFlow's algorithm, on strings.
struct Reference {
    counts: HashMap<String, u32>,
    captured: Vec<String>,
    log: Vec<String>,
}

fn join(cur: &str, name: &str) -> String {
    if cur.is_empty() {
        name.to_owned()
    } else {
        format!("{cur}/{name}")
    }
}

impl Reference {
    fn count(&self, name: &str) -> u32 {
        self.counts.get(name).copied().unwrap_or(0)
    }
    fn open(&mut self, name: &str) {
        *self.counts.entry(name.to_owned()).or_insert(0) += 1;
    }
    fn close_subscopes(&mut self, name: &str) {
        let prefix = format!("{name}/");
        for (k, v) in self.counts.iter_mut() {
            if k.starts_with(&prefix) {
                *v = 0;
            }
        }
    }
    fn run(&mut self, cur: &str, ops: &[Op]) {
        for op in ops {
            match op {
                Op::Named(i, body) => {
                    let full = join(cur, NAMES[*i]);
                    self.enter_named(&full, body);
                }
                Op::Default(i, body) => {
                    let prefix = NAMES[*i];
                    let base = join(cur, prefix);
                    let full = if self.count(&base) == 0 {
                        base
                    } else {
                        let mut idx = 1;
                        while self.count(&format!("{base}_{idx}")) > 0 {
                            idx += 1;
                        }
                        format!("{base}_{idx}")
                    };
                    self.enter_named(&full, body);
                }
                Op::Reenter(k, body) => {
                    if self.captured.is_empty() {
                        continue;
                    }
                    let full = self.captured[k % self.captured.len()].clone();
                    self.log.push(full.clone());
                    self.open(&full);
                    let snapshot = self.counts.clone();
                    self.run(&full, body);
                    self.counts = snapshot;
                }
            }
        }
    }
    fn enter_named(&mut self, full: &str, body: &[Op]) {
        self.log.push(full.to_owned());
        self.captured.push(full.to_owned());
        self.open(full);
        self.run(full, body);
        self.close_subscopes(full);
    }
}

/// The same program on a `VariableStore`.
fn run_store(
    store: &mut VariableStore,
    cur: &VarScope,
    ops: &[Op],
    captured: &mut Vec<VarScope>,
    log: &mut Vec<String>,
) {
    for op in ops {
        let o = ScopeOpts::new();
        let out = match op {
            Op::Named(i, body) => store.variable_scope(cur, NAMES[*i], o, |s, vs| {
                log.push(vs.name().to_owned());
                captured.push(vs.clone());
                run_store(s, vs, body, captured, log);
                Ok(())
            }),
            Op::Default(i, body) => store.variable_scope_unique(cur, NAMES[*i], o, |s, vs| {
                log.push(vs.name().to_owned());
                captured.push(vs.clone());
                run_store(s, vs, body, captured, log);
                Ok(())
            }),
            Op::Reenter(k, body) => {
                if captured.is_empty() {
                    continue;
                }
                let target = captured[k % captured.len()].clone();
                store.reenter_scope(&target, o, |s, vs| {
                    log.push(vs.name().to_owned());
                    run_store(s, vs, body, captured, log);
                    Ok(())
                })
            }
        };
        out.unwrap();
    }
}

/// Cases to run: `PROPTEST_CASES` if set, else 512.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(512)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
    #[test]
    fn default_names_match_tensorflow(ops in program()) {
        let mut reference = Reference { counts: HashMap::new(), captured: Vec::new(), log: Vec::new() };
        reference.run("", &ops);
        let mut store = VariableStore::new();
        let root = store.root_scope();
        let (mut captured, mut log) = (Vec::new(), Vec::new());
        run_store(&mut store, &root, &ops, &mut captured, &mut log);
        prop_assert_eq!(log, reference.log);
    }
}
