//! Float conversions of checkpoints round correctly: every value converted
//! between `F64`, `F32`, `BF16` and `F16` (on save with
//! `SaveOptions::floats_as`, on load with `DtypePolicy::Convert`) is the
//! nearest value of the target, ties to even, as an integer reference
//! written here computes it from the bits (not through `half`).
//!
//! The conversion is checked on every `f32` bit pattern (release only: the
//! file `src/checkpoint/float_convert.rs` is compiled into this test, as the
//! conversion is not public), and through the public API on random values
//! and values next to ties, f64 ones included. Before the fix, f32 values
//! just above a bf16 tie rounded down (`0x3e5a8007` became `0x3e5a`, not
//! `0x3e5b`): they went through `f64` and `half`'s `from_f64`.

use std::path::Path;

use half::{bf16, f16};
use scopetree::ScopeTree;
use scopetree::checkpoint::{self, Dtype, DtypePolicy, FloatDtype, LoadOptions, SaveOptions};

#[path = "../src/checkpoint/float_convert.rs"]
#[allow(dead_code)]
mod float_convert;

use float_convert::convert_floats;

// ----- the reference: rounding on the integer bits -----------------------------

/// A binary float format: the significand bits it stores (without the
/// implicit leading one) and its exponent bits.
#[derive(Clone, Copy, Debug)]
struct Format {
    man: u32,
    exp: u32,
    dtype: Dtype,
}

const F64: Format = Format {
    man: 52,
    exp: 11,
    dtype: Dtype::F64,
};
const F32: Format = Format {
    man: 23,
    exp: 8,
    dtype: Dtype::F32,
};
const BF16: Format = Format {
    man: 7,
    exp: 8,
    dtype: Dtype::BF16,
};
const F16: Format = Format {
    man: 10,
    exp: 5,
    dtype: Dtype::F16,
};

/// What a bit pattern of a format holds.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Value {
    Nan {
        negative: bool,
    },
    Inf {
        negative: bool,
    },
    /// `sig * 2^ex`, exactly.
    Finite {
        negative: bool,
        sig: u64,
        ex: i64,
    },
}

impl Format {
    fn bias(self) -> i64 {
        (1 << (self.exp - 1)) - 1
    }
    /// The smallest exponent of a normal number.
    fn emin(self) -> i64 {
        1 - self.bias()
    }
    fn inf_bits(self) -> u64 {
        ((1 << self.exp) - 1) << self.man
    }
    fn sign_bit(self) -> u64 {
        1 << (self.man + self.exp)
    }

    /// Reads a bit pattern of this format.
    fn decode(self, bits: u64) -> Value {
        let negative = bits & self.sign_bit() != 0;
        let e = (bits >> self.man) & ((1 << self.exp) - 1);
        let m = bits & ((1 << self.man) - 1);
        if e == (1 << self.exp) - 1 {
            return if m == 0 {
                Value::Inf { negative }
            } else {
                Value::Nan { negative }
            };
        }
        let (sig, ex) = if e == 0 {
            (m, self.emin() - i64::from(self.man))
        } else {
            (
                m | (1 << self.man),
                e as i64 - self.bias() - i64::from(self.man),
            )
        };
        Value::Finite { negative, sig, ex }
    }

    /// The bit pattern of this format nearest to `v`, ties to even; `None`
    /// for a NaN.
    fn nearest_even(self, v: Value) -> Option<u64> {
        let (negative, sig, ex) = match v {
            Value::Nan { .. } => return None,
            Value::Inf { negative } => {
                return Some((u64::from(negative) * self.sign_bit()) | self.inf_bits());
            }
            Value::Finite { negative, sig, ex } => (negative, sig, ex),
        };
        let sign = u64::from(negative) * self.sign_bit();
        if sig == 0 {
            return Some(sign);
        }
        // floor(log2(value)), and the exponent of the target's last bit there.
        let top = ex + 63 - i64::from(sig.leading_zeros());
        let ulp = top.max(self.emin()) - i64::from(self.man);
        let shift = ulp - ex;
        let q = if shift <= 0 {
            sig << -shift
        } else if shift >= 64 {
            0 // below half the target's smallest step (sig < 2^53)
        } else {
            let q = sig >> shift;
            let rem = sig & ((1 << shift) - 1);
            let half = 1 << (shift - 1);
            if rem > half || (rem == half && q & 1 == 1) {
                q + 1
            } else {
                q
            }
        };
        // Normal: q is in [2^man, 2^(man+1)] steps of 2^ulp, and the
        // exponent field is top + bias; a carry to 2^(man+1) moves into the
        // exponent, past the largest finite value into infinity.
        let mag = if top >= self.emin() {
            (((top - self.emin()) as u64) << self.man) + q
        } else {
            q
        };
        Some(sign | mag.min(self.inf_bits()))
    }

