//! Memory diagnostics: the sizes the brief budgets (at most 128 B per scope
//! and 64 B per variable slot, value payload excluded) and the inline width
//! of a scope's variable table. [`ScopeTree::heap_bytes`](crate::ScopeTree::heap_bytes)
//! gives a whole tree's figure.

/// How many variables a scope holds inline, before its table moves to the heap.
///
/// ```
/// assert_eq!(scopetree::diagnostics::INLINE_VARS, 4);
/// ```
pub const INLINE_VARS: usize = crate::arena::INLINE_VARS;

/// Bytes of one scope in the arena: its slot (with slotmap's version) and its
/// entries in the parent and signature arrays that lookups walk. O(1).
///
/// ```
/// assert!(scopetree::diagnostics::scope_slot_bytes() <= 128);
/// ```
pub fn scope_slot_bytes() -> usize {
    crate::arena::scope_slot_bytes()
}

/// Bytes of one variable slot in the arena (the slot plus slotmap's
/// version), value payload excluded. O(1).
///
/// ```
/// assert!(scopetree::diagnostics::var_slot_bytes() <= 64);
/// ```
pub fn var_slot_bytes() -> usize {
    crate::arena::var_slot_bytes()
}
