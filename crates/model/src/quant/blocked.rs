//! Weight codecs: FP8 e4m3 with 2-D block scales and packed FP4 e2m1 with per-group ue8m0 scales,
//! plus the writers' inverses. Spec §6, §2 (shapes).

use super::scalar::{
    ceil_log2_ratio, e2m1_to_f32, f32_to_e2m1, f32_to_e4m3, ue8m0_to_f32, E4M3_LUT,
};
use super::{
    checked_elems, expect_finite, expect_len, expect_nonzero_block, QuantError, E2M1_MAX, E4M3_MAX,
};

/// The block-scale tensor of an FP8 weight (the `.scale` companion of `*.weight`, spec §2).
///
/// Shape `[ceil(rows/block), ceil(cols/block)]`, row-major, one scale per `block`×`block` tile.
/// Source: spec §6 — Flash stores ue8m0 (`F8_E8M0`) scales, Flash-Base stores `F32` scales.
#[derive(Debug, Clone, Copy)]
pub enum BlockScales<'a> {
    /// ue8m0 bytes: byte `e` is the scale `2^(e-127)`; `0xFF` is NaN (see [`ue8m0_to_f32`]).
    Ue8m0(&'a [u8]),
    /// Plain f32 scales.
    F32(&'a [f32]),
}

impl BlockScales<'_> {
    /// Number of scales held.
    fn count(&self) -> usize {
        match self {
            BlockScales::Ue8m0(s) => s.len(),
            BlockScales::F32(s) => s.len(),
        }
    }

    /// Scale `i` as f32; `i` must be in bounds (checked by the callers through [`Self::count`]).
    #[inline]
    fn get(&self, i: usize) -> f32 {
        match self {
            BlockScales::Ue8m0(s) => ue8m0_to_f32(s[i]),
            BlockScales::F32(s) => s[i],
        }
    }
}

/// Dequantises an FP8 e4m3 weight with one scale per `block`×`block` tile (spec §6 "FP8 linear
/// weights").
///
/// - `w`: e4m3fn bytes, row-major `[rows, cols]` (`[out, in]`), length `rows * cols`.
/// - `scales`: row-major `[ceil(rows/block), ceil(cols/block)]` (ue8m0 or f32, see [`BlockScales`]);
///   edge tiles of a non-multiple shape are partial and use their own scale.
/// - `block`: tile edge (128 for DeepSeek-V4).
///
/// Returns `W[o, i] = e4m3(w[o, i]) · S[o / block, i / block]` as row-major f32 `[rows, cols]`; the
/// product is a single f32 multiplication, exactly as `weight.float() * scale` in PyTorch. NaN codes or a
/// NaN scale (`0xFF`) propagate as NaN, like the reference.
///
/// # Errors
/// [`QuantError::ZeroBlock`] if `block == 0`; [`QuantError::ShapeOverflow`] if `rows * cols` overflows;
/// [`QuantError::LengthMismatch`] if `w` or `scales` has the wrong length.
pub fn dequant_fp8_blocked(
    w: &[u8],
    rows: usize,
    cols: usize,
    scales: BlockScales<'_>,
    block: usize,
) -> Result<Vec<f32>, QuantError> {
    expect_nonzero_block("FP8 block size", block)?;
    let n = checked_elems(rows, cols)?;
    expect_len("FP8 weight bytes [rows, cols]", n, w.len())?;
    let block_cols = cols.div_ceil(block);
    // Cannot overflow: ceil(rows/block) * ceil(cols/block) <= rows * cols when both are non-zero.
    let n_scales = rows.div_ceil(block) * block_cols;
    expect_len(
        "FP8 block scales [ceil(rows/block), ceil(cols/block)]",
        n_scales,
        scales.count(),
    )?;
    let mut out = Vec::with_capacity(n);
    if cols == 0 {
        return Ok(out);
    }
    for (r, wrow) in w.chunks_exact(cols).enumerate() {
        let srow = (r / block) * block_cols;
        for (cb, chunk) in wrow.chunks(block).enumerate() {
            let s = scales.get(srow + cb);
            out.extend(chunk.iter().map(|&b| E4M3_LUT[usize::from(b)] * s));
        }
    }
    Ok(out)
}

