//! Walks: the only code that follows parent and kid links. Parents, kids
//! and pre-order are one iterator core ([`KeyWalk`]); the lookup walk and
//! paths are built on the dense parent array.

use std::fmt::Write;

use slotmap::{Key, SlotMap};

use super::interner::Sym;
use super::keys::{SlotLabel, slot_index};
use super::slots::{ScopeSlot, VarSlot, sig_bit};
use super::{Arena, Interner, ScopeKey, TreeTag, VarKey};

/// A read-only view of the arena's structure: scopes, parents and names,
/// without the variable slots. The worker split holds one while it hands
/// out the variable slots mutably.
#[derive(Copy, Clone)]
pub(crate) struct Structure<'a> {
    scopes: &'a SlotMap<ScopeKey, ScopeSlot>,
    up: &'a [ScopeKey],
    names: &'a Interner,
    tag: TreeTag,
}

/// How a [`KeyWalk`] steps from one scope to the next.
#[derive(Copy, Clone)]
enum Step {
    /// To the parent: ancestors, nearest first.
    Up,
    /// To the next sibling: the kids of one scope, in creation order.
    Across,
}

/// A walk over scope keys: the one core behind parents and kids.
#[derive(Clone)]
pub(crate) struct KeyWalk<'a> {
    view: Structure<'a>,
    next: ScopeKey,
    step: Step,
}

impl KeyWalk<'_> {
    /// The tag of the arena walked.
    #[inline]
    pub(crate) fn tag(&self) -> TreeTag {
        self.view.tag
    }
}

impl Iterator for KeyWalk<'_> {
    type Item = ScopeKey;
    #[inline]
    fn next(&mut self) -> Option<ScopeKey> {
        let cur = self.next;
        let slot = self.view.scopes.get(cur)?;
        self.next = match self.step {
            Step::Up => self.view.parent_key(cur),
            Step::Across => slot.next_sib,
        };
        Some(cur)
    }
}

impl std::iter::FusedIterator for KeyWalk<'_> {}

impl<'a> Structure<'a> {
    /// The tag of the arena viewed.
    #[inline]
    pub(crate) fn tag(&self) -> TreeTag {
        self.tag
    }

    /// The parent slot entry of a key (null for the root).
    #[inline]
    fn parent_key(&self, key: ScopeKey) -> ScopeKey {
        self.up.get(slot_index(key)).copied().unwrap_or_default()
    }

    /// `key` and its ancestors, nearest first, ending at the root. O(1) per
    /// step.
    pub(crate) fn parents(&self, key: ScopeKey) -> KeyWalk<'a> {
        KeyWalk {
            view: *self,
            next: key,
            step: Step::Up,
        }
    }

    /// The kids of `key`, in creation order. O(1) per step.
    pub(crate) fn kids(&self, key: ScopeKey) -> KeyWalk<'a> {
        KeyWalk {
            view: *self,
            next: self
                .scopes
                .get(key)
                .map_or(ScopeKey::null(), |s| s.first_kid),
            step: Step::Across,
        }
    }

    /// The scope after `cur` in a pre-order walk of the subtree of `top`,
    /// and how many levels the walk climbs to reach it (-1 when it descends
    /// to a kid). O(climb).
    pub(crate) fn preorder_next(&self, cur: ScopeKey, top: ScopeKey) -> Option<(ScopeKey, isize)> {
        let slot = self.scopes.get(cur)?;
        if !slot.first_kid.is_null() {
            return Some((slot.first_kid, -1));
        }
        for (climbed, k) in (0isize..).zip(self.parents(cur)) {
            if k == top {
                return None;
            }
            let next = self.scopes.get(k).map_or(ScopeKey::null(), |s| s.next_sib);
            if !next.is_null() {
                return Some((next, climbed));
            }
        }
        None
    }

    /// The text of a name of this arena.
    #[inline]
    pub(crate) fn name_text(&self, sym: Sym) -> &'a str {
        self.names.text(sym)
    }

    /// The path of a live scope: its components from below the root, joined
    /// by `/`; a named scope shows its name, an unnamed one `#index v version`.
    /// `""` for the root. O(depth).
    pub(crate) fn path(&self, key: ScopeKey) -> String {
        let mut parts: Vec<ScopeKey> = self
            .parents(key)
            .take_while(|&k| !self.parent_key(k).is_null())
            .collect();
        parts.reverse();
        let mut out = String::new();
        for (i, k) in parts.into_iter().enumerate() {
            if i > 0 {
                out.push('/');
            }
            self.push_component(&mut out, k);
        }
        out
    }

    /// Appends one path component: the scope's name or `#index v version`.
    pub(crate) fn push_component(&self, out: &mut String, key: ScopeKey) {
        match self.scopes.get(key).and_then(ScopeSlot::name) {
            Some(sym) => out.push_str(self.names.text(sym)),
            None => {
                let _ = write!(out, "#{}", SlotLabel(key.data()));
            }
        }
    }
}

impl Arena {
    /// The variable named `sym` in the table of `key`, for the lookup walk
    /// when the level's signature has the name's bit.
    #[inline]
    fn probe(&self, key: ScopeKey, sym: Sym) -> Option<VarKey> {
        self.scopes.get(key)?.vars.find(sym)
    }

    /// A read-only view of the structure.
    #[inline]
    pub(crate) fn structure(&self) -> Structure<'_> {
        Structure {
            scopes: &self.scopes,
            up: &self.up,
            names: &self.names,
            tag: self.tag,
        }
    }

    /// The structure, read-only, beside every live variable slot, mutable:
    /// what the worker split divides. The slots come in key order.
    pub(crate) fn split_values(
        &mut self,
    ) -> (Structure<'_>, impl Iterator<Item = (VarKey, &mut VarSlot)>) {
        let view = Structure {
            scopes: &self.scopes,
            up: &self.up,
            names: &self.names,
            tag: self.tag,
        };
        let vars = self.vars.iter_mut().filter(|(_, s)| !s.is_retired());
        (view, vars)
    }

    /// `key` and its ancestors, nearest first (see [`Structure::parents`]).
    #[inline]
    pub(crate) fn parents(&self, key: ScopeKey) -> KeyWalk<'_> {
        self.structure().parents(key)
    }

    /// The kids of `key` (see [`Structure::kids`]).
    #[inline]
    pub(crate) fn kids(&self, key: ScopeKey) -> KeyWalk<'_> {
        self.structure().kids(key)
    }

    /// The path of a live scope (see [`Structure::path`]).
    pub(crate) fn path(&self, key: ScopeKey) -> String {
        self.structure().path(key)
    }

    /// The nearest scope from `start` up to the root that holds a variable
    /// named `sym`, with that variable. O(depth): one load of the dense
    /// parent and signature arrays per level, and a table probe only where
    /// the signature has the name's bit.
    #[inline]
    pub(crate) fn find_sym(&self, start: ScopeKey, sym: Sym) -> Option<(ScopeKey, VarKey)> {
        let bit = sig_bit(sym);
        let mut key = start;
        loop {
            let i = slot_index(key);
            let (Some(&parent), Some(&sig)) = (self.up.get(i), self.sigs.get(i)) else {
                return None;
            };
            if sig & bit != 0 {
                if let Some(v) = self.probe(key, sym) {
                    return Some((key, v));
                }
            }
            if parent.is_null() {
                return None;
            }
            key = parent;
        }
    }
}
