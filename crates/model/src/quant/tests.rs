//! Unit tests for the quant codecs (spec §6, §10).

use super::scalar::{ceil_log2_ratio, pow2_f32, E2M1_GRID};
use super::*;

/// Deterministic xorshift64* generator (no external RNG dependency).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Independent e4m3fn reference: (-1)^s · 2^(e-7) · (1 + m/8), subnormal 2^-6 · m/8, NaN at S.1111.111.
fn e4m3_reference(byte: u8) -> f64 {
    let s = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((byte >> 3) & 0x0F);
    let m = f64::from(byte & 0x07);
    if e == 15 && m == 7.0 {
        return f64::NAN;
    }
    if e == 0 {
        s * 2f64.powi(-6) * (m / 8.0)
    } else {
        s * 2f64.powi(e - 7) * (1.0 + m / 8.0)
    }
}

/// Reference encoder: nearest of all finite e4m3 codes of the right sign (ties -> even code),
/// saturating at 448.
fn e4m3_encode_reference(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = f64::from(x.abs());
    let mut best = 0u8;
    let mut best_err = f64::INFINITY;
    for code in 0u8..=0x7E {
        let err = (e4m3_reference(code) - a).abs();
        if err < best_err || (err == best_err && code % 2 == 0) {
            best = code;
            best_err = err;
        }
    }
    sign | best
}

/// Official OFF-K `fast_log2_ceil` on the f32 bits of x (normal x > 0).
fn fast_log2_ceil(x: f32) -> i32 {
    let bits = x.to_bits();
    let exp = ((bits >> 23) & 0xFF) as i32;
    let man = bits & ((1 << 23) - 1);
    exp - 127 + i32::from(man != 0)
}

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

// ---------------------------------------------------------------- bf16 / f16

#[test]
fn bf16_and_f16_decode_and_rne_encode() {
    assert_eq!(bf16_to_f32(0x3F80), 1.0);
    assert_eq!(bf16_to_f32(0xC000), -2.0);
    assert!(bf16_to_f32(0x7FC0).is_nan());
    assert_eq!(bf16_to_f32(0x7F80), f32::INFINITY);
    assert_eq!(f16_to_f32(0x3C00), 1.0);
    assert_eq!(f16_to_f32(0x7BFF), 65504.0);
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));

    assert_eq!(f32_to_bf16(1.0), 0x3F80);
    // 1 + 2^-8 is halfway between bf16 1.0 (even) and 1 + 2^-7 (odd): ties to even -> 1.0.
    assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3F80);
    // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even) -> 0x3F82.
    assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
    // Just above a tie rounds up.
    assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8001)), 0x3F81);
    assert_eq!(f32_to_bf16(f32::NAN), 0x7FC0);
    assert_eq!(f32_to_bf16(f32::NEG_INFINITY), 0xFF80);
    assert_eq!(f32_to_bf16(f32::MAX), 0x7F80); // rounds up to +inf
    for bits in (0u16..=0xFFFF).step_by(7) {
        let v = bf16_to_f32(bits);
        if !v.is_nan() {
            assert_eq!(f32_to_bf16(v), bits);
        }
    }
}

// ---------------------------------------------------------------- e4m3

#[test]
fn e4m3_decode_exhaustive_against_formula() {
    for b in 0u8..=255 {
        let got = e4m3_to_f32(b);
        let want = e4m3_reference(b);
        if want.is_nan() {
            assert!(got.is_nan(), "byte {b:#04x}");
            assert!(b == 0x7F || b == 0xFF);
        } else {
            assert_eq!(f64::from(got), want, "byte {b:#04x}");
            assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "sign of {b:#04x}");
        }
    }
}

#[test]
fn e4m3_known_values() {
    assert_eq!(e4m3_to_f32(0x38), 1.0);
    assert_eq!(e4m3_to_f32(0x7E), 448.0);
    assert_eq!(e4m3_to_f32(0xFE), -448.0);
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9));
    assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
    assert_eq!(e4m3_to_f32(0x40), 2.0);
    assert_eq!(e4m3_to_f32(0x3F), 1.875);
    let nz = e4m3_to_f32(0x80);
    assert_eq!(nz, 0.0);
    assert!(nz.is_sign_negative());
    assert!(e4m3_to_f32(0x7F).is_nan());
    assert!(e4m3_to_f32(0xFF).is_nan());
}

#[test]
fn e4m3_encode_roundtrips_all_finite_codes() {
    for b in 0u8..=255 {
        if b & 0x7F == 0x7F {
            continue;
        }
        assert_eq!(f32_to_e4m3(e4m3_to_f32(b)), b, "code {b:#04x}");
    }
}