/// Dequantises a packed FP4 e2m1 weight with one ue8m0 scale per `group` consecutive inputs (spec §6
/// "FP4 routed experts", MXFP4-style).
///
/// - `packed`: bytes `[rows, cols/2]` row-major (safetensors `I8`); logical element `2k` of a row is the
///   **low** nibble of byte `k`, element `2k+1` the **high** nibble.
/// - `rows`, `cols`: logical shape `[out, in]`; `cols` must be even.
/// - `scales`: ue8m0 bytes `[rows, ceil(cols/group)]` row-major (`[rows, cols/32]` for the Flash experts);
///   a trailing partial group, if any, has its own scale.
/// - `group`: inputs per scale (32 for DeepSeek-V4).
///
/// Returns `W[o, i] = e2m1(nibble(o, i)) · 2^(S[o, i/group] − 127)` as row-major f32 `[rows, cols]`
/// (exact; a `0xFF` scale gives NaN).
///
/// # Errors
/// [`QuantError::ZeroBlock`] if `group == 0`; [`QuantError::OddColumns`] if `cols` is odd;
/// [`QuantError::ShapeOverflow`]; [`QuantError::LengthMismatch`] if `packed` or `scales` has the wrong
/// length.
pub fn dequant_fp4_grouped(
    packed: &[u8],
    rows: usize,
    cols: usize,
    scales: &[u8],
    group: usize,
) -> Result<Vec<f32>, QuantError> {
    expect_nonzero_block("FP4 group size", group)?;
    if cols & 1 != 0 {
        return Err(QuantError::OddColumns { cols });
    }
    let n = checked_elems(rows, cols)?;
    expect_len("FP4 packed bytes [rows, cols/2]", n / 2, packed.len())?;
    let groups = cols.div_ceil(group);
    // Cannot overflow: rows * ceil(cols/group) <= rows * cols.
    expect_len(
        "FP4 group scales [rows, ceil(cols/group)]",
        rows * groups,
        scales.len(),
    )?;
    let mut out = Vec::with_capacity(n);
    if cols == 0 {
        return Ok(out);
    }
    for (prow, srow) in packed
        .chunks_exact(cols / 2)
        .zip(scales.chunks_exact(groups))
    {
        for (g, &sbyte) in srow.iter().enumerate() {
            let s = ue8m0_to_f32(sbyte);
            let end = ((g + 1) * group).min(cols);
            out.extend((g * group..end).map(|i| {
                let byte = prow[i / 2];
                let nibble = if i & 1 == 0 { byte & 0x0F } else { byte >> 4 };
                e2m1_to_f32(nibble) * s
            }));
        }
    }
    Ok(out)
}

/// ue8m0 byte of the scale `2^ceil(log2(amax/qmax))` (amax 0 -> byte 127, i.e. 1.0), clamped to the
/// representable exponents [-127, 127]. The clamp never loses range: at the low end every value of the
/// block already fits, at the high end finite f32 inputs never get there.
fn ue8m0_scale_byte(amax: f32, qmax: f32) -> u8 {
    if amax == 0.0 {
        return 127;
    }
    let k = ceil_log2_ratio(amax, qmax).clamp(-127, 127);
    (k + 127) as u8
}

