//! Names: validation, the per-tree interner, and [`Symbol`].
//!
//! Every variable and scope name is interned once into its tree's
//! [`Interner`]. A lookup by string hashes the string once and then walks the
//! scope chain comparing 32-bit symbols; a lookup by [`Symbol`] skips even that
//! hash.

use std::sync::Arc;

use crate::error::{Error, InvalidNameReason};
use crate::handle::TreeTag;

/// The separator of full names (`encoder/layer_1/w`). It is reserved for the
/// sharing layer, so a plain scope or variable name cannot contain it.
pub const SEPARATOR: char = '/';

/// An interned name of one [`ScopeTree`](crate::ScopeTree).
///
/// Get one with [`ScopeTree::intern`](crate::ScopeTree::intern) and pass it
/// wherever a name is accepted to skip hashing the string. A symbol carries the
/// tag of its tree: using it with another tree returns
/// [`Error::ForeignSymbol`](crate::Error::ForeignSymbol).
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let w = tree.intern("w")?;
/// let id = tree.var(tree.root(), w)?;
/// assert_eq!(tree.find_var(tree.root(), w)?, Some(id));
/// assert_eq!(tree.resolve(w)?, "w");
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Symbol {
    pub(crate) idx: u32,
    pub(crate) tree: TreeTag,
}

impl Symbol {
    /// The symbol's index in its tree's interner (dense, from 0).
    ///
    /// ```
    /// use scopetree::ScopeTree;
    /// let mut tree = ScopeTree::new();
    /// let a = tree.intern("a")?;
    /// let b = tree.intern("b")?;
    /// assert_ne!(a.index(), b.index());
    /// # Ok::<(), scopetree::Error>(())
    /// ```
    pub fn index(self) -> u32 {
        self.idx
    }
}

/// A borrowed name as the tree receives it: text, or an interned symbol.
///
/// You never build this by hand: every method that takes a name is generic
/// over [`Name`], which `&str`, `String`, `&String`, [`Symbol`] and `&Symbol`
/// implement.
///
/// ```
/// use scopetree::{Name, NameRef};
/// assert!(matches!("w".as_name_ref(), NameRef::Str("w")));
/// ```
#[derive(Copy, Clone, Debug)]
pub enum NameRef<'a> {
    /// A name given as text.
    Str(&'a str),
    /// A name interned before.
    Sym(Symbol),
}

mod sealed {
    pub trait Sealed {}
}

/// Anything that names a variable or scope: `&str`, `String`, `&String`,
/// [`Symbol`], `&Symbol` or a [`NameRef`].
///
/// This trait is sealed: the tree only accepts these types.
///
/// ```
/// use scopetree::ScopeTree;
/// let mut tree = ScopeTree::new();
/// let root = tree.root();
/// let a = tree.var(root, "a")?;
/// assert_eq!(tree.var(root, String::from("a"))?, a);
/// let sym = tree.intern("a")?;
/// assert_eq!(tree.var(root, sym)?, a);
/// # Ok::<(), scopetree::Error>(())
/// ```
pub trait Name: sealed::Sealed {
    /// The name as text or symbol.
    fn as_name_ref(&self) -> NameRef<'_>;
}

impl sealed::Sealed for &str {}
impl Name for &str {
    fn as_name_ref(&self) -> NameRef<'_> {
        NameRef::Str(self)
    }
}
impl sealed::Sealed for String {}
impl Name for String {
    fn as_name_ref(&self) -> NameRef<'_> {
        NameRef::Str(self)
    }
}
impl sealed::Sealed for &String {}
impl Name for &String {
    fn as_name_ref(&self) -> NameRef<'_> {
        NameRef::Str(self)
    }
}
impl sealed::Sealed for NameRef<'_> {}
impl Name for NameRef<'_> {
    fn as_name_ref(&self) -> NameRef<'_> {
        *self
    }
}
impl sealed::Sealed for Symbol {}
impl Name for Symbol {
    fn as_name_ref(&self) -> NameRef<'_> {
        NameRef::Sym(*self)
    }
}
impl sealed::Sealed for &Symbol {}
impl Name for &Symbol {
    fn as_name_ref(&self) -> NameRef<'_> {
        NameRef::Sym(**self)
    }
}

