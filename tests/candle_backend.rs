//! `CandleStore` as the variable store behind candle-nn's `VarBuilder`
//! (issue 11): every layer the issue lists builds with its parameters in the
//! tree under their dotted names; reuse is checked (shape, dtype) and never
//! converts; a sealed store refuses unknown names instead of making zeros;
//! names the tree cannot hold are refused; freezing keeps gradients and
//! optimizer steps off a prefix; failed calls change nothing.

use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::rnn::{GRUConfig, LSTMConfig, RNN};
use candle_nn::{
    AdamW, Conv1dConfig, Conv2dConfig, Init, Optimizer, ParamsAdamW, VarBuilder, VarMap,
};
use scopetree::candle::{CandleStore, Error};
use scopetree::checkpoint::{self, LoadOptions};
use scopetree::sharing::{self, Initializer, TRAINABLE_VARIABLES, VarSpec};

type R = Result<(), Box<dyn std::error::Error>>;

const CPU: Device = Device::Cpu;

#[path = "support/candle_tiny.rs"]
mod candle_tiny;
use candle_tiny::{NAMES, Tiny, names_of};

fn vb(store: &CandleStore) -> VarBuilder<'static> {
    store.var_builder(DType::F32, &CPU)
}

/// Every variable's name, dtype, shape and element bits (all test variables
/// are F32).
fn snapshot(store: &CandleStore) -> Vec<(String, DType, Vec<usize>, Vec<u32>)> {
    store
        .named_vars()
        .expect("the store's names are valid dotted names")
        .into_iter()
        .map(|(k, v)| {
            let bits = v
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("an F32 variable")
                .iter()
                .map(|x| x.to_bits())
                .collect();
            (k, v.dtype(), v.dims().to_vec(), bits)
        })
        .collect()
}

