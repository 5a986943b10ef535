//! The get path: [`CandleStore::get`] (get-or-create, checked on reuse),
//! [`CandleStore::var`], and the `SimpleBackend` implementation through
//! which `VarBuilder` calls them.

use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::Init;
use candle_nn::var_builder::SimpleBackend;

use super::error::Error;
use super::names::check_name;
use super::store::{CandleStore, Inner};
use crate::VarId;
use crate::sharing::VariableStore;

impl Inner {
    /// The tensor `get` returns for variable `id` (named `name`), once
    /// `check` accepts its `Var`: the `Var`'s own tensor, or a detached one
    /// if the name is frozen; the variable is recorded as asked for. The
    /// `Var` is borrowed from the tree, not cloned. [`Error::NotAVar`] if
    /// the variable holds something else or nothing; `check`'s error
    /// changes nothing. O(freeze rules).
    fn hand_out(
        &mut self,
        id: VarId,
        name: &str,
        check: impl FnOnce(&Var) -> Result<(), Error>,
    ) -> Result<Tensor, Error> {
        let var = var_ref(&self.store, id, name)?;
        check(var)?;
        let tensor = if self.is_frozen(name) {
            var.as_detached_tensor()
        } else {
            var.as_tensor().clone()
        };
        self.asked.insert(id.key, id.tree);
        Ok(tensor)
    }
}

impl CandleStore {
    /// Gets the variable `name` (dotted) or creates it with `init`: the
    /// backend of [`VarBuilder::get`](candle_nn::VarBuilder::get). On reuse
    /// the shape, dtype and device must be the variable's own. Returns the
    /// `Var`'s own tensor, so gradients reach it, or a detached copy of it
    /// when the name is frozen. O(name length) to find a variable; creating
    /// adds `init`.
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::ShapeMismatch`],
    /// [`Error::DtypeMismatch`], [`Error::DeviceMismatch`] or
    /// [`Error::NotAVar`] on reuse; [`Error::Sealed`] for an unknown name of
    /// a sealed store; [`Error::Sharing`] wrapping
    /// [`InitFailed`](crate::sharing::Error::InitFailed) when `init`
    /// fails. The store is unchanged after an error.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// use scopetree::candle::{CandleStore, Error};
    /// let store = CandleStore::new();
    /// let w = store.get((2, 2), "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
    /// assert_eq!(w.sum_all()?.to_scalar::<f32>()?, 4.0);
    /// let err = store.get((2, 2), "w", candle_nn::Init::Const(1.0), DType::F64, &Device::Cpu).unwrap_err();
    /// assert!(matches!(err, Error::DtypeMismatch { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get(
        &self,
        shape: impl Into<Shape>,
        name: &str,
        init: Init,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor, Error> {
        let shape: Shape = shape.into();
        let mut inner = self.lock();
        // A deferred load's variables go where the model first asks.
        inner.place_pending(device)?;
        let Inner {
            store,
            sealed,
            collections,
            ..
        } = &mut *inner;
        // One walk: found, or made and created. Freezing is this store's
        // rule, applied when listing and handing out; the sharing layer
        // records every variable it makes trainable, so that `unfreeze`
        // brings it back. An invalid name is never found, so it is checked
        // only here, before anything is made.
        let (id, created) = store.get_or_make(name, b'.', collections, |leaf, scope| {
            check_name(name)?;
            if *sealed {
                return Err(Error::Sealed {
                    name: name.to_owned(),
                });
            }
            init.var(shape.dims(), dtype, device)
                .map_err(|e| crate::sharing::Error::InitFailed {
                    name: crate::short::name(leaf),
                    scope: crate::short::path(&scope.replace('.', "/")),
                    source: crate::sharing::InitError::new(e),
                })
                .map_err(Error::from)
        })?;
        inner.hand_out(id, name, |var| {
            if created {
                Ok(())
            } else {
                check_reuse(var, name, Some(shape.dims()), dtype, device)
            }
        })
    }

    /// The variable `name` (dotted) as a `Var`, or `None`. O(name length).
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::NotAVar`] if the name holds another
    /// value.
    ///
    /// ```
    /// use candle_core::{DType, Device};
    /// let store = scopetree::candle::CandleStore::new();
    /// candle_nn::linear(3, 2, store.var_builder(DType::F32, &Device::Cpu).pp("fc"))?;
    /// assert_eq!(store.var("fc.weight")?.expect("built").dims(), &[2, 3]);
    /// assert!(store.var("fc.nope")?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn var(&self, name: &str) -> Result<Option<Var>, Error> {
        check_name(name)?;
        let inner = self.placed()?;
        Ok(existing(&inner, name)?.map(|(_, v)| v))
    }
}

