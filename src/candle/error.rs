//! The candle layer's error type.

use candle_core::DType;

use crate::short;

/// Everything that can go wrong in a [`CandleStore`](super::CandleStore):
/// the sharing and checkpoint layers' errors, and the checks a candle
/// variable gets on reuse (shape, dtype, device), sealed stores and names
/// the tree cannot hold.
///
/// Inside candle (through [`VarBuilder`](candle_nn::VarBuilder)) it arrives
/// wrapped in a `candle_core::Error`, with the same message.
///
/// ```
/// use candle_core::{DType, Device};
/// use scopetree::candle::{CandleStore, Error};
/// let store = CandleStore::new();
/// store.get((2, 3), "lin.weight", candle_nn::Init::Const(0.5), DType::F32, &Device::Cpu)?;
/// let err = store.get((3, 2), "lin.weight", candle_nn::Init::Const(0.5), DType::F32, &Device::Cpu).unwrap_err();
/// assert!(matches!(err, Error::ShapeMismatch { .. }));
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error of the sharing layer (and through it, of the tree).
    #[error(transparent)]
    Sharing(#[from] crate::sharing::Error),

    /// An error of a checkpoint save or load.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::Error),

    /// A name the tree cannot hold: candle names are dotted paths, and a
    /// component may not contain `/` or be empty.
    #[error(
        "cannot use the name `{}`: {reason}; candle names are dotted paths such as \
         `encoder.layer_0.weight`",
        short_dotted(name)
    )]
    InvalidName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The variable exists with another shape.
    #[error(
        "variable `{}` has shape {found:?}, but shape {asked:?} was asked for; build the layer \
         with the stored shape, or delete the variable first",
        short_dotted(name)
    )]
    ShapeMismatch {
        /// The variable's dotted name.
        name: String,
        /// The shape asked for.
        asked: Vec<usize>,
        /// The shape it has.
        found: Vec<usize>,
    },

    /// The variable exists with another dtype. It is never converted
    /// silently.
    #[error(
        "variable `{}` holds {found:?}, but {asked:?} was asked for; build the model with \
         the stored dtype, or convert the checkpoint (DtypePolicy::Convert) before building",
        short_dotted(name)
    )]
    DtypeMismatch {
        /// The variable's dotted name.
        name: String,
        /// The dtype asked for.
        asked: DType,
        /// The dtype it holds.
        found: DType,
    },

    /// The variable lives on another device.
    #[error(
        "variable `{}` is on {found}, but {asked} was asked for; build the model on the \
         variable's device, or move the variables first",
        short_dotted(name)
    )]
    DeviceMismatch {
        /// The variable's dotted name.
        name: String,
        /// The device asked for.
        asked: String,
        /// The device it is on.
        found: String,
    },

    /// A load that names a device ([`load_on`](super::CandleStore::load_on))
    /// met an existing variable on another device. Nothing was loaded.
    #[error(
        "cannot load `{}` onto {asked}: the variable lives on {found}; load without naming a \
         device (each variable keeps its own), or move the variables first",
        short_dotted(name)
    )]
    LoadDevice {
        /// The variable's dotted name.
        name: String,
        /// The device the load names.
        asked: String,
        /// The device the variable is on.
        found: String,
    },

    /// The name holds a value that is not a candle `Var`.
    #[error(
        "variable `{}` holds a {}, not a candle Var; use another name",
        short_dotted(name),
        crate::short_type_name(holds)
    )]
    NotAVar {
        /// The variable's dotted name.
        name: String,
        /// The type it holds (`"nothing"` for no value).
        holds: &'static str,
    },

    /// The store is sealed and the name is unknown: a model asked for a
    /// variable that neither the checkpoint nor an earlier build made.
    #[error(
        "no variable `{}` in the sealed store; the model asks for a name the checkpoint lacks \
         (check the layer names), or call unseal() to let the store create it",
        short_dotted(name)
    )]
    Sealed {
        /// The dotted name asked for.
        name: String,
    },

    /// `get_unchecked` (or [`CandleStore::var`](super::CandleStore::var))
    /// named no variable.
    #[error(
        "no variable `{}`; load a checkpoint that holds it, or build the layer that creates it",
        short_dotted(name)
    )]
    Missing {
        /// The dotted name asked for.
        name: String,
    },

    /// candle failed (making or copying a tensor).
    #[error("candle failed on `{}`: {source}", short_dotted(name))]
    Candle {
        /// The variable's dotted name.
        name: String,
        /// candle's error.
        #[source]
        source: candle_core::Error,
    },
}

/// A dotted name as shown in a message: each component cut, long names cut
/// in the middle (as the tree shows paths).
pub(crate) fn short_dotted(name: &str) -> String {
    if name.contains('/') {
        return short::path(name);
    }
    short::path(&name.replace('.', "/")).replace('/', ".")
}

impl From<Error> for candle_core::Error {
    fn from(e: Error) -> Self {
        candle_core::Error::wrap(e)
    }
}
