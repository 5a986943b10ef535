//! The manifest of the variables to synchronise: full names, dtypes and
//! shapes in full-name order, its digest, and the agreement between ranks.

use std::any::Any;
use std::fmt;

use super::access::{Access, DTYPES, SUPPORTED, Types};
use super::checksum::digest_of;
use crate::checkpoint::{Dtype, Filter, Separator};
use crate::ranks::error::Error;
use crate::ranks::transport::collective::{Collective, DIGEST_BYTES, Digest};
use crate::sharing::VariableStore;
use crate::{ScopeId, ScopeTree, VarId};

/// One variable of a [`Manifest`]: its full name relative to the
/// synchronised scope (scope names and the variable's name joined by `/`),
/// its dtype and its shape.
///
/// ```
/// use scopetree::ranks::ManifestEntry;
/// use scopetree::checkpoint::Dtype;
/// let e = ManifestEntry { key: "enc/w".into(), dtype: Dtype::F32, shape: vec![3, 4] };
/// assert_eq!(e.to_string(), "enc/w: F32 [3, 4]");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestEntry {
    /// The full name, relative to the synchronised scope.
    pub key: String,
    /// The element type.
    pub dtype: Dtype,
    /// The shape, outermost dimension first (`[len]` for a flat value
    /// without a shape recorded by the sharing layer).
    pub shape: Vec<usize>,
}

impl ManifestEntry {
    /// `F32 [3, 4]`: the dtype and shape, as errors show them. O(rank).
    fn kind(&self) -> String {
        format!("{:?} {:?}", self.dtype, self.shape)
    }
}

impl fmt::Display for ManifestEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", crate::short::path(&self.key), self.kind())
    }
}

/// The variables a rank synchronises under one scope: full names, dtypes
/// and shapes, sorted by full name. Ranks compare manifests (by digest)
/// before any collective that depends on them, because MPI does not check
/// that ranks reduce buffers of one length: a mismatch there hangs or
/// corrupts memory.
///
/// Variables in unnamed scopes (step scopes, scratch) are left out, as a
/// checkpoint leaves them out.
///
/// ```
/// use scopetree::{ScopeTree, checkpoint::Tensor, ranks::{Manifest, SingleProcess}};
/// let mut tree = ScopeTree::new();
/// let enc = tree.new_named_scope(tree.root(), "enc")?;
/// let w = tree.var(enc, "w")?;
/// tree.set(w, Tensor::new(vec![2, 3], vec![0.0_f32; 6])?)?;
/// let b = tree.var(tree.root(), "b")?;
/// tree.set(b, vec![0.0_f64; 3])?;
/// let m = Manifest::of_tree(&tree, tree.root())?;
/// let keys: Vec<&str> = m.entries().iter().map(|e| e.key.as_str()).collect();
/// assert_eq!(keys, ["b", "enc/w"]);
/// m.agree(&SingleProcess)?; // one rank always agrees with itself
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    scope: String,
    entries: Vec<ManifestEntry>,
}

/// A manifest with the handles and accesses of its variables, in its order.
pub(crate) struct Bound {
    pub(crate) manifest: Manifest,
    pub(crate) scope: ScopeId,
    pub(crate) vars: Vec<(VarId, Access)>,
}