#[test]
fn e4m3_encode_rne_ties() {
    // Normal binade [1, 2): step 1/8. 1.0625 is halfway 1.0 (0x38, even) / 1.125 (0x39) -> 0x38.
    assert_eq!(f32_to_e4m3(1.0625), 0x38);
    // 1.1875 halfway 1.125 (0x39) / 1.25 (0x3A, even) -> 0x3A.
    assert_eq!(f32_to_e4m3(1.1875), 0x3A);
    // 1.9375 halfway 1.875 (0x3F) / 2.0 (0x40, even, next binade) -> 0x40.
    assert_eq!(f32_to_e4m3(1.9375), 0x40);
    // 432 halfway 416 (0x7D) / 448 (0x7E, even) -> 448; 424 is below the tie -> 416.
    assert_eq!(f32_to_e4m3(432.0), 0x7E);
    assert_eq!(f32_to_e4m3(424.0), 0x7D);
    // Subnormals, step 2^-9: 0.5·2^-9 -> 0 (even), 1.5·2^-9 -> 2 (even), 2.5·2^-9 -> 2 (even).
    let q = 2f32.powi(-9);
    assert_eq!(f32_to_e4m3(0.5 * q), 0x00);
    assert_eq!(f32_to_e4m3(1.5 * q), 0x02);
    assert_eq!(f32_to_e4m3(2.5 * q), 0x02);
    assert_eq!(f32_to_e4m3(3.5 * q), 0x04);
    // 7.5·2^-9 halfway between the largest subnormal (0x07) and the smallest normal 2^-6 (0x08).
    assert_eq!(f32_to_e4m3(7.5 * q), 0x08);
    assert_eq!(f32_to_e4m3(-1.0625), 0xB8);
    // Just off the ties.
    assert_eq!(f32_to_e4m3(f32::from_bits(1.0625f32.to_bits() + 1)), 0x39);
    assert_eq!(f32_to_e4m3(f32::from_bits(1.1875f32.to_bits() - 1)), 0x39);
    // Saturation, NaN, signed zero.
    assert_eq!(f32_to_e4m3(448.0), 0x7E);
    assert_eq!(f32_to_e4m3(464.0), 0x7E);
    assert_eq!(f32_to_e4m3(1e10), 0x7E);
    assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7E);
    assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xFE);
    assert_eq!(f32_to_e4m3(f32::NAN), 0x7F);
    assert_eq!(f32_to_e4m3(0.0), 0x00);
    assert_eq!(f32_to_e4m3(-0.0), 0x80);
    assert_eq!(f32_to_e4m3(-1e-9), 0x80);
    assert_eq!(f32_to_e4m3(f32::from_bits(1)), 0x00);
}

#[test]
fn e4m3_encode_matches_nearest_reference() {
    // All midpoints between adjacent codes, their neighbours one f32 ulp away, and random values over
    // the whole range, against a brute-force nearest-with-ties-to-even encoder.
    let mut probes = Vec::new();
    for c in 0u8..0x7E {
        let lo = e4m3_to_f32(c);
        let hi = e4m3_to_f32(c + 1);
        let mid = (lo + hi) / 2.0; // exact: adjacent e4m3 values
        probes.extend([
            mid,
            f32::from_bits(mid.to_bits() - 1),
            f32::from_bits(mid.to_bits() + 1),
        ]);
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..20_000 {
        let e = (rng.next_u64() % 30) as i32 - 20; // 2^-20 .. 2^9
        probes.push(rng.unit() * 2f32.powi(e));
    }
    for x in probes {
        for v in [x, -x] {
            assert_eq!(f32_to_e4m3(v), e4m3_encode_reference(v), "x = {v:e}");
        }
    }
}

// ---------------------------------------------------------------- ue8m0

#[test]
fn ue8m0_values() {
    assert_eq!(ue8m0_to_f32(127), 1.0);
    assert_eq!(ue8m0_to_f32(128), 2.0);
    assert_eq!(ue8m0_to_f32(126), 0.5);
    assert_eq!(ue8m0_to_f32(254), 2f32.powi(127));
    assert!(ue8m0_to_f32(0xFF).is_nan());
    let tiny = ue8m0_to_f32(0);
    assert_eq!(f64::from(tiny), 2f64.powi(-127));
    for e in 0u8..0xFF {
        assert_eq!(
            f64::from(ue8m0_to_f32(e)),
            2f64.powi(i32::from(e) - 127),
            "e = {e}"
        );
    }
}

// ---------------------------------------------------------------- e2m1

#[test]
fn e2m1_all_nibbles() {
    let want = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    for (n, &w) in want.iter().enumerate() {
        let got = e2m1_to_f32(n as u8);
        assert_eq!(got.to_bits(), f32::to_bits(w), "nibble {n:#x}");
        assert_eq!(f32_to_e2m1(got), n as u8, "round trip of nibble {n:#x}");
    }
    // High bits are ignored by the decoder.
    assert_eq!(e2m1_to_f32(0xF7), 6.0);
}

#[test]
fn e2m1_encode_ties_to_even_code() {
    // Rule: nearest grid value; at a midpoint pick the even code (= even mantissa bit).
    // Grid codes: 0:0 1:.5 2:1 3:1.5 4:2 5:3 6:4 7:6.
    let ties = [
        (0.25, 0x0), // 0 (code 0) vs 0.5 (code 1)
        (0.75, 0x2), // 0.5 (1) vs 1.0 (2)
        (1.25, 0x2), // 1.0 (2) vs 1.5 (3)
        (1.75, 0x4), // 1.5 (3) vs 2.0 (4)
        (2.5, 0x4),  // 2.0 (4) vs 3.0 (5)
        (3.5, 0x6),  // 3.0 (5) vs 4.0 (6)
        (5.0, 0x6),  // 4.0 (6) vs 6.0 (7)
    ];
    for (x, code) in ties {
        assert_eq!(f32_to_e2m1(x), code, "tie at {x}");
        assert_eq!(f32_to_e2m1(-x), code | 0x8, "tie at -{x}");
        // One ulp either side goes to the nearer neighbour.
        let below = f32::from_bits(f32::to_bits(x) - 1);
        let above = f32::from_bits(f32::to_bits(x) + 1);
        let lo = E2M1_GRID.iter().rposition(|&g| g < x).unwrap() as u8;
        assert_eq!(f32_to_e2m1(below), lo, "below tie {x}");
        assert_eq!(f32_to_e2m1(above), lo + 1, "above tie {x}");
    }
    assert_eq!(f32_to_e2m1(0.3), 0x1);
    assert_eq!(f32_to_e2m1(2.9), 0x5);
    assert_eq!(f32_to_e2m1(5.5), 0x7);
    assert_eq!(f32_to_e2m1(6.0), 0x7);
    assert_eq!(f32_to_e2m1(100.0), 0x7);
    assert_eq!(f32_to_e2m1(f32::INFINITY), 0x7);
    assert_eq!(f32_to_e2m1(f32::NEG_INFINITY), 0xF);
    assert_eq!(f32_to_e2m1(f32::NAN), 0x7);
    assert_eq!(f32_to_e2m1(-0.1), 0x8);
    assert_eq!(f32_to_e2m1(0.0), 0x0);
}

// ---------------------------------------------------------------- FP8 blocked weights

/// Naive reference dequant with explicit tile indices.
fn dequant_fp8_reference(
    w: &[u8],
    rows: usize,
    cols: usize,
    scale: impl Fn(usize, usize) -> f32,
) -> Vec<f32> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[r * cols + c] = e4m3_to_f32(w[r * cols + c]) * scale(r / 128, c / 128);
        }
    }
    out
}

