//! Names and dtypes between burn and a checkpoint: burn's dtypes against
//! safetensors', and key remapping with every collision reported.

use burn_core::tensor::{BoolStore, DType};
use burn_store::KeyRemapper;
use rustc_hash::FxHashMap;

use super::error::Error;
use crate::checkpoint::Dtype;
use crate::short;

/// The `__metadata__` prefix under which a save records each tensor's burn
/// [`ParamId`](burn_core::module::ParamId) (`scopetree_burn_param/<key>`:
/// the id as a decimal `u64`), so that a load gives the module back its
/// ids and an optimizer's state, keyed by them, still applies.
pub(crate) const PARAM_ID_PREFIX: &str = "scopetree_burn_param/";

/// The safetensors dtype a burn tensor of `dtype` is saved as, if any.
/// `Flex32` is saved as `F32`; bools of every storage as `BOOL`.
pub(crate) fn to_file(dtype: DType) -> Option<Dtype> {
    Some(match dtype {
        DType::F64 => Dtype::F64,
        DType::F32 | DType::Flex32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::I16 => Dtype::I16,
        DType::I8 => Dtype::I8,
        DType::U64 => Dtype::U64,
        DType::U32 => Dtype::U32,
        DType::U16 => Dtype::U16,
        DType::U8 => Dtype::U8,
        DType::Bool(_) => Dtype::BOOL,
        DType::QFloat(_) => return None,
    })
}

/// The burn dtype of a checkpoint tensor of `dtype`, if burn has one
/// (not the FP8 and sub-byte dtypes, nor `C64`).
pub(crate) fn to_burn(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::F64 => DType::F64,
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::I16 => DType::I16,
        Dtype::I8 => DType::I8,
        Dtype::U64 => DType::U64,
        Dtype::U32 => DType::U32,
        Dtype::U16 => DType::U16,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool(BoolStore::Native),
        _ => return None,
    })
}

/// The safetensors float dtype of a burn float dtype the convert policy
/// handles.
pub(crate) fn float_file_dtype(dtype: DType) -> Option<Dtype> {
    match dtype {
        DType::F64 => Some(Dtype::F64),
        DType::F32 | DType::Flex32 => Some(Dtype::F32),
        DType::F16 => Some(Dtype::F16),
        DType::BF16 => Some(Dtype::BF16),
        _ => None,
    }
}

/// `name` after every pattern of `remapper`, in order, as burn-store's
/// `KeyRemapper::remap` renames: each pattern that matches replaces all
/// its matches. O(patterns × name).
pub(crate) fn remap_one(remapper: &KeyRemapper, name: &str) -> String {
    let mut out = name.to_owned();
    for (pattern, replacement) in remapper.to_regex_pairs() {
        if pattern.is_match(&out) {
            out = pattern.replace_all(&out, replacement.as_str()).into_owned();
        }
    }
    out
}

/// `names` remapped, each with its position: a map from new name to the
/// position of the name it came from. Two names that land on one are
/// [`Error::Collision`], naming both and `shown` (the file or directory).
/// O(names × patterns).
pub(crate) fn remap_all<'n>(
    remapper: &KeyRemapper,
    names: impl Iterator<Item = &'n str>,
    shown: &str,
) -> Result<FxHashMap<String, usize>, Error> {
    let mut out: FxHashMap<String, usize> = FxHashMap::default();
    let mut originals: Vec<&str> = Vec::new();
    for (i, name) in names.enumerate() {
        originals.push(name);
        let new = if remapper.is_empty() {
            name.to_owned()
        } else {
            remap_one(remapper, name)
        };
        if let Some(&first) = out.get(&new) {
            return Err(Error::Collision {
                path: short::path(shown),
                name: new,
                first: originals[first].to_owned(),
                second: name.to_owned(),
            });
        }
        out.insert(new, i);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_dtype_burn_has_maps_back() {
        for d in [
            Dtype::F64,
            Dtype::F32,
            Dtype::F16,
            Dtype::BF16,
            Dtype::I64,
            Dtype::I32,
            Dtype::I16,
            Dtype::I8,
            Dtype::U64,
            Dtype::U32,
            Dtype::U16,
            Dtype::U8,
            Dtype::BOOL,
        ] {
            let burn = to_burn(d).unwrap();
            assert_eq!(to_file(burn), Some(d), "{d:?}");
        }
        assert_eq!(to_burn(Dtype::F8_E4M3), None);
        assert_eq!(to_file(DType::Flex32), Some(Dtype::F32));
    }

    #[test]
    fn remapping_reports_a_collision_with_both_names() {
        let r = KeyRemapper::new()
            .add_pattern(r"^model\.", "")
            .unwrap()
            .add_pattern(r"\.self_attn\.", ".attn.")
            .unwrap();
        assert_eq!(
            remap_one(&r, "model.layers.0.self_attn.q.weight"),
            "layers.0.attn.q.weight"
        );
        let names = ["model.a", "b", "a"];
        let err = remap_all(&r, names.into_iter(), "/ck").unwrap_err();
        match err {
            Error::Collision {
                name,
                first,
                second,
                ..
            } => {
                assert_eq!(
                    (name.as_str(), first.as_str(), second.as_str()),
                    ("a", "model.a", "a")
                );
            }
            e => panic!("{e}"),
        }
    }
}