/// Quantises an f32 weight to FP8 e4m3 with one ue8m0 scale per `block`×`block` tile — the writers'
/// inverse of [`dequant_fp8_blocked`], used to build official-layout test checkpoints (spec §6, §2).
///
/// - `w`: f32 row-major `[rows, cols]`, all finite.
/// - Per tile: `amax = max |x|`, `scale = 2^ceil(log2(amax/448))` (exact power of two; amax 0 gives
///   scale byte 127 = 1.0), values `e4m3(x / scale)` with round-to-nearest-even.
///
/// Returns `(bytes [rows*cols] row-major, scale bytes [ceil(rows/block) * ceil(cols/block)] row-major)`.
/// Dequantising gives every element within `|x|·2^-4 + scale·2^-10` of the input.
///
/// # Errors
/// [`QuantError::ZeroBlock`]; [`QuantError::ShapeOverflow`]; [`QuantError::LengthMismatch`] if
/// `w.len() != rows*cols`; [`QuantError::NonFinite`] for a NaN/inf element.
pub fn quantize_fp8_blocked(
    w: &[f32],
    rows: usize,
    cols: usize,
    block: usize,
) -> Result<(Vec<u8>, Vec<u8>), QuantError> {
    expect_nonzero_block("FP8 block size", block)?;
    let n = checked_elems(rows, cols)?;
    expect_len("f32 weight [rows, cols]", n, w.len())?;
    expect_finite("f32 weight for FP8 quantisation", w)?;
    let block_rows = rows.div_ceil(block);
    let block_cols = cols.div_ceil(block);
    let mut scale_bytes = Vec::with_capacity(block_rows * block_cols);
    let mut scale_vals = Vec::with_capacity(block_cols);
    let mut q = vec![0u8; n];
    for br in 0..block_rows {
        let r0 = br * block;
        let r1 = (r0 + block).min(rows);
        scale_vals.clear();
        for bc in 0..block_cols {
            let c0 = bc * block;
            let c1 = (c0 + block).min(cols);
            let amax = (r0..r1)
                .flat_map(|r| w[r * cols + c0..r * cols + c1].iter())
                .fold(0.0f32, |m, v| m.max(v.abs()));
            let byte = ue8m0_scale_byte(amax, E4M3_MAX);
            scale_bytes.push(byte);
            scale_vals.push(ue8m0_to_f32(byte));
        }
        for r in r0..r1 {
            let src = &w[r * cols..(r + 1) * cols];
            let dst = &mut q[r * cols..(r + 1) * cols];
            for ((sc, dc), &s) in src
                .chunks(block)
                .zip(dst.chunks_mut(block))
                .zip(scale_vals.iter())
            {
                for (d, &x) in dc.iter_mut().zip(sc) {
                    *d = f32_to_e4m3(x / s);
                }
            }
        }
    }
    Ok((q, scale_bytes))
}

/// Quantises an f32 weight to packed FP4 e2m1 with one ue8m0 scale per `group` consecutive inputs of a
/// row — the writers' inverse of [`dequant_fp4_grouped`] (spec §6 "FP4 routed experts").
///
/// - `w`: f32 row-major `[rows, cols]`, all finite; `cols` even.
/// - Per row, per group: `amax = max |x|`, `scale = 2^ceil(log2(amax/6))` (amax 0 gives 1.0),
///   `nibble = e2m1(x / scale)` (nearest, ties to even, see [`f32_to_e2m1`]).
///
/// Returns `(packed [rows*cols/2] with element 2k in the low nibble of byte k, scales
/// [rows * ceil(cols/group)])` — `[rows*cols/group]` when `group` divides `cols`. Values that are
/// e2m1 grid points times their group's scale round-trip exactly.
///
/// # Errors
/// [`QuantError::ZeroBlock`]; [`QuantError::OddColumns`]; [`QuantError::ShapeOverflow`];
/// [`QuantError::LengthMismatch`] if `w.len() != rows*cols`; [`QuantError::NonFinite`].
pub fn quantize_fp4_grouped(
    w: &[f32],
    rows: usize,
    cols: usize,
    group: usize,
) -> Result<(Vec<u8>, Vec<u8>), QuantError> {
    expect_nonzero_block("FP4 group size", group)?;
    if cols & 1 != 0 {
        return Err(QuantError::OddColumns { cols });
    }
    let n = checked_elems(rows, cols)?;
    expect_len("f32 weight [rows, cols]", n, w.len())?;
    expect_finite("f32 weight for FP4 quantisation", w)?;
    let groups = cols.div_ceil(group);
    let mut packed = vec![0u8; n / 2];
    let mut scales = Vec::with_capacity(rows * groups);
    if cols == 0 {
        return Ok((packed, scales));
    }
    for (row, prow) in w.chunks_exact(cols).zip(packed.chunks_exact_mut(cols / 2)) {
        for (g, chunk) in row.chunks(group).enumerate() {
            let amax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let byte = ue8m0_scale_byte(amax, E2M1_MAX);
            scales.push(byte);
            let s = ue8m0_to_f32(byte);
            for (j, &x) in chunk.iter().enumerate() {
                let i = g * group + j;
                let nib = f32_to_e2m1(x / s);
                if i & 1 == 0 {
                    prow[i / 2] |= nib;
                } else {
                    prow[i / 2] |= nib << 4;
                }
            }
        }
    }
    Ok((packed, scales))
}