#[test]
fn dequant_fp8_blocked_non_multiple_shape_both_scale_kinds() {
    let (rows, cols) = (130, 260); // 2 x 3 tiles; the last row/column tiles are partial
    let mut rng = Rng(42);
    let w: Vec<u8> = (0..rows * cols)
        .map(|_| {
            let b = rng.next_u64() as u8;
            if b & 0x7F == 0x7F {
                0x38
            } else {
                b
            }
        })
        .collect();
    let ue: Vec<u8> = vec![120, 127, 130, 100, 140, 127];
    let f: Vec<f32> = vec![0.5, 1.0, 3.25, -2.0, 1e-3, 7.0];

    let got = dequant_fp8_blocked(&w, rows, cols, BlockScales::Ue8m0(&ue), 128).unwrap();
    let want = dequant_fp8_reference(&w, rows, cols, |br, bc| ue8m0_to_f32(ue[br * 3 + bc]));
    assert!(bits_eq(&got, &want));
    // Tile corners: [0,0] uses scale (0,0); [129, 259] uses scale (1, 2); [127, 128] uses (0, 1).
    assert_eq!(got[0], e4m3_to_f32(w[0]) * 2f32.powi(-7));
    assert_eq!(
        got[129 * cols + 259],
        e4m3_to_f32(w[129 * cols + 259]) * 1.0
    );
    assert_eq!(
        got[127 * cols + 128],
        e4m3_to_f32(w[127 * cols + 128]) * 1.0
    );
    // [128, 255] uses scale (1, 1) = byte 140 = 2^13.
    assert_eq!(
        got[128 * cols + 255],
        e4m3_to_f32(w[128 * cols + 255]) * 2f32.powi(13)
    );

    let got = dequant_fp8_blocked(&w, rows, cols, BlockScales::F32(&f), 128).unwrap();
    let want = dequant_fp8_reference(&w, rows, cols, |br, bc| f[br * 3 + bc]);
    assert!(bits_eq(&got, &want));
    assert_eq!(got[128 * cols + 1], e4m3_to_f32(w[128 * cols + 1]) * -2.0);
}

#[test]
fn dequant_fp8_blocked_hand_case() {
    // 2x3 weight, block 2: scales [1, 2] -> tile (0,0) cols 0..2, tile (0,1) col 2.
    let w = [0x38, 0x40, 0x38, 0xB8, 0x01, 0x7E];
    let s = [127u8, 129];
    let got = dequant_fp8_blocked(&w, 2, 3, BlockScales::Ue8m0(&s), 2).unwrap();
    assert_eq!(got, vec![1.0, 2.0, 4.0, -1.0, 2f32.powi(-9), 448.0 * 4.0]);
}

