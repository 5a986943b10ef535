//! Conversions between the float dtypes a checkpoint converts (`F16`,
//! `BF16`, `F32`, `F64`): each value is rounded once, to nearest with ties
//! to even, as IEEE 754 and numpy (with `ml_dtypes` for bf16) do.
//!
//! - `F16`, `BF16` and `F32` sources widen to `f32` exactly; narrowing from
//!   `f32` uses `half`'s `from_f32`, which rounds correctly (its `from_f64`
//!   does not always: see `f64_to_f32_odd`).
//! - `F64` sources narrow to `f32` with Rust's `as` (round to nearest even);
//!   to `F16` and `BF16` through an `f32` rounded to odd, which then rounds
//!   to the target once: an `f32` keeps at least 13 more significand bits
//!   than either target, at every exponent of the target's range, so the
//!   second rounding sees exactly what the first threw away (sticky) and
//!   never rounds twice.
//! - NaN stays a quiet NaN of the same sign; values beyond a target's range
//!   become infinities of their sign; tiny values become subnormals or
//!   zeros of their sign.
//!
//! The file depends on `half` and the safetensors `Dtype` only:
//! `tests/float_rounding.rs` compiles it too, to check the conversion of
//! every `f32` against an integer reference.

use half::{bf16, f16};
use safetensors::Dtype;

/// Whether `d` is a float dtype the convert policy handles.
pub(crate) fn is_convertible_float(d: Dtype) -> bool {
    matches!(d, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
}

/// Converts little-endian float bytes between `F16`, `BF16`, `F32` and
/// `F64`, rounding each value once to nearest, ties to even. `bytes.len()`
/// is a multiple of `from`'s size (a trailing partial element is dropped).
/// O(len); allocates the output only.
pub(crate) fn convert_floats(from: Dtype, to: Dtype, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![0_u8; bytes.len() / (from.bitsize() / 8) * (to.bitsize() / 8)];
    convert_floats_into(from, to, bytes, &mut out);
    out
}

/// [`convert_floats`] into `out`, which holds as many elements of `to` as
/// `bytes` holds of `from` (extra bytes of `out` are left as they are).
/// O(len); allocates nothing.
pub(crate) fn convert_floats_into(from: Dtype, to: Dtype, bytes: &[u8], out: &mut [u8]) {
    match from {
        Dtype::F16 => from_f32_exact(to, bytes, out, |b: [u8; 2]| f16::from_le_bytes(b).to_f32()),
        Dtype::BF16 => from_f32_exact(to, bytes, out, |b: [u8; 2]| bf16::from_le_bytes(b).to_f32()),
        Dtype::F32 => from_f32_exact(to, bytes, out, f32::from_le_bytes),
        _ => match to {
            Dtype::F16 => map(bytes, out, |b| {
                f16::from_f32(f64_to_f32_odd(f64::from_le_bytes(b))).to_le_bytes()
            }),
            Dtype::BF16 => map(bytes, out, |b| {
                bf16::from_f32(f64_to_f32_odd(f64::from_le_bytes(b))).to_le_bytes()
            }),
            Dtype::F32 => map(bytes, out, |b| {
                f64_to_f32(f64::from_le_bytes(b)).to_le_bytes()
            }),
            _ => map(bytes, out, |b: [u8; 8]| b),
        },
    }
}

/// Converts elements whose values `read` gives exactly as `f32`.
fn from_f32_exact<const N: usize>(
    to: Dtype,
    bytes: &[u8],
    out: &mut [u8],
    read: impl Fn([u8; N]) -> f32,
) {
    match to {
        Dtype::F16 => map(bytes, out, |b| f16::from_f32(read(b)).to_le_bytes()),
        Dtype::BF16 => map(bytes, out, |b| bf16::from_f32(read(b)).to_le_bytes()),
        Dtype::F32 => map(bytes, out, |b| read(b).to_le_bytes()),
        _ => map(bytes, out, |b| f64::from(read(b)).to_le_bytes()),
    }
}

/// Maps each `N`-byte element of `bytes` to `M` bytes of `out`.
fn map<const N: usize, const M: usize>(
    bytes: &[u8],
    out: &mut [u8],
    f: impl Fn([u8; N]) -> [u8; M],
) {
    for (o, c) in out.chunks_exact_mut(M).zip(bytes.chunks_exact(N)) {
        let mut a = [0_u8; N];
        a.copy_from_slice(c);
        o.copy_from_slice(&f(a));
    }
}

/// `x` rounded to the nearest `f32`, ties to even; a NaN stays a quiet NaN
/// of its sign.
fn f64_to_f32(x: f64) -> f32 {
    if x.is_nan() {
        return quiet_nan_f32(x);
    }
    #[allow(clippy::cast_possible_truncation)] // rounds to nearest even
    let y = x as f32;
    y
}

/// `x` rounded to an `f32` with round-to-odd: toward zero, and when that is
/// inexact, the last significand bit set. Rounding the result once more to
/// a format with at least two fewer significand bits (bf16: 8, f16: 11,
/// against the `f32`'s 24) gives what rounding `x` directly would: the odd
/// bit marks "above the truncation" without ever making a tie. Overflow
/// gives `±f32::MAX` (which then rounds to infinity), underflow the
/// smallest subnormal of `x`'s sign. `half`'s own `from_f64` is not used:
/// it misrounds some values just above a tie (half-rs issue #151).
fn f64_to_f32_odd(x: f64) -> f32 {
    if x.is_nan() {
        return quiet_nan_f32(x);
    }
    #[allow(clippy::cast_possible_truncation)] // rounds to nearest even
    let y = x as f32;
    let bits = y.to_bits();
    if f64::from(y) == x || bits & 1 == 1 {
        return y;
    }
    // Inexact and even: the nearest f32 is one of the two around `x`, and
    // the odd one is its neighbour toward `x` (bits are sign-magnitude, so
    // ±1 moves the magnitude, across binades too).
    if f64::from(y).abs() < x.abs() {
        f32::from_bits(bits + 1)
    } else {
        f32::from_bits(bits - 1)
    }
}

/// A quiet `f32` NaN with `x`'s sign and the top of its payload.
fn quiet_nan_f32(x: f64) -> f32 {
    let b = x.to_bits();
    // The sign and the payload's top 22 bits, where an f32 keeps them.
    #[allow(clippy::cast_possible_truncation)] // masked to 32 bits
    let kept = (((b >> 32) & 0x8000_0000) | ((b >> 29) & 0x003f_ffff)) as u32;
    f32::from_bits(kept | 0x7fc0_0000)
}
