//! [`Partition`]: a plan's variables cut into one contiguous slice per
//! rank, of about equal bytes, for optimizer state partitioned across ranks
//! (ZeRO stage 1).

use std::ops::Range;

use crate::ranks::error::Error;
use crate::ranks::vars::manifest::Manifest;

/// One piece of a variable that a rank owns: elements `start..start + len`
/// of the variable at index `var` of the manifest.
///
/// ```
/// let p = scopetree::ranks::Piece { var: 0, start: 2, len: 3 };
/// assert_eq!(p.elems(), 2..5);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The variable's index in the manifest (full-name order).
    pub var: usize,
    /// The first element owned, within the variable.
    pub start: usize,
    /// The number of elements owned (at least 1).
    pub len: usize,
}

impl Piece {
    /// The element range owned. O(1).
    ///
    /// ```
    /// assert_eq!(scopetree::ranks::Piece { var: 1, start: 0, len: 4 }.elems(), 0..4);
    /// ```
    pub fn elems(&self) -> Range<usize> {
        self.start..self.start + self.len
    }
}

/// A manifest's variables cut into one contiguous slice per rank, of about
/// equal bytes: the rule of ZeRO stage 1's optimizer-state partition.
///
/// **The rule.** Lay the variables end to end in manifest order (full-name
/// order, the same on every rank), `T` bytes in all. Rank `r` of `N` owns the
/// bytes from `cut(r)` to `cut(r + 1)`, where `cut(r)` is `⌊r·T/N⌋` moved
/// back to the start of the element it falls in (`cut(0) = 0`,
/// `cut(N) = T`). So the slices are contiguous, cover every element exactly
/// once, and each holds `T/N` bytes give or take one element (less than
/// 9 bytes); a variable may be split between ranks, at an element boundary.
/// A rank's slice is a list of [`Piece`]s, in manifest order; a rank may own
/// nothing when there are fewer elements than ranks. The rule depends only on
/// the manifest and `N`, so every rank computes the same partition.
///
/// ```
/// use scopetree::{ScopeTree, ranks::{Manifest, Partition, Piece}};
/// let mut tree = ScopeTree::new();
/// let a = tree.var(tree.root(), "a")?;
/// tree.set(a, vec![0.0_f32; 6])?;
/// let b = tree.var(tree.root(), "b")?;
/// tree.set(b, vec![0.0_f32; 2])?;
/// let m = Manifest::of_tree(&tree, tree.root())?;
/// let p = Partition::new(&m, 2)?; // 32 bytes: 16 per rank
/// assert_eq!(p.pieces(0), [Piece { var: 0, start: 0, len: 4 }]);
/// assert_eq!(p.pieces(1), [Piece { var: 0, start: 4, len: 2 }, Piece { var: 1, start: 0, len: 2 }]);
/// assert_eq!((p.bytes(0), p.bytes(1)), (16, 16));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    pieces: Vec<Piece>,
    /// Per rank: its pieces in `pieces`, and its bytes.
    ranks: Vec<(Range<usize>, usize)>,
}

