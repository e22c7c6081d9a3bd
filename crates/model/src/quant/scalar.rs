//! Scalar codecs: bf16, f16, FP8 e4m3fn, ue8m0 (E8M0) and FP4 e2m1. Spec §2 (dtypes), §6 (formats).

/// Decodes a bfloat16 bit pattern to `f32` (exact: bf16 is the top half of an f32).
///
/// Input: the raw little-endian-decoded `u16` of a safetensors `BF16` element. NaN/inf/subnormals map to
/// the corresponding f32 values. Source: spec §2 (BF16 tensors).
#[inline]
#[must_use]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Decodes an IEEE binary16 (`F16`) bit pattern to `f32` (exact). Uses the `half` crate.
///
/// Source: spec §2 lists no F16 tensors for Flash; this exists so loaders can accept F16 tensors in
/// converted checkpoints without a separate code path.
#[inline]
#[must_use]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Encodes an `f32` as bfloat16 bits, rounding to nearest, ties to even (as PyTorch's
/// `c10::BFloat16` does).
///
/// Values beyond the bf16 range round to ±inf as IEEE requires; any NaN becomes the canonical quiet NaN
/// `0x7FC0` (PyTorch's choice). Source: spec §2 (BF16 tensors), §6 (GEMM outputs are bf16).
#[inline]
#[must_use]
pub fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7FC0;
    }
    let bits = x.to_bits();
    let lsb = (bits >> 16) & 1;
    // Cannot overflow: the largest non-NaN pattern is 0xFF80_0000 (-inf); adding at most 0x8000 stays
    // below 2^32.
    let rounded = bits + 0x7FFF + lsb;
    (rounded >> 16) as u16
}

/// Exact decode of one FP8 e4m3fn byte (PyTorch `float8_e4m3fn`), built at compile time.
const fn e4m3_decode_const(byte: u8) -> f32 {
    let sign = ((byte as u32) >> 7) << 31;
    let exp = ((byte >> 3) & 0x0F) as u32;
    let man = (byte & 0x07) as u32;
    if exp == 0x0F && man == 0x07 {
        // 0x7F / 0xFF: the only NaN codes; e4m3fn has no infinities.
        return f32::from_bits(sign | 0x7FC0_0000);
    }
    if exp == 0 {
        // Subnormal: man · 2^-9 (exact in f32).
        let mag = man as f32 * (1.0 / 512.0);
        return if sign != 0 { -mag } else { mag };
    }
    // Normal: (1 + man/8) · 2^(exp - 7); rebias 7 -> 127 and widen the mantissa 3 -> 23 bits.
    f32::from_bits(sign | ((exp + 120) << 23) | (man << 20))
}

/// All 256 FP8 e4m3fn values, indexed by byte.
pub(crate) static E4M3_LUT: [f32; 256] = {
    let mut lut = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        lut[i] = e4m3_decode_const(i as u8);
        i += 1;
    }
    lut
};

/// Decodes one FP8 e4m3fn byte (PyTorch `torch.float8_e4m3fn`) to `f32`, exactly.
///
/// Layout: bit 7 sign, bits 6..3 exponent (bias 7), bits 2..0 mantissa. Exponent 0 is subnormal
/// (`m · 2^-9`, smallest `0x01` = 2^-9). No infinities; `0x7F` and `0xFF` are NaN; the largest finite
/// value is `0x7E` = 448. `0x80` is -0.0. Source: spec §6 (FP8 linear weights).
#[inline]
#[must_use]
pub fn e4m3_to_f32(byte: u8) -> f32 {
    E4M3_LUT[usize::from(byte)]
}

/// Encodes an `f32` as FP8 e4m3fn, rounding to nearest, ties to even (exact for subnormals).
///
/// - Magnitudes ≥ 448 (including ±inf) **saturate** to ±448 (`0x7E`/`0xFE`). PyTorch's plain cast would
///   turn magnitudes ≥ 464 into NaN instead; OFF-K always clamps to ±448 before casting, so both agree on
///   every input the reference pipeline produces.
/// - NaN maps to `0x7F`.
/// - The sign is kept for results that round to zero (`-1e-9` -> `0x80`).
///
/// Source: spec §6 (`q = e4m3(clamp(x/s, ±448))`), §10.
#[inline]
#[must_use]
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    if a >= 448.0 {
        return sign | 0x7E;
    }
    if a < 0.015_625 {
        // Below the smallest normal 2^-6: quantum 2^-9. a · 512 is exact (power-of-two scaling, no
        // overflow) and lies in [0, 8); the rounded count 0..=8 is directly the code, since 8 = 0x08 is
        // the smallest normal (exponent field 1, mantissa 0).
        let q = (a * 512.0).round_ties_even();
        return sign | (q as u8);
    }
    // Normal range [2^-6, 448): rebias the exponent (127 -> 7), then round the 23-bit mantissa to 3
    // bits with ties to even; a mantissa carry propagates into the exponent as it should. The result is
    // at most 0x7E because a < 448 and 448 is representable.
    let r = a.to_bits() - (120 << 23);
    let lsb = (r >> 20) & 1;
    let code = (r + 0x7FFFF + lsb) >> 20;
    sign | (code as u8)
}