    /// Whether `bits` is a NaN of the given sign, and a quiet one when
    /// `quiet`.
    fn is_nan_of(self, bits: u64, negative: bool, quiet: bool) -> bool {
        bits & self.inf_bits() == self.inf_bits()
            && bits & ((1 << self.man) - 1) != 0
            && (!quiet || self.is_quiet(bits))
            && (bits & self.sign_bit() != 0) == negative
    }

    /// Whether a NaN pattern has the quiet bit.
    fn is_quiet(self, bits: u64) -> bool {
        bits & (1 << (self.man - 1)) != 0
    }
}

/// Checks one conversion: `got` (bits of `to`) of the value `bits` of
/// `from`. A NaN must stay a NaN of its sign, a quiet one if it was quiet
/// or if the conversion narrows (narrowing quiets every NaN; widening may
/// keep a signalling one's bits).
fn check(from: Format, to: Format, bits: u64, got: u64) {
    let v = from.decode(bits);
    match (v, to.nearest_even(v)) {
        (Value::Nan { negative }, _) => assert!(
            to.is_nan_of(got, negative, from.is_quiet(bits) || to.man < from.man),
            "{:?} NaN {bits:#x} -> {:?} {got:#x}: not a NaN of its sign, or not quiet",
            from.dtype,
            to.dtype
        ),
        (_, want) => assert_eq!(
            Some(got),
            want,
            "{:?} {bits:#x} -> {:?}: got {got:#x}, want {want:#x?}",
            from.dtype,
            to.dtype
        ),
    }
}

/// The little-endian bytes of `bits` in `f`'s width.
fn le(f: Format, bits: u64) -> Vec<u8> {
    let n = (f.man + f.exp + 1) as usize / 8;
    bits.to_le_bytes()[..n].to_vec()
}

/// The elements of little-endian bytes of `f`'s width, as bits.
fn unle(f: Format, bytes: &[u8]) -> Vec<u64> {
    let n = (f.man + f.exp + 1) as usize / 8;
    bytes
        .chunks_exact(n)
        .map(|c| {
            let mut a = [0_u8; 8];
            a[..n].copy_from_slice(c);
            u64::from_le_bytes(a)
        })
        .collect()
}

/// The reference agrees with known roundings (and with `half`'s f32
/// routines on a few values, though it does not use them).
#[test]
fn the_reference_rounds_known_values() {
    let r = |from: Format, to: Format, bits: u64| to.nearest_even(from.decode(bits)).unwrap();
    assert_eq!(r(F32, BF16, 0x3e5a_8007), 0x3e5b); // just above a tie
    assert_eq!(r(F32, BF16, 0x3e5a_8000), 0x3e5a); // a tie, to even
    assert_eq!(r(F32, BF16, 0x3e5b_8000), 0x3e5c); // a tie, to even (up)
    assert_eq!(r(F32, BF16, 0x7f7f_ffff), 0x7f80); // f32::MAX overflows
    assert_eq!(r(F32, BF16, 0x8000_0001), 0x8000); // -tiny -> -0
    assert_eq!(r(F32, F16, 1.0_f32.to_bits().into()), 0x3c00);
    assert_eq!(r(F32, F16, 65504.0_f32.to_bits().into()), 0x7bff);
    assert_eq!(r(F32, F16, 65519.99_f32.to_bits().into()), 0x7bff);
    assert_eq!(r(F32, F16, 65520.0_f32.to_bits().into()), 0x7c00); // tie, to inf
    assert_eq!(r(F32, F16, 2.0_f32.powi(-24).to_bits().into()), 0x0001);
    assert_eq!(r(F32, F16, 2.0_f32.powi(-25).to_bits().into()), 0x0000); // tie, to 0
    assert_eq!(
        r(F32, F16, (1.5 * 2.0_f32.powi(-25)).to_bits().into()),
        0x0001
    );
    assert_eq!(r(F32, F16, 2.0_f32.powi(-14).to_bits().into()), 0x0400);
    assert_eq!(
        r(F64, F32, (1.0_f64 + 2.0_f64.powi(-24)).to_bits()),
        0x3f80_0000
    );
    assert_eq!(r(F64, F32, 1e300_f64.to_bits()), 0x7f80_0000);
    assert_eq!(
        r(
            F64,
            BF16,
            (1.0 + 2.0_f64.powi(-8) + 2.0_f64.powi(-40)).to_bits()
        ),
        0x3f81
    );
    for x in [0.1_f32, -3.7, 1e-40, 6.1e-5, 1e30] {
        let b = u64::from(x.to_bits());
        assert_eq!(r(F32, BF16, b), u64::from(bf16::from_f32(x).to_bits()));
        assert_eq!(r(F32, F16, b), u64::from(f16::from_f32(x).to_bits()));
    }
}

