//! A world of ranks as threads of one process, for testing collective code
//! at several ranks without MPI: every call of every rank meets the
//! others' at a barrier, and each rank computes its result from all the
//! ranks' contributions (sums in rank order, so results are exact and the
//! same on every rank).

use std::sync::{Arc, Barrier, Mutex};

use scopetree::ranks::{Collective, Digest, Error};

struct Shared {
    barrier: Barrier,
    slots: Mutex<Vec<Vec<u8>>>,
}

/// One rank of a thread world.
pub struct ThreadRank {
    rank: usize,
    shared: Arc<Shared>,
}

/// Runs `f` on `size` ranks, each on a thread of its own, and returns each
/// rank's result in rank order.
pub fn run<T: Send>(size: usize, f: impl Fn(&ThreadRank) -> T + Sync) -> Vec<T> {
    let shared = Arc::new(Shared {
        barrier: Barrier::new(size),
        slots: Mutex::new(vec![Vec::new(); size]),
    });
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let me = ThreadRank {
                    rank,
                    shared: Arc::clone(&shared),
                };
                let f = &f;
                s.spawn(move || f(&me))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    })
}

impl ThreadRank {
    /// Contributes `mine`, then computes this rank's result from every
    /// rank's contribution.
    fn exchange<R>(&self, mine: &[u8], result: impl FnOnce(&[Vec<u8>]) -> R) -> R {
        self.shared.slots.lock().expect("no rank panicked")[self.rank] = mine.to_vec();
        self.shared.barrier.wait();
        let out = result(&self.shared.slots.lock().expect("no rank panicked"));
        self.shared.barrier.wait();
        out
    }

    fn sum<F: bytemuck::Pod + std::ops::Add<Output = F>>(&self, send: &[F]) -> Vec<F> {
        self.exchange(bytemuck::cast_slice(send), |all| {
            let elems = |bytes: &[u8]| -> Vec<F> {
                (bytes.chunks_exact(std::mem::size_of::<F>()))
                    .map(bytemuck::pod_read_unaligned)
                    .collect()
            };
            let mut acc = elems(&all[0]);
            for other in &all[1..] {
                for (a, b) in acc.iter_mut().zip(elems(other)) {
                    *a = *a + b;
                }
            }
            acc
        })
    }
}

impl Collective for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.slots.lock().expect("no rank panicked").len()
    }
    fn all_reduce_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        recv.copy_from_slice(&self.sum(send));
        Ok(())
    }
    fn all_reduce_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        recv.copy_from_slice(&self.sum(send));
        Ok(())
    }
    fn reduce_scatter_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        let n = recv.len();
        recv.copy_from_slice(&self.sum(send)[self.rank * n..(self.rank + 1) * n]);
        Ok(())
    }
    fn reduce_scatter_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        let n = recv.len();
        recv.copy_from_slice(&self.sum(send)[self.rank * n..(self.rank + 1) * n]);
        Ok(())
    }
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), Error> {
        self.exchange(send, |all| recv.copy_from_slice(&all.concat()));
        Ok(())
    }
    fn broadcast_bytes(&self, root: usize, buf: &mut [u8]) -> Result<(), Error> {
        let mine = if self.rank == root {
            buf.to_vec()
        } else {
            Vec::new()
        };
        self.exchange(&mine, |all| buf.copy_from_slice(&all[root]));
        Ok(())
    }
    fn all_gather_digest(&self, mine: &Digest, all: &mut [Digest]) -> Result<(), Error> {
        self.exchange(mine, |every| {
            for (d, bytes) in all.iter_mut().zip(every) {
                d.copy_from_slice(bytes);
            }
        });
        Ok(())
    }
    fn barrier(&self) -> Result<(), Error> {
        self.shared.barrier.wait();
        Ok(())
    }
}
