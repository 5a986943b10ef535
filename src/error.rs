//! The core tree's error type (the step, worker and sharing layers wrap it in
//! their own).

use std::fmt;

use crate::arena::{ScopeId, Symbol, TreeTag, VarId};

/// Why a name was rejected (see [`Error::InvalidName`]).
///
/// ```
/// use scopetree::{validate_name, Error, InvalidNameReason};
/// assert!(matches!(
///     validate_name(""),
///     Err(Error::InvalidName { reason: InvalidNameReason::Empty, .. })
/// ));
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidNameReason {
    /// The name is the empty string.
    Empty,
    /// The name contains `/`, which is reserved for full names.
    ContainsSeparator,
}

impl fmt::Display for InvalidNameReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InvalidNameReason::Empty => "it is empty; give a non-empty name",
            InvalidNameReason::ContainsSeparator => {
                "it contains '/', which is reserved for full names; \
                 create one scope per path component instead"
            }
        })
    }
}

/// A scope path as shown in messages: `<root>` for the root, else
/// `encoder/#3v1`, shortened in the middle when long (see `short::path`).
pub(crate) struct ShowPath<'a>(pub(crate) &'a str);

impl fmt::Display for ShowPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("<root>")
        } else {
            f.write_str(&crate::short::path(self.0))
        }
    }
}

/// Shortens a type name as `std::any::type_name` writes it by dropping the
/// module path of every path segment: `alloc::vec::Vec<f32>` becomes
/// `Vec<f32>`.
///
/// ```
/// assert_eq!(scopetree::short_type_name("alloc::vec::Vec<core::option::Option<f32>>"), "Vec<Option<f32>>");
/// assert_eq!(scopetree::short_type_name("f32"), "f32");
/// ```
pub fn short_type_name(full: &str) -> String {
    let mut out = String::with_capacity(full.len());
    let mut segment_start = 0;
    for (i, c) in full.char_indices() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            continue;
        }
        push_last_segment(&mut out, &full[segment_start..i]);
        out.push(c);
        segment_start = i + c.len_utf8();
    }
    push_last_segment(&mut out, &full[segment_start..]);
    out
}

fn push_last_segment(out: &mut String, path: &str) {
    out.push_str(path.rsplit("::").next().unwrap_or(path));
}

/// `a` shortened, unless that would make it read the same as `b` shortened.
pub(crate) fn show_type(a: &str, b: &str) -> String {
    let (sa, sb) = (short_type_name(a), short_type_name(b));
    if sa == sb && a != b { a.to_owned() } else { sa }
}