#[test]
fn quantize_fp8_blocked_roundtrip_and_scales() {
    let (rows, cols) = (130, 260);
    let mut rng = Rng(7);
    // Each tile gets its own magnitude so the scales differ.
    let mags = [1.0f32, 448.0, 1e-3, 3e4, 0.0, 17.0];
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            rng.unit() * mags[(r / 128) * 3 + c / 128]
        })
        .collect();
    let (q, s) = quantize_fp8_blocked(&w, rows, cols, 128).unwrap();
    assert_eq!(q.len(), rows * cols);
    assert_eq!(s.len(), 6);
    assert_eq!(s[4], 127, "all-zero tile gets scale 1.0");
    for (t, &byte) in s.iter().enumerate() {
        let (br, bc) = (t / 3, t % 3);
        let amax = (br * 128..((br + 1) * 128).min(rows))
            .flat_map(|r| (bc * 128..((bc + 1) * 128).min(cols)).map(move |c| (r, c)))
            .fold(0.0f32, |m, (r, c)| m.max(w[r * cols + c].abs()));
        if amax > 0.0 {
            // Smallest power of two with amax <= 448 · scale.
            let sc = ue8m0_to_f32(byte);
            assert!(
                amax <= 448.0 * sc && amax > 224.0 * sc,
                "tile {t}: amax {amax}, scale {sc}"
            );
        }
    }
    let d = dequant_fp8_blocked(&q, rows, cols, BlockScales::Ue8m0(&s), 128).unwrap();
    for i in 0..rows * cols {
        let (r, c) = (i / cols, i % cols);
        let sc = ue8m0_to_f32(s[(r / 128) * 3 + c / 128]);
        let bound = w[i].abs() * 2f32.powi(-4) + sc * 2f32.powi(-10);
        assert!(
            (d[i] - w[i]).abs() <= bound,
            "elem {i}: {} vs {}",
            w[i],
            d[i]
        );
    }
}

#[test]
fn quantize_fp8_blocked_hand_scales() {
    // One 1x4 tile per case, block 4.
    let case = |v: [f32; 4]| quantize_fp8_blocked(&v, 1, 4, 4).unwrap();
    // amax 448 -> 2^ceil(log2(1)) = 1 -> byte 127; values exact.
    let (q, s) = case([448.0, -1.0, 0.5, 0.0]);
    assert_eq!(s, vec![127]);
    assert_eq!(q, vec![0x7E, 0xB8, 0x30, 0x00]);
    // amax 449 -> 2 -> byte 128: 449/2 = 224.5 -> e4m3 224 (0x76).
    let (q, s) = case([449.0, 0.0, 0.0, 0.0]);
    assert_eq!(s, vec![128]);
    assert_eq!(q[0], 0x76);
    // amax 1.0 -> 1/448 in (2^-9, 2^-8] -> 2^-8 -> byte 119; 1.0 / 2^-8 = 256 = 0x78.
    let (q, s) = case([1.0, 0.0, 0.0, 0.0]);
    assert_eq!(s, vec![119]);
    assert_eq!(q[0], 0x78);
    // amax exactly 448 · 2^-8 = 1.75 -> 2^-8 (exact power: no extra step up).
    let (_, s) = case([1.75, 0.0, 0.0, 0.0]);
    assert_eq!(s, vec![119]);
    let (_, s) = case([f32::from_bits(1.75f32.to_bits() + 1), 0.0, 0.0, 0.0]);
    assert_eq!(s, vec![120]);
    // Tiny amax: the scale clamps at 2^-127 (byte 0) and the values still fit.
    let (q, s) = case([1e-40, 0.0, 0.0, 0.0]);
    assert_eq!(s, vec![0]);
    assert_eq!(q[0], f32_to_e4m3(1e-40 * 2f32.powi(127)));
    assert_ne!(q[0], 0);
}

// ---------------------------------------------------------------- FP4 grouped weights

#[test]
fn fp4_nibble_order_low_first() {
    // Byte 0x72: low nibble 2 (1.0) is element 0, high nibble 7 (6.0) element 1.
    // Byte 0xA1: low nibble 1 (0.5) is element 2, high nibble 0xA (-1.0) element 3.
    let packed = [0x72u8, 0xA1];
    let got = dequant_fp4_grouped(&packed, 1, 4, &[128], 32).unwrap();
    assert_eq!(got, vec![2.0, 12.0, 1.0, -2.0]);
    // Group size 2: elements 0,1 use scale byte 126 (0.5), elements 2,3 use 127 (1.0).
    let got = dequant_fp4_grouped(&packed, 1, 4, &[126, 127], 2).unwrap();
    assert_eq!(got, vec![0.5, 3.0, 0.5, -1.0]);
}

#[test]
fn dequant_fp4_grouped_rows_and_groups() {
    // 2 rows x 64 cols, group 32: scales [2, 2].
    let (rows, cols) = (2, 64);
    let packed: Vec<u8> = (0..rows * cols / 2)
        .map(|k| (k as u8).wrapping_mul(37))
        .collect();
    let scales = [127u8, 130, 120, 0];
    let got = dequant_fp4_grouped(&packed, rows, cols, &scales, 32).unwrap();
    for r in 0..rows {
        for c in 0..cols {
            let byte = packed[r * cols / 2 + c / 2];
            let nib = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
            let want = e2m1_to_f32(nib) * ue8m0_to_f32(scales[r * 2 + c / 32]);
            assert_eq!(got[r * cols + c].to_bits(), want.to_bits(), "[{r}, {c}]");
        }
    }
}

