//! What `train_char_gru` and `train_llama2_c` share to train across ranks
//! through `ranks::CandlePlan`: the transport (MPI, or NCCL with `--nccl`),
//! micro-batch accumulation in the order the ranks' sum adds, the held-out
//! loss of every rank, and a digest of the parameters to compare runs.
//!
//! Not an example of its own: each example includes it with `#[path]`.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use scopetree::candle::CandleStore;
use scopetree::ranks::{CandlePlan, Collective, DIGEST_BYTES, Reduce};

use super::Res;

/// How the ranks move parameters and gradients: MPI (the world's
/// collective; device tensors staged through the host a bucket segment at a
/// time) or, with `--nccl`, NCCL on the device (feature `nccl`).
pub struct Transport {
    #[cfg(feature = "nccl")]
    nccl: Option<scopetree::ranks::Nccl>,
}

impl Transport {
    /// MPI, or NCCL when `nccl` (a collective call over `world` then).
    pub fn new(nccl: bool, world: &dyn Collective, dev: &Device) -> Res<Self> {
        #[cfg(feature = "nccl")]
        {
            let nccl = if nccl {
                if !dev.is_cuda() {
                    return Err("--nccl needs --device cuda".into());
                }
                Some(scopetree::ranks::Nccl::new(world, dev)?)
            } else {
                None
            };
            Ok(Self { nccl })
        }
        #[cfg(not(feature = "nccl"))]
        {
            let _ = (world, dev);
            if nccl {
                return Err("--nccl: build with --features nccl,mpi".into());
            }
            Ok(Self {})
        }
    }

    /// What reduces, for the log.
    pub fn name(&self) -> &'static str {
        #[cfg(feature = "nccl")]
        if self.nccl.is_some() {
            return "NCCL";
        }
        "the world's collective (MPI under mpirun)"
    }

    /// Every rank takes rank 0's values.
    pub fn broadcast(&self, plan: &mut CandlePlan, world: &dyn Collective) -> Res<()> {
        #[cfg(feature = "nccl")]
        if let Some(nccl) = &self.nccl {
            return Ok(plan.broadcast_nccl(world, nccl, 0)?);
        }
        Ok(plan.broadcast(world, 0)?)
    }

    /// The ranks' mean of `grads`, in place.
    pub fn all_reduce(
        &self,
        plan: &mut CandlePlan,
        world: &dyn Collective,
        grads: &mut GradStore,
    ) -> Res<()> {
        #[cfg(feature = "nccl")]
        if let Some(nccl) = &self.nccl {
            return Ok(plan.all_reduce_nccl(world, nccl, grads, Reduce::Mean)?);
        }
        Ok(plan.all_reduce(world, grads, Reduce::Mean)?)
    }

    /// ZeRO's first half: the ranks' mean of each rank's slice of `grads`.
    #[allow(dead_code)] // train_char_gru has no --zero
    pub fn reduce_scatter(
        &self,
        plan: &mut CandlePlan,
        world: &dyn Collective,
        grads: &mut GradStore,
    ) -> Res<()> {
        #[cfg(feature = "nccl")]
        if let Some(nccl) = &self.nccl {
            return Ok(plan.reduce_scatter_nccl(world, nccl, grads, Reduce::Mean)?);
        }
        Ok(plan.reduce_scatter(world, grads, Reduce::Mean)?)
    }

    /// ZeRO's second half: every rank's slice of the values, from its owner.
    #[allow(dead_code)] // train_char_gru has no --zero
    pub fn all_gather(&self, plan: &mut CandlePlan, world: &dyn Collective) -> Res<()> {
        #[cfg(feature = "nccl")]
        if let Some(nccl) = &self.nccl {
            return Ok(plan.all_gather_nccl(world, nccl)?);
        }
        Ok(plan.all_gather(world)?)
    }
}