/// The element bits of an F32 tensor.
fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .expect("an F32 tensor")
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// The store's `Var` called `name` (it must exist).
fn var(store: &CandleStore, name: &str) -> Var {
    store
        .var(name)
        .expect("a valid name")
        .unwrap_or_else(|| panic!("no variable {name}"))
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

/// Every layer the issue lists, built through one `VarBuilder`.
struct Zoo {
    lin: candle_nn::Linear,
    emb: candle_nn::Embedding,
    c1: candle_nn::Conv1d,
    c2: candle_nn::Conv2d,
    ln: candle_nn::LayerNorm,
    gru: candle_nn::GRU,
    lstm: candle_nn::LSTM,
}

impl Zoo {
    fn build(vb: &VarBuilder) -> candle_core::Result<Self> {
        Ok(Self {
            lin: candle_nn::linear(4, 3, vb.pp("enc").pp("lin"))?,
            emb: candle_nn::embedding(10, 4, vb.pp("emb"))?,
            c1: candle_nn::conv1d(2, 3, 5, Conv1dConfig::default(), vb.pp("c1"))?,
            c2: candle_nn::conv2d(2, 3, 3, Conv2dConfig::default(), vb.pp("c2"))?,
            ln: candle_nn::layer_norm(4, 1e-5, vb.pp("ln"))?,
            gru: candle_nn::gru(4, 5, GRUConfig::default(), vb.pp("gru"))?,
            lstm: candle_nn::lstm(4, 6, LSTMConfig::default(), vb.pp("lstm"))?,
        })
    }

    /// A scalar that depends on every parameter.
    fn loss(&self) -> candle_core::Result<Tensor> {
        let x = Tensor::arange(0f32, 8., &CPU)?
            .reshape((2, 4))?
            .affine(0.1, -0.3)?;
        let xt = Tensor::arange(0f32, 8., &CPU)?
            .reshape((4, 2))?
            .affine(0.2, -0.1)?
            .t()?;
        assert!(!xt.is_contiguous());
        let ids = Tensor::new(&[[1u32, 7, 3], [0, 9, 2]], &CPU)?;
        let seq = self.emb.forward(&ids)?; // (2, 3, 4)
        let mut terms = vec![
            self.lin.forward(&x)?.sqr()?.sum_all()?,
            // candle-nn's fused layer norm (taken for a contiguous input)
            // has no backward pass; a transposed input takes the plain one.
            self.ln.forward(&xt)?.affine(1.0, 0.5)?.sqr()?.sum_all()?,
        ];
        let s1 = Tensor::arange(0f32, 16., &CPU)?
            .reshape((1, 2, 8))?
            .affine(0.05, -0.2)?;
        terms.push(self.c1.forward(&s1)?.sqr()?.sum_all()?);
        let s2 = Tensor::arange(0f32, 50., &CPU)?
            .reshape((1, 2, 5, 5))?
            .affine(0.02, -0.4)?;
        terms.push(self.c2.forward(&s2)?.sqr()?.sum_all()?);
        let g = self.gru.seq(&seq)?;
        terms.push(g.last().expect("3 steps").h().sqr()?.sum_all()?);
        let l = self.lstm.seq(&seq)?;
        terms.push(l.last().expect("3 steps").h().sqr()?.sum_all()?);
        Tensor::stack(&terms, 0)?.sum_all()
    }
}

/// Every name and shape of the zoo.
fn zoo_names() -> Vec<(&'static str, Vec<usize>)> {
    vec![
        ("c1.bias", vec![3]),
        ("c1.weight", vec![3, 2, 5]),
        ("c2.bias", vec![3]),
        ("c2.weight", vec![3, 2, 3, 3]),
        ("emb.weight", vec![10, 4]),
        ("enc.lin.bias", vec![3]),
        ("enc.lin.weight", vec![3, 4]),
        ("gru.bias_hh_l0", vec![15]),
        ("gru.bias_ih_l0", vec![15]),
        ("gru.weight_hh_l0", vec![15, 5]),
        ("gru.weight_ih_l0", vec![15, 4]),
        ("ln.bias", vec![4]),
        ("ln.weight", vec![4]),
        ("lstm.bias_hh_l0", vec![24]),
        ("lstm.bias_ih_l0", vec![24]),
        ("lstm.weight_hh_l0", vec![24, 6]),
        ("lstm.weight_ih_l0", vec![24, 4]),
    ]
}

// ----- building ---------------------------------------------------------------

#[test]
fn every_layer_builds_with_dotted_names_and_shapes() -> R {
    let store = CandleStore::new();
    Zoo::build(&vb(&store))?;
    let want = zoo_names();
    let names: Vec<&str> = want.iter().map(|(n, _)| *n).collect();
    assert_eq!(store.names()?, names);
    for (name, shape) in &want {
        let v = var(&store, name);
        assert_eq!(v.dims(), shape.as_slice(), "{name}");
        assert_eq!(v.dtype(), DType::F32, "{name}");
    }
    // The layers' `Init` hints were used to create: layer norm's weight is
    // ones and its bias zeros, the GRU's biases zeros.
    assert_eq!(bits(&var(&store, "ln.weight")), vec![1f32.to_bits(); 4]);
    assert_eq!(bits(&var(&store, "ln.bias")), vec![0f32.to_bits(); 4]);
    assert_eq!(
        bits(&var(&store, "gru.bias_ih_l0")),
        vec![0f32.to_bits(); 15]
    );
    // Random hints give values that are not all zero.
    assert!(bits(&var(&store, "emb.weight")).iter().any(|&b| b != 0));
    Ok(())
}

#[test]
fn the_model_holds_the_var_itself_so_every_var_gets_a_gradient() -> R {
    let store = CandleStore::new();
    let zoo = Zoo::build(&vb(&store))?;
    // The tensor a layer holds is the Var's own tensor (same id).
    assert_eq!(
        zoo.lin.weight().id(),
        var(&store, "enc.lin.weight").as_tensor().id()
    );
    assert_eq!(
        zoo.emb.embeddings().id(),
        var(&store, "emb.weight").as_tensor().id()
    );
    let grads = zoo.loss()?.backward()?;
    for (name, shape) in zoo_names() {
        let v = var(&store, name);
        let g = grads
            .get(v.as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        assert_eq!(g.dims(), shape.as_slice(), "{name}");
    }
    Ok(())
}

// ----- reuse ------------------------------------------------------------------

#[test]
fn building_again_reuses_the_same_storage() -> R {
    let store = CandleStore::new();
    let first = Zoo::build(&vb(&store))?;
    let before = snapshot(&store);
    let second = Zoo::build(&vb(&store))?;
    assert_eq!(snapshot(&store), before, "no new names, values unchanged");
    // The same tensor: same id, and a write through the Var shows in both.
    assert_eq!(second.lin.weight().id(), first.lin.weight().id());
    let w = var(&store, "enc.lin.weight");
    w.set(&Tensor::full(0.25f32, (3, 4), &CPU)?)?;
    assert_eq!(bits(second.lin.weight()), vec![0.25f32.to_bits(); 12]);
    assert_eq!(bits(first.lin.weight()), vec![0.25f32.to_bits(); 12]);
    assert_eq!(store.names()?.len(), 17);
    Ok(())
}

#[test]
fn shape_mismatch_on_reuse_names_both_shapes_and_changes_nothing() -> R {
    let store = CandleStore::new();
    candle_nn::linear(4, 3, vb(&store).pp("lin"))?;
    let before = snapshot(&store);

    let err = store
        .get((3, 5), "lin.weight", Init::Const(0.), DType::F32, &CPU)
        .unwrap_err();
    match err {
        Error::ShapeMismatch { name, asked, found } => {
            assert_eq!(name, "lin.weight");
            assert_eq!(asked, [3, 5]);
            assert_eq!(found, [3, 4]);
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    assert_eq!(snapshot(&store), before);

    // Through VarBuilder: a candle error with the same message.
    let err = candle_nn::linear(5, 3, vb(&store).pp("lin")).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("lin.weight") && msg.contains("[3, 4]") && msg.contains("[3, 5]"),
        "{msg}"
    );
    assert_eq!(snapshot(&store), before);
    Ok(())
}

#[test]
fn dtype_mismatch_on_reuse_is_an_error_never_a_conversion() -> R {
    let store = CandleStore::new();
    candle_nn::linear(4, 3, vb(&store).pp("lin"))?;
    let before = snapshot(&store);

    let err = store
        .get((3, 4), "lin.weight", Init::Const(0.), DType::F64, &CPU)
        .unwrap_err();
    match err {
        Error::DtypeMismatch { name, asked, found } => {
            assert_eq!(name, "lin.weight");
            assert_eq!(asked, DType::F64);
            assert_eq!(found, DType::F32);
        }
        other => panic!("expected DtypeMismatch, got {other:?}"),
    }
    assert_eq!(snapshot(&store), before);

    // The whole layer through an F64 builder: refused, the Vars stay F32.
    let f64_vb = store.var_builder(DType::F64, &CPU);
    let err = candle_nn::linear(4, 3, f64_vb.pp("lin")).unwrap_err();
    assert!(err.to_string().contains("F64"), "{err}");
    assert_eq!(snapshot(&store), before);
    assert_eq!(var(&store, "lin.bias").dtype(), DType::F32);
    Ok(())
}

// ----- sealed mode ------------------------------------------------------------

#[test]
fn a_sealed_store_refuses_unknown_names_and_reuses_known_ones() -> R {
    let store = CandleStore::new();
    let first = candle_nn::linear(4, 3, vb(&store).pp("lin"))?;
    store.seal();
    assert!(store.is_sealed());
    let before = snapshot(&store);

    // Known names still build, and hand out the same tensors.
    let again = candle_nn::linear(4, 3, vb(&store).pp("lin"))?;
    assert_eq!(again.weight().id(), first.weight().id());

    // An unknown name: `Error::Sealed`, nothing created.
    let err = store
        .get(3, "head.bias", Init::Const(0.), DType::F32, &CPU)
        .unwrap_err();
    assert!(
        matches!(err, Error::Sealed { ref name } if name == "head.bias"),
        "{err:?}"
    );
    // Through VarBuilder: a candle error that says "sealed".
    let err = candle_nn::linear(3, 2, vb(&store).pp("head")).unwrap_err();
    assert!(err.to_string().contains("sealed"), "{err}");
    // A name without a hint is refused too (VarMap would make zeros).
    let err = vb(&store).get((2, 3), "nohint").unwrap_err();
    assert!(err.to_string().contains("sealed"), "{err}");
    assert_eq!(snapshot(&store), before);

    // unseal() lets the store create again.
    store.unseal();
    assert!(!store.is_sealed());
    candle_nn::linear(3, 2, vb(&store).pp("head"))?;
    assert_eq!(
        store.names()?,
        ["head.bias", "head.weight", "lin.bias", "lin.weight"]
    );
    Ok(())
}

#[test]
fn varmap_makes_zeros_for_a_name_without_hint_where_a_sealed_store_errs() -> R {
    // candle #699: `vb.get` passes `Init::Const(0.)`, so a misspelt name on
    // a VarMap silently becomes a variable of zeros.
    let varmap = VarMap::new();
    let vm_vb = VarBuilder::from_varmap(&varmap, DType::F32, &CPU);
    candle_nn::linear(4, 3, vm_vb.pp("lin"))?;
    let zeros = vm_vb.pp("lin").get((3, 4), "wieght")?;
    assert_eq!(bits(&zeros), vec![0u32; 12]);
    assert!(
        varmap
            .data()
            .lock()
            .expect("lock")
            .contains_key("lin.wieght")
    );

    // The same typo on a sealed scopetree store is an error.
    let store = CandleStore::new();
    candle_nn::linear(4, 3, vb(&store).pp("lin"))?;
    store.seal();
    let err = vb(&store).pp("lin").get((3, 4), "wieght").unwrap_err();
    assert!(err.to_string().contains("sealed"), "{err}");
    assert_eq!(store.names()?, ["lin.bias", "lin.weight"]);
    assert!(store.var("lin.wieght")?.is_none());
    Ok(())
}

// ----- names the tree cannot hold -------------------------------------------

#[test]
fn names_with_a_slash_or_an_empty_component_are_refused() -> R {
    let store = CandleStore::new();
    candle_nn::linear(2, 2, vb(&store).pp("ok"))?;
    let before = snapshot(&store);
    for (name, reason) in [
        ("a/b", "it contains `/`, which the tree uses between scopes"),
        ("a..b", "it has an empty component"),
        (".a", "it has an empty component"),
        ("a.", "it has an empty component"),
        ("", "it is empty"),
    ] {
        let err = store
            .get(2, name, Init::Const(1.), DType::F32, &CPU)
            .unwrap_err();
        match err {
            Error::InvalidName { name: n, reason: r } => {
                assert_eq!(n, name);
                assert_eq!(r, reason, "{name:?}");
            }
            other => panic!("{name:?}: expected InvalidName, got {other:?}"),
        }
        assert!(matches!(store.var(name), Err(Error::InvalidName { .. })));
        assert_eq!(snapshot(&store), before, "{name:?}");
    }
    // Through VarBuilder: a prefix with a slash.
    let err = candle_nn::linear(2, 2, vb(&store).pp("x/y")).unwrap_err();
    assert!(err.to_string().contains("x/y"), "{err}");
    assert_eq!(snapshot(&store), before);
    Ok(())
}

// ----- freezing ---------------------------------------------------------------

#[test]
fn a_frozen_prefix_gets_no_gradient_and_does_not_move() -> R {
    let store = CandleStore::new();
    store.freeze("emb")?;
    let model = Tiny::build(&vb(&store))?;
    assert_eq!(store.names()?, NAMES);
    assert!(store.is_frozen("emb.weight"));
    assert_eq!(names_of(&store, &store.trainable_vars("")?), &NAMES[1..]);

    let emb = var(&store, "emb.weight");
    let grads = model.loss()?.backward()?;
    assert!(grads.get(emb.as_tensor()).is_none());
    for name in &NAMES[1..] {
        assert!(grads.get(var(&store, name).as_tensor()).is_some(), "{name}");
    }

    let before = snapshot(&store);
    let mut opt = AdamW::new(store.trainable_vars("")?, ParamsAdamW::default())?;
    opt.step(&grads)?;
    let after = snapshot(&store);
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a.0, b.0);
        if a.0 == "emb.weight" {
            assert_eq!(a.3, b.3, "the frozen emb.weight moved");
        } else {
            assert_ne!(a.3, b.3, "{} did not move", a.0);
        }
    }
    // The frozen model still sees the (unchanged) embedding's storage.
    assert_eq!(bits(model.emb.embeddings()), before[0].3);
    Ok(())
}

#[test]
fn unfreeze_and_trainable_lists() -> R {
    let store = CandleStore::new();
    Tiny::build(&vb(&store))?;
    store.freeze("gru")?;
    assert_eq!(
        names_of(&store, &store.trainable_vars("")?),
        ["emb.weight", "out.bias", "out.weight"]
    );
    assert!(store.trainable_vars("gru")?.is_empty());
    // Unfreezing one variable below a frozen prefix.
    store.unfreeze("gru.bias_hh_l0")?;
    assert!(!store.is_frozen("gru.bias_hh_l0"));
    assert!(store.is_frozen("gru.bias_ih_l0"));
    assert_eq!(
        names_of(&store, &store.trainable_vars("gru")?),
        ["gru.bias_hh_l0"]
    );
    // Unfreezing the prefix: everything trainable again.
    store.unfreeze("gru")?;
    assert!(!store.is_frozen("gru.bias_ih_l0"));
    assert_eq!(names_of(&store, &store.trainable_vars("")?), NAMES);
    // A model built now gets the Var's own tensor again (a gradient).
    let model = Tiny::build(&vb(&store))?;
    let grads = model.loss()?.backward()?;
    assert!(
        grads
            .get(var(&store, "gru.weight_ih_l0").as_tensor())
            .is_some()
    );
    // A malformed prefix is refused.
    assert!(matches!(
        store.freeze("a/b"),
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        store.trainable_vars("a..b"),
        Err(Error::InvalidName { .. })
    ));
    Ok(())
}

#[test]
fn prefixes_are_whole_components_and_lists_are_sorted_by_name() -> R {
    let store = CandleStore::new();
    let v = vb(&store);
    // Built in an order that is not the name order.
    candle_nn::gru(3, 2, GRUConfig::default(), v.pp("gru2"))?;
    candle_nn::linear(2, 2, v.pp("b"))?;
    candle_nn::gru(3, 2, GRUConfig::default(), v.pp("gru"))?;
    candle_nn::linear(2, 2, v.pp("a"))?;
    let all = strings(&[
        "a.bias",
        "a.weight",
        "b.bias",
        "b.weight",
        "gru.bias_hh_l0",
        "gru.bias_ih_l0",
        "gru.weight_hh_l0",
        "gru.weight_ih_l0",
        "gru2.bias_hh_l0",
        "gru2.bias_ih_l0",
        "gru2.weight_hh_l0",
        "gru2.weight_ih_l0",
    ]);
    assert_eq!(store.names()?, all);
    assert_eq!(names_of(&store, &store.trainable_vars("")?), all);
    assert_eq!(
        names_of(&store, &store.trainable_vars_in(TRAINABLE_VARIABLES)?),
        all
    );
    // `gru` selects gru.* and not gru2.*.
    assert_eq!(names_of(&store, &store.trainable_vars("gru")?), all[4..8]);
    assert_eq!(names_of(&store, &store.trainable_vars("gru2")?), all[8..]);
    assert_eq!(
        names_of(&store, &store.trainable_vars("a.weight")?),
        ["a.weight"]
    );

    store.freeze("gru")?;
    assert!(store.is_frozen("gru.weight_ih_l0"));
    assert!(!store.is_frozen("gru2.weight_ih_l0"));
    let mut rest = all[..4].to_vec();
    rest.extend_from_slice(&all[8..]);
    assert_eq!(names_of(&store, &store.trainable_vars("")?), rest);
    assert_eq!(
        names_of(&store, &store.trainable_vars_in(TRAINABLE_VARIABLES)?),
        rest
    );
    assert_eq!(names_of(&store, &store.trainable_vars("gru2")?), all[8..]);
    Ok(())
}

// ----- get_unchecked, contains_tensor ---------------------------------------------

#[test]
fn get_unchecked_and_contains_tensor() -> R {
    let store = CandleStore::new();
    candle_nn::linear(4, 3, vb(&store).pp("lin"))?;
    let w = var(&store, "lin.weight");

    let t = vb(&store).get_unchecked("lin.weight")?;
    assert_eq!(t.id(), w.as_tensor().id());
    assert_eq!(t.dims(), [3, 4]);
    let t = vb(&store).pp("lin").get_unchecked("bias")?;
    assert_eq!(t.id(), var(&store, "lin.bias").as_tensor().id());

    let err = vb(&store).get_unchecked("lin.nope").unwrap_err();
    assert!(err.to_string().contains("lin.nope"), "{err}");
    // Checked for dtype all the same.
    assert!(
        vb(&store)
            .get_unchecked_dtype("lin.weight", DType::F64)
            .is_err()
    );
    assert_eq!(store.names()?, ["lin.bias", "lin.weight"]);

    assert!(vb(&store).contains_tensor("lin.weight"));
    assert!(vb(&store).pp("lin").contains_tensor("bias"));
    assert!(!vb(&store).contains_tensor("lin.nope"));
    assert!(!vb(&store).contains_tensor("lin"));
    assert!(!vb(&store).contains_tensor("a/b"));
    Ok(())
}

// ----- failing initializers -------------------------------------------------------

#[test]
fn a_failing_initializer_is_init_failed_and_creates_nothing() -> R {
    let store = CandleStore::new();
    candle_nn::linear(2, 2, vb(&store).pp("ok"))?;
    let before = snapshot(&store);

    let res = store.with_store(|s| {
        let root = s.root_scope();
        let init = Initializer::try_with_shape(|_: &[usize]| -> Result<Var, &str> {
            Err("device out of memory")
        });
        s.get_variable(&root, VarSpec::new("bad/w").shape([2]).initializer(init))
    });
    match res {
        Err(sharing::Error::InitFailed {
            name,
            scope,
            source,
        }) => {
            assert_eq!(name, "w");
            assert_eq!(scope, "bad");
            assert_eq!(source.to_string(), "device out of memory");
        }
        other => panic!("expected InitFailed, got {other:?}"),
    }
    assert_eq!(snapshot(&store), before);
    assert!(store.var("bad.w")?.is_none());
    let kid = store.with_store(|s| s.tree().kid(s.tree().root(), "bad"))?;
    assert!(kid.is_none(), "the scope `bad` was left behind");

    // candle's own initializer failing (a random init of an integer dtype)
    // comes back through the same path.
    let err = store
        .get(
            (2, 2),
            "ints",
            Init::Randn {
                mean: 0.,
                stdev: 1.,
            },
            DType::U32,
            &CPU,
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::Sharing(sharing::Error::InitFailed { ref name, .. }) if name == "ints"),
        "{err:?}"
    );
    assert_eq!(snapshot(&store), before);
    Ok(())
}