#[test]
fn quantize_fp4_grouped_exact_on_grid() {
    let (rows, cols) = (3, 96);
    let mut rng = Rng(99);
    let group_scales = [
        1.0f32,
        0.25,
        8.0,
        2f32.powi(-20),
        1024.0,
        0.5,
        1.0,
        4.0,
        2f32.powi(30),
    ];
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            let s = group_scales[r * 3 + c / 32];
            // First element of each group is ±6 so the group's amax pins the scale to s.
            let g = if c % 32 == 0 {
                6.0
            } else {
                E2M1_GRID[(rng.next_u64() % 8) as usize]
            };
            let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
            sign * g * s
        })
        .collect();
    let (packed, scales) = quantize_fp4_grouped(&w, rows, cols, 32).unwrap();
    assert_eq!(packed.len(), rows * cols / 2);
    assert_eq!(scales.len(), rows * cols / 32);
    for (i, &b) in scales.iter().enumerate() {
        assert_eq!(ue8m0_to_f32(b), group_scales[i]);
    }
    let d = dequant_fp4_grouped(&packed, rows, cols, &scales, 32).unwrap();
    assert!(bits_eq(&d, &w));

    // Hand case: [1.0, -6.0, 0.0, 0.7] with group 4: amax 6 -> scale 1 (byte 127);
    // nibbles 2, 0xF, 0, 1 (0.7 -> 0.5) -> bytes 0xF2, 0x10.
    let (p, s) = quantize_fp4_grouped(&[1.0, -6.0, 0.0, 0.7], 1, 4, 4).unwrap();
    assert_eq!(s, vec![127]);
    assert_eq!(p, vec![0xF2, 0x10]);
    // amax 7 -> 7/6 in (1, 2] -> scale 2 (byte 128); 7/2 = 3.5 ties to 4 (code 6).
    let (p, s) = quantize_fp4_grouped(&[7.0, 0.0], 1, 2, 2).unwrap();
    assert_eq!((p, s), (vec![0x06], vec![128]));
    // All-zero group -> scale byte 127.
    let (p, s) = quantize_fp4_grouped(&[0.0, 0.0], 1, 2, 2).unwrap();
    assert_eq!((p, s), (vec![0x00], vec![127]));
}

// ---------------------------------------------------------------- power-of-two scales

#[test]
fn ceil_log2_ratio_matches_official_bit_trick() {
    let mut rng = Rng(2024);
    for den in [448.0f32, 6.0] {
        for k in -100..100 {
            let p = den * 2f32.powi(k); // exact
            for amax in [
                p,
                f32::from_bits(p.to_bits() + 1),
                f32::from_bits(p.to_bits() - 1),
            ] {
                let q = amax / den;
                assert!(q.is_normal());
                assert_eq!(
                    ceil_log2_ratio(amax, den),
                    fast_log2_ceil(q),
                    "amax {amax:e} / {den}"
                );
            }
            assert_eq!(ceil_log2_ratio(p, den), k);
            for _ in 0..20 {
                let amax = (rng.unit().abs() + 0.01) * p;
                assert_eq!(
                    ceil_log2_ratio(amax, den),
                    fast_log2_ceil(amax / den),
                    "amax {amax:e}"
                );
            }
        }
    }
    // Out-of-contract inputs do not hang or panic.
    assert_eq!(ceil_log2_ratio(f32::INFINITY, 448.0), 0);
    assert_eq!(ceil_log2_ratio(0.0, 448.0), 0);
    // The floors land where the spec says.
    assert_eq!(ceil_log2_ratio(ACT_AMAX_FLOOR, E4M3_MAX), -22);
    assert_eq!(ceil_log2_ratio(FP4_AMAX_FLOOR, E2M1_MAX), -126);
    assert_eq!(pow2_f32(-127), ue8m0_to_f32(0));
    assert_eq!(f64::from(pow2_f32(-149)), 2f64.powi(-149));
}

// ---------------------------------------------------------------- §10.1 activation FP8

#[test]
fn act_quant_fp8_hand_case() {
    // amax 1.0: 1/448 = 0.00223 lies in (2^-9 = 0.00195, 2^-8 = 0.00391], so s = 2^-8 and x/s = 256·x.
    let mut x = vec![0.0f32; 128];
    x[0] = 1.0; // 256 -> exact (0x78) -> 1.0
    x[1] = 0.3; // 76.8: binade [64,128) step 8 -> 80 -> 0.3125
    x[2] = 0.001; // 0.256: binade [0.25,0.5) step 2^-5 -> 0.25 -> 2^-10
    x[3] = -0.5; // -128 exact
    x[4] = 0.0001; // 0.0256: binade [2^-6,2^-5) step 2^-9 -> 13·2^-9 -> 13·2^-17
    x[5] = 0.999; // 255.744: binade [128,256) step 16 -> 256 -> 1.0
    x[6] = 1e-7; // 2.56e-5 < 2^-10: rounds to 0
    act_quant_fp8_roundtrip(&mut x, 128).unwrap();
    assert_eq!(x[0], 1.0);
    assert_eq!(x[1], 0.3125);
    assert_eq!(x[2], 2f32.powi(-10));
    assert_eq!(x[3], -0.5);
    assert_eq!(x[4], 13.0 * 2f32.powi(-17));
    assert_eq!(x[5], 1.0);
    assert_eq!(x[6], 0.0);
    assert!(x[7..].iter().all(|&v| v == 0.0));
}

