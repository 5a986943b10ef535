//! A load's checks: the module walked once, every parameter matched
//! against the checkpoint's tensors by name, shape and dtype as burn-store's
//! applier would match it (the same paths, filter, alternative names and
//! adapted shapes), reading no tensor data and changing nothing. All
//! problems end in one [`Error::Mismatch`].

use burn_core::module::{ModuleVisitor, Param};
use burn_core::tensor::{Bool, DType, Int, Shape, Tensor};
use burn_store::burn_pack::{Error as PackError, Tensor as PackTensor};
use burn_store::{ModuleAdapter, ModuleContext, PathFilter};
use rustc_hash::FxHashMap;

use super::names::{float_file_dtype, to_burn};
use crate::checkpoint::{Dtype, DtypePolicy, FileTensor, Mismatch};

/// What a load does with one checkpoint tensor.
pub(crate) struct Step {
    /// Its position in the opened checkpoint's tensors.
    pub(crate) tensor: usize,
    /// The module path it goes to.
    pub(crate) path: String,
    /// The dtype its bytes are handed to burn in.
    pub(crate) dtype: DType,
    /// The float dtype its bytes are converted to first, if any.
    pub(crate) convert_to: Option<Dtype>,
}

/// The kind of a parameter: what burn-store's applier accepts for it.
#[derive(Clone, Copy)]
enum Kind {
    Float,
    Int,
    Bool,
}

impl Kind {
    fn accepts(self, d: DType) -> bool {
        match self {
            Self::Float => d.is_float(),
            Self::Int => d.is_int() || d.is_uint(),
            Self::Bool => d.is_bool(),
        }
    }
}

/// The module walk of a load's checks.
pub(crate) struct Checker<'a> {
    /// Checkpoint names (after remapping) to positions in `tensors`.
    pub(crate) names: &'a FxHashMap<String, usize>,
    pub(crate) tensors: &'a [(usize, FileTensor)],
    pub(crate) adapter: Option<&'a dyn ModuleAdapter>,
    pub(crate) filter: Option<&'a PathFilter>,
    pub(crate) skip_enum_variants: bool,
    pub(crate) policy: DtypePolicy,
    path: Vec<String>,
    containers: Vec<String>,
    /// Whether each tensor of `tensors` went to a parameter.
    pub(crate) used: Vec<bool>,
    pub(crate) steps: Vec<Step>,
    pub(crate) missing: Vec<(String, String)>,
    pub(crate) skipped: Vec<String>,
    pub(crate) mismatched: Vec<Mismatch>,
}

fn describe(dtype: impl std::fmt::Debug, shape: &[usize]) -> String {
    let shown: Vec<_> = shape.iter().take(8).collect();
    let cut = if shape.len() > 8 { " (cut)" } else { "" };
    format!("{dtype:?} {shown:?}{cut}")
}

impl<'a> Checker<'a> {
    pub(crate) fn new(
        names: &'a FxHashMap<String, usize>,
        tensors: &'a [(usize, FileTensor)],
        adapter: Option<&'a dyn ModuleAdapter>,
        filter: Option<&'a PathFilter>,
        skip_enum_variants: bool,
        policy: DtypePolicy,
    ) -> Self {
        Self {
            names,
            tensors,
            adapter,
            filter,
            skip_enum_variants,
            policy,
            path: Vec::new(),
            containers: Vec::new(),
            used: vec![false; tensors.len()],
            steps: Vec::new(),
            missing: Vec::new(),
            skipped: Vec::new(),
            mismatched: Vec::new(),
        }
    }

    /// The dtype and shape a checkpoint tensor of `dtype` and `shape` has
    /// after the adapter, computed without its data (adapters compose
    /// their transforms onto a deferred source).
    fn adapted(&self, path: &str, dtype: DType, shape: &[usize]) -> (DType, Shape) {
        let Some(adapter) = self.adapter else {
            return (dtype, Shape::from(shape.to_vec()));
        };
        let probe = PackTensor::deferred(path.to_owned(), dtype, shape.to_vec(), None, 0, || {
            Err(PackError::ValidationError(
                "a load's checks read no data".into(),
            ))
        });
        let out = adapter.adapt(probe, ModuleContext::new(&self.containers));
        (out.dtype, out.shape)
    }

