//! Bounded text for error messages: names cut to [`NAME_CHARS`] characters,
//! paths shortened in the middle, so that no message grows with its input.
//!
//! Every layer's error type builds the names, paths and lists it shows
//! through [`name`], [`path`] and [`list`]; a message is then at most a few hundred bytes plus
//! its fixed text, whatever the caller passed in.

use crate::arena::{Arena, ScopeKey, Structure};

/// Names in messages keep at most this many characters.
pub(crate) const NAME_CHARS: usize = 64;

/// Paths in messages keep at most this many characters at each end.
pub(crate) const PATH_END_CHARS: usize = 96;

/// Paths up to this many characters are shown whole.
const PATH_WHOLE_CHARS: usize = 2 * PATH_END_CHARS + 64;

/// Lists in messages show at most this many entries.
pub(crate) const LIST_SHOWN: usize = 8;

/// The first [`LIST_SHOWN`] of `items`, comma-separated, then how many more
/// (`a, b, … 3 more`). O(the shown entries' text).
pub(crate) fn list<T: std::fmt::Display>(items: &[T]) -> String {
    let mut s = String::new();
    for (i, it) in items.iter().take(LIST_SHOWN).enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&it.to_string());
    }
    if items.len() > LIST_SHOWN {
        s.push_str(&format!(", … {} more", items.len() - LIST_SHOWN));
    }
    s
}

/// `s` as shown in a message: unchanged up to [`NAME_CHARS`] characters,
/// else its first [`NAME_CHARS`] characters followed by `…` and its length
/// (`aaaa… (1048576 bytes)`). O(min(len, [`NAME_CHARS`])).
pub(crate) fn name(s: &str) -> String {
    match s.char_indices().nth(NAME_CHARS) {
        None => s.to_owned(),
        Some((cut, _)) => format!("{}… ({} bytes)", &s[..cut], s.len()),
    }
}

/// A path (`a/b/c`) as shown in a message: whole up to `PATH_WHOLE_CHARS`
/// (256) characters, each component cut as [`name`] cuts names, else its first and last
/// [`PATH_END_CHARS`] characters around `/…/`, with the full length
/// (`enc/layer/…/w (2000000 bytes)`), components again cut. O(len), for
/// counting the length.
pub(crate) fn path(s: &str) -> String {
    let chars = s.chars().count();
    if chars <= PATH_WHOLE_CHARS {
        return cut_components(s);
    }
    let head_end = s
        .char_indices()
        .nth(PATH_END_CHARS)
        .map_or(s.len(), |(i, _)| i);
    let tail_start = s
        .char_indices()
        .nth(chars - PATH_END_CHARS)
        .map_or(s.len(), |(i, _)| i);
    format!(
        "{}/…/{} ({} bytes)",
        cut_components(s[..head_end].trim_end_matches('/')),
        cut_components(s[tail_start..].trim_start_matches('/')),
        s.len()
    )
}

fn cut_components(s: &str) -> String {
    s.split('/').map(name).collect::<Vec<_>>().join("/")
}

impl Structure<'_> {
    /// The path of `key` as an error keeps it: cut in the middle when long
    /// (see [`path`]), so that an error stays small however deep the scope.
    /// O(depth).
    pub(crate) fn error_path(&self, key: ScopeKey) -> String {
        path(&self.path(key))
    }
}

impl Arena {
    /// The path of `key` cut for an error (see [`Structure::error_path`]).
    /// O(depth).
    pub(crate) fn error_path(&self, key: ScopeKey) -> String {
        self.structure().error_path(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_kept_and_long_ones_cut() {
        assert_eq!(name("w"), "w");
        let long = "é".repeat(1 << 19);
        let shown = name(&long);
        assert!(shown.starts_with(&"é".repeat(NAME_CHARS)));
        assert!(shown.ends_with(&format!("… ({} bytes)", long.len())));
        assert!(shown.len() < 200);
    }

    #[test]
    fn long_paths_are_cut_in_the_middle() {
        assert_eq!(path("a/b/c"), "a/b/c");
        let deep = vec!["ab"; 1_000_000].join("/");
        let shown = path(&deep);
        assert!(shown.starts_with("ab/ab/"));
        assert!(shown.contains("/…/"));
        assert!(!shown.contains("//"), "{shown}");
        let slashes = vec!["abc"; 100_000].join("/");
        assert!(!path(&slashes).contains("//"));
        assert!(shown.len() < 400, "{}", shown.len());
        let wide = format!("a/{}/c", "x".repeat(1 << 20));
        let shown = path(&wide);
        assert!(shown.len() < 400, "{}", shown.len());
        assert!(shown.starts_with("a/xxxx"));
    }
}