impl Manifest {
    /// The manifest of the entries whose keys `keep` keeps, in order, with
    /// their positions in this one. O(entries).
    pub(crate) fn subset(&self, keep: &dyn Fn(&str) -> bool) -> (Manifest, Vec<usize>) {
        let (at, entries): (Vec<usize>, Vec<ManifestEntry>) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| keep(&e.key))
            .map(|(i, e)| (i, e.clone()))
            .unzip();
        let scope = self.scope.clone();
        (Manifest { scope, entries }, at)
    }

    /// The manifest of every variable of `scope` and its named descendants.
    /// O(variables × depth) for the names, plus a sort.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the first variable (in full-name order)
    /// that holds no value or a value other than a `Vec`, `Box<[_]>` or
    /// [`Tensor`](crate::checkpoint::Tensor) of `f32`, `f64` or a fixed-size
    /// integer; [`Error::Checkpoint`] when two variables map to one full
    /// name; [`Error::Tree`] for a stale or foreign scope.
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{Error, Manifest}};
    /// let mut tree = ScopeTree::new();
    /// let n = tree.var(tree.root(), "name")?;
    /// tree.set(n, String::from("not a tensor"))?;
    /// let err = Manifest::of_tree(&tree, tree.root()).unwrap_err();
    /// assert!(matches!(err, Error::Unsupported { ref key, .. } if key == "name"));
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn of_tree(tree: &ScopeTree, scope: ScopeId) -> Result<Self, Error> {
        Ok(bind(tree, scope, None, &|_| None)?.manifest)
    }

    /// The manifest of a whole [`VariableStore`]: as
    /// [`of_tree`](Self::of_tree) from its root, with the shape the store
    /// recorded for a flat value, as [`checkpoint::save_store`](crate::checkpoint::save_store)
    /// saves it. O(as `of_tree`).
    ///
    /// # Errors
    /// As [`of_tree`](Self::of_tree).
    ///
    /// ```
    /// use scopetree::{ranks::Manifest, sharing::{Initializer, VariableStore, VarSpec}};
    /// let mut store = VariableStore::new();
    /// let mut root = store.root_scope();
    /// root.set_initializer(Initializer::with_shape(|s: &[usize]| vec![0.0_f32; s.iter().product()]));
    /// store.get_variable(&root, VarSpec::<Vec<f32>>::new("w").shape([12]))?;
    /// let m = Manifest::of_store(&store)?;
    /// assert_eq!(m.entries()[0].shape, [12]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn of_store(store: &VariableStore) -> Result<Self, Error> {
        Ok(bind_store(store, None)?.manifest)
    }

    /// A manifest of `entries`, sorted here by key, under the scope path
    /// `scope`. O(n log n).
    #[cfg(feature = "candle")]
    pub(crate) fn from_entries(scope: String, mut entries: Vec<ManifestEntry>) -> Self {
        entries.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        Self { scope, entries }
    }

    /// The entries, sorted by full name. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::Manifest};
    /// let tree = ScopeTree::new();
    /// assert!(Manifest::of_tree(&tree, tree.root())?.entries().is_empty());
    /// # Ok::<(), scopetree::ranks::Error>(())
    /// ```
    pub fn entries(&self) -> &[ManifestEntry] {
        &self.entries
    }

    /// The path of the scope the manifest was made from (empty for the
    /// root). O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::Manifest};
    /// let mut tree = ScopeTree::new();
    /// let m = tree.new_named_scope(tree.root(), "model")?;
    /// assert_eq!(Manifest::of_tree(&tree, m)?.scope(), "model");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The manifest as bytes, the form ranks exchange: per entry the key's
    /// length and bytes, a one-byte dtype code, the rank and the dimensions
    /// (integers as little-endian `u64`). The scope's path is not part of
    /// it: ranks may name the scope differently. O(size).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::Manifest};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![0_u8; 2])?;
    /// let m = Manifest::of_tree(&tree, tree.root())?;
    /// let back = Manifest::from_bytes(&m.to_bytes(), "")?;
    /// assert_eq!(back, m);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for e in &self.entries {
            put_u64(&mut out, e.key.len());
            out.extend_from_slice(e.key.as_bytes());
            let code = DTYPES
                .iter()
                .position(|&d| d == e.dtype)
                .unwrap_or(u8::MAX as usize);
            out.push(u8::try_from(code).unwrap_or(u8::MAX));
            put_u64(&mut out, e.shape.len());
            for &d in &e.shape {
                put_u64(&mut out, d);
            }
        }
        out
    }

    /// Reads a manifest written by [`to_bytes`](Self::to_bytes), naming the
    /// scope `scope`. O(size).
    ///
    /// # Errors
    /// [`Error::BadManifest`] (with rank 0) if the bytes are not a manifest.
    ///
    /// ```
    /// use scopetree::ranks::{Error, Manifest};
    /// assert!(matches!(Manifest::from_bytes(&[1, 2, 3], ""), Err(Error::BadManifest { .. })));
    /// ```
    pub fn from_bytes(bytes: &[u8], scope: &str) -> Result<Self, Error> {
        decode(bytes, scope).map_err(|reason| Error::BadManifest { rank: 0, reason })
    }

    /// The digest ranks compare: the xxh3-128 checksum of
    /// [`to_bytes`](Self::to_bytes), little-endian (no seed: the same on
    /// every rank and every build). O(size).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::Manifest};
    /// let mut a = ScopeTree::new();
    /// let w = a.var(a.root(), "w")?;
    /// a.set(w, vec![0.0_f32; 4])?;
    /// let mut b = ScopeTree::new();
    /// let w = b.var(b.root(), "w")?;
    /// b.set(w, vec![0.0_f32; 5])?;
    /// let (ma, mb) = (Manifest::of_tree(&a, a.root())?, Manifest::of_tree(&b, b.root())?);
    /// assert_ne!(ma.digest(), mb.digest());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn digest(&self) -> Digest {
        digest_of(&self.to_bytes())
    }

    /// Checks that every rank holds the same manifest: the ranks all-gather
    /// its digest; when the digests differ, each rank broadcasts its
    /// manifest in turn and every rank builds the same
    /// [`Error::Disagree`] from them. Every rank must call it. O(size of
    /// the manifest + world size) when the ranks agree; O(world size × size
    /// of the manifests) when they do not.
    ///
    /// # Errors
    /// [`Error::Disagree`], the same on every rank, naming the first full
    /// name on which ranks differ and what each group of ranks holds there;
    /// [`Error::BadManifest`] if a rank sent bytes that are no manifest.
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{Manifest, SingleProcess}};
    /// let tree = ScopeTree::new();
    /// Manifest::of_tree(&tree, tree.root())?.agree(&SingleProcess)?;
    /// # Ok::<(), scopetree::ranks::Error>(())
    /// ```
    pub fn agree<C: Collective + ?Sized>(&self, comm: &C) -> Result<(), Error> {
        let bytes = self.to_bytes();
        let mine = digest_of(&bytes);
        let mut all = vec![[0_u8; DIGEST_BYTES]; comm.size()];
        comm.all_gather_digest(&mine, &mut all)?;
        if all.iter().all(|d| *d == mine) {
            return Ok(());
        }
        let mut manifests = Vec::with_capacity(all.len());
        for r in 0..all.len() {
            let mut len = [0_u8; 8];
            if r == comm.rank() {
                len = (bytes.len() as u64).to_le_bytes();
            }
            comm.broadcast_bytes(r, &mut len)?;
            let len = usize::try_from(u64::from_le_bytes(len)).map_err(|_| Error::BadManifest {
                rank: r,
                reason: "its length does not fit this machine".into(),
            })?;
            let mut buf = if r == comm.rank() {
                bytes.clone()
            } else {
                vec![0_u8; len]
            };
            comm.broadcast_bytes(r, &mut buf)?;
            manifests.push(
                decode(&buf, &self.scope)
                    .map_err(|reason| Error::BadManifest { rank: r, reason })?,
            );
        }
        match Self::compare(&manifests) {
            // Unreachable while every rank runs one build: equal manifests
            // have equal bytes, hence equal digests.
            Ok(()) => Err(Error::Disagree {
                scope: self.scope.clone(),
                key: "(no single variable: the manifests' bytes differ)".to_owned(),
                sides: vec![(
                    "manifests whose digests differ".into(),
                    (0..all.len()).collect(),
                )],
            }),
            Err(e) => Err(e),
        }
    }

    /// Compares the manifests of the ranks (`manifests[r]` is rank `r`'s),
    /// as [`agree`](Self::agree) does once it holds them all. Local: no
    /// collective. O(ranks × entries).
    ///
    /// # Errors
    /// [`Error::Disagree`] naming the first full name (in full-name order)
    /// on which the ranks differ, and each group of ranks with what it holds
    /// there (a dtype and shape, or `absent`); the scope is the first
    /// manifest's.
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{Error, Manifest}};
    /// let mut a = ScopeTree::new();
    /// let w = a.var(a.root(), "w")?;
    /// a.set(w, vec![0.0_f32; 4])?;
    /// let mut b = ScopeTree::new();
    /// let v = b.var(b.root(), "v")?;
    /// b.set(v, vec![0.0_f32; 4])?;
    /// let m = [Manifest::of_tree(&a, a.root())?, Manifest::of_tree(&b, b.root())?];
    /// let err = Manifest::compare(&m).unwrap_err();
    /// assert!(err.to_string().contains("first difference at `v`: absent on rank 0; F32 [4] on rank 1"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn compare(manifests: &[Manifest]) -> Result<(), Error> {
        let mut at = vec![0_usize; manifests.len()];
        loop {
            // The smallest key not yet passed, over all ranks.
            let Some(key) = manifests
                .iter()
                .zip(&at)
                .filter_map(|(m, &i)| m.entries.get(i).map(|e| e.key.as_str()))
                .min()
            else {
                return Ok(());
            };
            let here = |r: usize| manifests[r].entries.get(at[r]).filter(|e| e.key == key);
            let first = here(0);
            let same = (1..manifests.len()).all(|r| {
                let e = here(r);
                e.map(|e| (e.dtype, &e.shape)) == first.map(|e| (e.dtype, &e.shape))
            });
            if !same {
                let mut sides: Vec<(String, Vec<usize>)> = Vec::new();
                for r in 0..manifests.len() {
                    let what = here(r).map_or_else(|| "absent".to_owned(), ManifestEntry::kind);
                    match sides.iter_mut().find(|(w, _)| *w == what) {
                        Some((_, ranks)) => ranks.push(r),
                        None => sides.push((what, vec![r])),
                    }
                }
                return Err(Error::Disagree {
                    scope: manifests[0].scope.clone(),
                    key: key.to_owned(),
                    sides,
                });
            }
            let key = key.to_owned();
            for (r, i) in at.iter_mut().enumerate() {
                if manifests[r].entries.get(*i).is_some_and(|e| e.key == key) {
                    *i += 1;
                }
            }
        }
    }
}

