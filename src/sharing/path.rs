//! [`Path`]: a full or relative name of the sharing layer (`encoder/layer_1/w`),
//! checked once, and the one place that knows the `/` separator.

use crate::error::InvalidNameReason;
use crate::sharing::error::Error;

/// The separator between the components of a full name.
const SEP: char = '/';

/// A name of one or more non-empty components separated by `/`. Borrowed:
/// parsing allocates nothing, and remembers where the last component
/// starts.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Path<'a> {
    text: &'a str,
    /// Byte offset of the last component (0: a single component).
    leaf_at: usize,
}

impl<'a> Path<'a> {
    /// Checks `text`: not empty, no empty component. One pass, O(len).
    ///
    /// # Errors
    /// [`Error::Tree`] with [`InvalidName`](crate::Error::InvalidName) and
    /// reason `Empty`.
    pub(crate) fn parse(text: &'a str) -> Result<Self, Error> {
        let bytes = text.as_bytes();
        // `leaf_at` is where the current component starts; a separator must
        // end a non-empty one, and the last one must be non-empty too.
        let mut leaf_at = 0;
        let mut ok = true;
        for (i, &b) in bytes.iter().enumerate() {
            if b == SEP as u8 {
                ok &= i > leaf_at;
                leaf_at = i + 1;
            }
        }
        ok &= leaf_at < bytes.len();
        if !ok {
            return Err(Error::Tree(crate::Error::InvalidName {
                name: crate::short::name(text),
                reason: InvalidNameReason::Empty,
            }));
        }
        Ok(Path { text, leaf_at })
    }

    /// The text. O(1).
    pub(crate) fn as_str(self) -> &'a str {
        self.text
    }

    /// The components, first to last. O(1) each.
    pub(crate) fn components(self) -> impl Iterator<Item = &'a str> {
        self.text.split(SEP)
    }

    /// The scopes part (`None` for one component) and the last component.
    /// O(1) for one component, else O(len) (the scopes part's own last
    /// component is found).
    pub(crate) fn split_leaf(self) -> (Option<Path<'a>>, &'a str) {
        if self.leaf_at == 0 {
            return (None, self.text);
        }
        let dirs = &self.text[..self.leaf_at - 1];
        let dirs_leaf = dirs.rfind(SEP).map_or(0, |i| i + 1);
        (
            Some(Path {
                text: dirs,
                leaf_at: dirs_leaf,
            }),
            &self.text[self.leaf_at..],
        )
    }

    /// The part after `base/`, if this path lies under the path `base`
    /// (whole components only). O(len(base)).
    pub(crate) fn strip_base(self, base: &str) -> Option<Path<'a>> {
        let rest = self.text.strip_prefix(base)?.strip_prefix(SEP)?;
        let cut = base.len() + 1;
        (!base.is_empty() && !rest.is_empty()).then_some(Path {
            text: rest,
            leaf_at: self.leaf_at.saturating_sub(cut),
        })
    }
}

/// `base/rel`, or `rel` when `base` is the root's empty name. O(len).
pub(crate) fn join(base: &str, rel: &str) -> String {
    if base.is_empty() {
        rel.to_owned()
    } else {
        let mut s = String::with_capacity(base.len() + 1 + rel.len());
        s.push_str(base);
        s.push(SEP);
        s.push_str(rel);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rejects_empty_components_and_splits_the_leaf() {
        for bad in ["", "/", "a/", "/a", "a//b"] {
            assert!(Path::parse(bad).is_err(), "{bad:?}");
        }
        let p = Path::parse("a/b/c").unwrap();
        assert_eq!(p.components().collect::<Vec<_>>(), ["a", "b", "c"]);
        let (dirs, leaf) = p.split_leaf();
        assert_eq!((dirs.map(Path::as_str), leaf), (Some("a/b"), "c"));
        assert_eq!(p.strip_base("a").map(Path::as_str), Some("b/c"));
        assert_eq!(p.strip_base("a/b").map(Path::as_str), Some("c"));
        assert!(p.strip_base("a/b/c").is_none());
        assert!(p.strip_base("a/").is_none());
        assert!(Path::parse("ab/c").unwrap().strip_base("a").is_none());
        assert_eq!(
            Path::parse("w").unwrap().split_leaf().0.map(Path::as_str),
            None
        );
        assert_eq!(join("", "w"), "w");
        assert_eq!(join("a", "w"), "a/w");
    }
}