// ----- unused -----------------------------------------------------------------------

#[test]
fn unused_lists_the_names_the_model_never_asked_for() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("with_extra.safetensors");
    let trained = CandleStore::new();
    Tiny::build(&vb(&trained))?;
    trained.get(3, "extra", Init::Const(1.), DType::F32, &CPU)?;
    assert!(trained.unused()?.is_empty());
    trained.save(&path)?;

    let fresh = CandleStore::new();
    let report = fresh.load(&path, &LoadOptions::new().create(true))?;
    let mut all = strings(&NAMES);
    all.insert(1, "extra".to_owned()); // sorted: after emb.weight
    assert_eq!(report.created, all);
    assert_eq!(fresh.unused()?, all);
    Tiny::build(&vb(&fresh))?;
    assert_eq!(fresh.unused()?, ["extra"]);
    assert_eq!(fresh.names()?, all);
    Ok(())
}

/// A `get` that is refused (another shape, another dtype, a name that holds
/// something other than a `Var`) hands nothing out: the variable stays
/// unused, as a load left it, and unchanged. Only an accepted `get` counts.
#[test]
fn a_refused_get_does_not_count_as_asked_for() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("one.safetensors");
    let trained = CandleStore::new();
    trained.get((2, 3), "lin.w", Init::Const(2.), DType::F32, &CPU)?;
    trained.save(&path)?;

    let fresh = CandleStore::new();
    fresh.load(&path, &LoadOptions::new().create(true))?;
    let before = snapshot(&fresh);
    let wrong_shape = fresh.get((3, 2), "lin.w", Init::Const(0.), DType::F32, &CPU);
    assert!(matches!(wrong_shape, Err(Error::ShapeMismatch { .. })));
    let wrong_dtype = fresh.get((2, 3), "lin.w", Init::Const(0.), DType::F64, &CPU);
    assert!(matches!(wrong_dtype, Err(Error::DtypeMismatch { .. })));
    assert!(vb(&fresh).get_unchecked_dtype("lin.w", DType::F64).is_err());
    assert_eq!(fresh.unused()?, ["lin.w"]);
    assert_eq!(snapshot(&fresh), before);

    // A name that holds another value: `NotAVar`, from `get` and from
    // `get_unchecked`, and the value is left as it was.
    fresh.with_store(|s| {
        let root = s.root_scope();
        s.get_variable(
            &root,
            VarSpec::new("lin/v").initializer(Initializer::constant(vec![1.0_f32; 2])),
        )
    })?;
    let err = fresh
        .get(2, "lin.v", Init::Const(0.), DType::F32, &CPU)
        .unwrap_err();
    assert!(matches!(err, Error::NotAVar { .. }), "{err}");
    let err = vb(&fresh).get_unchecked("lin.v").unwrap_err();
    assert!(err.to_string().contains("lin.v"), "{err}");
    let held = fresh.with_store(|s| {
        let v = s.variable("lin/v")?.expect("created above");
        Ok::<_, sharing::Error>(s.tree().get::<Vec<f32>>(v)?.clone())
    })?;
    assert_eq!(held, [1.0, 1.0]);

    // Accepted: now it counts, and the model sees the loaded values.
    let t = fresh.get((2, 3), "lin.w", Init::Const(0.), DType::F32, &CPU)?;
    assert_eq!(t.sum_all()?.to_scalar::<f32>()?, 12.0);
    assert!(fresh.unused()?.is_empty());
    Ok(())
}

