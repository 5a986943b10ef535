//! Loading: check everything first, then stream tensors one at a time.
//!
//! | file | holds |
//! |---|---|
//! | `options` | [`LoadOptions`], [`DtypePolicy`]: what a load accepts and makes |
//! | `report` | [`LoadReport`]: what a load did |
//! | `plan` | the strict checks: the file's tensors matched against the tree, one step each; changes nothing |
//! | `cursor` | reading a tensor's bytes from the checkpoint's files, converting floats |
//! | `apply` | the three passes that put the values in, and the undo log |
//! | `staged` | staged reads: parallel readers into reused staging buffers, checksums on the staged bytes, a sink per destination |

mod apply;
mod cursor;
mod options;
mod plan;
mod report;
#[cfg(feature = "candle")]
pub(crate) mod staged;

#[cfg(feature = "candle")]
pub(crate) use apply::Commit;
pub(crate) use apply::apply;
pub use options::DEFAULT_STAGING_BUDGET;
pub use options::{DtypePolicy, LoadOptions};
pub(crate) use plan::plan;
#[cfg(feature = "candle")]
pub(crate) use plan::{Plan, Step};
pub use report::LoadReport;
