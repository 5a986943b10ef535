//! Names at the edges: empty, containing `/`, very long (1 MiB), non-ASCII,
//! look-alikes, and the same name in 10,000 sibling scopes.

use scopetree::{Error, InvalidNameReason, ScopeTree, validate_name};

const MIB: usize = 1 << 20;

#[test]
fn empty_and_separator_names_are_invalid_and_change_nothing() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    assert_eq!(
        tree.var(root, ""),
        Err(Error::InvalidName {
            name: String::new(),
            reason: InvalidNameReason::Empty
        })
    );
    for bad in ["/", "a/", "/a", "a/b/c", "//", "ü/名"] {
        assert_eq!(
            tree.var(root, bad),
            Err(Error::InvalidName {
                name: bad.to_owned(),
                reason: InvalidNameReason::ContainsSeparator
            }),
            "{bad:?}"
        );
        assert!(tree.symbol(bad).is_none(), "an invalid name was interned");
    }
    assert_eq!(tree.var_count(), 0);
    // Lookalikes of the separator are ordinary characters.
    for ok in ["a\u{2215}b", "a\u{ff0f}b", "a\\b", "a.b", "a:b"] {
        let v = tree.create_var(root, ok).unwrap();
        assert_eq!(tree.var_name(v).unwrap(), ok);
    }
}

#[test]
fn a_one_mebibyte_name_works_everywhere() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let long: String = "w".repeat(MIB);
    let other: String = format!("{}x", "w".repeat(MIB - 1));

    let v = tree.create_var(root, &long).unwrap();
    tree.set(v, 1_u32).unwrap();
    assert_eq!(tree.var_name(v).unwrap().len(), MIB);
    let step = tree.new_scope(root).unwrap();
    assert_eq!(tree.find_var(step, &long).unwrap(), Some(v));
    // A name that differs only in its last byte is another name.
    assert_eq!(tree.find_var(step, &other).unwrap(), None);
    let v2 = tree.var(root, &other).unwrap();
    assert_ne!(v, v2);

    // Named scope, path, kid lookup.
    let s = tree.new_named_scope(root, &long).unwrap();
    assert_eq!(tree.kid(root, &long).unwrap(), Some(s));
    let inner = tree.var(s, &long).unwrap();
    assert_eq!(tree.var_path(inner).unwrap().len(), 2 * MIB + 1);

    // Rename to it and back, unique names from it.
    tree.rename(root, &long, "short").unwrap();
    assert_eq!(tree.var_name(v).unwrap(), "short");
    tree.rename(root, "short", &long).unwrap();
    let u = tree.unique_var(root, &long).unwrap();
    assert!(tree.var_name(u).unwrap().starts_with(&long));
    assert!(tree.var_name(u).unwrap().ends_with("_0"));

    // Errors carry the name cut to 64 characters and its length (issue 9:
    // messages stay short whatever the input); the dump holds it whole.
    let e = tree.create_var(root, &long).unwrap_err();
    let cut = format!("{}… ({MIB} bytes)", "w".repeat(64));
    assert!(
        matches!(&e, Error::NameTaken { name, .. } if *name == cut),
        "{e:?}"
    );
    assert!(e.to_string().len() < 1024);
    let dump = tree.dump(root).unwrap().to_string();
    assert!(dump.len() > 4 * MIB);

    assert_eq!(tree.erase_vars(root, [&long, &other]).unwrap(), 2);
    assert!(!tree.contains_var(v));
}

