//! The crate-internal API that the layers above the arena (sharing, steps,
//! workers, checkpoints) use instead of the arena's fields. Every method
//! takes raw keys that the caller already holds and treats a dead key as
//! absent; none of them panics.
//!
//! The names and signatures here are the contract between the arena and its
//! layers: the arena may change its storage, not these.

use crate::arena::{ScopeId, ScopeKey, TextFind, VarId, VarKey};
use crate::tree::ScopeTree;

pub(crate) use crate::arena::Sym;

impl ScopeTree {
    /// The root scope's key. O(1).
    #[inline]
    pub(crate) fn root_key(&self) -> ScopeKey {
        self.arena().root()
    }

    /// Wraps a key of this tree into a public handle. O(1).
    #[inline]
    pub(crate) fn scope_id(&self, key: ScopeKey) -> ScopeId {
        ScopeId::new(key, self.tag())
    }

    /// Wraps a key of this tree into a public handle. O(1).
    #[inline]
    pub(crate) fn var_id(&self, key: VarKey) -> VarId {
        VarId::new(key, self.tag())
    }

    /// Whether `key` is a live scope. O(1).
    #[inline]
    pub(crate) fn scope_is_live(&self, key: ScopeKey) -> bool {
        self.arena().scope(key).is_some()
    }

    /// Whether `key` is a live variable. O(1).
    #[inline]
    pub(crate) fn var_is_live(&self, key: VarKey) -> bool {
        self.arena().var(key).is_some()
    }

    /// The parent of a live scope; `None` for the root or a dead key. O(1).
    #[inline]
    pub(crate) fn parent_of(&self, key: ScopeKey) -> Option<ScopeKey> {
        self.arena().parent(key)
    }

    /// The depth of a live scope (the root is 0). O(1).
    #[inline]
    pub(crate) fn depth_of(&self, key: ScopeKey) -> Option<u32> {
        self.arena().scope(key)?.depth()
    }

    /// `key` and its ancestors, nearest first, ending at the root; empty for a
    /// dead key. O(1) per step.
    pub(crate) fn ancestor_keys(&self, key: ScopeKey) -> impl Iterator<Item = ScopeKey> + '_ {
        let live = self.scope_is_live(key);
        self.arena().parents(key).take_while(move |_| live)
    }

    /// Whether the live scope `key` is `top` or below it. O(depth(key) −
    /// depth(top)).
    pub(crate) fn is_within(&self, key: ScopeKey, top: ScopeKey) -> bool {
        let (Some(d), Some(top_depth)) = (self.depth_of(key), self.depth_of(top)) else {
            return false;
        };
        d >= top_depth && self.ancestor_keys(key).nth((d - top_depth) as usize) == Some(top)
    }

    /// The owner scope of a live variable. O(1).
    #[inline]
    pub(crate) fn owner_of(&self, key: VarKey) -> Option<ScopeKey> {
        self.arena().var(key)?.owner()
    }

    /// The symbol of `name` if some scope or variable uses it (or it is
    /// pinned); no validation, so a name with `/` is simply absent. O(len).
    #[inline]
    pub(crate) fn sym_of(&self, name: &str) -> Option<Sym> {
        self.arena().names().get(name)
    }

    /// The generation of a symbol's slot: bumped each time the name is
    /// freed, so an unchanged `(symbol, generation)` pair still names the
    /// same text. O(1).
    #[inline]
    pub(crate) fn sym_generation(&self, sym: Sym) -> u32 {
        self.arena().names().generation(sym)
    }

    /// The text of a symbol of this tree. O(1).
    #[inline]
    pub(crate) fn sym_text(&self, sym: Sym) -> &str {
        self.arena().names().text(sym)
    }

    /// The kid of the live scope `parent` named `sym`. O(1).
    #[inline]
    pub(crate) fn kid_key(&self, parent: ScopeKey, sym: Sym) -> Option<ScopeKey> {
        self.arena().kid_by_sym(parent, sym)
    }

    /// The variable named `sym` held by the live scope `scope` itself. O(1).
    #[inline]
    pub(crate) fn local_var_key(&self, scope: ScopeKey, sym: Sym) -> Option<VarKey> {
        self.arena().scope(scope)?.vars().find(sym)
    }

    /// The variable named `text` held by `scope` itself: by a text scan when
    /// the scope holds few variables (see [`TextFind`]), else by symbol.
    /// O(len).
    #[inline]
    pub(crate) fn local_var_named(&self, scope: ScopeKey, text: &str) -> Option<VarKey> {
        match self.local_var_by_text(scope, text.as_bytes()) {
            TextFind::Found(var) => Some(var),
            TextFind::Absent => None,
            TextFind::Unscanned => self.local_var_key(scope, self.sym_of(text)?),
        }
    }

    /// The variable named `text` in `scope`, found without interning `text`
    /// when the scope holds few variables (see [`TextFind`]); a dead scope
    /// holds nothing. O(1).
    #[inline]
    pub(crate) fn local_var_by_text(&self, scope: ScopeKey, text: &[u8]) -> TextFind {
        match self.arena().scope(scope) {
            Some(slot) => slot.vars().find_text(text, self.arena().names()),
            None => TextFind::Absent,
        }
    }
}

impl ScopeTree {
    /// The owner scope and name symbol of a live variable, in one slot read.
    /// O(1).
    #[inline]
    pub(crate) fn var_place(&self, key: VarKey) -> Option<(ScopeKey, Sym)> {
        let slot = self.arena().var(key)?;
        Some((slot.owner()?, slot.name()))
    }
}

impl ScopeTree {
    /// The value of a live variable as `&dyn Any`, for layers that dispatch
    /// on the value's `TypeId` (the checkpoint layer finds a variable's
    /// checkpointable type this way in O(1) instead of trying every type);
    /// `None` when the handle is stale or foreign or the variable has no
    /// value. O(1).
    #[cfg(feature = "safetensors")]
    pub(crate) fn value_any(&self, var: VarId) -> Option<&dyn std::any::Any> {
        let slot = self.var_slot(var).ok()?;
        slot.value_any()
    }
}

impl ScopeTree {
    /// The `TypeId` of the value of the live variable `key`, in one slot
    /// read (no handle check: the caller holds a key of this tree); `None`
    /// when the key is dead or the variable has no value. Lets the sharing
    /// layer check a shared variable's type without going through a handle.
    /// O(1).
    #[inline]
    pub(crate) fn value_type_id(&self, key: VarKey) -> Option<std::any::TypeId> {
        let any = self.arena().var(key)?.value_any()?;
        Some(std::any::Any::type_id(any))
    }
}