/// Checks that `name` can name a scope or variable: non-empty and free of the
/// separator `/`. Any other text, of any length and script, is accepted.
///
/// # Errors
/// [`Error::InvalidName`] saying which rule the name breaks.
///
/// ```
/// use scopetree::validate_name;
/// assert!(validate_name("layer_1").is_ok());
/// assert!(validate_name("").is_err());
/// assert!(validate_name("enc/w").is_err());
/// ```
pub fn validate_name(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::InvalidName {
            name: String::new(),
            reason: InvalidNameReason::Empty,
        });
    }
    if name.contains(SEPARATOR) {
        return Err(Error::InvalidName {
            // As documented on the variant: cut, so that a huge name is not
            // copied whole into the error.
            name: crate::short::name(name),
            reason: InvalidNameReason::ContainsSeparator,
        });
    }
    Ok(())
}

/// A `HashMap` with `rustc-hash`'s hasher. Names and keys come from model
/// code, not from an adversary, so HashDoS resistance is traded for speed;
/// unlike a multiply-only hash, `rustc-hash` 2 mixes its output, so keys that
/// differ only in their high bits (a parent index above a shared name) still
/// spread over the table.
pub(crate) type FxHashMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// The per-tree string interner. Names are never forgotten: the table grows
/// with the number of distinct names the tree has ever seen.
///
/// It also holds each symbol's *variable epoch*, a counter the tree bumps
/// whenever a variable of that name is created, freed or renamed (from or
/// to it); a [`Resolver`](crate::Resolver) entry for that name is valid while
/// the counter is unchanged. The counters live here so that they grow in
/// step with the symbols: every symbol has one from the moment it exists.
#[derive(Default)]
pub(crate) struct Interner {
    map: FxHashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
    epochs: Vec<u64>,
}

impl Interner {
    /// The symbol index of `name`, if it was interned. O(len(name)).
    #[inline]
    pub(crate) fn get(&self, name: &str) -> Option<u32> {
        self.map.get(name).copied()
    }

    /// Interns `name` (which must be valid) and returns its index.
    /// O(len(name)); allocates only the first time a name is seen.
    pub(crate) fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.map.get(name) {
            return i;
        }
        let i = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        let text: Arc<str> = Arc::from(name);
        self.names.push(Arc::clone(&text));
        self.epochs.push(0);
        self.map.insert(text, i);
        i
    }

    /// The text of an interned index ("" if out of range, which no symbol of
    /// this tree can be).
    #[inline]
    pub(crate) fn text(&self, idx: u32) -> &str {
        self.names.get(idx as usize).map_or("", |s| s)
    }

    /// The variable epoch of symbol `idx` (0 if out of range, which no
    /// symbol of this tree can be). O(1).
    #[inline]
    pub(crate) fn epoch(&self, idx: u32) -> u64 {
        self.epochs.get(idx as usize).copied().unwrap_or(0)
    }

    /// Records that the set of variables named `idx` changed. O(1), never
    /// allocates. (A `u64` bumped once a nanosecond wraps after 584 years.)
    #[inline]
    pub(crate) fn bump(&mut self, idx: u32) {
        if let Some(e) = self.epochs.get_mut(idx as usize) {
            *e = e.wrapping_add(1);
        }
    }

    /// How many distinct names were interned.
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// Bytes held by the interner's tables and strings (approximate).
    pub(crate) fn heap_bytes(&self) -> usize {
        let strings: usize = self.names.iter().map(|s| s.len() + 16).sum();
        strings
            + self.names.capacity() * std::mem::size_of::<Arc<str>>()
            + self.epochs.capacity() * std::mem::size_of::<u64>()
            + self.map.capacity() * (std::mem::size_of::<(Arc<str>, u32)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interner_dedups_and_resolves() {
        let mut i = Interner::default();
        let a = i.intern("a");
        let b = i.intern("b");
        assert_ne!(a, b);
        assert_eq!(i.intern("a"), a);
        assert_eq!(i.text(b), "b");
        assert_eq!(i.get("c"), None);
        assert_eq!(i.len(), 2);
    }
}
