//! A test runner for checks that need a CUDA device (the test files set
//! `harness = false`): each check runs in turn and prints `PASS name` or
//! `FAIL name: why`, then libtest's own lines. Without a device every
//! check prints `skipped: no CUDA device` and counts as ignored, never as
//! passed. A name given on the command line runs the checks whose names
//! contain it.

use std::process::ExitCode;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};

/// A check: its name and its body, given the device.
pub type Check = (&'static str, fn(&Device) -> Result<(), String>);

/// Runs `checks` on CUDA device 0, or skips them all when there is none.
pub fn run(checks: &[Check]) -> ExitCode {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let chosen: Vec<&Check> = checks
        .iter()
        .filter(|(n, _)| filter.as_deref().is_none_or(|f| n.contains(f)))
        .collect();
    let filtered = checks.len() - chosen.len();
    println!("\nrunning {} tests", chosen.len());
    let device = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            for (name, _) in &chosen {
                println!("test {name} ... ignored, skipped: no CUDA device");
            }
            println!("skipped: no CUDA device ({})", first_line(&e.to_string()));
            println!(
                "\ntest result: ok. 0 passed; 0 failed; {} ignored; 0 measured; {filtered} filtered out\n",
                chosen.len()
            );
            return ExitCode::SUCCESS;
        }
    };
    let (mut passed, mut failed) = (0, Vec::new());
    for (name, check) in &chosen {
        let t0 = Instant::now();
        let outcome =
            std::panic::catch_unwind(|| check(&device)).unwrap_or_else(|p| Err(panic_text(&p)));
        let s = t0.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => {
                passed += 1;
                println!("PASS {name} ({s:.2} s)");
                println!("test {name} ... ok");
            }
            Err(why) => {
                println!("FAIL {name}: {why}");
                println!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    let verdict = if failed.is_empty() { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {} failed; 0 ignored; 0 measured; {filtered} filtered out\n",
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failures: {failed:?}");
        ExitCode::FAILURE
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_owned()
    }
}

/// Fails the check with a message when `cond` is false.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// A `Result` of anything printable, as a check's error.
pub trait Why<T> {
    /// The value, or the error as text with `what` in front.
    fn why(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::fmt::Display> Why<T> for Result<T, E> {
    fn why(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// The bits of every element of `t` (any float dtype, any device), widened
/// to `f64` exactly, in row-major order: what the checks compare.
pub fn bits_of(t: &Tensor) -> Result<Vec<u64>, String> {
    Ok(t.flatten_all()
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec1::<f64>())
        .why("bits")?
        .iter()
        .map(|x| x.to_bits())
        .collect())
}