fn put_u64(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u64).to_le_bytes());
}

fn decode(mut bytes: &[u8], scope: &str) -> Result<Manifest, String> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if bytes.len() < n {
            return Err(format!("cut short: {n} bytes wanted, {} left", bytes.len()));
        }
        let (head, tail) = bytes.split_at(n);
        *bytes = tail;
        Ok(head)
    }
    fn int(bytes: &mut &[u8]) -> Result<usize, String> {
        let mut a = [0_u8; 8];
        a.copy_from_slice(take(bytes, 8)?);
        usize::try_from(u64::from_le_bytes(a)).map_err(|_| "a number too large".to_owned())
    }
    let mut entries: Vec<ManifestEntry> = Vec::new();
    while !bytes.is_empty() {
        let n = int(&mut bytes)?;
        let key = std::str::from_utf8(take(&mut bytes, n)?)
            .map_err(|_| "a key that is not UTF-8".to_owned())?
            .to_owned();
        let code = take(&mut bytes, 1)?[0];
        let dtype = *DTYPES
            .get(usize::from(code))
            .ok_or_else(|| format!("unknown dtype code {code}"))?;
        let rank = int(&mut bytes)?;
        if rank > bytes.len() / 8 {
            return Err(format!("a rank of {rank} with {} bytes left", bytes.len()));
        }
        let shape = (0..rank)
            .map(|_| int(&mut bytes))
            .collect::<Result<_, _>>()?;
        if entries.last().is_some_and(|l| l.key >= key) {
            return Err("keys out of order".to_owned());
        }
        entries.push(ManifestEntry { key, dtype, shape });
    }
    Ok(Manifest {
        scope: scope.to_owned(),
        entries,
    })
}

