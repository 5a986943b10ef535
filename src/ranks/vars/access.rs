//! The values the ranks layer sends: `Vec`, `Box<[_]>` and
//! [`Tensor`](crate::checkpoint::Tensor) of the plain numeric element types,
//! seen as their native bytes (and, for reductions, their `f32` or `f64`
//! elements), looked up by the value's `TypeId` in O(1).

use std::any::{Any, TypeId};

use bytemuck::Pod;
use rustc_hash::FxHashMap;

use crate::checkpoint::{Checkpointable, Dtype, Element, Tensor};
use crate::{ScopeTree, VarId};

/// A value whose elements lie in one slice.
trait Flat: Checkpointable {
    type E: Pod + Element;
    fn elems(&self) -> &[Self::E];
    fn elems_mut(&mut self) -> &mut [Self::E];
    /// Takes `other`'s elements (as many as it holds), leaving it the old
    /// ones; false, and nothing changed, when the lengths differ. O(1)
    /// (no element copied).
    fn swap_elems(&mut self, other: &mut Vec<Self::E>) -> bool;
}

impl<E: Pod + Element> Flat for Vec<E> {
    type E = E;
    fn elems(&self) -> &[E] {
        self
    }
    fn elems_mut(&mut self) -> &mut [E] {
        self
    }
    fn swap_elems(&mut self, other: &mut Vec<E>) -> bool {
        if other.len() != self.len() {
            return false;
        }
        std::mem::swap(self, other);
        true
    }
}

impl<E: Pod + Element> Flat for Box<[E]> {
    type E = E;
    fn elems(&self) -> &[E] {
        self
    }
    fn elems_mut(&mut self) -> &mut [E] {
        self
    }
    fn swap_elems(&mut self, other: &mut Vec<E>) -> bool {
        // Only a buffer without spare capacity becomes a box without a
        // reallocation.
        if other.len() != self.len() || other.capacity() != other.len() {
            return false;
        }
        let new = std::mem::take(other).into_boxed_slice();
        *other = std::mem::replace(self, new).into_vec();
        true
    }
}

impl<E: Pod + Element> Flat for Tensor<E> {
    type E = E;
    fn elems(&self) -> &[E] {
        self.data()
    }
    fn elems_mut(&mut self) -> &mut [E] {
        self.data_mut()
    }
    fn swap_elems(&mut self, other: &mut Vec<E>) -> bool {
        self.swap_data(other)
    }
}

/// How the layer reads and writes one type of value.
#[derive(Clone, Copy)]
pub(crate) struct Access {
    /// The elements' dtype.
    pub(crate) dtype: Dtype,
    /// Whether the value has no shape beyond its length (`Vec`, `Box`).
    pub(crate) flat: bool,
    /// The value's shape.
    shape: fn(&dyn Any) -> Option<Vec<usize>>,
    /// The value's elements as native bytes.
    pub(crate) bytes: for<'t> fn(&'t ScopeTree, VarId) -> Result<&'t [u8], crate::Error>,
    /// The value's elements as native bytes, mutably.
    pub(crate) bytes_mut:
        for<'t> fn(&'t mut ScopeTree, VarId) -> Result<&'t mut [u8], crate::Error>,
    /// Swaps the value's elements with a `Vec` of its element type and
    /// length behind the `&mut dyn Any` (no element copied); false when the
    /// `Any` is not such a `Vec`.
    pub(crate) swap: fn(&mut ScopeTree, VarId, &mut dyn Any) -> Result<bool, crate::Error>,
}

fn shape_of<T: Flat>(v: &dyn Any) -> Option<Vec<usize>> {
    Some(v.downcast_ref::<T>()?.shape().into_owned())
}

fn bytes_of<T: Flat>(tree: &ScopeTree, var: VarId) -> Result<&[u8], crate::Error> {
    Ok(bytemuck::cast_slice(tree.get::<T>(var)?.elems()))
}

fn bytes_mut_of<T: Flat>(tree: &mut ScopeTree, var: VarId) -> Result<&mut [u8], crate::Error> {
    Ok(bytemuck::cast_slice_mut(
        tree.get_mut::<T>(var)?.elems_mut(),
    ))
}

fn swap_of<T: Flat>(
    tree: &mut ScopeTree,
    var: VarId,
    other: &mut dyn Any,
) -> Result<bool, crate::Error> {
    let Some(other) = other.downcast_mut::<Vec<T::E>>() else {
        return Ok(false);
    };
    Ok(tree.get_mut::<T>(var)?.swap_elems(other))
}

impl Access {
    fn of<T: Flat>() -> (TypeId, Self) {
        (
            TypeId::of::<T>(),
            Self {
                dtype: <T::E as Element>::DTYPE,
                flat: T::FLAT,
                shape: shape_of::<T>,
                bytes: bytes_of::<T>,
                bytes_mut: bytes_mut_of::<T>,
                swap: swap_of::<T>,
            },
        )
    }

    /// The value's shape (`None` if `value` is not of this access's type).
    /// O(rank).
    pub(crate) fn shape(&self, value: &dyn Any) -> Option<Vec<usize>> {
        (self.shape)(value)
    }
}

/// The types the layer sends, by `TypeId`.
pub(crate) struct Types(FxHashMap<TypeId, Access>);

impl Types {
    /// `Vec`, `Box<[_]>` and `Tensor` of `f32`, `f64`, `i8`–`i64` and
    /// `u8`–`u64`. O(1) (30 entries).
    pub(crate) fn new() -> Self {
        let mut map = FxHashMap::default();
        macro_rules! add {
            ($($e:ty),*) => {$(
                map.extend([
                    Access::of::<Vec<$e>>(),
                    Access::of::<Box<[$e]>>(),
                    Access::of::<Tensor<$e>>(),
                ]);
            )*};
        }
        add!(f32, f64, i8, i16, i32, i64, u8, u16, u32, u64);
        Self(map)
    }

    /// The access for a value of type `id`. O(1).
    pub(crate) fn get(&self, id: TypeId) -> Option<Access> {
        self.0.get(&id).copied()
    }
}

/// The dtypes a manifest can hold, in the order of their one-byte codes.
pub(crate) const DTYPES: [Dtype; 10] = [
    Dtype::F32,
    Dtype::F64,
    Dtype::I8,
    Dtype::I16,
    Dtype::I32,
    Dtype::I64,
    Dtype::U8,
    Dtype::U16,
    Dtype::U32,
    Dtype::U64,
];

/// What the layer accepts, for error messages.
pub(crate) const SUPPORTED: &str = "the ranks layer synchronises Vec, Box<[_]> or checkpoint::Tensor \
     of f32, f64 or a fixed-size integer type; store it as one of those, or keep it outside the \
     synchronised scope";

/// What a reduction accepts, for error messages.
pub(crate) const FLOATS: &str = "gradients are reduced as f32 or f64 only; keep integer \
     variables outside the reduced scope (build a plan on the gradients' scope)";