// ----- tree names candle cannot read (made through the sharing API) -------------

/// Creates the F32 variable `path` (a tree path, `/` between scopes) of
/// `shape` through the sharing API, bypassing the candle name checks.
fn sharing_var(store: &CandleStore, path: &str, shape: &[usize]) -> scopetree::VarId {
    store
        .with_store(|s| {
            let root = s.root_scope();
            let init = Initializer::try_with_shape(|s: &[usize]| Var::ones(s, DType::F32, &CPU));
            s.get_variable(&root, VarSpec::new(path).shape(shape).initializer(init))
        })
        .unwrap_or_else(|e| panic!("the sharing API creates {path}: {e}"))
}

/// Calls `check` with the error of every listing of `store`
/// (`trainable_vars` both for everything and under `prefix`).
fn each_listing_fails(store: &CandleStore, prefix: &str, check: impl Fn(&str, Error)) {
    check("names", store.names().unwrap_err());
    check("named_vars", store.named_vars().unwrap_err());
    check("all_vars", store.all_vars().unwrap_err());
    check("unused", store.unused().unwrap_err());
    check(
        "trainable_vars(\"\")",
        store.trainable_vars("").unwrap_err(),
    );
    check(
        &format!("trainable_vars({prefix:?})"),
        store.trainable_vars(prefix).unwrap_err(),
    );
    check(
        "trainable_vars_in",
        store
            .trainable_vars_in(scopetree::sharing::TRAINABLE_VARIABLES)
            .unwrap_err(),
    );
}

