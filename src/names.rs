//! Names as callers pass them: validation, and the [`Name`] trait that lets
//! every method take `&str`, `String` or a [`Symbol`].
//!
//! Every variable and scope name is interned once into its tree's interner
//! (in the arena). A lookup by string hashes the string once and then walks
//! the scope chain comparing 32-bit symbols; a lookup by [`Symbol`] skips
//! even that hash.

use crate::arena::Symbol;
use crate::error::{Error, InvalidNameReason};

/// The separator of full names (`encoder/layer_1/w`). It is reserved for the
/// sharing layer, so a plain scope or variable name cannot contain it.
pub const SEPARATOR: char = '/';

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