/// The `Var` named `name` (dotted, checked) with its handle, if any.
fn existing(inner: &Inner, name: &str) -> Result<Option<(VarId, Var)>, Error> {
    let Some(id) = inner.store.find_sep(name, b'.') else {
        return Ok(None);
    };
    Ok(Some((id, var_ref(&inner.store, id, name)?.clone())))
}

/// The `Var` variable `id` (named `name`) holds; [`Error::NotAVar`] if it
/// holds something else or nothing.
fn var_ref<'a>(store: &'a VariableStore, id: VarId, name: &str) -> Result<&'a Var, Error> {
    let tree = store.tree();
    match tree.get::<Var>(id) {
        Ok(v) => Ok(v),
        Err(_) => Err(Error::NotAVar {
            name: name.to_owned(),
            holds: tree
                .type_name(id)
                .map_err(crate::sharing::Error::from)?
                .unwrap_or("nothing"),
        }),
    }
}

/// The checks a `get` makes of an existing variable: its shape, when one is
/// asked for (`get_unchecked` asks for none), its dtype and its device.
fn check_reuse(
    var: &Var,
    name: &str,
    dims: Option<&[usize]>,
    dtype: DType,
    device: &Device,
) -> Result<(), Error> {
    if let Some(dims) = dims.filter(|&d| d != var.dims()) {
        return Err(Error::ShapeMismatch {
            name: name.to_owned(),
            asked: dims.to_vec(),
            found: var.dims().to_vec(),
        });
    }
    if var.dtype() != dtype {
        return Err(Error::DtypeMismatch {
            name: name.to_owned(),
            asked: dtype,
            found: var.dtype(),
        });
    }
    if !var.device().same_device(device) {
        return Err(Error::DeviceMismatch {
            name: name.to_owned(),
            asked: format!("{:?}", device.location()),
            found: format!("{:?}", var.device().location()),
        });
    }
    Ok(())
}

/// The backend `VarBuilder` calls: [`CandleStore::get`], with errors
/// wrapped in `candle_core::Error`.
impl SimpleBackend for CandleStore {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        Ok(CandleStore::get(self, s, name, h, dtype, dev)?)
    }

    /// An existing variable of any shape, checked for dtype and device.
    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        check_name(name)?;
        let mut inner = self.lock();
        inner.place_pending(dev)?;
        let Some(id) = inner.store.find_sep(name, b'.') else {
            return Err(Error::Missing {
                name: name.to_owned(),
            }
            .into());
        };
        Ok(inner.hand_out(id, name, |var| check_reuse(var, name, None, dtype, dev))?)
    }

    /// Whether `name` is a `Var` of the store (what [`var`](CandleStore::var)
    /// finds, without cloning it: `layer_norm` asks this on every build).
    fn contains_tensor(&self, name: &str) -> bool {
        // No name check: the walk never finds an invalid name.
        let inner = self.lock();
        let store = &inner.store;
        inner
            .pending
            .as_ref()
            .is_some_and(|p| p.keys.contains(name))
            || store
                .find_sep(name, b'.')
                .is_some_and(|id| store.tree().get::<Var>(id).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop that builds and deletes a layer keeps the record of handed-out
    /// variables bounded by the live ones.
    #[test]
    fn the_record_of_asked_variables_stays_bounded_under_churn() {
        let store = CandleStore::new();
        for _ in 0..1_000 {
            store
                .get(2, "tmp.w", Init::Const(0.), DType::F32, &Device::Cpu)
                .expect("created");
            store
                .with_store(|s| {
                    let tmp = s.tree().kid(s.tree().root(), "tmp")?.expect("built");
                    s.delete_scope(tmp)
                })
                .expect("deleted");
        }
        let asked = store.lock().asked.len();
        assert!(asked <= 2 + 64, "{asked} handles kept for no live variable");
    }
}
