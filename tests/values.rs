//! Typed values: set/get, type mismatch, uninitialised, get-or-default,
//! take/replace/clear, disjoint mutable access.

use scopetree::{Error, ScopeTree};

#[derive(Debug, PartialEq)]
struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

#[test]
fn any_send_sync_value_round_trips() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let t = tree.var(root, "t")?;
    let s = tree.var(root, "s")?;
    let arc = tree.var(root, "arc")?;
    tree.set(
        t,
        Tensor {
            shape: vec![2],
            data: vec![1.0, 2.0],
        },
    )?;
    tree.set(s, String::from("hello"))?;
    tree.set(arc, std::sync::Arc::new([1_u8, 2, 3]))?;
    assert_eq!(tree.get::<Tensor>(t)?.data, [1.0, 2.0]);
    assert_eq!(tree.get::<String>(s)?, "hello");
    assert_eq!(tree.get::<std::sync::Arc<[u8; 3]>>(arc)?[2], 3);
    Ok(())
}

#[test]
fn a_wrong_type_read_names_both_types_the_variable_and_the_scope() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let enc = tree.new_named_scope(tree.root(), "encoder")?;
    let w = tree.var(enc, "w")?;
    tree.set(w, vec![1.0_f32])?;
    let err = tree.get::<Vec<f64>>(w).unwrap_err();
    assert_eq!(
        err,
        Error::TypeMismatch {
            name: "w".into(),
            scope: "encoder".into(),
            expected: std::any::type_name::<Vec<f64>>(),
            found: std::any::type_name::<Vec<f32>>(),
        }
    );
    let msg = err.to_string();
    for part in ["`w`", "`encoder`", "Vec<f32>", "Vec<f64>"] {
        assert!(msg.contains(part), "{part} missing in: {msg}");
    }
    assert!(tree.get_mut::<f32>(w).is_err());
    assert!(!tree.is::<Vec<f64>>(w)?);
    Ok(())
}

#[test]
fn an_unset_read_is_its_own_error() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let w = tree.var(tree.root(), "w")?;
    let err = tree.get::<f32>(w).unwrap_err();
    assert_eq!(
        err,
        Error::Uninitialized {
            name: "w".into(),
            scope: String::new(),
            expected: "f32",
        }
    );
    assert!(err.to_string().contains("`<root>`"));
    assert!(matches!(
        tree.get_mut::<f32>(w),
        Err(Error::Uninitialized { .. })
    ));
    assert!(matches!(
        tree.take::<f32>(w),
        Err(Error::Uninitialized { .. })
    ));
    assert!(!tree.is_initialized(w)?);
    assert_eq!(tree.type_name(w)?, None);
    Ok(())
}

#[test]
fn get_or_default_initialises_once() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let c = tree.var(tree.root(), "counter")?;
    for _ in 0..3 {
        *tree.get_or_default::<u32>(c)? += 1;
    }
    assert_eq!(*tree.get::<u32>(c)?, 3);
    let mut calls = 0;
    tree.get_or_insert_with(c, || {
        calls += 1;
        0_u32
    })?;
    assert_eq!(calls, 0);
    assert_eq!(*tree.get::<u32>(c)?, 3);
    Ok(())
}

#[test]
fn set_changes_the_type_replace_does_not() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let v = tree.var(tree.root(), "v")?;
    tree.set(v, 1_i64)?;
    assert_eq!(tree.replace(v, 2_i64)?, Some(1));
    assert!(matches!(
        tree.replace(v, 2.5_f64),
        Err(Error::TypeMismatch { .. })
    ));
    assert_eq!(*tree.get::<i64>(v)?, 2);
    tree.set(v, 2.5_f64)?;
    assert_eq!(tree.type_name(v)?, Some("f64"));
    Ok(())
}

#[test]
fn take_and_clear_leave_the_variable_uninitialised() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let v = tree.var(tree.root(), "v")?;
    tree.set(v, vec![1_u8, 2])?;
    assert!(matches!(
        tree.take::<String>(v),
        Err(Error::TypeMismatch { .. })
    ));
    assert_eq!(tree.take::<Vec<u8>>(v)?, [1, 2]);
    assert!(!tree.is_initialized(v)?);
    tree.set(v, 9_u8)?;
    assert!(tree.clear(v)?);
    assert!(!tree.clear(v)?);
    assert!(tree.contains_var(v));
    Ok(())
}