#[test]
fn act_quant_fp8_floor_blocks_and_rows() {
    // Block 0: tiny values -> amax floored to 1e-4 -> s = 2^-22; 1e-6 / 2^-22 = 4.19 -> 4 -> 4·2^-22.
    // Block 1: amax 448 -> s = 1: plain e4m3 rounding.
    let mut x = vec![0.0f32; 256];
    x[0] = 1e-6;
    x[128] = 448.0;
    x[129] = 300.0; // binade [256,512) step 32: 300 -> 288
    x[130] = 100.0; // binade [64,128) step 8: 100 -> 96 (tie 100 = 96+4: 96 mantissa 4 even) -> 96
    x[131] = -3.3; // step 0.25: -3.25
    act_quant_fp8_roundtrip(&mut x, 128).unwrap();
    assert_eq!(x[0], 4.0 * 2f32.powi(-22));
    assert_eq!(x[128], 448.0);
    assert_eq!(x[129], 288.0);
    assert_eq!(x[130], 96.0);
    assert_eq!(x[131], -3.25);

    // Two rows of 128 processed in one call equal two separate calls.
    let mut rng = Rng(5);
    let v: Vec<f32> = (0..256)
        .map(|i| rng.unit() * if i < 128 { 3.0 } else { 0.01 })
        .collect();
    let mut a = v.clone();
    act_quant_fp8_roundtrip(&mut a, 128).unwrap();
    let (mut b0, mut b1) = (v[..128].to_vec(), v[128..].to_vec());
    act_quant_fp8_roundtrip(&mut b0, 128).unwrap();
    act_quant_fp8_roundtrip(&mut b1, 128).unwrap();
    b0.extend(b1);
    assert!(bits_eq(&a, &b0));
    // Idempotent: quantised values are fixed points.
    let mut c = a.clone();
    act_quant_fp8_roundtrip(&mut c, 128).unwrap();
    assert!(bits_eq(&a, &c));
}

// ---------------------------------------------------------------- §10.2 KV nope FP8

#[test]
fn kv_nope_roundtrip_leaves_rope_dims() {
    let mut rng = Rng(11);
    let v: Vec<f32> = (0..512).map(|_| rng.unit() * 5.0 + 0.001).collect();
    let mut x = v.clone();
    kv_nope_fp8_roundtrip(&mut x, 448, 64).unwrap();
    assert!(bits_eq(&x[448..], &v[448..]), "rope dims must be untouched");
    // Each nope block equals the activation formula with block 64.
    let mut want = v[..448].to_vec();
    act_quant_fp8_roundtrip(&mut want, 64).unwrap();
    assert!(bits_eq(&x[..448], &want));
    assert!(!bits_eq(&x[..448], &v[..448]));
    // Non-finite rope dims are not the simulation's business.
    let mut y = v.clone();
    y[500] = f32::NAN;
    kv_nope_fp8_roundtrip(&mut y, 448, 64).unwrap();
    assert!(y[500].is_nan());
    // nope_dims 0: nothing changes.
    let mut z = v.clone();
    kv_nope_fp8_roundtrip(&mut z, 0, 64).unwrap();
    assert!(bits_eq(&z, &v));
}

// ---------------------------------------------------------------- Hadamard

#[test]
fn hadamard_len4_explicit_matrix() {
    let h = [
        [1.0f32, 1.0, 1.0, 1.0],
        [1.0, -1.0, 1.0, -1.0],
        [1.0, 1.0, -1.0, -1.0],
        [1.0, -1.0, -1.0, 1.0],
    ];
    let x = [0.5f32, -2.0, 3.0, 7.25];
    let mut y = x;
    hadamard_normalized(&mut y).unwrap();
    for i in 0..4 {
        let want: f32 = (0..4).map(|j| h[i][j] * x[j]).sum::<f32>() / 2.0;
        assert_eq!(y[i], want, "row {i}");
    }
    let mut one = [3.5f32];
    hadamard_normalized(&mut one).unwrap();
    assert_eq!(one, [3.5]);
}

#[test]
fn hadamard_is_orthonormal_involution() {
    for n in [2usize, 8, 128] {
        // Build the matrix column by column from unit vectors.
        let mut m = vec![0.0f32; n * n];
        for j in 0..n {
            let mut e = vec![0.0f32; n];
            e[j] = 1.0;
            hadamard_normalized(&mut e).unwrap();
            for i in 0..n {
                m[i * n + j] = e[i];
                // Sylvester entries: (-1)^popcount(i & j) / sqrt(n).
                let sign = if (i & j).count_ones() % 2 == 0 {
                    1.0
                } else {
                    -1.0
                };
                assert!((e[i] - sign / (n as f32).sqrt()).abs() < 1e-6);
            }
        }
        // H · H = I (H is symmetric, so this is also H · H^T).
        for i in 0..n {
            for j in 0..n {
                let d: f32 = (0..n).map(|k| m[i * n + k] * m[k * n + j]).sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((d - want).abs() < 1e-5, "n {n} ({i},{j}): {d}");
            }
        }
        // Applying twice returns the input; dot products are preserved.
        let mut rng = Rng(n as u64);
        let a: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
        let b: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
        let (mut ha, mut hb) = (a.clone(), b.clone());
        hadamard_normalized(&mut ha).unwrap();
        hadamard_normalized(&mut hb).unwrap();
        let dot = |u: &[f32], v: &[f32]| u.iter().zip(v).map(|(p, q)| p * q).sum::<f32>();
        assert!((dot(&a, &b) - dot(&ha, &hb)).abs() < 1e-4);
        hadamard_normalized(&mut ha).unwrap();
        assert!(a.iter().zip(&ha).all(|(p, q)| (p - q).abs() < 1e-5));
    }
}