    /// Matches the parameter at the current path: its kind, its dtype (for
    /// a parameter not initialized yet, the device's default of its kind)
    /// and its shape.
    fn param(&mut self, kind: Kind, dtype: DType, shape: Shape) {
        let path = self.path.join(".");
        if let Some(f) = self.filter {
            if !f.matches_with_container_path(&self.path, &self.containers) {
                self.skipped.push(path);
                return;
            }
        }
        let mut found = self.names.get(&path).copied();
        if found.is_none() {
            if let (Some(adapter), Some(module), Some(last)) = (
                self.adapter,
                ModuleContext::new(&self.containers).module_type(),
                self.path.last(),
            ) {
                if let Some(alt) = adapter.get_alternative_param_name(last, module) {
                    let mut alt_path = self.path.clone();
                    if let Some(l) = alt_path.last_mut() {
                        *l = alt;
                    }
                    found = self.names.get(&alt_path.join(".")).copied();
                }
            }
        }
        let Some(i) = found else {
            self.missing.push((path, self.containers.join(".")));
            return;
        };
        self.used[i] = true;
        let t = &self.tensors[i].1;
        let module_side = describe(dtype, &shape);
        let Some(file_dtype) = to_burn(t.dtype) else {
            self.mismatched.push(Mismatch {
                key: path,
                file: format!("{} (no burn dtype)", describe(t.dtype, &t.shape)),
                tree: module_side,
            });
            return;
        };
        let (a_dtype, a_shape) = self.adapted(&path, file_dtype, &t.shape);
        let mut file_side = describe(t.dtype, &t.shape);
        if a_shape.as_slice() != t.shape.as_slice() || a_dtype != file_dtype {
            file_side.push_str(&format!(
                " ({} after the adapter)",
                describe(a_dtype, &a_shape)
            ));
        }
        let shape_ok = a_shape == shape;
        let (dtype_ok, deliver, convert_to) = if a_dtype == dtype && kind.accepts(a_dtype) {
            (true, file_dtype, None)
        } else if let (DtypePolicy::Convert, Kind::Float, Some(from), Some(to)) = (
            self.policy,
            kind,
            float_file_dtype(file_dtype),
            float_file_dtype(dtype),
        ) {
            // Converted before the adapter: it must then give the
            // module's dtype.
            let burn_to = to_burn(to).unwrap_or(dtype);
            let (c_dtype, _) = self.adapted(&path, burn_to, &t.shape);
            let ok = c_dtype == dtype || (dtype == DType::Flex32 && c_dtype == DType::F32);
            (ok, burn_to, (from != to).then_some(to))
        } else {
            (
                dtype == DType::Flex32 && a_dtype == DType::F32,
                file_dtype,
                None,
            )
        };
        if shape_ok && dtype_ok {
            self.steps.push(Step {
                tensor: i,
                path,
                dtype: deliver,
                convert_to,
            });
            return;
        }
        let mut module_side = module_side;
        if !dtype_ok && self.policy == DtypePolicy::Convert {
            module_side.push_str(" (only float dtypes convert)");
        }
        self.mismatched.push(Mismatch {
            key: path,
            file: file_side,
            tree: module_side,
        });
    }
}

impl ModuleVisitor for Checker<'_> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.containers.push(container_type.to_owned());
        if !self.skip_enum_variants || !container_type.starts_with("Enum:") {
            self.path.push(name.to_owned());
        }
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        self.containers.pop();
        if !self.skip_enum_variants || !container_type.starts_with("Enum:") {
            self.path.pop();
        }
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let dtype = if param.is_initialized() {
            param.base().dtype()
        } else {
            param.lazy_device().settings().float_dtype.into()
        };
        self.param(Kind::Float, dtype, param.lazy_shape());
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        let dtype = if param.is_initialized() {
            param.base().dtype()
        } else {
            param.lazy_device().settings().int_dtype.into()
        };
        self.param(Kind::Int, dtype, param.lazy_shape());
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        let dtype = if param.is_initialized() {
            param.base().dtype()
        } else {
            param.lazy_device().settings().bool_dtype.into()
        };
        // Bools of any storage take a checkpoint's BOOL.
        let dtype = if dtype.is_bool() {
            DType::Bool(burn_core::tensor::BoolStore::Native)
        } else {
            dtype
        };
        self.param(Kind::Bool, dtype, param.lazy_shape());
    }
}
