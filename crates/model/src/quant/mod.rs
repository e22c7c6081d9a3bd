//! Exact CPU codecs for DeepSeek-V4's stored weight formats (spec §6) and the "official numerics"
//! simulations of OFF-M / OFF-K (spec §10).
//!
//! Everything here is plain `f32` arithmetic on the CPU and is meant as the reference that GPU kernels
//! are tested against. Three groups of items, all re-exported at `flashseek_model::quant::*`:
//!
//! - **Scalar codecs**: [`bf16_to_f32`], [`f16_to_f32`], [`f32_to_bf16`], [`e4m3_to_f32`], [`f32_to_e4m3`],
//!   [`ue8m0_to_f32`], [`e2m1_to_f32`], [`f32_to_e2m1`]. Decoders are exact bit constructions; encoders round
//!   to nearest, ties to even.
//! - **Weight codecs** (spec §6): [`dequant_fp8_blocked`] (FP8 e4m3 with one scale per 128×128 tile, scales
//!   either ue8m0 or f32, see [`BlockScales`]), [`dequant_fp4_grouped`] (packed FP4 e2m1, low nibble first,
//!   one ue8m0 scale per 32 inputs), and the writers' inverses [`quantize_fp8_blocked`] and
//!   [`quantize_fp4_grouped`] (used to build official-layout test checkpoints).
//! - **Official numerics** (spec §10): [`act_quant_fp8_roundtrip`] (§10.1, activation FP8 quant-dequant),
//!   [`kv_nope_fp8_roundtrip`] (§10.2, KV non-RoPE dims), [`hadamard_normalized`] and
//!   [`indexer_hadamard_fp4_roundtrip`] (§10.3, indexer Q/K).
//!
//! # Power-of-two scales
//! All ue8m0-style scales are `2^ceil(log2(amax / qmax))`. They are computed exactly from the exponent
//! bits, never through a floating-point `log2`. The exact value equals what OFF-K computes (f32 division
//! `amax / qmax`, then `fast_log2_ceil` on the bits of the quotient) for every quotient in the normal f32
//! range, which covers all activations (see the `amax` floors of §6/§10); the unit tests check this
//! equivalence on exponent sweeps and boundary values.
//!
//! # Errors
//! No function here panics on bad input. Length, shape and block-size mismatches return
//! [`QuantError`], whose messages say what was expected and what was found.

mod blocked;
mod numerics;
mod scalar;

#[cfg(test)]
mod tests;

pub use blocked::{
    dequant_fp4_grouped, dequant_fp8_blocked, quantize_fp4_grouped, quantize_fp8_blocked,
    BlockScales,
};
pub use numerics::{
    act_quant_fp8_roundtrip, hadamard_normalized, indexer_hadamard_fp4_roundtrip,
    kv_nope_fp8_roundtrip,
};
pub use scalar::{
    bf16_to_f32, e2m1_to_f32, e4m3_to_f32, f16_to_f32, f32_to_bf16, f32_to_e2m1, f32_to_e4m3,
    ue8m0_to_f32,
};

/// Largest finite FP8 e4m3fn magnitude (`0x7E` = 1.75 · 2^8 = 448). Spec §6.
pub const E4M3_MAX: f32 = 448.0;

/// Largest FP4 e2m1 magnitude (nibble `0x7` = 6). Spec §6.
pub const E2M1_MAX: f32 = 6.0;

/// Tile edge of the FP8 weight block scales (128×128 tiles) and block length of the activation
/// quantisation (128 contiguous features). Spec §6, §10.1.
pub const FP8_BLOCK: usize = 128;

/// Number of consecutive input elements sharing one ue8m0 scale in FP4 routed-expert weights, and the
/// block length of the indexer FP4 simulation. Spec §6, §10.3.
pub const FP4_GROUP: usize = 32;

/// Block length (channels) of the KV non-RoPE FP8 simulation. Spec §10.2.
pub const KV_FP8_BLOCK: usize = 64;

/// Lower bound on the block amax in the FP8 activation / KV simulations (`max(amax, 1e-4)`, as an f32
/// literal). Spec §6 (OFF-K `act_quant`), §10.2.
pub const ACT_AMAX_FLOOR: f32 = 1e-4;

/// Lower bound on the block amax in the indexer FP4 simulation: `6 · 2^-126`, so the scale is at least
/// the smallest normal f32, `2^-126`. Spec §10.3.
pub const FP4_AMAX_FLOOR: f32 = 6.0 * f32::MIN_POSITIVE;

