//! scopetree checkpoints behind burn-store's
//! [`ModuleStore`](burn_store::ModuleStore) (feature `burn`).
//!
//! [`CheckpointStore`] saves a burn module as one safetensors file or as a
//! sharded Hugging Face checkpoint, and loads either back strictly and
//! atomically, through the checkpoint layer: its header checks, its index
//! reading, its float conversions and its atomic writes. The store works
//! with any backend; the layer enables none (the tests and the example use
//! burn's ndarray backend, feature `burn-ndarray`). See `docs/burn.md`.
//!
//! | file | holds |
//! |---|---|
//! | `store` | [`CheckpointStore`]: where it saves and loads, and its options |
//! | `module_store` | the `ModuleStore` impl; the checkpoint's tensors as burn-store lists them |
//! | `save` | a save: the module collected, renamed, written a file at a time |
//! | `check` | a load's checks: the module matched against the checkpoint, nothing read or changed |
//! | `load` | a load: the checks, then each shard read, checked and applied |
//! | `names` | burn's dtypes against safetensors', key remapping and its collisions |
//! | `error` | [`Error`], this layer's errors |
//!
//! ```
//! # use burn_core as burn;
//! # if !cfg!(feature = "burn-ndarray") { return Ok(()); }
//! # let tmp = tempfile::tempdir()?; let dir = tmp.path().to_path_buf();
//! use burn_core::module::{Module, Param};
//! use burn_core::tensor::{Device, Tensor};
//! use burn_store::ModuleSnapshot;
//! use scopetree::burn::{CheckpointStore, Error};
//!
//! #[derive(Module, Debug)]
//! struct Net { w: Param<Tensor<1>> }
//!
//! let device = Device::default();
//! let net = Net { w: Param::from_tensor(Tensor::ones([4], &device)) };
//! net.save_into(&mut CheckpointStore::sharded(&dir))?;
//!
//! // A module of another shape: one error, and the module is unchanged.
//! let mut other = Net { w: Param::from_tensor(Tensor::zeros([3], &device)) };
//! let err = other.load_from(&mut CheckpointStore::sharded(&dir)).unwrap_err();
//! assert!(matches!(err, Error::Mismatch { .. }));
//! assert_eq!(other.w.val().into_data().try_into_vec::<f32>().unwrap(), [0.0; 3]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod check;
mod error;
mod load;
mod module_store;
mod names;
mod save;
mod store;

pub use error::Error;
pub use store::CheckpointStore;

/// The code blocks of `docs/burn.md`, compiled and run as doctests.
#[cfg(all(doctest, feature = "burn-ndarray"))]
#[doc = include_str!("../../docs/burn.md")]
struct BurnDocDoctests;
