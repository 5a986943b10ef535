//! candle's dotted names: the check a name gets before the store makes a
//! variable of it, and the prefix match that freezing and listing use.

use super::error::Error;

/// Whether the dotted `name` is `prefix` or below it (`""` is everything):
/// whole components only, so `gru` selects `gru.w` but not `gru2.w`.
#[inline]
pub(super) fn within(name: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || name == prefix
        || (name.starts_with(prefix) && name.as_bytes().get(prefix.len()) == Some(&b'.'))
}

/// Checks a candle name: dotted, no empty component, no `/`.
/// One pass over the bytes: `VarBuilder` calls this on every `get`.
#[inline]
pub(super) fn check_name(name: &str) -> Result<(), Error> {
    let mut reason = None;
    // At the start, after a `.`: a `.` or the end here is an empty component.
    let mut boundary = true;
    for &b in name.as_bytes() {
        if b == b'/' {
            reason = Some("it contains `/`, which the tree uses between scopes");
            break;
        }
        let dot = b == b'.';
        if dot && boundary {
            reason = Some("it has an empty component");
        }
        boundary = dot;
    }
    if name.is_empty() {
        reason = Some("it is empty");
    } else if boundary && reason.is_none() {
        reason = Some("it has an empty component");
    }
    match reason {
        Some(reason) => Err(Error::InvalidName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// A checked prefix (`""` for everything).
#[inline]
pub(super) fn check_prefix(prefix: &str) -> Result<(), Error> {
    if prefix.is_empty() {
        Ok(())
    } else {
        check_name(prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass check gives the reason the plain definition gives, for
    /// every name of up to five characters over `a`, `.`, `/` and `é`.
    #[test]
    fn the_name_check_agrees_with_its_definition() {
        fn reference(name: &str) -> Option<&'static str> {
            if name.is_empty() {
                Some("it is empty")
            } else if name.contains('/') {
                Some("it contains `/`, which the tree uses between scopes")
            } else if name.split('.').any(str::is_empty) {
                Some("it has an empty component")
            } else {
                None
            }
        }
        let alphabet = ['a', '.', '/', 'é'];
        let mut names = vec![String::new()];
        let mut checked = 0;
        for _ in 0..=5 {
            let mut longer = Vec::new();
            for n in &names {
                let got = match check_name(n) {
                    Ok(()) => None,
                    Err(Error::InvalidName { reason, .. }) => Some(reason),
                    Err(e) => panic!("{n:?}: {e}"),
                };
                assert_eq!(got, reference(n), "{n:?}");
                checked += 1;
                longer.extend(alphabet.iter().map(|c| format!("{n}{c}")));
            }
            names = longer;
        }
        assert_eq!(checked, 1 + 4 + 16 + 64 + 256 + 1024);
    }
}