/// The manifest of `scope` with its handles, of the keys `filter` keeps;
/// `shape_of` gives a flat value's recorded shape, if any. O(variables × depth + sort).
pub(crate) fn bind(
    tree: &ScopeTree,
    scope: ScopeId,
    filter: Option<&Filter>,
    shape_of: &dyn Fn(VarId) -> Option<Vec<usize>>,
) -> Result<Bound, Error> {
    let walked = crate::checkpoint::walk(tree, scope, Separator::Slash, filter)?;
    let types = Types::new();
    let scope_path = tree.path(scope)?;
    let mut entries = Vec::with_capacity(walked.vars.len());
    let mut vars = Vec::with_capacity(walked.vars.len());
    for (key, var) in walked.vars {
        let value: Option<&dyn Any> = tree.value_any(var);
        let found = value.and_then(|v| Some((types.get(Any::type_id(v))?, v)));
        let Some((access, v)) = found else {
            return Err(Error::Unsupported {
                key,
                scope: scope_path,
                holds: tree.type_name(var)?,
                wanted: SUPPORTED,
            });
        };
        let own = access.shape(v).unwrap_or_default();
        let shape = if access.flat {
            shape_of(var)
                .filter(|s| s.iter().product::<usize>() == own.iter().product::<usize>())
                .unwrap_or(own)
        } else {
            own
        };
        entries.push(ManifestEntry {
            key,
            dtype: access.dtype,
            shape,
        });
        vars.push((var, access));
    }
    Ok(Bound {
        manifest: Manifest {
            scope: scope_path,
            entries,
        },
        scope,
        vars,
    })
}

/// [`bind`] for a whole store, with the shapes it recorded.
pub(crate) fn bind_store(store: &VariableStore, filter: Option<&Filter>) -> Result<Bound, Error> {
    let tree = store.tree();
    bind(tree, tree.root(), filter, &|v| {
        store
            .initial_shape(v)
            .ok()
            .flatten()
            .and_then(|s| s.to_vec())
    })
}
