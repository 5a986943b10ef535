//! The checkpointable types a save or a load knows ([`Types`], by
//! `TypeId`), and the value type a load makes for a dtype.

use std::any::TypeId;

use half::{bf16, f16};
use rustc_hash::FxHashMap;

use super::checkpointable::Checkpointable;
use super::codec::Codec;
use super::dtype::Dtype;
use super::tensor::Tensor;

/// The checkpointable types a save or load knows, by `TypeId`.
#[derive(Clone)]
pub(crate) struct Types {
    pub(crate) by_id: FxHashMap<TypeId, Codec>,
}

impl Types {
    /// The crate's own types: `Vec`, `Box<[_]>` and `Tensor` of every element.
    pub(crate) fn builtin() -> Self {
        let mut by_id = FxHashMap::default();
        macro_rules! add {
            ($($e:ty),*) => {$(
                by_id.extend([
                    Codec::of::<Vec<$e>>(),
                    Codec::of::<Box<[$e]>>(),
                    Codec::of::<Tensor<$e>>(),
                ]);
            )*};
        }
        add!(
            f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, bool, f16, bf16
        );
        for c in by_id.values_mut() {
            c.builtin = true;
        }
        Self { by_id }
    }

    /// Registers `T` as one of the crate's own types (see
    /// [`Codec::builtin`]).
    #[cfg(feature = "candle")]
    pub(crate) fn add_builtin<T: Checkpointable>(&mut self) {
        let (id, mut c) = Codec::of::<T>();
        c.builtin = true;
        self.by_id.insert(id, c);
    }

    pub(crate) fn add<T: Checkpointable>(&mut self) {
        let (id, c) = Codec::of::<T>();
        self.by_id.entry(id).or_insert(c);
    }

    pub(crate) fn get(&self, id: TypeId) -> Option<&Codec> {
        self.by_id.get(&id)
    }
}

/// The codec a load uses for a variable that has no value yet: `Vec<E>`, or
/// [`Tensor<E>`] when `shaped`; `None` for a dtype the crate has no element
/// type for.
pub(crate) fn default_codec(dtype: Dtype, shaped: bool) -> Option<Codec> {
    macro_rules! pick {
        ($($d:ident => $e:ty),*) => {
            match dtype {
                $(Dtype::$d => Some(if shaped { Codec::of::<Tensor<$e>>().1 } else { Codec::of::<Vec<$e>>().1 }),)*
                _ => None,
            }
        };
    }
    pick!(F32 => f32, F64 => f64, I8 => i8, I16 => i16, I32 => i32, I64 => i64,
          U8 => u8, U16 => u16, U32 => u32, U64 => u64, BOOL => bool, F16 => f16, BF16 => bf16)
}