/// Asserts that every listing of `store` fails with `Error::InvalidName` for
/// the tree path `path`.
fn assert_invalid_everywhere(store: &CandleStore, path: &str) {
    const REASON: &str = "a scope or variable name of the tree contains `.`, which candle \
                          reads as a scope separator; rename it";
    let check = |what: &str, err: Error| match err {
        Error::InvalidName { name, reason } => {
            assert_eq!(name, path, "{what}");
            assert_eq!(reason, REASON, "{what}");
        }
        other => panic!("{what}: expected InvalidName, got {other:?}"),
    };
    each_listing_fails(store, "fc", check);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("dotted.safetensors");
    check("save", store.save(&file).unwrap_err());
    assert!(!file.exists(), "a refused save wrote {}", file.display());
}

#[test]
fn a_dotted_tree_name_is_invalid_name_in_every_listing() -> R {
    let store = CandleStore::new();
    candle_nn::linear(2, 2, vb(&store).pp("fc"))?;
    assert_eq!(store.names()?, ["fc.bias", "fc.weight"]);

    // A root variable literally named `a.weight` (no scope `a`).
    sharing_var(&store, "a.weight", &[2]);
    assert!(
        store
            .with_store(|s| s.tree().kid(s.tree().root(), "a"))?
            .is_none()
    );
    assert_invalid_everywhere(&store, "a.weight");

    // A dotted scope name is reported by its tree path.
    let other = CandleStore::new();
    candle_nn::linear(2, 2, vb(&other).pp("fc"))?;
    sharing_var(&other, "x.y/w", &[3]);
    assert_invalid_everywhere(&other, "x.y/w");
    // The error is not sticky: once the scope is gone, the lists are back.
    other.with_store(|s| {
        let xy = s
            .tree()
            .kid(s.tree().root(), "x.y")?
            .expect("the scope x.y");
        s.delete_scope(xy)
    })?;
    assert_eq!(other.names()?, ["fc.bias", "fc.weight"]);
    assert_eq!(other.unused()?, Vec::<String>::new());
    assert_eq!(
        names_of(&other, &other.trainable_vars("")?),
        ["fc.bias", "fc.weight"]
    );
    Ok(())
}

