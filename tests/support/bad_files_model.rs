//! The small model that malformed checkpoints are loaded into, by
//! `tests/checkpoint_bad_files.rs` and the fuzz targets (`tests/fuzz`):
//! three variables of three dtypes, in two scopes.

use scopetree::checkpoint::Tensor;
use scopetree::{ScopeTree, VarId};

/// `a`: `Vec<f32>` of 5; `s/b`: `Tensor<i16>` [2, 3]; `s/c`: `Vec<u8>` of
/// 4. Filled with one set of values or another (`fill`), so that a load
/// that changed anything shows.
pub fn model(fill: bool) -> (ScopeTree, [VarId; 3]) {
    let mut t = ScopeTree::new();
    let s = t.new_named_scope(t.root(), "s").unwrap();
    let a = t.var(t.root(), "a").unwrap();
    let b = t.var(s, "b").unwrap();
    let c = t.var(s, "c").unwrap();
    let k = i16::from(fill);
    let a_values: Vec<f32> = (0..5).map(|i| f32::from(i * k) + 0.5).collect();
    t.set(a, a_values).unwrap();
    let b_values = (0..6).map(|i| i * k - 3).collect();
    t.set(b, Tensor::new(vec![2, 3], b_values).unwrap())
        .unwrap();
    t.set(c, vec![7_u8 * u8::from(fill); 4]).unwrap();
    (t, [a, b, c])
}
