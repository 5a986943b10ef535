//! The element types of a checkpoint's tensors: safetensors' [`Dtype`],
//! and the [`FloatDtype`]s a save or a load converts floats to.

pub use safetensors::Dtype;

/// A float dtype a checkpoint converts to: on load
/// ([`LoadOptions::create_floats_as`](super::LoadOptions::create_floats_as))
/// or on save ([`SaveOptions::floats_as`](super::SaveOptions::floats_as)).
///
/// ```
/// use scopetree::checkpoint::{Dtype, FloatDtype};
/// assert_eq!(FloatDtype::BF16.dtype(), Dtype::BF16);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatDtype {
    /// IEEE half precision.
    F16,
    /// bfloat16, the usual dtype of published checkpoints.
    BF16,
    /// Single precision.
    F32,
    /// Double precision.
    F64,
}

impl FloatDtype {
    /// The safetensors dtype. O(1).
    ///
    /// ```
    /// use scopetree::checkpoint::{Dtype, FloatDtype};
    /// assert_eq!(FloatDtype::F32.dtype(), Dtype::F32);
    /// ```
    pub fn dtype(self) -> Dtype {
        match self {
            Self::F16 => Dtype::F16,
            Self::BF16 => Dtype::BF16,
            Self::F32 => Dtype::F32,
            Self::F64 => Dtype::F64,
        }
    }
}
