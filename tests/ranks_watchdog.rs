//! The watchdog ends the process, so each case runs in a child: the test
//! re-runs its own executable on itself alone (`--exact`), with an
//! environment variable that makes it the child, and checks how the child
//! ended. The child's world is one rank whose every all-gather sleeps as
//! long as the case says (a rank that waits for a stalled peer).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use scopetree::ScopeTree;
use scopetree::ranks::{
    Collective, Digest, Error, PlanOptions, Reduce, STALL_EXIT_CODE, SingleProcess, SyncPlan, Watch,
};

/// Set in the child's environment to the test it runs.
const CHILD: &str = "SCOPETREE_WATCHDOG_CHILD";

/// The longest a child may run before the parent kills it.
const CHILD_LIMIT: Duration = Duration::from_secs(30);

/// A world of one rank whose all-gathers of digests (every plan call makes
/// one first) sleep `delay_ms`.
#[derive(Default)]
struct Sleepy {
    delay_ms: AtomicU64,
}

impl Sleepy {
    fn delay(&self, d: Duration) {
        self.delay_ms
            .store(d.as_millis().try_into().unwrap(), Ordering::Relaxed);
    }
}

impl Collective for Sleepy {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        SingleProcess.all_reduce_sum_f32(send, recv)
    }
    fn all_reduce_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        SingleProcess.all_reduce_sum_f64(send, recv)
    }
    fn reduce_scatter_sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), Error> {
        SingleProcess.reduce_scatter_sum_f32(send, recv)
    }
    fn reduce_scatter_sum_f64(&self, send: &[f64], recv: &mut [f64]) -> Result<(), Error> {
        SingleProcess.reduce_scatter_sum_f64(send, recv)
    }
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), Error> {
        SingleProcess.all_gather_bytes(send, recv)
    }
    fn broadcast_bytes(&self, root: usize, buf: &mut [u8]) -> Result<(), Error> {
        SingleProcess.broadcast_bytes(root, buf)
    }
    fn all_gather_digest(&self, mine: &Digest, all: &mut [Digest]) -> Result<(), Error> {
        std::thread::sleep(Duration::from_millis(self.delay_ms.load(Ordering::Relaxed)));
        SingleProcess.all_gather_digest(mine, all)
    }
    fn barrier(&self) -> Result<(), Error> {
        SingleProcess.barrier()
    }
}

/// A tree with a scope `grads` holding one `f32` variable.
fn grads() -> (ScopeTree, scopetree::ScopeId) {
    let mut tree = ScopeTree::new();
    let grads = tree.new_named_scope(tree.root(), "grads").unwrap();
    let g = tree.var(grads, "w").unwrap();
    tree.set(g, vec![1.0_f32; 16]).unwrap();
    (tree, grads)
}

fn one_second() -> PlanOptions {
    PlanOptions::new().timeout(Duration::from_secs(1))
}

/// How a child ended.
struct Ended {
    code: Option<i32>,
    stderr: String,
    took: Duration,
}

/// Whether this process is the child running `test`.
fn is_child(test: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|t| t == test)
}

/// Runs the test `test` alone in a child process, as the child; kills it
/// if it outlives [`CHILD_LIMIT`].
fn run_child(test: &str) -> Ended {
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let mut child = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).unwrap();
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > CHILD_LIMIT {
            child.kill().unwrap();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    Ended {
        code: status.code(),
        stderr: reader.join().unwrap(),
        took,
    }
}

/// Checks that the child was ended by the watchdog within `limit`, with a
/// message that holds each of `names`.
fn assert_watchdog_ended(e: &Ended, names: &[&str], limit: Duration) {
    assert_eq!(e.code, Some(STALL_EXIT_CODE), "stderr: {}", e.stderr);
    assert!(e.took < limit, "took {:?}; stderr: {}", e.took, e.stderr);
    let line = e
        .stderr
        .lines()
        .find(|l| l.starts_with("scopetree watchdog: rank 0 waited "))
        .unwrap_or_else(|| panic!("no watchdog line in: {}", e.stderr));
    for name in names {
        assert!(line.contains(name), "{name:?} not in {line:?}");
    }
}