// ----- every f32 --------------------------------------------------------------

/// Rounds `x >> shift` to nearest, ties to even (`1 <= shift < 32`).
fn shift_rne(x: u32, shift: u32) -> u32 {
    let (q, rem, half) = (x >> shift, x & ((1 << shift) - 1), 1 << (shift - 1));
    q + u32::from(rem > half || (rem == half && q & 1 == 1))
}

/// f32 bits to bf16 bits, nearest, ties to even, on the u32 alone (any
/// value for a NaN): drop the low 16 bits, rounding; a carry moves into
/// the exponent, and past the largest finite value into infinity.
fn bf16_of(u: u32) -> u16 {
    shift_rne(u, 16) as u16
}

/// f32 bits to f16 bits, nearest, ties to even, on the u32 alone (any
/// value for a NaN). In f16's normal range (2^-14 to 2^16) the exponent is
/// rebiased (127 - 15 = 112) and 13 bits dropped, rounding (a carry moves
/// into the exponent, past 65504 into infinity); below it, the value in
/// steps of 2^-24 (the smallest subnormal) is `sig * 2^(e - 126)`, rounded.
fn f16_of(u: u32) -> u16 {
    let sign = ((u >> 16) & 0x8000) as u16;
    let abs = u & 0x7fff_ffff;
    let e = abs >> 23;
    let mag = if abs >= 0x4780_0000 {
        0x7c00 // 2^16 and above, infinity included
    } else if e >= 113 {
        shift_rne(abs - (112 << 23), 13).min(0x7c00)
    } else if e >= 102 {
        shift_rne((abs & 0x7f_ffff) | 0x80_0000, 126 - e)
    } else {
        0 // below 2^-25: less than half the smallest subnormal
    };
    sign | mag as u16
}

/// Whether f32 bits are a NaN.
fn is_nan32(u: u32) -> bool {
    u & 0x7fff_ffff > 0x7f80_0000
}

/// The fast references agree with the general one (on the cases below and
/// on a stride through every f32).
#[test]
fn the_u32_references_agree_with_the_general_one() {
    let mut rng = Rng(0xfeed);
    let mut bits: Vec<u64> = cases(F32, BF16, 10_000, &mut rng);
    bits.extend(cases(F32, F16, 10_000, &mut rng));
    bits.extend((0..1_u64 << 32).step_by(65_537));
    for b in bits {
        let u = b as u32;
        let nan = is_nan32(u);
        let want = |to: Format| to.nearest_even(F32.decode(b));
        assert_eq!((!nan).then(|| bf16_of(u).into()), want(BF16), "{u:#x}");
        assert_eq!((!nan).then(|| f16_of(u).into()), want(F16), "{u:#x}");
    }
}

/// Checks `out`, the 16-bit conversions of the f32 patterns from `first`
/// on, against `reference` (NaNs against the NaN rule of [`check`]).
fn sweep(to: Format, first: u32, out: &[u8], reference: impl Fn(u32) -> u16) {
    let mut bad = false;
    for (i, g) in out.chunks_exact(2).enumerate() {
        let u = first + i as u32;
        bad |= (reference(u) != u16::from_le_bytes([g[0], g[1]])) | is_nan32(u);
    }
    if bad {
        for (i, g) in out.chunks_exact(2).enumerate() {
            let u = first + i as u32;
            let got = u16::from_le_bytes([g[0], g[1]]);
            if is_nan32(u) || reference(u) != got {
                check(F32, to, u.into(), got.into());
            }
        }
    }
}