/// Errors of the quantisation codecs. Every variant carries what was expected and what was found.
///
/// Returned instead of panicking for any length/shape/block-size mismatch and for non-finite inputs to
/// the quantisers and simulations (which have no meaningful power-of-two scale for them).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    /// A buffer has the wrong number of elements for the given shape.
    #[error("{what}: expected {expected} elements, found {found}")]
    LengthMismatch {
        /// Which buffer (e.g. `"FP8 weight bytes"`).
        what: &'static str,
        /// Length implied by the shape arguments.
        expected: usize,
        /// Length of the slice passed in.
        found: usize,
    },
    /// A block or group size of zero was passed.
    #[error("{what}: expected a block/group size of at least 1, found 0")]
    ZeroBlock {
        /// Which size argument.
        what: &'static str,
    },
    /// A length must be a multiple of the block size but is not.
    #[error("{what}: expected a length that is a multiple of the block size {block}, found {len}")]
    NotMultiple {
        /// Which length (e.g. `"activation row(s)"`).
        what: &'static str,
        /// The offending length.
        len: usize,
        /// The block size it must be a multiple of.
        block: usize,
    },
    /// Packed FP4 needs an even number of logical columns (two e2m1 values per byte).
    #[error("FP4 packed weight: expected an even number of columns (two e2m1 values per byte), found {cols}")]
    OddColumns {
        /// The logical column count passed in.
        cols: usize,
    },
    /// The Hadamard transform needs a power-of-two length (≥ 1).
    #[error("Hadamard transform: expected a power-of-two length, found {len}")]
    NotPowerOfTwo {
        /// The length passed in.
        len: usize,
    },
    /// `rows * cols` does not fit in `usize`.
    #[error(
        "shape [{rows}, {cols}]: expected an element count that fits in usize, found overflow"
    )]
    ShapeOverflow {
        /// Rows passed in.
        rows: usize,
        /// Columns passed in.
        cols: usize,
    },
    /// A quantiser or simulation met a NaN or infinity; no finite power-of-two scale exists for it.
    #[error("{what}: expected finite values, found {value} at index {index}")]
    NonFinite {
        /// Which input.
        what: &'static str,
        /// Index of the first non-finite element (in the slice passed in).
        index: usize,
        /// The value found there.
        value: f32,
    },
    /// `nope_dims` exceeds the head vector length in the KV simulation.
    #[error("KV nope dims: expected nope_dims <= head vector length {len}, found nope_dims = {nope_dims}")]
    NopeDimsOutOfRange {
        /// The `nope_dims` argument.
        nope_dims: usize,
        /// Length of the head vector.
        len: usize,
    },
}

/// `rows * cols`, or [`QuantError::ShapeOverflow`].
fn checked_elems(rows: usize, cols: usize) -> Result<usize, QuantError> {
    rows.checked_mul(cols)
        .ok_or(QuantError::ShapeOverflow { rows, cols })
}

/// `Ok(())` if `found == expected`, else [`QuantError::LengthMismatch`].
fn expect_len(what: &'static str, expected: usize, found: usize) -> Result<(), QuantError> {
    if expected == found {
        Ok(())
    } else {
        Err(QuantError::LengthMismatch {
            what,
            expected,
            found,
        })
    }
}

/// `Ok(())` if `block >= 1`, else [`QuantError::ZeroBlock`].
fn expect_nonzero_block(what: &'static str, block: usize) -> Result<(), QuantError> {
    if block == 0 {
        Err(QuantError::ZeroBlock { what })
    } else {
        Ok(())
    }
}

/// `Ok(())` if `block` divides `len` (block must be non-zero), else [`QuantError::NotMultiple`].
fn expect_multiple(what: &'static str, len: usize, block: usize) -> Result<(), QuantError> {
    expect_nonzero_block(what, block)?;
    let rem = len % block;
    if rem == 0 {
        Ok(())
    } else {
        Err(QuantError::NotMultiple { what, len, block })
    }
}

/// `Ok(())` if every element is finite, else [`QuantError::NonFinite`] for the first one that is not.
fn expect_finite(what: &'static str, x: &[f32]) -> Result<(), QuantError> {
    match x.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(index) => Err(QuantError::NonFinite {
            what,
            index,
            value: x[index],
        }),
    }
}
