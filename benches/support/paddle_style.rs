//! A textbook Paddle-style scope, the baseline of the benches.
//!
//! This is *not* part of `scopetree`: it is the design the brief compares
//! against, written the way PaddlePaddle's `framework::Scope` is (seed files
//! 000–003): a heap node per scope, a parent pointer (`Arc` here), one
//! `Mutex<HashMap<String, Box<Var>>>` per level, and a recursive `FindVar`
//! that locks and hashes at every level on the way to the root. Kids are kept
//! in a list that `delete_scope` searches, as Paddle's `DeleteScope` does.
//!
//! Lookups return the address of the boxed variable, as Paddle's
//! `Variable*` does; the benches only compare and `black_box` it.
//! Ownership: a kid holds an `Arc` to its parent and the parent lists its kids
//! weakly (a strong list would be a reference cycle); the caller holds the
//! scopes it made, as a Paddle executor holds its `Scope*`.
//! The hasher is a type parameter: `PaddleScope` uses the standard library's
//! default (SipHash), `PaddleScopeFx` an Fx-style hasher like the one
//! `scopetree` uses, so that a reader can see how much of the gap is hashing.

#![allow(dead_code)]

use std::any::Any;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

/// A variable: an optional boxed value, like Paddle's `Variable`.
#[derive(Default)]
pub struct Var {
    value: Option<Box<dyn Any + Send + Sync>>,
}

impl Var {
    /// Sets the value (boxing it, as Paddle's `GetMutable<T>` does on first use).
    pub fn set<T: Any + Send + Sync>(&mut self, v: T) {
        match self.value.as_mut().and_then(|b| b.downcast_mut::<T>()) {
            Some(old) => *old = v,
            None => self.value = Some(Box::new(v)),
        }
    }

    /// Reads the value as `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.value.as_ref()?.downcast_ref::<T>()
    }
}

/// One scope: parent pointer, kids list, and a locked hash map of variables.
pub struct Scope<S> {
    parent: Option<Arc<Scope<S>>>,
    kids: Mutex<Vec<Weak<Scope<S>>>>,
    vars: Mutex<HashMap<String, Box<Var>, S>>,
}

/// With the standard library's default hasher (SipHash-1-3).
pub type PaddleScope = Scope<std::hash::RandomState>;
/// With `rustc-hash`'s Fx hasher.
pub type PaddleScopeFx = Scope<rustc_hash::FxBuildHasher>;

impl<S: BuildHasher + Default> Scope<S> {
    /// A new root scope.
    pub fn new_root() -> Arc<Self> {
        Arc::new(Scope {
            parent: None,
            kids: Mutex::new(Vec::new()),
            vars: Mutex::new(HashMap::default()),
        })
    }

    /// `Scope::NewScope`: a kid, owned by this scope's kid list.
    pub fn new_scope(self: &Arc<Self>) -> Arc<Self> {
        let kid = Arc::new(Scope {
            parent: Some(Arc::clone(self)),
            kids: Mutex::new(Vec::new()),
            vars: Mutex::new(HashMap::default()),
        });
        self.kids.lock().unwrap().push(Arc::downgrade(&kid));
        kid
    }

    /// `Scope::DeleteScope`: finds the kid in the list (O(kids), as Paddle's
    /// `std::find` on its kid list) and drops it.
    pub fn delete_scope(&self, kid: Arc<Self>) {
        let mut kids = self.kids.lock().unwrap();
        if let Some(pos) = kids
            .iter()
            .position(|k| std::ptr::eq(k.as_ptr(), Arc::as_ptr(&kid)))
        {
            kids.remove(pos);
        }
        drop(kids);
        drop(kid);
    }

    /// `Scope::Var`: finds the local variable or creates it.
    pub fn var(&self, name: &str) -> NonNull<Var> {
        let mut vars = self.vars.lock().unwrap();
        if let Some(v) = vars.get(name) {
            return NonNull::from(&**v);
        }
        let v = vars.entry(name.to_owned()).or_default();
        NonNull::from(&**v)
    }

    /// Sets the value of the local variable `name`, creating it if needed.
    pub fn set<T: Any + Send + Sync>(&self, name: &str, value: T) {
        let mut vars = self.vars.lock().unwrap();
        match vars.get_mut(name) {
            Some(v) => v.set(value),
            None => vars.entry(name.to_owned()).or_default().set(value),
        }
    }

    /// Reads `name` as `T`, searching the parents like `FindVar` does.
    pub fn read<T: Any + Copy>(&self, name: &str) -> Option<T> {
        let found = self
            .vars
            .lock()
            .unwrap()
            .get(name)
            .map(|v| v.get::<T>().copied());
        match found {
            Some(v) => v,
            None => self.parent.as_ref()?.read(name),
        }
    }

    /// `Scope::FindVar`: this scope, then the parent, recursively, locking
    /// and hashing at each level.
    pub fn find_var(&self, name: &str) -> Option<NonNull<Var>> {
        if let Some(v) = self.find_var_locally(name) {
            return Some(v);
        }
        self.parent.as_ref()?.find_var(name)
    }

    /// `Scope::FindLocalVar`.
    pub fn find_var_locally(&self, name: &str) -> Option<NonNull<Var>> {
        self.vars
            .lock()
            .unwrap()
            .get(name)
            .map(|v| NonNull::from(&**v))
    }

    /// Number of direct kids.
    pub fn kid_count(&self) -> usize {
        self.kids.lock().unwrap().len()
    }
}

impl<S> Drop for Scope<S> {
    /// Releases the chain of parents with a loop, so that dropping the last
    /// handle to a deep chain does not recurse through nested `Arc` drops.
    fn drop(&mut self) {
        let mut parent = self.parent.take();
        while let Some(p) = parent {
            match Arc::try_unwrap(p) {
                Ok(mut s) => parent = s.parent.take(),
                Err(_) => break,
            }
        }
    }
}
