//! [`VarMeta`]: what the sharing layer keeps per variable it created.

use std::any::TypeId;
use std::sync::Arc;

use crate::sharing::shape::Shape;

/// What the sharing layer knows of a variable it created.
#[derive(Clone, Debug)]
pub(crate) struct VarMeta {
    /// The shape of the initial value.
    pub(crate) shape: Shape,
    pub(crate) trainable: bool,
    pub(crate) type_id: TypeId,
    pub(crate) type_name: &'static str,
    /// How many collection entries the variable has (each becomes a dead
    /// entry when it is deleted; see `Collections::maybe_compact`).
    pub(crate) entries: usize,
    /// The full name it was created at, the key of its full-name index
    /// entry; `None` for a variable the index does not hold (the candle
    /// backend's, which candle finds by their dotted names).
    pub(crate) full: Option<Arc<str>>,
}