#[test]
fn two_variables_with_one_dotted_name_are_a_key_collision() -> R {
    let store = CandleStore::new();
    // `a.weight` through candle: the variable `weight` of the scope `a`.
    store.get(2, "a.weight", Init::Const(0.), DType::F32, &CPU)?;
    candle_nn::linear(2, 2, vb(&store).pp("fc"))?;
    // The root variable literally named `a.weight`: the same dotted key.
    sharing_var(&store, "a.weight", &[2]);

    let check = |what: &str, err: Error| match err {
        Error::Checkpoint(checkpoint::Error::KeyCollision { key, first, second }) => {
            assert_eq!(key, "a.weight", "{what}");
            let mut paths = [first, second];
            paths.sort();
            assert_eq!(paths, ["a.weight", "a/weight"], "{what}");
        }
        other => panic!("{what}: expected KeyCollision, got {other:?}"),
    };
    each_listing_fails(&store, "a", check);
    // The candle name still reaches the scoped variable.
    assert_eq!(var(&store, "a.weight").dims(), [2]);
    Ok(())
}

// ----- unused by handle ---------------------------------------------------------------

#[test]
fn a_variable_deleted_and_recreated_by_a_load_is_unused_until_asked_for() -> R {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.safetensors");
    let store = CandleStore::new();
    let old = Tiny::build(&vb(&store))?;
    store.save(&path)?;
    assert_eq!(store.unused()?, Vec::<String>::new());
    let old_out_w = var(&store, "out.weight");

    store.with_store(|s| {
        let out = s
            .tree()
            .kid(s.tree().root(), "out")?
            .expect("the scope out");
        s.delete_scope(out)
    })?;
    assert_eq!(store.names()?, NAMES[..5]);
    assert_eq!(store.unused()?, Vec::<String>::new());

    // The load recreates out.* under the names the model asked for before:
    // new variables, which no model holds yet.
    let report = store.load(&path, &LoadOptions::new().create(true))?;
    assert_eq!(report.created, ["out.bias", "out.weight"]);
    assert_eq!(report.loaded, NAMES);
    assert_eq!(store.names()?, NAMES);
    assert_eq!(store.unused()?, ["out.bias", "out.weight"]);
    assert_ne!(
        var(&store, "out.weight").as_tensor().id(),
        old_out_w.as_tensor().id()
    );
    assert_ne!(
        old.out.weight().id(),
        var(&store, "out.weight").as_tensor().id()
    );

    // A model built now asks for them.
    let new = Tiny::build(&vb(&store))?;
    assert_eq!(store.unused()?, Vec::<String>::new());
    assert_eq!(
        new.out.weight().id(),
        var(&store, "out.weight").as_tensor().id()
    );
    Ok(())
}