/// Every f32 bit pattern, converted by the crate's conversion to bf16 and
/// to f16, is the nearest-even value the u32 references compute (NaNs: a
/// quiet NaN of their sign). On every core; release only.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only: 2^32 values; run with cargo test --release --test float_rounding"
)]
fn every_f32_converts_to_bf16_and_f16_as_the_reference_rounds() {
    const CHUNK: u32 = 1 << 16;
    let chunks = 1_u32 << 16;
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut bytes = vec![0_u8; CHUNK as usize * 4];
                let mut c = t;
                while c < chunks {
                    let first = c * CHUNK;
                    for (i, b) in bytes.chunks_exact_mut(4).enumerate() {
                        b.copy_from_slice(&(first + i as u32).to_le_bytes());
                    }
                    let bf16s = convert_floats(Dtype::F32, Dtype::BF16, &bytes);
                    sweep(BF16, first, &bf16s, bf16_of);
                    let f16s = convert_floats(Dtype::F32, Dtype::F16, &bytes);
                    sweep(F16, first, &f16s, f16_of);
                    c += threads;
                }
            });
        }
    });
}

// ----- random values and values next to ties ----------------------------------

/// splitmix64: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Bit patterns of `src` (F64 or F32) to convert to `to`: special values
/// (zeros, infinities, NaNs, the ties between the largest finite f16, bf16
/// and f32 and infinity, subnormals), random patterns, random values in
/// `to`'s range, and the midpoints between neighbours of `to`, each exactly
/// and one and two steps of `src` either side.
fn cases(src: Format, to: Format, n: usize, rng: &mut Rng) -> Vec<u64> {
    let src_bits = |x: f64| -> u64 {
        if src.man == 52 {
            x.to_bits()
        } else {
            u64::from((x as f32).to_bits()) // rounded to src where it must be
        }
    };
    let mut out: Vec<u64> = [
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        1.0,
        -1.0,
        f64::from(f32::MAX),
        f64::from(f32::MAX) + 2.0_f64.powi(103), // the f32 tie with infinity
        f64::from(f32::from_bits(0x7f7f_8000)),  // the bf16 tie with infinity
        f64::from(f32::MIN_POSITIVE),
        65504.0,
        65520.0,
        -65520.0,
        2.0_f64.powi(-24),
        2.0_f64.powi(-25),
        -2.0_f64.powi(-25),
        1.5 * 2.0_f64.powi(-25),
        2.0_f64.powi(-133),
        2.0_f64.powi(-134),
        2.0_f64.powi(-149),
        -2.0_f64.powi(-150),
    ]
    .into_iter()
    .map(src_bits)
    .collect();
    if src.man == 52 {
        out.extend([
            1e300_f64.to_bits(),
            (-1e300_f64).to_bits(),
            1e-300_f64.to_bits(),
            (-1e-300_f64).to_bits(),
            1, // the smallest subnormal
            f64::MAX.to_bits(),
            0x7ff0_0000_0000_0001, // a signalling NaN
            0xfff8_0000_0000_1234,
        ]);
    } else {
        out.extend([0x3e5a_8007, 0x7f80_0001, 0xff80_1234, 1, 0x7f7f_ffff]);
    }
    let src_width_mask = if src.man == 52 {
        u64::MAX
    } else {
        u64::from(u32::MAX)
    };
    let to_width = to.man + to.exp + 1;
    for _ in 0..n {
        // Any pattern of the source.
        out.push(rng.next() & src_width_mask);
        // A value in the target's range: a random target pattern, with
        // random bits below its last one.
        let t = rng.next() & ((1 << to_width) - 1);
        if let Value::Finite { negative, sig, ex } = to.decode(t) {
            let frac = (rng.next() >> 11) as f64 * 2.0_f64.powi(-53); // [0, 1)
            let v = (sig as f64 + frac) * 2.0_f64.powi(ex as i32);
            let v = if src.man == 52 {
                v
            } else {
                f64::from(v as f32)
            };
            out.push(src_bits(if negative { -v } else { v }));
        }
        // The midpoint above a finite target pattern, and its neighbours.
        let t = rng.next() & ((1 << to_width) - 1);
        if let Value::Finite { negative, sig, ex } = to.decode(t) {
            let mid = (2 * sig + 1) as f64 * 2.0_f64.powi(ex as i32 - 1);
            let m = src_bits(if negative { -mid } else { mid });
            for d in [0, 1, 2] {
                out.extend([m + d, m.saturating_sub(d)]);
            }
            if src.man == 52 {
                // Below an f32 step: a conversion through f32 rounding to
                // nearest lands on the tie, and then rounds to even.
                out.extend([m + (1 << 20), m - (1 << 20), m + (1 << 28), m - (1 << 28)]);
            }
        }
    }
    out
}

