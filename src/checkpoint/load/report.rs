//! [`LoadReport`]: what a load did.

/// What a load did: keys loaded, created, missing from the file and unused.
/// Each list is sorted.
///
/// ```
/// let r = scopetree::checkpoint::LoadReport::default();
/// assert!(r.loaded.is_empty() && r.missing.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadReport {
    /// Keys whose tensors were loaded (including created ones).
    pub loaded: Vec<String>,
    /// Keys of variables the load created ([`LoadOptions::create`](super::LoadOptions::create)).
    pub created: Vec<String>,
    /// Keys of tree variables the file does not hold (kept as they were).
    pub missing: Vec<String>,
    /// File keys that name no tree variable (skipped).
    pub unused: Vec<String>,
    /// Keys of tree variables that hold no tensor (or no value) and that the
    /// file does not name: left as they are, and not counted as missing.
    pub not_tensors: Vec<String>,
    /// Tensors of a sharded checkpoint that a shard holds but the index
    /// assigns to another shard or to none, as `(key, shard file)`: never
    /// loaded (accepted only with [`LoadOptions::allow_unused`](super::LoadOptions::allow_unused)).
    pub unassigned: Vec<(String, String)>,
}