/// `Error::InvalidName` documents its name as "cut to 64 characters": a huge
/// invalid name must not be copied whole into the error, and the cut must
/// fall on a character boundary.
#[test]
fn invalid_name_in_error_is_cut_to_64_characters() {
    let ascii = format!("{}/", "a".repeat(MIB));
    let e = validate_name(&ascii).unwrap_err();
    let Error::InvalidName { name, reason } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(*reason, InvalidNameReason::ContainsSeparator);
    assert_eq!(
        *name,
        format!("{}… ({} bytes)", "a".repeat(64), ascii.len())
    );
    assert!(e.to_string().len() < 400, "{} bytes", e.to_string().len());

    // Multi-byte characters: 3 bytes each, so byte 64 is mid-character.
    let wide = format!("{}/{}", "名".repeat(MIB / 3), "名".repeat(10));
    let mut tree = ScopeTree::new();
    let e = tree.var(tree.root(), &wide).unwrap_err();
    let Error::InvalidName { name, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(
        *name,
        format!("{}… ({} bytes)", "名".repeat(64), wide.len())
    );

    // Short names are kept whole.
    assert!(matches!(validate_name("a/b"), Err(Error::InvalidName { name, .. }) if name == "a/b"));
}

#[test]
fn non_ascii_names_are_exact_byte_strings() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let names = [
        "ü",
        "名前",
        "🦀",
        "שלום",
        "e\u{301}", // e + combining acute
        "\u{e9}",   // precomposed é: a different name (no normalisation)
        "zero\u{200b}width",
        "tab\there",
        "new\nline",
        "nul\0byte",
        " ",
        "#1v1", // looks like an unnamed scope's path component
    ];
    let vars: Vec<_> = names
        .iter()
        .map(|n| tree.create_var(root, *n).unwrap())
        .collect();
    assert_eq!(tree.var_count(), names.len());
    let step = tree.new_named_scope(root, "ステップ").unwrap();
    for (n, v) in names.iter().zip(&vars) {
        assert_eq!(tree.find_var(step, *n).unwrap(), Some(*v), "{n:?}");
        assert_eq!(tree.var_name(*v).unwrap(), *n);
        let sym = tree.symbol(n).unwrap();
        assert_eq!(tree.resolve(sym).unwrap(), *n);
    }
    assert_eq!(tree.path(step).unwrap(), "ステップ");
    let w = tree.var(step, "重み").unwrap();
    assert_eq!(tree.var_path(w).unwrap(), "ステップ/重み");
    let e = tree.get_var(step, "バイアス").unwrap_err();
    assert!(e.to_string().contains("`バイアス`") && e.to_string().contains("`ステップ`"));
    // Unique names built on a non-ASCII prefix.
    let u = tree.unique_var(step, "名前").unwrap();
    assert_eq!(tree.var_name(u).unwrap(), "名前_0");
    // The DOT output escapes quotes, backslashes and newlines in names.
    tree.create_var(step, "say \"hi\"\\").unwrap();
    let dot = tree.to_dot(root).unwrap().to_string();
    assert!(dot.contains("say \\\"hi\\\"\\\\"), "{dot}");
    assert!(dot.contains("new\\nline"));
}

#[test]
fn unique_names_skip_taken_names_and_never_repeat() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    // Names that look generated are plain names.
    tree.create_var(root, "tmp_0").unwrap();
    tree.create_var(root, "tmp_2").unwrap();
    let a = tree.unique_var(root, "tmp").unwrap();
    let b = tree.unique_var(root, "tmp").unwrap();
    assert_eq!(tree.var_name(a).unwrap(), "tmp_1");
    assert_eq!(tree.var_name(b).unwrap(), "tmp_3");
    // Erasing a generated name does not make the generator hand it out again.
    tree.remove_var(a).unwrap();
    let c = tree.unique_var(root, "tmp").unwrap();
    assert_eq!(tree.var_name(c).unwrap(), "tmp_4");
    // The counter is per tree, shared by every prefix and by rename_unique.
    let w = tree.var(root, "w").unwrap();
    assert_eq!(tree.rename_unique(root, "w").unwrap(), "w_5");
    assert_eq!(tree.var_name(w).unwrap(), "w_5");
    // Renaming onto the next generated name makes the generator skip it.
    tree.rename(root, "w_5", "w_6").unwrap();
    let x = tree.create_var(root, "x").unwrap();
    assert_eq!(tree.rename_unique(root, "w_6").unwrap(), "w_6_6");
    assert_eq!(tree.rename_unique(root, "x").unwrap(), "x_7");
    assert_eq!(tree.var_name(x).unwrap(), "x_7");
    // A scope that holds the next name only skips it there.
    let kid = tree.new_scope(root).unwrap();
    tree.create_var(kid, "t_8").unwrap();
    let y = tree.unique_var(kid, "t").unwrap();
    assert_eq!(tree.var_name(y).unwrap(), "t_9");
}