// ---------------------------------------------------------------- §10.3 indexer

#[test]
fn indexer_fp4_hand_case() {
    // x = [1.25, 0.25, 0.125, 0]; H x / 2 = [0.8125, 0.5625, 0.6875, 0.4375] (all exact).
    // amax 0.8125: 0.8125/6 = 0.135 in (2^-3, 2^-2] -> s = 0.25; x/s = [3.25, 2.25, 2.75, 1.75]
    // -> e2m1 [3, 2, 3, 2] (1.75 is a tie 1.5/2 -> even code 4 = 2.0) -> ·s = [0.75, 0.5, 0.75, 0.5].
    let mut x = [1.25f32, 0.25, 0.125, 0.0];
    indexer_hadamard_fp4_roundtrip(&mut x, 4).unwrap();
    assert_eq!(x, [0.75, 0.5, 0.75, 0.5]);

    // Block 2 on the same input: blocks [0.8125, 0.5625] (s = 0.25 -> [3, 2.25->2] -> [0.75, 0.5])
    // and [0.6875, 0.4375] (0.6875/6 = 0.115 in (2^-4, 2^-3] -> s = 0.125 -> [5.5 -> 6, 3.5 -> 4]
    // -> [0.75, 0.5]).
    let mut x = [1.25f32, 0.25, 0.125, 0.0];
    indexer_hadamard_fp4_roundtrip(&mut x, 2).unwrap();
    assert_eq!(x, [0.75, 0.5, 0.75, 0.5]);

    // Zero and tiny vectors: floor 6·2^-126 -> s = 2^-126; everything rounds to zero.
    let mut z = [0.0f32; 128];
    indexer_hadamard_fp4_roundtrip(&mut z, 32).unwrap();
    assert!(z.iter().all(|&v| v == 0.0));
    let mut t = [1e-40f32; 128];
    indexer_hadamard_fp4_roundtrip(&mut t, 32).unwrap();
    assert!(t.iter().all(|&v| v == 0.0));
}

#[test]
fn indexer_fp4_realistic_head() {
    let mut rng = Rng(77);
    let v: Vec<f32> = (0..128).map(|_| rng.unit() * 2.0).collect();
    let mut x = v.clone();
    indexer_hadamard_fp4_roundtrip(&mut x, 32).unwrap();
    let mut rot = v.clone();
    hadamard_normalized(&mut rot).unwrap();
    for (xb, rb) in x.chunks(32).zip(rot.chunks(32)) {
        let amax = rb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let s = pow2_f32(ceil_log2_ratio(amax, 6.0));
        assert!(
            amax / s <= 6.0 && amax / s > 3.0,
            "scale {s} for amax {amax}"
        );
        for (&q, &r) in xb.iter().zip(rb) {
            // On the scaled grid, and a nearest grid point of r / s.
            let g = q / s;
            assert!(E2M1_GRID.contains(&g.abs()), "{g}");
            let best = E2M1_GRID
                .iter()
                .map(|&p| (p - (r / s).abs()).abs())
                .fold(f32::INFINITY, f32::min);
            assert_eq!((g - r / s).abs(), best, "{q} vs {r} (s {s})");
        }
    }
}

// ---------------------------------------------------------------- errors

