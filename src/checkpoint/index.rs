//! The Hugging Face index of a sharded checkpoint,
//! `model.safetensors.index.json`:
//! `{"metadata": {"total_size": N}, "weight_map": {name: shard file}}`.
//! Reading it (every name once, every shard a plain file name beside the
//! index) and writing it.

use std::fmt;
use std::path::Path;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::error::{BadIndex, Error, cut};
use crate::short;

/// The index's file name in a checkpoint directory.
pub(crate) const INDEX_FILE: &str = "model.safetensors.index.json";

/// A single-file checkpoint's name in a checkpoint directory.
pub(crate) const SINGLE_FILE: &str = "model.safetensors";

/// The key, in the index's `metadata` and in each shard's `__metadata__`,
/// of the id of the save that wrote them: a shard whose id differs from
/// the index's was left by another save.
pub(crate) const SAVE_ID: &str = "scopetree_save_id";

/// The prefix, in a shard's `__metadata__`, of the keys that hold a
/// tensor's checksum (`scopetree_xxh3/<tensor key>`: the xxh3-128 of its
/// bytes as written, 32 hex digits), for the layers that verify what they
/// read.
pub(crate) const CHECKSUM_PREFIX: &str = "scopetree_xxh3/";

/// The index, beside [`INDEX_FILE`], of the optimizer state that ranks
/// sliced across them (ZeRO): the same layout, its shards
/// named by [`shard_file`] with the stem `optimizer`.
pub(crate) const OPTIMIZER_INDEX_FILE: &str = "optimizer.safetensors.index.json";

/// The name of shard `k` (from 1) of `n`, as the Hugging Face tools write
/// it: `model-00001-of-00004.safetensors`. O(1).
pub(crate) fn shard_name(k: usize, n: usize) -> String {
    shard_file("model", k, n)
}

/// The name of shard `k` (from 1) of `n` with the file stem `stem`:
/// `{stem}-00001-of-00004.safetensors`. O(1).
pub(crate) fn shard_file(stem: &str, k: usize, n: usize) -> String {
    format!("{stem}-{k:05}-of-{n:05}.safetensors")
}

/// A read index: its names with their shards, in the index's order.
pub(crate) struct Index {
    /// `(tensor name, shard file name)`; each name once.
    pub(crate) entries: Vec<(String, String)>,
    /// The id of the save that wrote it, if scopetree did.
    pub(crate) save_id: Option<String>,
}

fn bad(path: &str, problem: BadIndex) -> Error {
    Error::BadIndex {
        path: short::path(path),
        problem,
    }
}

/// Whether `file` names a file beside the index: not empty, no path
/// separator, not `.` or `..`.
fn plain_file_name(file: &str) -> bool {
    !file.is_empty() && file != "." && file != ".." && !file.contains(['/', '\\', '\0'])
}

/// Reads and checks the index at `path`: a JSON object with a `weight_map`
/// of names to plain shard file names, no name twice. O(index size).
pub(crate) fn read_index(path: &Path) -> Result<Index, Error> {
    let shown = path.to_string_lossy();
    let text = std::fs::read(path).map_err(Error::io(&shown))?;
    let mut json = serde_json::Deserializer::from_slice(&text);
    let read = IndexSeed
        .deserialize(&mut json)
        .and_then(|r| json.end().map(|()| r));
    let (entries, save_id) = read.map_err(|e| {
        bad(
            &shown,
            BadIndex::BadJson {
                reason: cut(&e.to_string()),
            },
        )
    })?;
    let Some(entries) = entries else {
        return Err(bad(&shown, BadIndex::NoWeightMap));
    };
    if let Some((key, file)) = entries.iter().find(|(_, f)| !plain_file_name(f)) {
        return Err(bad(
            &shown,
            BadIndex::BadShardName {
                key: key.clone(),
                file: file.clone(),
            },
        ));
    }
    // A name twice: sorted, nothing copied but the two shards of the report.
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| entries[a].0.cmp(&entries[b].0).then(a.cmp(&b)));
    if let Some(w) = order
        .windows(2)
        .find(|w| entries[w[0]].0 == entries[w[1]].0)
    {
        return Err(bad(
            &shown,
            BadIndex::DuplicateName {
                key: entries[w[0]].0.clone(),
                first: entries[w[0]].1.clone(),
                second: entries[w[1]].1.clone(),
            },
        ));
    }
    Ok(Index { entries, save_id })
}

