//! "Official mode" numerics simulations (spec §10): FP8 activation quant-dequant, KV non-RoPE FP8
//! round trip, and the indexer's Hadamard + FP4 round trip. All operate in place on f32.

use super::scalar::{
    ceil_log2_ratio, e2m1_to_f32, e4m3_to_f32, f32_to_e2m1, f32_to_e4m3, pow2_f32,
};
use super::{
    expect_finite, expect_multiple, expect_nonzero_block, QuantError, ACT_AMAX_FLOOR, E2M1_MAX,
    E4M3_MAX, FP4_AMAX_FLOOR,
};

/// FP8 quant-dequant of one block in place: `amax = max(max|x|, 1e-4)`, `s = 2^ceil(log2(amax/448))`,
/// `x <- e4m3(clamp(x/s, ±448)) · s`. Values must be finite (checked by the callers).
fn fp8_block_roundtrip(block: &mut [f32]) {
    let amax = block
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()))
        .max(ACT_AMAX_FLOOR);
    // amax in [1e-4, f32::MAX] -> k in [-22, 120]: s is a normal f32 power of two, so x/s and q·s are
    // exact (an x/s that underflows is far below the smallest e4m3 subnormal and encodes to 0 anyway).
    let s = pow2_f32(ceil_log2_ratio(amax, E4M3_MAX));
    for v in block.iter_mut() {
        let q = f32_to_e4m3((*v / s).clamp(-E4M3_MAX, E4M3_MAX));
        *v = e4m3_to_f32(q) * s;
    }
}

/// FP8 e4m3 activation quant-dequant in place, per `block` contiguous features (spec §6 "Official
/// activation quantisation", §10.1; OFF-K `act_quant` with ue8m0 scale rounding).
///
/// For each block of `block` (128 in DeepSeek-V4) consecutive elements:
/// `amax = max(max|x|, 1e-4)`, `s = 2^ceil(log2(amax/448))` (exact power of two),
/// `x <- e4m3(clamp(x/s, ±448)) · s` with round-to-nearest-even. Pass one row `[K]` or several rows
/// `[R, K]` flattened row-major; blocks never straddle rows as long as `K` is a multiple of `block`.
///
/// # Errors
/// [`QuantError::ZeroBlock`] if `block == 0`; [`QuantError::NotMultiple`] if `x.len()` is not a multiple
/// of `block`; [`QuantError::NonFinite`] if any element is NaN/inf. On error `x` is left unchanged.
pub fn act_quant_fp8_roundtrip(x: &mut [f32], block: usize) -> Result<(), QuantError> {
    expect_multiple("activation row(s) for FP8 quantisation", x.len(), block)?;
    expect_finite("activation for FP8 quantisation", x)?;
    for b in x.chunks_exact_mut(block) {
        fp8_block_roundtrip(b);
    }
    Ok(())
}

/// KV-cache FP8 simulation on one head vector, in place (spec §10.2; OFF-M QAT simulation of the
/// non-RoPE KV dims).
///
/// - `x`: one KV head vector, e.g. `[512]` f32 after RoPE.
/// - Dims `[0, nope_dims)` (448 in DeepSeek-V4) are processed in blocks of `block` (64) channels with the
///   same formula as [`act_quant_fp8_roundtrip`]: `s = 2^ceil(log2(max(amax, 1e-4)/448))`,
///   `x <- e4m3(clamp(x/s, ±448)) · s`.
/// - Dims `>= nope_dims` (the RoPE dims) are left bit-for-bit untouched.
///
/// # Errors
/// [`QuantError::ZeroBlock`] if `block == 0`; [`QuantError::NopeDimsOutOfRange`] if
/// `nope_dims > x.len()`; [`QuantError::NotMultiple`] if `nope_dims` is not a multiple of `block`;
/// [`QuantError::NonFinite`] if a nope dim is NaN/inf. On error `x` is left unchanged.
pub fn kv_nope_fp8_roundtrip(
    x: &mut [f32],
    nope_dims: usize,
    block: usize,
) -> Result<(), QuantError> {
    expect_nonzero_block("KV FP8 block size", block)?;
    if nope_dims > x.len() {
        return Err(QuantError::NopeDimsOutOfRange {
            nope_dims,
            len: x.len(),
        });
    }
    expect_multiple("KV nope dims", nope_dims, block)?;
    let nope = &mut x[..nope_dims];
    expect_finite("KV nope dims for FP8 simulation", nope)?;
    for b in nope.chunks_exact_mut(block) {
        fp8_block_roundtrip(b);
    }
    Ok(())
}

