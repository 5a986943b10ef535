//! The candle backend's access to a [`VariableStore`] by names whose
//! components are separated by a byte other than `/` (`.` for candle's
//! `h.3.attn.q.weight`): find, get-or-create in one walk (starting from the
//! deepest scope shared with the last name walked, see
//! [`Prefixes`](crate::sharing::prefix::Prefixes)), and
//! adopting variables a checkpoint load made.

use std::any::TypeId;

use smallvec::SmallVec;

use crate::arena::{ScopeKey, VarId};
use crate::layer_api::Sym;
use crate::sharing::collections::{GLOBAL_VARIABLES, TRAINABLE_VARIABLES};
use crate::sharing::error::Error;
use crate::sharing::shape::{HasShape, Shape};
use crate::sharing::store::VariableStore;

impl VariableStore {
    /// The variable at the full name `name` whose components are separated
    /// by `sep` (`.` for candle names), walked without building a string
    /// from the deepest scope it shares with the last name
    /// [`get_or_make`](Self::get_or_make) walked; `None` if absent or if a
    /// component is empty or holds `/` (no tree name is empty or holds `/`,
    /// and a leading separator is caught here). O(len).
    pub(crate) fn find_sep(&self, name: &str, sep: u8) -> Option<VarId> {
        let (dirs, leaf) = split_leaf(name, sep);
        if leading_sep(name, sep) {
            return None;
        }
        let from = self.prefixes.start(&self.tree, dirs, sep);
        let (k, at, _) = self.walk_sep(from.key, dirs, from.done, sep, |_, _| ());
        if at < dirs.len() {
            return None;
        }
        let v = self.tree.local_var_named(k, leaf)?;
        Some(self.tree.var_id(v))
    }

    /// Walks the scope path `dirs` down from `key`, the scope of its first
    /// `done` bytes, as far as its scopes exist, calling `level` with the
    /// end of each component found and its scope. Returns the deepest scope
    /// reached, the length of its path in `dirs` and, if the walk stopped
    /// at a component whose name the tree holds, that name's symbol (so that
    /// a caller creating the scope need not hash it again). O(len).
    fn walk_sep(
        &self,
        mut key: ScopeKey,
        dirs: &str,
        mut done: usize,
        sep: u8,
        mut level: impl FnMut(usize, ScopeKey),
    ) -> (ScopeKey, usize, Option<Sym>) {
        while done < dirs.len() {
            let (begin, end) = next_component(dirs, done, sep);
            let Some(sym) = self.tree.sym_of(&dirs[begin..end]) else {
                return (key, done, None);
            };
            let Some(kid) = self.tree.kid_key(key, sym) else {
                return (key, done, Some(sym));
            };
            level(end, kid);
            (key, done) = (kid, end);
        }
        (key, done, None)
    }

    /// Get-or-create at the full name `name` (components separated by
    /// `sep`) from the root, walking it once (the candle store's `get`): the
    /// variable if one exists there, else a new one holding
    /// `make(leaf, scope path)`'s value, with the missing scopes, recorded as
    /// `get_variable` records a trainable variable (`collections`, its
    /// shape), except in the full-name index: the candle store finds its
    /// variables by this walk, so a `/`-joined copy of every name would be
    /// built for nothing. `make` runs before anything is created,
    /// so its failure changes nothing. Returns the variable and whether it
    /// was created. O(len) plus `make`.
    ///
    /// The walk starts at the deepest scope the name shares with the last
    /// one walked (see
    /// [`Prefixes`](crate::sharing::prefix::Prefixes)): a model's names come in runs
    /// (`h.3.attn.q.weight`, `h.3.attn.q.bias`, `h.3.attn.k.weight`), so
    /// most walks take one step.
    ///
    /// A name with an empty component or a `/` is never found (no tree
    /// name is empty or holds `/`, and a leading separator is caught here),
    /// so the caller can leave its name check to `make`, the path that
    /// creates.
    pub(crate) fn get_or_make<T, E>(
        &mut self,
        name: &str,
        sep: u8,
        collections: &[String],
        make: impl FnOnce(&str, &str) -> Result<T, E>,
    ) -> Result<(VarId, bool), E>
    where
        T: HasShape + Send + Sync + 'static,
        E: From<Error>,
    {
        let (dirs, leaf) = split_leaf(name, sep);
        let from = self.prefixes.start(&self.tree, dirs, sep);
        let mut levels: SmallVec<[(usize, ScopeKey); 8]> = SmallVec::new();
        let (mut k, at, mut next_sym) =
            self.walk_sep(from.key, dirs, from.done, sep, |end, key| {
                levels.push((end, key));
            });
        // The symbols of the first missing scope and of the leaf, when the
        // tree holds those names: creating with them hashes no text again.
        let mut leaf_sym = None;
        if at == dirs.len() && !leading_sep(name, sep) {
            // By symbol, not by a text scan: a model's build mostly misses
            // here, and the create that follows reuses the symbol.
            leaf_sym = self.tree.sym_of(leaf);
            let v = leaf_sym.and_then(|s| self.tree.local_var_key(k, s));
            if !dirs.is_empty() {
                self.prefixes.record(&self.tree, dirs, sep, from, &levels);
            }
            if let Some(v) = v {
                return Ok((self.tree.var_id(v), false));
            }
        }
        let value = make(leaf, dirs)?;
        let shape = value.shape();
        let mut first_new: Option<ScopeKey> = None;
        let created = (|| -> Result<VarId, Error> {
            let mut done = at;
            while done < dirs.len() {
                let (begin, end) = next_component(dirs, done, sep);
                let name = self.name_ref(next_sym.take(), &dirs[begin..end]);
                k = self.tree.new_named_scope(self.tree.scope_id(k), name)?.key;
                first_new.get_or_insert(k);
                levels.push((end, k));
                done = end;
            }
            let name = self.name_ref(leaf_sym, leaf);
            self.create_var_with(k, name, Box::new(value))
        })();
        let var = match created {
            Ok(v) => v,
            Err(e) => {
                if let Some(s) = first_new {
                    let _ = self.tree.delete_scope(self.tree.scope_id(s));
                }
                return Err(e.into());
            }
        };
        if first_new.is_some() {
            self.prefixes.record(&self.tree, dirs, sep, from, &levels);
        }
        self.record_new_var(
            var.key,
            None,
            collections,
            (shape, true, TypeId::of::<T>(), std::any::type_name::<T>()),
        );
        Ok((var, true))
    }

