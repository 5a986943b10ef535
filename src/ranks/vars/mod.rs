//! Vars: what the ranks see of a plan's variables. How a value is read as
//! bytes, by type; the variables as bytes and the float types a plan
//! reduces; the checksums ranks compare; and the [`Manifest`](crate::ranks::Manifest)
//! they agree on before any collective.
//!
//! | file | role |
//! |---|---|
//! | `access.rs` | how a variable's value is read as bytes, by type |
//! | `checksum.rs` | the checksums ranks compare (xxh3-128) |
//! | `values.rs` | a plan's variables as bytes; the float types it reduces |
//! | `manifest.rs` | [`Manifest`](crate::ranks::Manifest) and its agreement |
//!
//! It may import `transport/` and the layer's `error.rs`.

pub(super) mod access;
pub(super) mod checksum;
pub(super) mod manifest;
pub(super) mod values;