/// The index text for `entries` (name, shard), sorted by name, with the
/// total tensor bytes and the save's id in its `metadata`.
pub(crate) fn index_json(entries: &[(&str, &str)], total_size: u64, save_id: &str) -> String {
    let mut meta = serde_json::Map::new();
    meta.insert("total_size".into(), total_size.into());
    meta.insert(SAVE_ID.into(), save_id.into());
    let map: serde_json::Map<String, serde_json::Value> = entries
        .iter()
        .map(|&(k, f)| (k.to_owned(), f.into()))
        .collect();
    let mut top = serde_json::Map::new();
    top.insert("metadata".into(), meta.into());
    top.insert("weight_map".into(), map.into());
    let mut text = serde_json::to_string_pretty(&serde_json::Value::Object(top))
        .unwrap_or_else(|e| unreachable!("a map of strings always serializes: {e}"));
    text.push('\n');
    text
}

type Read = (Option<Vec<(String, String)>>, Option<String>);

/// The top-level object: `weight_map` read in order with duplicates kept,
/// the save id taken from `metadata`, anything else skipped.
struct IndexSeed;

impl<'de> DeserializeSeed<'de> for IndexSeed {
    type Value = Read;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Read, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for IndexSeed {
    type Value = Read;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object with a \"weight_map\"")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Read, A::Error> {
        let (mut entries, mut save_id) = (None, None);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "weight_map" if entries.is_some() => {
                    return Err(serde::de::Error::custom("\"weight_map\" appears twice"));
                }
                "weight_map" => entries = Some(map.next_value_seed(WeightMapSeed)?),
                "metadata" => {
                    let meta: serde_json::Value = map.next_value()?;
                    save_id = meta
                        .get(SAVE_ID)
                        .and_then(|v| v.as_str())
                        .map(str::to_owned);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((entries, save_id))
    }
}

/// The `weight_map` object, as `(name, shard)` pairs in order, duplicates
/// kept (a map type would keep only the last of a name given twice).
struct WeightMapSeed;

impl<'de> DeserializeSeed<'de> for WeightMapSeed {
    type Value = Vec<(String, String)>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for WeightMapSeed {
    type Value = Vec<(String, String)>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of tensor names to shard file names")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(key) = map.next_key::<String>()? {
            let file = map.next_value::<String>()?;
            out.push((key, file));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Index, Error> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(INDEX_FILE);
        std::fs::write(&p, text).unwrap();
        read_index(&p)
    }

    fn problem(text: &str) -> BadIndex {
        match read(text) {
            Err(Error::BadIndex { problem, .. }) => problem,
            Err(e) => panic!("not BadIndex: {e}"),
            Ok(_) => panic!("accepted {text}"),
        }
    }

    #[test]
    fn an_index_reads_in_order_with_its_save_id() {
        let r = read(
            r#"{"metadata": {"total_size": 8, "scopetree_save_id": "x1"},
                "weight_map": {"b": "s2", "a": "s1"}}"#,
        )
        .unwrap();
        assert_eq!(
            r.entries,
            [("b".into(), "s2".into()), ("a".into(), "s1".into())]
        );
        assert_eq!(r.save_id.as_deref(), Some("x1"));
    }

    #[test]
    fn a_name_given_twice_is_reported_with_both_shards() {
        assert_eq!(
            problem(
                r#"{"weight_map": {"w": "a.safetensors", "v": "a.safetensors", "w": "b.safetensors"}}"#
            ),
            BadIndex::DuplicateName {
                key: "w".into(),
                first: "a.safetensors".into(),
                second: "b.safetensors".into()
            }
        );
    }

    #[test]
    fn malformed_indexes_are_named() {
        assert_eq!(problem(r#"{"metadata": {}}"#), BadIndex::NoWeightMap);
        assert!(matches!(problem("[1, 2]"), BadIndex::BadJson { .. }));
        assert!(matches!(
            problem(r#"{"weight_map": {"w": 3}}"#),
            BadIndex::BadJson { .. }
        ));
        assert!(matches!(
            problem(r#"{"weight_map": {"w": "a"}"#),
            BadIndex::BadJson { .. }
        ));
        assert!(matches!(
            problem(r#"{"weight_map": {}, "weight_map": {}}"#),
            BadIndex::BadJson { .. }
        ));
        for file in ["", "../x.safetensors", "/etc/passwd", "a/b", "..", "a\\b"] {
            let text = serde_json::json!({"weight_map": {"w": file}}).to_string();
            assert_eq!(
                problem(&text),
                BadIndex::BadShardName {
                    key: "w".into(),
                    file: file.into()
                },
                "{file}"
            );
        }
    }

    #[test]
    fn the_written_index_reads_back() {
        let text = index_json(&[("a", "s1"), ("b.c", "s2")], 12, "id9");
        let r = read(&text).unwrap();
        assert_eq!(
            r.entries,
            [("a".into(), "s1".into()), ("b.c".into(), "s2".into())]
        );
        assert_eq!(r.save_id.as_deref(), Some("id9"));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["metadata"]["total_size"], 12);
        assert_eq!(shard_name(2, 14), "model-00002-of-00014.safetensors");
    }
}