/// Everything that can go wrong when using a [`ScopeTree`](crate::ScopeTree).
///
/// Absence is not an error: lookups return `Ok(None)` for a name that is not
/// there. An `Err` means misuse: a handle that is stale or foreign, a name that
/// is invalid or taken, a read of the wrong type. Scope paths in messages are
/// written `<root>` for the root and `a/b/#3v1` below it (`#3v1` is an
/// unnamed scope, shown by its slot).
///
/// ```
/// use scopetree::{Error, ScopeTree};
/// let mut tree = ScopeTree::new();
/// let w = tree.var(tree.root(), "w")?;
/// tree.set(w, 1_u8)?;
/// let err = tree.get::<f32>(w).unwrap_err();
/// assert!(matches!(err, Error::TypeMismatch { .. }));
/// assert!(err.to_string().contains("`w`"));
/// # Ok::<(), scopetree::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The scope handle refers to a scope that was deleted.
    #[error(
        "scope handle {scope:?} is stale: that scope was deleted (directly or with an ancestor); \
         create a new scope or resolve the handle again"
    )]
    StaleScope {
        /// The stale handle.
        scope: ScopeId,
    },
    /// The variable handle refers to a variable that was erased, or whose
    /// scope was deleted.
    #[error(
        "variable handle {var:?} is stale: the variable was erased or its scope deleted; \
         look the name up again with `find_var` or recreate it with `var`"
    )]
    StaleVar {
        /// The stale handle.
        var: VarId,
    },
    /// The scope handle was issued by another tree.
    #[error(
        "scope handle {scope:?} belongs to tree {:?}, not to this tree {tree:?}; \
         use handles only with the tree that issued them",
        scope.tree()
    )]
    ForeignScope {
        /// The foreign handle.
        scope: ScopeId,
        /// The tag of the tree it was passed to.
        tree: TreeTag,
    },
    /// The variable handle was issued by another tree.
    #[error(
        "variable handle {var:?} belongs to tree {:?}, not to this tree {tree:?}; \
         use handles only with the tree that issued them",
        var.tree()
    )]
    ForeignVar {
        /// The foreign handle.
        var: VarId,
        /// The tag of the tree it was passed to.
        tree: TreeTag,
    },
    /// The symbol was interned by another tree.
    #[error(
        "symbol {symbol:?} was interned by another tree, not by this tree {tree:?}; \
         intern names with the tree you look them up in"
    )]
    ForeignSymbol {
        /// The foreign symbol.
        symbol: Symbol,
        /// The tag of the tree it was passed to.
        tree: TreeTag,
    },
    /// The symbol's name was freed: no scope or variable carries it any more
    /// and it was never [interned](crate::ScopeTree::intern).
    #[error(
        "symbol {symbol:?} is stale: no scope or variable carries its name any more; \
         get symbols you keep with `intern`, which never frees the name"
    )]
    StaleSymbol {
        /// The stale symbol.
        symbol: Symbol,
    },
    /// A strict lookup found no variable of that name.
    #[error(
        "variable `{name}` not found in scope `{}` or its ancestors; \
         create it first with `var` or `create_var`",
        ShowPath(scope)
    )]
    NotFound {
        /// The name looked up.
        name: String,
        /// Path of the scope the lookup started in.
        scope: String,
    },
    /// A strict create found a variable of that name in the scope itself.
    #[error(
        "variable `{name}` already exists in scope `{}`; \
         use `var` to get-or-create, or pick another name (`unique_var`)",
        ShowPath(scope)
    )]
    NameTaken {
        /// The name asked for.
        name: String,
        /// Path of the scope that already holds it.
        scope: String,
    },
    /// A named scope was asked for a name a sibling already has.
    #[error(
        "scope `{}` already has a kid scope named `{name}`; \
         reuse it (`kid`) or pick another name",
        ShowPath(scope)
    )]
    ScopeNameTaken {
        /// The kid name asked for.
        name: String,
        /// Path of the parent scope.
        scope: String,
    },
    /// The name is empty or contains the separator `/`.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name, cut to 64 characters followed by `…` and its
        /// length in bytes when it is longer.
        name: String,
        /// Which rule it breaks.
        reason: InvalidNameReason,
    },
    /// The variable holds a value of another type than the one asked for.
    #[error(
        "variable `{name}` in scope `{}` holds a `{}`, not a `{}`; \
         read it as `{}`, or `set` a new value to change its type",
        ShowPath(scope),
        show_type(found, expected),
        show_type(expected, found),
        show_type(found, expected)
    )]
    TypeMismatch {
        /// The variable's name.
        name: String,
        /// Path of the variable's scope.
        scope: String,
        /// The type asked for.
        expected: &'static str,
        /// The type held.
        found: &'static str,
    },
    /// The variable holds no value yet.
    #[error(
        "variable `{name}` in scope `{}` is uninitialised (asked for a `{}`); \
         `set` it first or use `get_or_insert_with`",
        ShowPath(scope),
        short_type_name(expected)
    )]
    Uninitialized {
        /// The variable's name.
        name: String,
        /// Path of the variable's scope.
        scope: String,
        /// The type asked for.
        expected: &'static str,
    },
    /// The scope is not a direct kid of the given parent.
    #[error(
        "scope `{}` is not a kid of scope `{}`; pass the scope's own parent",
        ShowPath(kid),
        ShowPath(scope)
    )]
    NotAKid {
        /// Path of the scope that was expected to be a kid.
        kid: String,
        /// Path of the supposed parent.
        scope: String,
    },
    /// The root scope cannot be deleted (it lives as long as the tree).
    #[error(
        "the root scope cannot be deleted; use `drop_kids` and `erase_vars_except` to empty it, \
         or drop the tree"
    )]
    RootScope,
    /// The same variable was passed twice to a call that borrows several
    /// variables mutably at once.
    #[error(
        "variable `{name}` in scope `{}` was passed more than once to a disjoint mutable borrow; \
         pass each handle once",
        ShowPath(scope)
    )]
    AliasedVar {
        /// The variable's name.
        name: String,
        /// Path of the variable's scope.
        scope: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_short_names_fall_back_to_full_paths() {
        assert_eq!(show_type("a::T", "b::T"), "a::T");
        assert_eq!(show_type("a::T", "f32"), "T");
        assert_eq!(
            short_type_name("(a::B, [c::D; 4], &'static str)"),
            "(B, [D; 4], &'static str)"
        );
    }

    #[test]
    fn root_path_is_shown_as_root() {
        let e = Error::NotFound {
            name: "w".into(),
            scope: String::new(),
        };
        assert_eq!(
            e.to_string(),
            "variable `w` not found in scope `<root>` or its ancestors; \
             create it first with `var` or `create_var`"
        );
    }
}
