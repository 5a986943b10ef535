//! Starting threads that the system may refuse. `std::thread::spawn` and
//! `Scope::spawn` panic when the system cannot start a thread (a
//! container's process limit, no memory for a stack); the crate starts its
//! threads through [`spawn`] or [`spawn_scoped`] instead, which hand the
//! work back on a refusal so that the caller can do it on its own thread.
//! Two start threads their own way and handle a refusal too: the staged
//! loader's reader pool (rayon's; it asks [`refused`] first, and the
//! caller reads alone without it) and the ranks' watchdog (its calls then
//! run unwatched, as it says on stderr).
//!
//! The work's input travels to the new thread through a one-slot channel
//! once the thread has started, so that a refusal, which drops the
//! thread's closure, loses nothing.

use std::sync::mpsc;
use std::thread::{Builder, JoinHandle, Scope, ScopedJoinHandle};

#[cfg(test)]
thread_local! {
    /// Set by [`refusing`]: spawns from this thread are refused.
    static REFUSE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every spawn from the calling thread refused, as a system
/// out of threads would: the tests' way to drive the fallbacks.
#[cfg(test)]
pub(crate) fn refusing<R>(f: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            REFUSE.with(|r| r.set(false));
        }
    }
    REFUSE.with(|r| r.set(true));
    let _reset = Reset;
    f()
}

/// Whether the system is to be taken as refusing this thread's spawns:
/// when a test asks for it.
#[cfg(test)]
pub(crate) fn refused() -> bool {
    REFUSE.with(std::cell::Cell::get)
}

/// Whether the system is to be taken as refusing this thread's spawns:
/// never, outside the crate's tests.
#[cfg(not(test))]
pub(crate) const fn refused() -> bool {
    false
}

/// Starts a thread named `name` that runs `work(input)`, or hands `input`
/// back when the system refuses the thread. O(1) besides the thread's
/// start.
pub(crate) fn spawn<A, T, F>(name: &str, input: A, work: F) -> Result<JoinHandle<T>, A>
where
    A: Send + 'static,
    T: Send + 'static,
    F: FnOnce(A) -> T + Send + 'static,
{
    start(input, |rx| {
        Builder::new()
            .name(name.to_owned())
            .spawn(move || work(received(&rx)))
    })
}

/// [`spawn`] within `scope`: the thread may borrow what outlives the
/// scope, and is joined by the end of it at the latest. O(1) besides the
/// thread's start.
pub(crate) fn spawn_scoped<'scope, 'env, A, T, F>(
    scope: &'scope Scope<'scope, 'env>,
    name: &str,
    input: A,
    work: F,
) -> Result<ScopedJoinHandle<'scope, T>, A>
where
    A: Send + 'scope,
    T: Send + 'scope,
    F: FnOnce(A) -> T + Send + 'scope,
{
    start(input, |rx| {
        Builder::new()
            .name(name.to_owned())
            .spawn_scoped(scope, move || work(received(&rx)))
    })
}

/// Starts a thread with `begin`, which is given the receiving end of the
/// channel that `input` takes to it once it has started; hands `input`
/// back when the system refuses the thread.
fn start<A, H>(
    input: A,
    begin: impl FnOnce(mpsc::Receiver<A>) -> std::io::Result<H>,
) -> Result<H, A> {
    if refused() {
        return Err(input);
    }
    let (tx, rx) = mpsc::sync_channel::<A>(1);
    match begin(rx) {
        Ok(h) => {
            send(&tx, input);
            Ok(h)
        }
        Err(_) => Err(input),
    }
}

/// The input, on the new thread. The spawner sends it as soon as the
/// thread has started and only then drops its sender, so it always comes.
fn received<A>(rx: &mpsc::Receiver<A>) -> A {
    rx.recv()
        .expect("a started thread's spawner sends its input before dropping the sender")
}

/// Hands `input` to a started thread. The channel has a free slot and the
/// thread holds the receiver until it has taken the input, so this neither
/// blocks nor fails.
fn send<A>(tx: &mpsc::SyncSender<A>, input: A) {
    if tx.send(input).is_err() {
        unreachable!("a started thread holds its receiver until it has its input");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_thread_gets_its_input() {
        let h = spawn("scopetree-test", vec![1, 2, 3], |v: Vec<i32>| {
            v.iter().sum::<i32>()
        })
        .expect("a thread");
        assert_eq!(h.join().unwrap(), 6);
        let data = [4, 5];
        let sum = std::thread::scope(|s| {
            spawn_scoped(s, "scopetree-test", 10, |k| k + data.iter().sum::<i32>())
                .expect("a thread")
                .join()
                .unwrap()
        });
        assert_eq!(sum, 19);
    }

    #[test]
    fn a_refused_thread_hands_its_input_back_and_the_refusal_ends_with_the_call() {
        let back = refusing(|| spawn("scopetree-test", String::from("work"), |s| s.len()));
        assert_eq!(back.err().as_deref(), Some("work"));
        let back = refusing(|| {
            std::thread::scope(|s| spawn_scoped(s, "scopetree-test", 7_u8, |k| k).err())
        });
        assert_eq!(back, Some(7));
        let h = spawn("scopetree-test", 1_u8, |k| k + 1).expect("spawns work again");
        assert_eq!(h.join().unwrap(), 2);
    }
}