/// Where a save wrote each tensor: the file's bytes of `key`.
fn tensor_bytes(path: &Path, key: &str) -> (Dtype, Vec<u8>) {
    let file = std::fs::read(path).unwrap();
    let header = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let t = checkpoint::inspect(path)
        .unwrap()
        .into_iter()
        .find(|t| t.key == key)
        .unwrap();
    let start = 8 + header;
    (
        t.dtype,
        file[start + t.begin as usize..start + t.end as usize].to_vec(),
    )
}

fn float_dtype(f: Format) -> FloatDtype {
    match f.dtype {
        Dtype::BF16 => FloatDtype::BF16,
        Dtype::F16 => FloatDtype::F16,
        Dtype::F32 => FloatDtype::F32,
        _ => FloatDtype::F64,
    }
}

/// Saves `bits` of `src` with `floats_as(to)` and checks every written
/// element against the reference; returns how many were checked.
fn save_and_check(src: Format, to: Format, bits: &[u64], dir: &Path) -> usize {
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let x = tree.var(root, "x").unwrap();
    if src.man == 52 {
        let v: Vec<f64> = bits.iter().map(|&b| f64::from_bits(b)).collect();
        tree.set(x, v).unwrap();
    } else {
        let v: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b as u32)).collect();
        tree.set(x, v).unwrap();
    }
    let path = dir.join(format!("{:?}-{:?}.safetensors", src.dtype, to.dtype));
    let opts = SaveOptions::new().floats_as(float_dtype(to));
    checkpoint::save(&tree, root, &path, &opts).unwrap();
    let (dtype, bytes) = tensor_bytes(&path, "x");
    assert_eq!(dtype, to.dtype);
    let got = unle(to, &bytes);
    assert_eq!(got.len(), bits.len());
    for (&b, &g) in bits.iter().zip(&got) {
        check(src, to, b, g);
    }
    got.len()
}

/// The example, through the public API: f32 `0x3e5a8007` saved as
/// bf16 is `0x3e5b` (it was `0x3e5a`), and so is a load that converts it.
#[test]
fn an_f32_just_above_a_bf16_tie_saves_and_loads_rounded_up() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("x.safetensors");
    let mut tree = ScopeTree::new();
    let root = tree.root();
    let x = tree.var(root, "x").unwrap();
    tree.set(x, vec![f32::from_bits(0x3e5a_8007)]).unwrap();
    let opts = SaveOptions::new().floats_as(FloatDtype::BF16);
    checkpoint::save(&tree, root, &path, &opts).unwrap();
    assert_eq!(
        tensor_bytes(&path, "x"),
        (Dtype::BF16, 0x3e5b_u16.to_le_bytes().to_vec())
    );

    // Saved as f32, loaded into a bf16 value (Convert) and created as bf16.
    checkpoint::save(&tree, root, &path, &SaveOptions::new()).unwrap();
    let mut into = ScopeTree::new();
    let root = into.root();
    let y = into.var(root, "x").unwrap();
    into.set(y, vec![bf16::ZERO]).unwrap();
    let opts = LoadOptions::new().dtype_policy(DtypePolicy::Convert);
    checkpoint::load(&mut into, root, &path, &opts).unwrap();
    assert_eq!(into.get::<Vec<bf16>>(y).unwrap()[0].to_bits(), 0x3e5b);

    let mut fresh = ScopeTree::new();
    let root = fresh.root();
    let opts = LoadOptions::new()
        .create(true)
        .create_floats_as(FloatDtype::BF16);
    checkpoint::load(&mut fresh, root, &path, &opts).unwrap();
    let z = fresh.find_local_var(root, "x").unwrap().unwrap();
    assert_eq!(fresh.get::<Vec<bf16>>(z).unwrap()[0].to_bits(), 0x3e5b);
}