#[test]
fn a_variable_recreated_through_the_sharing_api_is_unused_until_asked_for() -> R {
    let store = CandleStore::new();
    Tiny::build(&vb(&store))?;
    store.with_store(|s| {
        let emb = s
            .tree()
            .kid(s.tree().root(), "emb")?
            .expect("the scope emb");
        s.delete_scope(emb)
    })?;
    sharing_var(&store, "emb/weight", &[8, 4]);
    assert_eq!(store.names()?, NAMES);
    assert_eq!(store.unused()?, ["emb.weight"]);
    let model = Tiny::build(&vb(&store))?;
    assert_eq!(store.unused()?, Vec::<String>::new());
    assert_eq!(bits(model.emb.embeddings()), vec![1f32.to_bits(); 32]);
    Ok(())
}

#[test]
fn unfreeze_brings_back_variables_created_while_frozen() -> R {
    let store = CandleStore::new();
    store.freeze("enc")?;
    candle_nn::linear(2, 2, vb(&store).pp("enc"))?;
    candle_nn::linear(2, 2, vb(&store).pp("dec"))?;
    assert_eq!(
        names_of(&store, &store.trainable_vars("")?),
        ["dec.bias", "dec.weight"]
    );
    store.unfreeze("enc")?;
    let all = ["dec.bias", "dec.weight", "enc.bias", "enc.weight"];
    assert_eq!(names_of(&store, &store.trainable_vars("")?), all);
    assert_eq!(
        names_of(
            &store,
            &store.trainable_vars_in(scopetree::sharing::TRAINABLE_VARIABLES)?
        ),
        all
    );
    Ok(())
}

// ----- name walks against a model ----------------------------------------------