/// This rank's micro-batches of a global batch of `batch` windows: the
/// (rank × accumulate + m)-th slice is micro-batch m of this rank, so one
/// process accumulating N micro-batches adds what N ranks add, in order.
///
/// # Errors
///
/// When `batch` does not split evenly.
pub fn micro_batches(
    batch: usize,
    rank: usize,
    ranks: usize,
    accumulate: usize,
) -> Res<Vec<std::ops::Range<usize>>> {
    if accumulate == 0 || batch % (ranks * accumulate) != 0 {
        return Err(format!(
            "--batch {batch} does not split evenly over {ranks} rank(s) of {accumulate} micro-batch(es)"
        )
        .into());
    }
    let slice = batch / (ranks * accumulate);
    Ok((0..accumulate)
        .map(|m| {
            let k = rank * accumulate + m;
            k * slice..(k + 1) * slice
        })
        .collect())
}

/// The gradients of `vars` over this rank's `micro`-batches, and their
/// mean loss: `loss_of(range)` gives the loss of the windows `range` of
/// the global batch; their gradients are added in order (the first
/// micro-batch's, then the next's, as the ranks' sum at two ranks adds
/// them) and divided by their number as the ranks' mean divides (element
/// by element, in the gradients' type).
pub fn micro_grads(
    micro: &[std::ops::Range<usize>],
    vars: &[Var],
    mut loss_of: impl FnMut(std::ops::Range<usize>) -> Res<Tensor>,
) -> Res<(GradStore, f64)> {
    let mut grads = None;
    let mut sum = 0.0;
    for range in micro {
        let loss = loss_of(range.clone())?;
        let g = loss.backward()?;
        grads = Some(match grads {
            None => g,
            Some(acc) => accumulate(acc, &g, vars)?,
        });
        sum += f64::from(loss.to_dtype(DType::F32)?.to_scalar::<f32>()?);
    }
    let mut grads = grads.ok_or("no micro-batch")?;
    if micro.len() > 1 {
        mean_of(&mut grads, vars, micro.len())?;
    }
    Ok((grads, sum / micro.len() as f64))
}

/// `acc` with `g`'s gradient of each of `vars` added.
fn accumulate(mut acc: GradStore, g: &GradStore, vars: &[Var]) -> Res<GradStore> {
    for v in vars {
        let sum = match (acc.get(v.as_tensor()), g.get(v.as_tensor())) {
            (Some(a), Some(b)) => a.add(b)?,
            (None, Some(b)) => b.clone(),
            (_, None) => continue,
        };
        acc.insert(v.as_tensor(), sum);
    }
    Ok(acc)
}

/// Divides each of `vars`' gradients in `grads` by `n`.
fn mean_of(grads: &mut GradStore, vars: &[Var], n: usize) -> Res<()> {
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            let d = Tensor::new(n as f32, g.device())?.to_dtype(g.dtype())?;
            let mean = g.broadcast_div(&d)?;
            grads.insert(v.as_tensor(), mean);
        }
    }
    Ok(())
}

/// `loss` of every rank (`f64` bits all-gathered), as every rank learns
/// them.
pub fn every_rank(world: &dyn Collective, loss: f64) -> Res<Vec<f64>> {
    let mut mine = [0_u8; DIGEST_BYTES];
    mine[..8].copy_from_slice(&loss.to_bits().to_le_bytes());
    let mut all = vec![[0_u8; DIGEST_BYTES]; world.size()];
    world.all_gather_digest(&mine, &mut all)?;
    Ok(all
        .iter()
        .map(|d| f64::from_bits(u64::from_le_bytes(d[..8].try_into().unwrap_or_default())))
        .collect())
}

/// `2.0934 (bit-identical on 2 rank(s))`, or each rank's value.
pub fn describe(losses: &[f64]) -> String {
    if losses.iter().all(|l| l.to_bits() == losses[0].to_bits()) {
        format!(
            "{:.4} (bit-identical on {} rank(s))",
            losses[0],
            losses.len()
        )
    } else {
        let each: Vec<String> = losses.iter().map(|l| format!("{l:.6}")).collect();
        format!("DIFFERENT per rank: {}", each.join(", "))
    }
}

/// A digest of every parameter's bits (FNV-1a over the names and values,
/// in name order), to compare runs.
pub fn digest(store: &CandleStore) -> Res<String> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for x in b {
            h ^= u64::from(*x);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (k, v) in store.named_vars()? {
        eat(k.as_bytes());
        let vals: Vec<f32> = v.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
        for x in vals {
            eat(&x.to_bits().to_le_bytes());
        }
    }
    Ok(format!("{h:016x}"))
}