/// Sylvester-ordered Walsh–Hadamard transform normalised by `len^-1/2`, in place (spec §4.10, §10.3;
/// OFF-M uses `fast_hadamard_transform.hadamard_transform(x, scale=dim**-0.5)`).
///
/// `x <- H_n x / sqrt(n)` with `H_1 = [1]`, `H_2n = [[H_n, H_n], [H_n, -H_n]]`, i.e.
/// `H[i][j] = (-1)^popcount(i & j)`. The normalised transform is symmetric and orthonormal (its own
/// inverse). Computed with the radix-2 butterfly in f32, then one multiplication by the f32-rounded
/// `1/sqrt(n)`; the summation order differs from the CUDA kernel, so results agree to rounding, not bits.
///
/// # Errors
/// [`QuantError::NotPowerOfTwo`] if `x.len()` is 0 or not a power of two.
pub fn hadamard_normalized(x: &mut [f32]) -> Result<(), QuantError> {
    let n = x.len();
    if !n.is_power_of_two() {
        return Err(QuantError::NotPowerOfTwo { len: n });
    }
    let mut h = 1;
    while h < n {
        for pair in x.chunks_exact_mut(2 * h) {
            let (lo, hi) = pair.split_at_mut(h);
            for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                let (u, v) = (*a, *b);
                *a = u + v;
                *b = u - v;
            }
        }
        h *= 2;
    }
    // Python computes dim ** -0.5 in f64; the kernel receives it as an f32.
    let scale = (1.0 / (n as f64).sqrt()) as f32;
    for v in x.iter_mut() {
        *v *= scale;
    }
    Ok(())
}

/// Indexer FP4 simulation on one index query/key head vector, in place (spec §10.3, §4.10).
///
/// - `x`: one head vector (128 f32 in DeepSeek-V4); its length must be a power of two and a multiple of
///   `block`. For several heads call once per head.
/// - First `x <- hadamard_normalized(x)`; then per `block` (32) channels
///   `s = 2^ceil(log2(max(amax, 6·2^-126)/6))`, `x <- e2m1(clamp(x/s, ±6)) · s` (nearest, ties to even).
/// - The result stays in the rotated basis: the rotation is orthonormal, so dot products of two rotated
///   vectors equal those of the unrotated ones and the indexer score needs no inverse transform.
///
/// # Errors
/// [`QuantError::ZeroBlock`]; [`QuantError::NotPowerOfTwo`]; [`QuantError::NotMultiple`] if `block` does
/// not divide `x.len()`; [`QuantError::NonFinite`] if an input, or a value after the rotation (overflow),
/// is NaN/inf. On error `x` is left unchanged.
pub fn indexer_hadamard_fp4_roundtrip(x: &mut [f32], block: usize) -> Result<(), QuantError> {
    expect_nonzero_block("indexer FP4 block size", block)?;
    if !x.len().is_power_of_two() {
        return Err(QuantError::NotPowerOfTwo { len: x.len() });
    }
    expect_multiple("indexer head vector for FP4 simulation", x.len(), block)?;
    expect_finite("indexer head vector for FP4 simulation", x)?;
    let mut y = x.to_vec();
    hadamard_normalized(&mut y)?;
    expect_finite("indexer head vector after Hadamard rotation", &y)?;
    for b in y.chunks_exact_mut(block) {
        let amax = b
            .iter()
            .fold(0.0f32, |m, v| m.max(v.abs()))
            .max(FP4_AMAX_FLOOR);
        // amax in [6·2^-126, f32::MAX] -> k in [-126, 126]: s is a normal f32 power of two, so x/s is
        // exact wherever it matters (an underflowing x/s encodes to 0 anyway) and q·s is exact.
        let s = pow2_f32(ceil_log2_ratio(amax, E2M1_MAX));
        for v in b.iter_mut() {
            let q = f32_to_e2m1((*v / s).clamp(-E2M1_MAX, E2M1_MAX));
            *v = e2m1_to_f32(q) * s;
        }
    }
    x.copy_from_slice(&y);
    Ok(())
}
