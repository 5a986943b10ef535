//! What a [`VariableStore`] answers about one variable: the variable at a
//! full name, a variable's full name, and the metadata `get_variable`
//! recorded (initial shape, trainable flag).

use crate::arena::VarId;
use crate::sharing::error::Error;
use crate::sharing::path::Path;
use crate::sharing::shape::Shape;
use crate::sharing::store::VariableStore;
use crate::sharing::var_meta::VarMeta;

impl VariableStore {
    /// The variable at the full name `full_name` (`encoder/layer_1/w`), if
    /// any: exactly that name, resolved from the root component by component,
    /// never a parent's variable of the same local name. O(len) for a variable
    /// `get_variable` created (one hash of the whole name in an index, checked
    /// against the tree in O(1)); otherwise (a variable made through the tree
    /// or by the candle backend) O(depth), one O(1) named-kid probe per
    /// component.
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`InvalidName`](crate::Error::InvalidName)) for an empty name or component.
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, ScopeOpts, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let w = store.variable_scope(&root, "enc", ScopeOpts::new(), |s, vs| {
    ///     s.get_variable(vs, VarSpec::new("w").initializer(Initializer::constant(0_u8)))
    /// })?;
    /// assert_eq!(store.variable("enc/w")?, Some(w));
    /// assert_eq!(store.variable("w")?, None);
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    #[inline]
    pub fn variable(&self, full_name: &str) -> Result<Option<VarId>, Error> {
        match self.names.get(&self.tree, full_name) {
            Some(v) => Ok(Some(self.tree.var_id(v))),
            None => self.variable_by_walk(full_name),
        }
    }

    /// [`variable`](Self::variable) for a name the index does not confirm:
    /// the component walk, out of line so that a hit's call stays small.
    #[inline(never)]
    fn variable_by_walk(&self, full_name: &str) -> Result<Option<VarId>, Error> {
        let (dirs, leaf) = Path::parse(full_name)?.split_leaf();
        Ok(self
            .locate(self.tree.root_key(), dirs, leaf)
            .map(|v| self.tree.var_id(v)))
    }

    /// The full name of a variable (its tree path, `encoder/w`). O(depth).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`StaleVar`](crate::Error::StaleVar)) or [`Tree`](Error::Tree)([`ForeignVar`](crate::Error::ForeignVar)).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let v = store.get_variable(&root, VarSpec::new("a/b").initializer(Initializer::constant(0_u8)))?;
    /// assert_eq!(store.full_name(v)?, "a/b");
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn full_name(&self, var: VarId) -> Result<String, Error> {
        Ok(self.tree.var_path(var)?)
    }

    fn meta(&self, var: VarId) -> Result<Option<&VarMeta>, Error> {
        self.tree.var_slot(var)?;
        Ok(self.var_meta.get(var.key))
    }

    /// The shape of the value `get_variable` created `var` with; `None` for a
    /// variable the sharing layer did not create. O(1).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`StaleVar`](crate::Error::StaleVar)) or [`Tree`](Error::Tree)([`ForeignVar`](crate::Error::ForeignVar)).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, Shape, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let v = store.get_variable(&root, VarSpec::new("v").initializer(Initializer::constant(vec![0_u8; 3])))?;
    /// assert_eq!(store.initial_shape(v)?, Some(&Shape::new([3])));
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn initial_shape(&self, var: VarId) -> Result<Option<&Shape>, Error> {
        Ok(self.meta(var)?.map(|m| &m.shape))
    }

    /// Whether `var` was created trainable; `None` for a variable the sharing
    /// layer did not create. O(1).
    ///
    /// # Errors
    /// [`Tree`](Error::Tree)([`StaleVar`](crate::Error::StaleVar)) or [`Tree`](Error::Tree)([`ForeignVar`](crate::Error::ForeignVar)).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VariableStore, VarSpec};
    /// let mut store = VariableStore::new();
    /// let root = store.root_scope();
    /// let v = store.get_variable(&root, VarSpec::new("v").initializer(Initializer::constant(0_u8)))?;
    /// assert_eq!(store.is_trainable(v)?, Some(true));
    /// # Ok::<(), scopetree::sharing::Error>(())
    /// ```
    pub fn is_trainable(&self, var: VarId) -> Result<Option<bool>, Error> {
        Ok(self.meta(var)?.map(|m| m.trainable))
    }
}
