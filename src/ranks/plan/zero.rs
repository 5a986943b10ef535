//! Optimizer state partitioned across ranks (ZeRO stage 1): a plan's
//! gradients reduce-scattered so that each rank holds the reduced values of
//! its own slice ([`Partition`]), and its parameters all-gathered once each
//! rank updated its slice.

use super::agree::{Same, show_count};
use super::options::Reduce;
use super::sync_plan::SyncPlan;
use crate::ScopeTree;
use crate::ranks::error::Error;
use crate::ranks::layout::partition::Partition;
use crate::ranks::transport::collective::Collective;

impl SyncPlan {
    /// Each rank's slice of the plan's variables: contiguous ranges in
    /// manifest order, of about equal bytes (see [`Partition`] for the
    /// rule), computed when the plan was built for the world's size. Plans
    /// whose manifests have the same dtypes and shapes in the same order
    /// (the gradients' and the parameters') have equal partitions. O(1).
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![0.0_f32; 4])?;
    /// let plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// assert_eq!(plan.partition().bytes(0), 16); // one rank owns everything
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// Sums (or averages, [`Reduce::Mean`]) the variables over the ranks so
    /// that each rank ends with the reduced values of its own slice
    /// ([`partition`](Self::partition)). A piece of a slice of at least
    /// [`PlanOptions::direct_bytes`](crate::ranks::PlanOptions::direct_bytes) is
    /// summed from its variable's own buffer to its owner (`MPI_Reduce`, in
    /// chunks of the bucket) into a spare buffer, which then becomes the
    /// variable when the piece is all of it (no copy), or is copied into
    /// the piece. The smaller pieces go through one
    /// `MPI_Reduce_scatter_block` per float type, each rank's padded to the
    /// largest rank's. The elements outside this rank's slice keep this
    /// rank's own values. A collective call. The first call allocates the
    /// buffers: the spares of this rank's direct pieces (about its slice's
    /// bytes) and, per float type, `size + 1` blocks of the largest rank's
    /// small pieces; later calls allocate nothing on a tree. O(bytes) per
    /// rank, of which only the small pieces (and the direct pieces that
    /// are parts of variables, on their owners) are copied, plus one
    /// all-gather of 16 bytes per rank for the check and the transport.
    ///
    /// Each element's sum is the MPI library's, as for
    /// [`all_reduce`](Self::all_reduce); with two ranks it is the same one
    /// addition. With more, the library may group the additions unlike its
    /// all-reduce (Open MPI 4.1 did at 4 ranks for 21.8 KB), so the results
    /// can differ from [`all_reduce`](Self::all_reduce)'s in the last bits,
    /// and between the two ways a piece moves.
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce): [`Error::Unsupported`] for a
    /// variable that is neither `f32` nor `f64`, [`Error::ArgumentsDiffer`]
    /// when the ranks pass different `op`s, [`Error::Changed`] on a rank
    /// whose tree changed and [`Error::PeerFailed`] on the others; nothing
    /// changes then. [`Error::BadBuffers`] when a slice exceeds MPI's count.
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, Reduce, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let g = tree.var(tree.root(), "g")?;
    /// tree.set(g, vec![1.0_f32, 2.0])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// plan.reduce_scatter(&SingleProcess, &mut tree, Reduce::Mean)?;
    /// assert_eq!(tree.get::<Vec<f32>>(g)?, &[1.0, 2.0]); // a world of one owns it all
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce_scatter<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
        op: Reduce,
    ) -> Result<(), Error> {
        let _watch = self.watch(comm, "reduce-scatter");
        self.require_floats(tree)?;
        self.check_slots(comm, tree, "reduce-scatter", Ok(()), op.same())?;
        let (part, slots) = (&self.partition, &self.slots[..]);
        self.zero.reduce_scatter(comm, tree, part, slots, op)
    }

    /// Copies each rank's slice of the variables ([`partition`](Self::partition))
    /// from that rank to every rank: after each rank updated the parameters
    /// of its own slice, every rank holds all the updated parameters (any
    /// dtype the plan holds). A piece of at least
    /// [`PlanOptions::direct_bytes`](crate::ranks::PlanOptions::direct_bytes) is
    /// broadcast from its owner in place, in chunks of the bucket (no
    /// copy); the smaller pieces go through one `MPI_Allgather` of bytes,
    /// each rank's padded to the largest rank's. A collective call. The
    /// first call allocates the buffers (`size + 1` blocks of the largest
    /// rank's small pieces); later calls allocate nothing. O(bytes) per
    /// rank, of which only the small pieces are copied, plus one all-gather
    /// of 16 bytes per rank for the check and the transport.
    ///
    /// # Errors
    /// On a rank whose tree changed since the plan, [`Error::Changed`], and
    /// on the others [`Error::PeerFailed`]; nothing changes then.
    /// [`Error::BadBuffers`] when the slices exceed MPI's count.
    ///
    /// ```
    /// use scopetree::{ScopeTree, ranks::{PlanOptions, SingleProcess, SyncPlan}};
    /// let mut tree = ScopeTree::new();
    /// let w = tree.var(tree.root(), "w")?;
    /// tree.set(w, vec![0.5_f64; 3])?;
    /// let mut plan = SyncPlan::new(&SingleProcess, &tree, tree.root(), &PlanOptions::new())?;
    /// plan.all_gather(&SingleProcess, &mut tree)?;
    /// assert_eq!(tree.get::<Vec<f64>>(w)?, &[0.5; 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_gather<C: Collective + ?Sized>(
        &mut self,
        comm: &C,
        tree: &mut ScopeTree,
    ) -> Result<(), Error> {
        let _watch = self.watch(comm, "all-gather");
        let part = &self.partition;
        let block = (0..part.ranks()).map(|r| part.bytes(r)).max().unwrap_or(0);
        let same: Same = ("slice sizes", block as u64, show_count);
        self.check_slots(comm, tree, "all-gather", Ok(()), same)?;
        if block == 0 {
            return Ok(()); // nothing to send, on every rank
        }
        let (part, slots) = (&self.partition, &self.slots[..]);
        self.zero.all_gather(comm, tree, part, slots)
    }
}