#[test]
fn values_are_dropped_with_their_scope() -> scopetree::Result<()> {
    use std::sync::Arc;
    let probe = Arc::new(());
    let mut tree = ScopeTree::new();
    let s = tree.new_scope(tree.root())?;
    let kid = tree.new_scope(s)?;
    for (scope, name) in [(s, "a"), (kid, "b")] {
        let v = tree.var(scope, name)?;
        tree.set(v, Arc::clone(&probe))?;
    }
    assert_eq!(Arc::strong_count(&probe), 3);
    tree.delete_scope(s)?;
    assert_eq!(Arc::strong_count(&probe), 1);

    let v = tree.var(tree.root(), "c")?;
    tree.set(v, Arc::clone(&probe))?;
    tree.erase_vars(tree.root(), ["c"])?;
    assert_eq!(Arc::strong_count(&probe), 1);
    drop(tree);
    Ok(())
}

#[test]
fn values_are_dropped_with_the_tree() -> scopetree::Result<()> {
    use std::sync::Arc;
    let probe = Arc::new(());
    let mut tree = ScopeTree::new();
    let v = tree.var(tree.root(), "a")?;
    tree.set(v, Arc::clone(&probe))?;
    drop(tree);
    assert_eq!(Arc::strong_count(&probe), 1);
    Ok(())
}

#[test]
fn disjoint_mutable_access() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let w = tree.var(root, "w")?;
    let g = tree.var(root, "w@GRAD")?;
    let m = tree.var(root, "w@MOMENT")?;
    tree.set(w, vec![1.0_f32; 3])?;
    tree.set(g, vec![1.0_f32; 3])?;
    tree.set(m, vec![0.0_f32; 3])?;
    {
        let [w, g, m] = tree.get_disjoint_mut::<Vec<f32>, 3>([w, g, m])?;
        for i in 0..3 {
            m[i] = 0.9 * m[i] + g[i];
            w[i] -= 0.5 * m[i];
        }
    }
    assert_eq!(tree.get::<Vec<f32>>(w)?, &[0.5; 3]);

    let err = tree.get_disjoint_mut::<Vec<f32>, 2>([w, w]).unwrap_err();
    assert!(matches!(err, Error::AliasedVar { .. }));
    assert!(err.to_string().contains("`w`"));

    tree.set(m, 0_u8)?;
    assert!(matches!(
        tree.get_disjoint_mut::<Vec<f32>, 2>([w, m]),
        Err(Error::TypeMismatch { .. })
    ));
    tree.remove_var(g)?;
    assert_eq!(
        tree.get_disjoint_mut::<Vec<f32>, 2>([w, g]).unwrap_err(),
        Error::StaleVar { var: g }
    );
    Ok(())
}

#[test]
fn reads_through_a_shared_tree_from_many_threads() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let ids: Vec<_> = (0..64_u32)
        .map(|i| {
            let v = tree.var(root, format!("p{i}"))?;
            tree.set(v, i)?;
            Ok(v)
        })
        .collect::<scopetree::Result<_>>()?;
    let leaf = (0..8).try_fold(root, |s, _| tree.new_scope(s))?;
    std::thread::scope(|sc| {
        for t in 0..4 {
            let (tree, ids) = (&tree, &ids);
            sc.spawn(move || {
                for (i, id) in ids.iter().enumerate().skip(t) {
                    assert_eq!(tree.get::<u32>(*id), Ok(&(i as u32)));
                    let name = format!("p{i}");
                    assert_eq!(tree.find_var(leaf, name.as_str()), Ok(Some(*id)));
                }
            });
        }
    });
    Ok(())
}

#[test]
fn pair_mutable_access_of_two_types() -> scopetree::Result<()> {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let step = tree.var(root, "step")?;
    let hist = tree.var(root, "hist")?;
    tree.set(step, 0_u32)?;
    tree.set(hist, Vec::<u32>::new())?;
    for _ in 0..3 {
        let (s, h) = tree.get_pair_mut::<u32, Vec<u32>>(step, hist)?;
        *s += 1;
        h.push(*s);
    }
    assert_eq!(tree.get::<Vec<u32>>(hist)?, &[1, 2, 3]);
    assert!(matches!(
        tree.get_pair_mut::<u32, u32>(step, step),
        Err(Error::AliasedVar { .. })
    ));
    assert!(matches!(
        tree.get_pair_mut::<u32, u32>(step, hist),
        Err(Error::TypeMismatch { .. })
    ));
    Ok(())
}
