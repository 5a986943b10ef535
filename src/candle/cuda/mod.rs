//! CUDA devices (feature `cuda`): page-locked staging buffers for loads to
//! the device and saves from it, and the device side of the store's staged
//! copies.
//!
//! | file | holds |
//! |---|---|
//! | `pinned` | `Pinned`: a page-locked host buffer and the event of its last copy; the crate's only `unsafe` code |
//! | `copy` | copies between staging buffers and a `CudaStorage`'s elements, by dtype |
//! | `save` | a device tensor's bytes streamed through two page-locked buffers, for saves |

mod copy;
mod pinned;
mod save;

pub(crate) use copy::{Timer, fresh, read_range, write_range};
pub(crate) use pinned::Pinned;
pub(crate) use save::{free_save_staging, save_staging_bytes, write_device};