#[test]
fn error_cases_return_err() {
    use QuantError as E;
    let w = [0u8; 6];
    // FP8 dequant.
    assert!(matches!(
        dequant_fp8_blocked(&w, 2, 4, BlockScales::Ue8m0(&[127]), 128),
        Err(E::LengthMismatch {
            expected: 8,
            found: 6,
            ..
        })
    ));
    assert!(matches!(
        dequant_fp8_blocked(&w, 2, 3, BlockScales::Ue8m0(&[127, 127]), 128),
        Err(E::LengthMismatch {
            expected: 1,
            found: 2,
            ..
        })
    ));
    assert!(matches!(
        dequant_fp8_blocked(&w, 2, 3, BlockScales::F32(&[]), 2),
        Err(E::LengthMismatch {
            expected: 2,
            found: 0,
            ..
        })
    ));
    assert!(matches!(
        dequant_fp8_blocked(&w, 2, 3, BlockScales::F32(&[1.0]), 0),
        Err(E::ZeroBlock { .. })
    ));
    assert!(matches!(
        dequant_fp8_blocked(&w, usize::MAX, 2, BlockScales::F32(&[1.0]), 128),
        Err(E::ShapeOverflow { .. })
    ));
    // FP4 dequant.
    assert!(matches!(
        dequant_fp4_grouped(&w, 1, 3, &[127], 32),
        Err(E::OddColumns { cols: 3 })
    ));
    assert!(matches!(
        dequant_fp4_grouped(&w, 1, 64, &[127, 127], 32),
        Err(E::LengthMismatch {
            expected: 32,
            found: 6,
            ..
        })
    ));
    assert!(matches!(
        dequant_fp4_grouped(&w, 2, 6, &[127], 32),
        Err(E::LengthMismatch {
            expected: 2,
            found: 1,
            ..
        })
    ));
    assert!(matches!(
        dequant_fp4_grouped(&w, 2, 6, &[127, 127], 0),
        Err(E::ZeroBlock { .. })
    ));
    // Quantisers.
    assert!(matches!(
        quantize_fp8_blocked(&[1.0; 5], 2, 3, 128),
        Err(E::LengthMismatch { .. })
    ));
    assert!(matches!(
        quantize_fp8_blocked(&[1.0; 6], 2, 3, 0),
        Err(E::ZeroBlock { .. })
    ));
    assert!(matches!(
        quantize_fp8_blocked(&[1.0, f32::NAN], 1, 2, 128),
        Err(E::NonFinite { index: 1, .. })
    ));
    assert!(matches!(
        quantize_fp4_grouped(&[1.0; 6], 2, 3, 32),
        Err(E::OddColumns { .. })
    ));
    assert!(matches!(
        quantize_fp4_grouped(&[1.0; 6], 2, 4, 32),
        Err(E::LengthMismatch { .. })
    ));
    assert!(matches!(
        quantize_fp4_grouped(&[f32::INFINITY, 1.0], 1, 2, 32),
        Err(E::NonFinite { index: 0, .. })
    ));
    // Simulations; on error the input is unchanged.
    let mut x = vec![1.3f32; 130];
    assert!(matches!(
        act_quant_fp8_roundtrip(&mut x, 128),
        Err(E::NotMultiple {
            len: 130,
            block: 128,
            ..
        })
    ));
    assert!(matches!(
        act_quant_fp8_roundtrip(&mut x, 0),
        Err(E::ZeroBlock { .. })
    ));
    let mut x = vec![1.3f32; 256];
    x[200] = f32::NAN;
    assert!(matches!(
        act_quant_fp8_roundtrip(&mut x, 128),
        Err(E::NonFinite { index: 200, .. })
    ));
    assert!(x[..200].iter().all(|&v| v == 1.3));
    let mut kv = vec![1.0f32; 512];
    assert!(matches!(
        kv_nope_fp8_roundtrip(&mut kv, 600, 64),
        Err(E::NopeDimsOutOfRange { .. })
    ));
    assert!(matches!(
        kv_nope_fp8_roundtrip(&mut kv, 450, 64),
        Err(E::NotMultiple { .. })
    ));
    assert!(matches!(
        kv_nope_fp8_roundtrip(&mut kv, 448, 0),
        Err(E::ZeroBlock { .. })
    ));
    assert!(matches!(
        hadamard_normalized(&mut []),
        Err(E::NotPowerOfTwo { len: 0 })
    ));
    assert!(matches!(
        hadamard_normalized(&mut [1.0; 6]),
        Err(E::NotPowerOfTwo { len: 6 })
    ));
    assert!(matches!(
        indexer_hadamard_fp4_roundtrip(&mut [1.0; 96], 32),
        Err(E::NotPowerOfTwo { .. })
    ));
    assert!(matches!(
        indexer_hadamard_fp4_roundtrip(&mut [1.0; 16], 32),
        Err(E::NotMultiple { .. })
    ));
    assert!(matches!(
        indexer_hadamard_fp4_roundtrip(&mut [1.0; 16], 0),
        Err(E::ZeroBlock { .. })
    ));
    // Overflow in the rotation is caught before anything is written.
    let mut big = [f32::MAX; 4];
    assert!(matches!(
        indexer_hadamard_fp4_roundtrip(&mut big, 4),
        Err(E::NonFinite { .. })
    ));
    assert_eq!(big, [f32::MAX; 4]);
    // Messages say what was expected and what was found.
    let msg = dequant_fp8_blocked(&w, 2, 4, BlockScales::Ue8m0(&[127]), 128)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("expected 8") && msg.contains("found 6"),
        "{msg}"
    );
}

#[test]
fn empty_shapes_are_fine() {
    assert_eq!(
        dequant_fp8_blocked(&[], 0, 5, BlockScales::Ue8m0(&[]), 128).unwrap(),
        Vec::<f32>::new()
    );
    assert_eq!(
        dequant_fp8_blocked(&[], 5, 0, BlockScales::F32(&[]), 128).unwrap(),
        Vec::<f32>::new()
    );
    assert_eq!(
        dequant_fp4_grouped(&[], 3, 0, &[], 32).unwrap(),
        Vec::<f32>::new()
    );
    assert_eq!(
        quantize_fp8_blocked(&[], 0, 0, 128).unwrap(),
        (vec![], vec![])
    );
    assert_eq!(
        quantize_fp4_grouped(&[], 2, 0, 32).unwrap(),
        (vec![], vec![])
    );
    let mut e: [f32; 0] = [];
    act_quant_fp8_roundtrip(&mut e, 128).unwrap();
}