#[test]
fn a_stalled_all_reduce_ends_the_process_naming_the_call_scope_and_step() {
    const NAME: &str = "a_stalled_all_reduce_ends_the_process_naming_the_call_scope_and_step";
    if is_child(NAME) {
        let world = Sleepy::default();
        let (mut tree, grads) = grads();
        let mut plan = SyncPlan::new(&world, &tree, grads, &one_second()).unwrap();
        Watch::set_step(1234);
        world.delay(CHILD_LIMIT * 2); // a peer that never comes
        let _ = plan.all_reduce(&world, &mut tree, Reduce::Sum);
        unreachable!("the watchdog ends the process first");
    }
    let ended = run_child(NAME);
    assert!(
        ended.took >= Duration::from_secs(1),
        "took {:?}",
        ended.took
    );
    assert_watchdog_ended(
        &ended,
        &[
            "in all-reduce of scope `grads` (step 1234)",
            "timeout 1 s passed",
            "exiting with status 3",
        ],
        Duration::from_secs(15),
    );
}

#[test]
fn a_stall_while_building_the_plan_ends_the_process() {
    const NAME: &str = "a_stall_while_building_the_plan_ends_the_process";
    if is_child(NAME) {
        let world = Sleepy::default();
        world.delay(CHILD_LIMIT * 2);
        let (tree, grads) = grads();
        let _ = SyncPlan::new(&world, &tree, grads, &one_second());
        unreachable!("the watchdog ends the process first");
    }
    let ended = run_child(NAME);
    assert_watchdog_ended(
        &ended,
        &["in building the plan of scope `grads`"],
        Duration::from_secs(15),
    );
}

/// Calls shorter than the timeout, one after the other for longer than it,
/// and a long call of a plan without a timeout: the child ends normally.
#[test]
fn calls_within_the_timeout_and_plans_without_one_run_to_the_end() {
    const NAME: &str = "calls_within_the_timeout_and_plans_without_one_run_to_the_end";
    if is_child(NAME) {
        let world = Sleepy::default();
        let (mut tree, grads) = grads();
        let mut plan = SyncPlan::new(&world, &tree, grads, &one_second()).unwrap();
        world.delay(Duration::from_millis(250));
        for _ in 0..6 {
            plan.all_reduce(&world, &mut tree, Reduce::Mean).unwrap();
        }
        let opts = PlanOptions::new().without_timeout();
        let mut unwatched = SyncPlan::new(&world, &tree, grads, &opts).unwrap();
        world.delay(Duration::from_millis(1500));
        unwatched.check_consistency(&world, &tree).unwrap();
        return;
    }
    let ended = run_child(NAME);
    assert_eq!(ended.code, Some(0), "stderr: {}", ended.stderr);
    assert!(!ended.stderr.contains("watchdog"), "{}", ended.stderr);
}

/// A plan's call inside a watch of one's own: when the call returns, the
/// outer watch is armed again, and ends the process when its time passes.
#[test]
fn an_outer_watch_is_restored_after_a_plan_call_inside_it() {
    const NAME: &str = "an_outer_watch_is_restored_after_a_plan_call_inside_it";
    if is_child(NAME) {
        let world = Sleepy::default();
        let (mut tree, grads) = grads();
        let opts = PlanOptions::new().timeout(Duration::from_secs(600));
        let mut plan = SyncPlan::new(&world, &tree, grads, &opts).unwrap();
        let of: Arc<str> = "the training statistics".into();
        let _outer = Watch::arm(0, "all-reduce", &of, Some(Duration::from_secs(1)));
        plan.all_reduce(&world, &mut tree, Reduce::Sum).unwrap(); // arms and disarms its own
        std::thread::sleep(CHILD_LIMIT * 2); // still in the outer call
        unreachable!("the watchdog ends the process first");
    }
    let ended = run_child(NAME);
    assert_watchdog_ended(
        &ended,
        &["in all-reduce of the training statistics"],
        Duration::from_secs(15),
    );
}

#[test]
fn a_zero_timeout_is_a_bad_option() {
    let (tree, grads) = grads();
    let opts = PlanOptions::new().timeout(Duration::ZERO);
    let err = SyncPlan::new(&SingleProcess, &tree, grads, &opts).unwrap_err();
    assert!(matches!(err, Error::BadOption { .. }), "{err}");
    assert!(err.to_string().contains("timeout of zero"), "{err}");
}