/// The same variable name in 10,000 sibling scopes: each sibling finds its
/// own, deletions in the middle of the sibling list leave the others intact,
/// and erasing the local one uncovers the parent's.
#[test]
fn same_name_in_ten_thousand_siblings() {
    const N: usize = 10_000;
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let shared = tree.var(root, "w").unwrap();
    tree.set(shared, usize::MAX).unwrap();
    let mut kids = Vec::with_capacity(N);
    let mut vars = Vec::with_capacity(N);
    for i in 0..N {
        let s = tree.new_scope(root).unwrap();
        let v = tree.create_var(s, "w").unwrap();
        tree.set(v, i).unwrap();
        kids.push(s);
        vars.push(v);
    }
    assert_eq!(tree.kid_count(root).unwrap(), N);
    assert_eq!(tree.var_count(), N + 1);
    for i in 0..N {
        assert_eq!(tree.find_var(kids[i], "w").unwrap(), Some(vars[i]));
        assert_eq!(*tree.get::<usize>(vars[i]).unwrap(), i);
    }
    // Delete every odd sibling, then erase "w" from every third even one.
    for i in (1..N).step_by(2) {
        tree.delete_kid(root, kids[i]).unwrap();
    }
    for i in (0..N).step_by(6) {
        assert_eq!(tree.erase_vars(kids[i], ["w"]).unwrap(), 1);
    }
    let mut left = Vec::new();
    for i in 0..N {
        let found = tree.find_var(kids[i], "w");
        if i % 2 == 1 {
            assert!(matches!(found, Err(Error::StaleScope { .. })));
            assert!(!tree.contains_var(vars[i]));
        } else if i % 6 == 0 {
            assert_eq!(found.unwrap(), Some(shared), "the parent's w shows through");
        } else {
            assert_eq!(found.unwrap(), Some(vars[i]));
            left.push(kids[i]);
        }
    }
    let even: Vec<_> = kids.iter().step_by(2).copied().collect();
    assert_eq!(tree.kids(root).unwrap().collect::<Vec<_>>(), even);
    assert_eq!(tree.var_count(), 1 + left.len());
    // New siblings after the churn go to the end, with fresh handles.
    let late = tree.new_scope(root).unwrap();
    assert!(!kids.contains(&late));
    assert_eq!(tree.kids(root).unwrap().last(), Some(late));
    tree.drop_kids(root).unwrap();
    assert_eq!((tree.scope_count(), tree.var_count()), (1, 1));
    assert_eq!(*tree.get::<usize>(shared).unwrap(), usize::MAX);
}

/// The same scope name under 10,000 different parents is fine; twice under
/// one parent is not.
#[test]
fn same_scope_name_under_many_parents() {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let mut layers = Vec::new();
    for _ in 0..10_000 {
        let p = tree.new_scope(root).unwrap();
        let l = tree.new_named_scope(p, "layer").unwrap();
        assert!(matches!(
            tree.new_named_scope(p, "layer"),
            Err(Error::ScopeNameTaken { .. })
        ));
        layers.push((p, l));
    }
    for (p, l) in &layers {
        assert_eq!(tree.kid(*p, "layer").unwrap(), Some(*l));
        assert!(tree.path(*l).unwrap().ends_with("/layer"));
    }
    assert_eq!(tree.scope_count(), 1 + 2 * 10_000);
}