/// One step of [`the_store_answers_names_like_a_map_through_any_history`].
#[derive(Clone, Debug)]
enum Op {
    Get(String),
    Contains(String),
    /// Deletes the scope at this dotted path, if there is one.
    Delete(String),
}

/// A dotted name of 1–4 components: scope components from a set whose
/// members share leading bytes (`1`, `10`, `1x`), then a leaf that is never
/// a scope name.
fn a_name() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    (
        prop::collection::vec(prop::sample::select(vec!["h", "1", "10", "1x", "a"]), 0..4),
        prop::sample::select(vec!["w", "b"]),
    )
        .prop_map(|(dirs, leaf)| {
            dirs.into_iter()
                .chain(std::iter::once(leaf))
                .collect::<Vec<_>>()
                .join(".")
        })
}

/// A name from [`a_name`], or one made invalid: an empty component at the
/// start, the end or inside (`.w`, `h.`, `h..w`), or a `/` in a component.
fn a_maybe_bad_name() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    (a_name(), 0..5_u8).prop_map(|(n, how)| match how {
        1 => format!(".{n}"),
        2 => format!("{n}."),
        3 => n.replacen('.', "..", 1),
        4 => n.replacen('.', "/", 1),
        _ => n,
    })
}

/// Whether candle's dotted `name` is one the store accepts.
fn valid_dotted(name: &str) -> bool {
    !name.contains('/') && name.split('.').all(|c| !c.is_empty())
}

fn an_op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => a_maybe_bad_name().prop_map(Op::Get),
        3 => a_maybe_bad_name().prop_map(Op::Contains),
        1 => a_name().prop_map(|n| Op::Delete(n.rsplit_once('.').map_or(n.clone(), |(d, _)| d.to_owned()))),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// `get`, `contains_tensor` and `var` agree with a map from names to
    /// tensors through any order of names and scope deletions: the walk that
    /// starts below the last name's scopes never answers for a deleted
    /// scope, a recreated one, or a name that shares bytes but not
    /// components with the last (`h.1` and `h.10`). An invalid name (`.w`,
    /// `h..w`, `h/1.w`) is never found and never created, even when its
    /// valid components name variables of the store.
    #[test]
    fn the_store_answers_names_like_a_map_through_any_history(
        ops in proptest::collection::vec(an_op(), 1..48)
    ) {
        let store = CandleStore::new();
        let mut model: std::collections::BTreeMap<String, candle_core::TensorId> =
            std::collections::BTreeMap::new();
        for op in ops {
            match op {
                Op::Get(name) if !valid_dotted(&name) => {
                    let got = store.get(2, &name, Init::Const(0.), DType::F32, &CPU);
                    proptest::prop_assert!(
                        matches!(got, Err(Error::InvalidName { .. })),
                        "{}: {:?}", name, got
                    );
                    proptest::prop_assert_eq!(
                        store.names()?,
                        model.keys().cloned().collect::<Vec<_>>()
                    );
                }
                Op::Get(name) => {
                    let t = store.get(2, &name, Init::Const(0.), DType::F32, &CPU)?;
                    let id = *model.entry(name.clone()).or_insert(t.id());
                    proptest::prop_assert_eq!(t.id(), id, "{}", name);
                }
                Op::Contains(name) if !valid_dotted(&name) => {
                    proptest::prop_assert!(!vb(&store).contains_tensor(&name), "{}", name);
                    proptest::prop_assert!(store.var(&name).is_err(), "{}", name);
                }
                Op::Contains(name) => {
                    proptest::prop_assert_eq!(
                        vb(&store).contains_tensor(&name),
                        model.contains_key(&name),
                        "{}", name
                    );
                    let held = store.var(&name)?.map(|v| v.as_tensor().id());
                    proptest::prop_assert_eq!(held, model.get(&name).copied(), "{}", name);
                    // The sharing layer finds the same variable at its tree path.
                    let by_path = store.with_store(|s| {
                        let Some(id) = s.variable(&name.replace('.', "/"))? else {
                            return Ok::<_, sharing::Error>(None);
                        };
                        Ok(Some(s.tree().get::<Var>(id)?.as_tensor().id()))
                    })?;
                    proptest::prop_assert_eq!(by_path, model.get(&name).copied(), "{}", name);
                }
                Op::Delete(dirs) => {
                    let found = store.with_store(|s| {
                        let tree = s.tree();
                        let mut k = Some(tree.root());
                        for c in dirs.split('.') {
                            k = match k {
                                Some(k) => tree.kid(k, c)?,
                                None => None,
                            };
                        }
                        match k {
                            Some(k) if k != tree.root() => s.delete_scope(k).map(|()| true),
                            _ => Ok(false),
                        }
                    })?;
                    if found {
                        let under = format!("{dirs}.");
                        model.retain(|n, _| !n.starts_with(&under));
                    }
                }
            }
        }
        proptest::prop_assert_eq!(store.names()?, model.keys().cloned().collect::<Vec<_>>());
    }
}