/// f32 values (random, and next to bf16 and f16 ties) saved as bf16 and
/// f16 are the reference's roundings.
#[test]
fn f32_saves_as_bf16_and_f16_round_to_nearest_even() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x05ee_df32);
    for to in [BF16, F16] {
        let bits = cases(F32, to, 20_000, &mut rng);
        assert!(save_and_check(F32, to, &bits, d.path()) > 100_000);
    }
}

/// f64 values (random, next to ties of the target, and just off a tie by
/// less than an f32 step, where rounding through f32 to nearest would
/// round twice) saved as f32, bf16 and f16 are the reference's roundings.
#[test]
fn f64_saves_as_f32_bf16_and_f16_round_to_nearest_even() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x05ee_df64);
    for to in [F32, BF16, F16] {
        let bits = cases(F64, to, 20_000, &mut rng);
        assert!(save_and_check(F64, to, &bits, d.path()) > 100_000);
    }
}

/// A load that converts (`DtypePolicy::Convert`) rounds f64 values into
/// f32, bf16 and f16 values as the reference does.
#[test]
fn f64_loads_into_f32_bf16_and_f16_values_round_to_nearest_even() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("f64.safetensors");
    let mut rng = Rng(0x10ad);
    for to in [F32, BF16, F16] {
        let bits = cases(F64, to, 2_000, &mut rng);
        let mut tree = ScopeTree::new();
        let root = tree.root();
        let x = tree.var(root, "x").unwrap();
        let v: Vec<f64> = bits.iter().map(|&b| f64::from_bits(b)).collect();
        tree.set(x, v).unwrap();
        checkpoint::save(&tree, root, &path, &SaveOptions::new()).unwrap();

        let mut into = ScopeTree::new();
        let root = into.root();
        let y = into.var(root, "x").unwrap();
        let n = bits.len();
        match to.dtype {
            Dtype::F32 => into.set(y, vec![0.0_f32; n]),
            Dtype::BF16 => into.set(y, vec![bf16::ZERO; n]),
            _ => into.set(y, vec![f16::ZERO; n]),
        }
        .unwrap();
        let opts = LoadOptions::new().dtype_policy(DtypePolicy::Convert);
        checkpoint::load(&mut into, root, &path, &opts).unwrap();
        let got: Vec<u64> = match to.dtype {
            Dtype::F32 => into
                .get::<Vec<f32>>(y)
                .unwrap()
                .iter()
                .map(|x| x.to_bits().into())
                .collect(),
            Dtype::BF16 => into
                .get::<Vec<bf16>>(y)
                .unwrap()
                .iter()
                .map(|x| x.to_bits().into())
                .collect(),
            _ => into
                .get::<Vec<f16>>(y)
                .unwrap()
                .iter()
                .map(|x| x.to_bits().into())
                .collect(),
        };
        for (&b, &g) in bits.iter().zip(&got) {
            check(F64, to, b, g);
        }
    }
}

/// The crate's conversion, called directly on many more values than the
/// saves above: f64 to every narrower format, and between the 16-bit ones
/// (which widen to f32 exactly and round once), and the widenings, exact.
#[test]
fn every_conversion_rounds_to_nearest_even_on_many_values() {
    let mut rng = Rng(0xc0de);
    let n = if cfg!(debug_assertions) {
        20_000
    } else {
        400_000
    };
    let pairs = [
        (F64, F32),
        (F64, BF16),
        (F64, F16),
        (F32, BF16),
        (F32, F16),
        (F16, BF16),
        (BF16, F16),
        (F32, F64),
        (BF16, F32),
        (F16, F32),
        (BF16, F64),
        (F16, F64),
    ];
    for (from, to) in pairs {
        // Narrowing: values next to the target's ties; widening: any.
        let near = if to.man > from.man { BF16 } else { to };
        let bits: Vec<u64> = match from.dtype {
            Dtype::F64 | Dtype::F32 => cases(from, near, n, &mut rng),
            // Every pattern of a 16-bit format.
            _ => (0..1 << 16).collect(),
        };
        let bytes: Vec<u8> = bits.iter().flat_map(|&b| le(from, b)).collect();
        let got = unle(to, &convert_floats(from.dtype, to.dtype, &bytes));
        assert_eq!(got.len(), bits.len());
        for (&b, &g) in bits.iter().zip(&got) {
            check(from, to, b, g);
        }
    }
}
