//! The type-erased codecs: the operations on one [`Checkpointable`] type
//! behind function pointers, which the save and load passes look a
//! variable's value up with by its `TypeId`.

use std::any::{Any, TypeId, type_name};
use std::io::Read;

use super::checkpointable::Checkpointable;
use super::dtype::Dtype;
use super::error::Error;

/// A value's dtype, shape and flatness.
pub(crate) type Meta = (Dtype, Vec<usize>, bool);

/// A value taken out of a variable by a load, kept to undo the load.
pub(crate) type Old = Box<dyn Any + Send + Sync>;

/// The operations on one checkpointable type, behind function pointers so
/// that a variable's value is matched by its `TypeId` in O(1).
#[derive(Clone, Copy)]
pub(crate) struct Codec {
    /// dtype, shape and flatness, without touching the bytes.
    pub(crate) meta: fn(&dyn Any) -> Option<Meta>,
    /// Streams a value's bytes ([`Checkpointable::write_le`]).
    pub(crate) write: WriteLe,
    /// [`Checkpointable::SHARED`]: loads stage a new value, then assign it.
    pub(crate) shared: bool,
    /// Reads a new value without touching the tree (for shared types).
    pub(crate) stage: fn(Source<'_>) -> Result<Old, Error>,
    /// Writes a staged value into the variable's value in place.
    pub(crate) assign: fn(&mut crate::ScopeTree, crate::VarId, Old) -> Result<(), Error>,
    /// Reads a value into the variable's value in place, or (when the
    /// value declines) replaces it; returns the replaced value.
    pub(crate) read_into: ReadInto,
    /// Puts an old value back (undo).
    pub(crate) restore: fn(&mut crate::ScopeTree, crate::VarId, Old) -> Result<(), crate::Error>,
    /// Puts a staged value in the variable; returns the replaced one.
    pub(crate) put: fn(&mut crate::ScopeTree, crate::VarId, Old) -> Result<Option<Old>, Error>,
    /// One of the crate's own types (`Vec`, `Box<[_]>`, `Tensor` of an
    /// element, and candle's `Var` in a candle store's load), which take a
    /// tensor of their dtype and size in place: read into their memory, or
    /// for a shared type assigned from a value read just before.
    pub(crate) builtin: bool,
}

/// Streams a value's little-endian bytes to a sink in pieces of at most a
/// given size.
pub(crate) type WriteLe =
    fn(&dyn Any, usize, &mut dyn FnMut(&[u8]) -> Result<(), Error>) -> Result<(), Error>;

/// Reads a value into a variable, in place where the value fits; returns
/// the replaced value, for undo.
pub(crate) type ReadInto =
    fn(&mut crate::ScopeTree, crate::VarId, Source<'_>) -> Result<Option<Old>, Error>;

/// Where a load's value comes from: straight from the file, or from bytes
/// already converted to the target dtype.
pub(crate) enum Source<'a> {
    Reader {
        dtype: Dtype,
        shape: &'a [usize],
        nbytes: usize,
        reader: &'a mut dyn Read,
    },
    Bytes {
        dtype: Dtype,
        shape: &'a [usize],
        bytes: Vec<u8>,
    },
}

fn meta_of<T: Checkpointable>(v: &dyn Any) -> Option<Meta> {
    let v = v.downcast_ref::<T>()?;
    Some((v.dtype(), v.shape().into_owned(), T::FLAT))
}

fn write_of<T: Checkpointable>(
    v: &dyn Any,
    chunk: usize,
    out: &mut dyn FnMut(&[u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    match v.downcast_ref::<T>() {
        Some(v) => v.write_le(chunk, out),
        None => Err(Error::BadTensor {
            reason: format!("a value to save is not a {}", type_name::<T>()),
        }),
    }
}

/// Builds a value of `T` from a load's source.
fn build<T: Checkpointable>(src: Source<'_>) -> Result<T, Error> {
    match src {
        Source::Reader {
            dtype,
            shape,
            nbytes,
            reader,
        } => T::read_le(dtype, shape, nbytes, reader),
        Source::Bytes {
            dtype,
            shape,
            bytes,
        } => T::from_le_bytes(dtype, shape, bytes),
    }
}

fn stage<T: Checkpointable>(src: Source<'_>) -> Result<Old, Error> {
    Ok(Box::new(build::<T>(src)?))
}

fn assign<T: Checkpointable>(
    tree: &mut crate::ScopeTree,
    var: crate::VarId,
    new: Old,
) -> Result<(), Error> {
    let new = new.downcast::<T>().map_err(|_| Error::BadTensor {
        reason: format!("a staged value is not a {}", type_name::<T>()),
    })?;
    tree.get_mut::<T>(var)?.assign(*new)
}

fn read_into<T: Checkpointable>(
    tree: &mut crate::ScopeTree,
    var: crate::VarId,
    src: Source<'_>,
) -> Result<Option<Old>, Error> {
    let holds = tree.is::<T>(var)?;
    // A value of the right type and size takes the bytes where it is.
    let src = match src {
        Source::Reader {
            dtype,
            shape,
            nbytes,
            reader,
        } if holds => {
            let v = tree.get_mut::<T>(var)?;
            if v.read_le_in_place(dtype, shape, nbytes, reader)? {
                return Ok(None);
            }
            Source::Reader {
                dtype,
                shape,
                nbytes,
                reader,
            }
        }
        other => other,
    };
    if T::SHARED && holds {
        // Its owners hold this value: the new elements are assigned into
        // it, and the value read for them is dropped at once (its memory
        // serves the next tensor's).
        assign::<T>(tree, var, stage::<T>(src)?)?;
        return Ok(None);
    }
    put::<T>(tree, var, stage::<T>(src)?)
}

fn restore<T: Checkpointable>(
    tree: &mut crate::ScopeTree,
    var: crate::VarId,
    old: Old,
) -> Result<(), crate::Error> {
    // The undo log only holds values `read_into::<T>` or `put::<T>` took out.
    match old.downcast::<T>() {
        Ok(v) => tree.set(var, *v),
        Err(_) => Ok(()),
    }
}

fn put<T: Checkpointable>(
    tree: &mut crate::ScopeTree,
    var: crate::VarId,
    new: Old,
) -> Result<Option<Old>, Error> {
    let new = new.downcast::<T>().map_err(|_| Error::BadTensor {
        reason: format!("a staged value is not a {}", type_name::<T>()),
    })?;
    // An uninitialised variable is simply set (`replace` returns `None`);
    // the load checked beforehand that an initialised one holds a `T`.
    let old = tree.replace::<T>(var, *new)?;
    Ok(old.map(|v| Box::new(v) as Old))
}

impl Codec {
    /// The codec of `T`.
    pub(crate) fn of<T: Checkpointable>() -> (TypeId, Self) {
        (
            TypeId::of::<T>(),
            Self {
                meta: meta_of::<T>,
                write: write_of::<T>,
                shared: T::SHARED,
                stage: stage::<T>,
                assign: assign::<T>,
                read_into: read_into::<T>,
                restore: restore::<T>,
                put: put::<T>,
                builtin: false,
            },
        )
    }
}