/// Decodes one ue8m0 (safetensors `F8_E8M0`) scale byte: `2^(e - 127)`, exactly.
///
/// `0xFF` is NaN; `e = 0` gives 2^-127 (an f32 subnormal); `127` gives 1.0. Built from bits, not `powf`.
/// Source: spec §6 (Flash FP8 scales and FP4 group scales are E8M0).
#[inline]
#[must_use]
pub fn ue8m0_to_f32(byte: u8) -> f32 {
    match byte {
        0xFF => f32::NAN,
        0 => f32::from_bits(1 << 22),
        e => f32::from_bits(u32::from(e) << 23),
    }
}

/// The eight non-negative FP4 e2m1 magnitudes, indexed by the low three bits of a nibble.
pub(crate) const E2M1_GRID: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// All 16 FP4 e2m1 values, indexed by nibble (bit 3 = sign, so `0x8` is -0.0).
pub(crate) static E2M1_LUT: [f32; 16] = {
    let mut lut = [0.0f32; 16];
    let mut i = 0;
    while i < 8 {
        lut[i] = E2M1_GRID[i];
        lut[i + 8] = -E2M1_GRID[i];
        i += 1;
    }
    lut
};

/// Decodes one FP4 e2m1 nibble to `f32`.
///
/// Low three bits index `[0, 0.5, 1, 1.5, 2, 3, 4, 6]`, bit 3 is the sign (`0x8` = -0.0). Bits above
/// the low nibble are ignored. Source: spec §6 (OFF-CV `FP4_TABLE`).
#[inline]
#[must_use]
pub fn e2m1_to_f32(nibble: u8) -> f32 {
    E2M1_LUT[usize::from(nibble & 0x0F)]
}

/// Encodes an `f32` as an FP4 e2m1 nibble (`0..=15`): nearest grid value, ties to even.
///
/// "Even" means the even mantissa bit, which is the even code: the grid codes 0..7 are
/// `[0, .5, 1, 1.5, 2, 3, 4, 6]`, so the midpoints round as 0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
/// 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4 (the same rule as IEEE RNE / CUDA `cvt.rn.satfinite.e2m1x2`).
/// Magnitudes above 6 (including ±inf) saturate to ±6. The sign bit is kept, also for results that
/// round to zero (`-0.1` -> `0x8`). NaN maps to `0x7` (+6; e2m1 has no NaN). Source: spec §10.3.
#[inline]
#[must_use]
pub fn f32_to_e2m1(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7;
    }
    let sign = if x.is_sign_negative() { 0x8 } else { 0x0 };
    let a = x.abs();
    // Even codes win their ties (<=), odd codes lose them (<).
    let code = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    sign | code
}

/// `2^k` as f32, exact for `k` in `[-149, 127]` (subnormals included). Callers guarantee the range.
#[inline]
pub(crate) fn pow2_f32(k: i32) -> f32 {
    if k >= -126 {
        f32::from_bits(((k + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (k + 149))
    }
}

/// `2^k` as f64, exact for `k` in `[-1022, 1023]`. Callers guarantee the range.
#[inline]
fn pow2_f64(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// Exact `ceil(log2(num / den))` for finite `num > 0` and finite `den > 0` (both f32).
///
/// Returns the smallest integer `k` with `num <= den · 2^k`, evaluated in f64 where `den · 2^k` is exact
/// (every f32 is a normal f64 and `k` stays within a few hundred). For quotients in the normal f32 range
/// this equals OFF-K's `fast_log2_ceil(num / den)` on the f32-rounded quotient (tested).
/// Out-of-contract inputs (non-finite, zero or negative) return 0 instead of looping or panicking;
/// every caller checks finiteness and handles `amax == 0` before calling.
pub(crate) fn ceil_log2_ratio(num: f32, den: f32) -> i32 {
    if !(num.is_finite() && num > 0.0 && den.is_finite() && den > 0.0) {
        return 0;
    }
    let n = f64::from(num);
    let d = f64::from(den);
    let exp_of = |v: f64| ((v.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    // n / d lies in (2^(k-1), 2^(k+1)) for this first guess, so each loop runs at most twice.
    let mut k = exp_of(n) - exp_of(d);
    while d * pow2_f64(k) < n {
        k += 1;
    }
    while d * pow2_f64(k - 1) >= n {
        k -= 1;
    }
    k
}