impl Partition {
    /// Cuts `manifest`'s variables into `ranks` slices by the rule above.
    /// O(variables + ranks); allocates the pieces (at most variables +
    /// ranks).
    ///
    /// # Errors
    /// [`Error::BadOption`] when `ranks` is 0.
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{Error, Manifest, Partition}};
    /// let tree = ScopeTree::new();
    /// let m = Manifest::of_tree(&tree, tree.root())?;
    /// assert!(matches!(Partition::new(&m, 0), Err(Error::BadOption { .. })));
    /// assert_eq!(Partition::new(&m, 3)?.bytes(2), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(manifest: &Manifest, ranks: usize) -> Result<Self, Error> {
        if ranks == 0 {
            return Err(Error::BadOption {
                reason: format!(
                    "a partition of scope `{}` into 0 ranks; pass the world's size (at least 1)",
                    crate::short::path(manifest.scope())
                ),
            });
        }
        // (element size, elements) per variable.
        let vars: Vec<(usize, usize)> = manifest
            .entries()
            .iter()
            .map(|e| (e.dtype.bitsize() / 8, e.shape.iter().product::<usize>()))
            .collect();
        let total: usize = vars.iter().map(|&(s, n)| s * n).sum();
        // The cuts, as (variable, element) positions: a walk over the
        // variables, each cut at or after the last.
        let mut cuts = Vec::with_capacity(ranks + 1);
        let (mut v, mut at) = (0, 0); // variable, its first byte
        for r in 0..=ranks {
            let want = usize::try_from(total as u128 * r as u128 / ranks as u128)
                .unwrap_or(total)
                .min(total);
            while v < vars.len() && at + vars[v].0 * vars[v].1 <= want {
                at += vars[v].0 * vars[v].1;
                v += 1;
            }
            if r == ranks || v == vars.len() {
                cuts.push((vars.len(), 0));
            } else {
                cuts.push((v, (want - at) / vars[v].0));
            }
        }
        let mut pieces = Vec::with_capacity(vars.len() + ranks);
        let mut out = Vec::with_capacity(ranks);
        for r in 0..ranks {
            let first = pieces.len();
            let mut bytes = 0;
            let ((v0, e0), (v1, e1)) = (cuts[r], cuts[r + 1]);
            for (var, &(size, n)) in vars.iter().enumerate().take(v1 + 1).skip(v0) {
                let start = if var == v0 { e0 } else { 0 };
                let end = if var == v1 { e1 } else { n };
                if end > start {
                    pieces.push(Piece {
                        var,
                        start,
                        len: end - start,
                    });
                    bytes += size * (end - start);
                }
            }
            out.push((first..pieces.len(), bytes));
        }
        Ok(Self { pieces, ranks: out })
    }

    /// The number of ranks. O(1).
    ///
    /// ```
    /// # use scopetree::{ScopeTree, ranks::{Manifest, Partition}};
    /// # let tree = ScopeTree::new();
    /// # let m = Manifest::of_tree(&tree, tree.root())?;
    /// assert_eq!(Partition::new(&m, 4)?.ranks(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ranks(&self) -> usize {
        self.ranks.len()
    }

    /// The pieces rank `rank` owns, in manifest order (empty for a rank
    /// outside the partition). O(1).
    ///
    /// ```
    /// # use scopetree::{ScopeTree, ranks::{Manifest, Partition}};
    /// # let tree = ScopeTree::new();
    /// # let m = Manifest::of_tree(&tree, tree.root())?;
    /// assert!(Partition::new(&m, 2)?.pieces(1).is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pieces(&self, rank: usize) -> &[Piece] {
        self.ranks
            .get(rank)
            .map_or(&[][..], |(r, _)| &self.pieces[r.clone()])
    }

    /// The bytes rank `rank` owns (0 outside the partition). O(1).
    ///
    /// ```
    /// # use scopetree::{ScopeTree, ranks::{Manifest, Partition}};
    /// # let tree = ScopeTree::new();
    /// # let m = Manifest::of_tree(&tree, tree.root())?;
    /// assert_eq!(Partition::new(&m, 2)?.bytes(0), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bytes(&self, rank: usize) -> usize {
        self.ranks.get(rank).map_or(0, |r| r.1)
    }

    /// The piece of variable `var` (a manifest index) that `rank` owns, if
    /// any. O(pieces of the rank).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{Manifest, Partition, Piece}};
    /// let mut tree = ScopeTree::new();
    /// let a = tree.var(tree.root(), "a")?;
    /// tree.set(a, vec![0.0_f64; 4])?;
    /// let p = Partition::new(&Manifest::of_tree(&tree, tree.root())?, 2)?;
    /// assert_eq!(p.piece_of(1, 0), Some(Piece { var: 0, start: 2, len: 2 }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn piece_of(&self, rank: usize, var: usize) -> Option<Piece> {
        self.pieces(rank).iter().find(|p| p.var == var).copied()
    }
}