    /// The name `text` as its symbol `sym` when the walk found one (so
    /// that creating with it hashes no text again), else as text. O(1).
    fn name_ref<'a>(&self, sym: Option<Sym>, text: &'a str) -> crate::NameRef<'a> {
        match sym {
            Some(sym) => crate::NameRef::Sym(self.tree.symbol_of(sym)),
            None => crate::NameRef::Str(text),
        }
    }

    /// Records a tree variable made outside `get_variable` (a checkpoint
    /// load's `create`) as the candle store's `get` records the variables
    /// it makes: metadata, [`GLOBAL_VARIABLES`] and, when `trainable`,
    /// [`TRAINABLE_VARIABLES`], not the full-name index. A variable the
    /// store already knows is left as it is. O(collections).
    pub(crate) fn adopt(&mut self, var: VarId, shape: Shape, trainable: bool) -> Result<(), Error> {
        self.tree.var_slot(var)?;
        if self.var_meta.contains_key(var.key) {
            return Ok(());
        }
        if self.tree.var_place(var.key).is_none() {
            return Ok(());
        }
        let type_id = self
            .tree
            .value_type_id(var.key)
            .unwrap_or(TypeId::of::<()>());
        let type_name = self.tree.type_name(var)?.unwrap_or("()");
        let mut collections = vec![GLOBAL_VARIABLES.to_owned()];
        if trainable {
            collections.push(TRAINABLE_VARIABLES.to_owned());
        }
        self.record_new_var(
            var.key,
            None,
            &collections,
            (shape, trainable, type_id, type_name),
        );
        Ok(())
    }
}

/// `name` split at its last `sep` (an ASCII byte) into the scope path and
/// the leaf; the path is empty for a name without `sep`. O(len).
fn split_leaf(name: &str, sep: u8) -> (&str, &str) {
    debug_assert!(sep.is_ascii());
    match name.bytes().rposition(|b| b == sep) {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => ("", name),
    }
}

/// Whether `name` starts with `sep`: an empty first component, which
/// [`split_leaf`] would otherwise turn into a leaf at the root (`.w` into
/// `w`). O(1).
fn leading_sep(name: &str, sep: u8) -> bool {
    name.as_bytes().first() == Some(&sep)
}

/// The component of the scope path `dirs` after its first `done` bytes
/// (0, or the end of a component): where it begins and ends. O(its length).
fn next_component(dirs: &str, done: usize, sep: u8) -> (usize, usize) {
    let begin = if done == 0 { 0 } else { done + 1 };
    let end = find_byte(&dirs[begin..], sep).map_or(dirs.len(), |i| begin + i);
    (begin, end)
}

/// The first `b` (an ASCII byte) in `s`: a plain loop, cheaper than a
/// `char` search on the short components of a candle name. O(len).
fn find_byte(s: &str, b: u8) -> Option<usize> {
    debug_assert!(b.is_ascii());
    s.bytes().position(|c| c == b)
}
