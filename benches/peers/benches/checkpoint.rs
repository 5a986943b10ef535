//! Checkpoints next to candle: scopetree's `checkpoint::save`/`load` and
//! candle-nn's `VarMap::save`/`VarMap::load` on the same tensors (about
//! 1 GiB in 256 `f32` tensors of the same names and shapes), in one run.
//!
//! - `scopetree_save` / `candle_save`: write the whole model to a
//!   `.safetensors` file (both through safetensors 0.8's
//!   `serialize_to_file`: a temporary file, then a rename).
//! - `scopetree_load` (strict; the default: values overwritten in place),
//!   `scopetree_load_rollback` (`rollback(true)`: every tensor read into new
//!   memory first), `candle_load`: read it back into the built model.
//!   candle mmaps the file and `Var::set`s each tensor.
//!
//! Size: `SCOPETREE_CKPT_MIB` MiB (default 1024); 8 MiB in criterion's test
//! mode. Run: `cargo bench -p scopetree-peers --bench checkpoint` (builds
//! candle; not part of CI).

use std::time::Duration;

use candle_core::{DType, Device};
use candle_nn::{Init, VarMap};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use scopetree::ScopeTree;
use scopetree::checkpoint::{self, LoadOptions, SaveOptions, Separator};

#[path = "../../support/timing.rs"]
mod timing;
use timing::after_sync;

const TENSORS: usize = 256;

fn total_mib() -> usize {
    if !std::env::args().any(|a| a == "--bench") {
        return 8;
    }
    std::env::var("SCOPETREE_CKPT_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

/// (scope, name, value) of every tensor: `layer_LL.wJ`.
fn names() -> Vec<(String, String, f32)> {
    (0..TENSORS)
        .map(|i| {
            (
                format!("layer_{:02}", i / 8),
                format!("w{}", i % 8),
                i as f32 * 0.5,
            )
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mib = total_mib();
    let bytes = mib << 20;
    let elems = bytes / TENSORS / 4;
    let dir = std::env::temp_dir().join(format!("scopetree-peers-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ours = dir.join("scopetree.safetensors");
    let theirs = dir.join("candle.safetensors");

    let mut tree = ScopeTree::new();
    let mut map = VarMap::new();
    for (scope, name, v) in names() {
        let s = match tree.kid(tree.root(), scope.as_str()).unwrap() {
            Some(s) => s,
            None => tree.new_named_scope(tree.root(), scope.as_str()).unwrap(),
        };
        let var = tree.var(s, name.as_str()).unwrap();
        tree.set(var, vec![v; elems]).unwrap();
        map.get(
            elems,
            &format!("{scope}.{name}"),
            Init::Const(f64::from(v)),
            DType::F32,
            &Device::Cpu,
        )
        .unwrap();
    }
    let save_opts = SaveOptions::new().separator(Separator::Dot);
    let load_opts = LoadOptions::new().separator(Separator::Dot);
    // Both files exist before any group, so that a run filtered to the loads
    // (`-- load`) has files to read.
    checkpoint::save(&tree, tree.root(), &ours, &save_opts).unwrap();
    map.save(&theirs).unwrap();

    let mut g = c.benchmark_group(format!("peers_checkpoint_{mib}MiB_{TENSORS}_f32"));
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(12))
        .throughput(Throughput::Bytes(bytes as u64));
    // Each timed save starts with the file it replaces flushed to disk.
    g.bench_function("scopetree_save", |b| {
        after_sync(b, &ours, || {
            checkpoint::save(&tree, tree.root(), &ours, &save_opts).unwrap();
        })
    });
    g.bench_function("candle_save", |b| {
        after_sync(b, &theirs, || map.save(&theirs).unwrap())
    });
    // The two files hold the same tensors under the same names.
    assert_eq!(
        std::fs::read(&ours).unwrap(),
        std::fs::read(&theirs).unwrap()
    );

    let root = tree.root();
    g.bench_function("scopetree_load", |b| {
        b.iter(|| checkpoint::load(&mut tree, root, &ours, &load_opts).unwrap())
    });
    let staged = load_opts.clone().rollback(true);
    g.bench_function("scopetree_load_rollback", |b| {
        b.iter(|| checkpoint::load(&mut tree, root, &ours, &staged).unwrap())
    });
    g.bench_function("candle_load", |b| b.iter(|| map.load(&theirs).unwrap()));
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
