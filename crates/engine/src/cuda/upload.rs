//! Where the GPU model's weights come from ([`GpuSource`]): a [`TensorSource`] (dequantized to f32;
//! used for parity on f32 goldens), a checkpoint in its stored formats (FP8 e4m3 + ue8m0 128×128
//! scales, FP4 e2m1 + ue8m0 per 32, BF16, F32 — uploaded byte for byte, dequantized in the
//! kernels; spec §6), or random bytes in DeepSeek's official formats (benchmarks at full size).

use super::gpu::{Gpu, GpuMatrix, GpuWeight};
use super::CudaError;
use crate::weights::TensorSource;
use flashseek_model::checkpoint::official::{canonical_tensors, OfficialFormat};
use flashseek_model::checkpoint::{Checkpoint, StoredDtype};
use flashseek_model::config::Ds4Config;
use std::collections::HashMap;

fn bad(name: &str, e: impl std::fmt::Display) -> CudaError {
    CudaError::Unsupported { what: "weight upload", detail: format!("{name}: {e}") }
}

/// A source of device weights by canonical name (spec §2 names).
pub trait GpuSource {
    /// Matrix `name` of logical shape `[rows, cols]`.
    fn matrix(&self, gpu: &Gpu, name: &str, rows: usize, cols: usize) -> Result<GpuWeight, CudaError>;
    /// Host-side f32 values of tensor `name` with logical `shape` (norm weights, biases, sinks,
    /// `ape`, mHC parameters, the embedding).
    fn host(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CudaError>;
    /// Integer table `[rows, cols]` (tid2eid).
    fn table(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<i64>, CudaError>;
}

/// Any [`TensorSource`], uploaded as f32 matrices.
pub struct F32Source<'a>(pub &'a dyn TensorSource);

impl GpuSource for F32Source<'_> {
    fn matrix(&self, gpu: &Gpu, name: &str, rows: usize, cols: usize) -> Result<GpuWeight, CudaError> {
        let v = self.0.load_f32(name, &[rows, cols]).map_err(|e| bad(name, e))?;
        Ok(GpuWeight { rows, cols, data: GpuMatrix::F32(gpu.upload(&v)?) })
    }
    fn host(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CudaError> {
        self.0.load_f32(name, shape).map_err(|e| bad(name, e))
    }
    fn table(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<i64>, CudaError> {
        self.0.load_i64(name, &[rows, cols]).map_err(|e| bad(name, e))
    }
}

/// A checkpoint's tensors in their stored formats (FP8 with ue8m0 scales, FP4, BF16, F32 as they
/// are; anything else — F16, FP8 with f32 scales — dequantized to f32).
pub struct StoredSource<'a>(pub &'a Checkpoint);

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

impl GpuSource for StoredSource<'_> {
    fn matrix(&self, gpu: &Gpu, name: &str, rows: usize, cols: usize) -> Result<GpuWeight, CudaError> {
        let ck = self.0;
        let info = ck.info(name).ok_or_else(|| bad(name, "missing from the checkpoint"))?;
        let base = name.strip_suffix(".weight").unwrap_or(name);
        let scale = ck.info(&format!("{base}.scale"));
        // The kernels index scales by the weight's shape: a scale tensor of another shape would be
        // read out of bounds, so it is refused here (spec §6 layouts).
        if let Some(s) = &scale {
            let want: Option<Vec<usize>> = match info.dtype {
                StoredDtype::F8E4M3 => Some(vec![rows.div_ceil(128), cols.div_ceil(128)]),
                StoredDtype::I8 | StoredDtype::U8 => Some(vec![rows, cols.div_ceil(32)]),
                _ => None,
            };
            if let Some(want) = want.filter(|w| s.dtype == StoredDtype::F8E8M0 && *w != s.shape) {
                return Err(bad(name, format!("scale tensor {base}.scale has shape {:?}, expected {want:?} for a [{rows}, {cols}] weight", s.shape)));
            }
        }
        let data = match (&info.dtype, scale.as_ref().map(|s| &s.dtype)) {
            (StoredDtype::F8E4M3, Some(StoredDtype::F8E8M0)) if info.shape == [rows, cols] => GpuMatrix::Fp8 {
                w: gpu.upload(ck.raw_bytes(name).map_err(|e| bad(name, e))?)?,
                scales: gpu.upload(ck.raw_bytes(&format!("{base}.scale")).map_err(|e| bad(name, e))?)?,
            },
            (StoredDtype::I8 | StoredDtype::U8, Some(StoredDtype::F8E8M0)) if info.shape == [rows, cols / 2] && cols.is_multiple_of(32) => {
                let scales = ck.raw_bytes(&format!("{base}.scale")).map_err(|e| bad(name, e))?;
                GpuMatrix::Fp4 { w: gpu.upload(ck.raw_bytes(name).map_err(|e| bad(name, e))?)?, scales: gpu.upload(scales)?, fold: super::ops_q8::fp4_fold_exact(scales, cols) }
            }
            (StoredDtype::BF16, None) if info.shape == [rows, cols] && cols.is_multiple_of(8) => {
                GpuMatrix::Bf16(gpu.upload(&u16s(ck.raw_bytes(name).map_err(|e| bad(name, e))?))?)
            }
            _ => GpuMatrix::F32(gpu.upload(&ck.load_f32(name, &[rows, cols]).map_err(|e| bad(name, e))?)?),
        };
        Ok(GpuWeight { rows, cols, data })
    }
    fn host(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CudaError> {
        self.0.load_f32(name, shape).map_err(|e| bad(name, e))
    }
    fn table(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<i64>, CudaError> {
        self.0.load_i64(name, &[rows, cols]).map_err(|e| bad(name, e))
    }
}

/// Random weights in DeepSeek's official format of each tensor (spec §2, §6): FP8 bytes with
/// ue8m0 scales near 2^-8, FP4 nibbles with scales near 2^-6, BF16/F32 values of a sensible
/// magnitude (tensors the official layout lists as BF16 rounded to bf16 by `host` too, as `matrix`
/// stores every name it does not list as FP8/FP4/F32). For speed measurements only (the numbers
/// are not a model).
pub struct RandomOfficialSource {
    formats: HashMap<String, OfficialFormat>,
    seed: u64,
    n_experts: usize,
}

impl RandomOfficialSource {
    /// Formats from the official layout of `cfg`.
    pub fn new(cfg: &Ds4Config, seed: u64) -> Self {
        RandomOfficialSource {
            formats: canonical_tensors(cfg).into_iter().map(|t| (t.name, t.format)).collect(),
            seed,
            n_experts: cfg.n_routed_experts,
        }
    }
    /// `n` pseudo-random bytes for tensor `name`: xorshift64 streams of 1 MiB chunks, each seeded from
    /// (seed, name, chunk), generated in parallel (the values do not depend on the thread count).
    fn bytes(&self, name: &str, n: usize, map: impl Fn(u64) -> u8 + Sync) -> Vec<u8> {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 20;
        let base = crate::testing::fnv1a64(&format!("{}:{name}", self.seed));
        let mut out = vec![0u8; n];
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
            let mut s = (base ^ (c as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
            for v in chunk.iter_mut() {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                *v = map(s >> 24);
            }
        });
        out
    }
}

impl GpuSource for RandomOfficialSource {
    fn matrix(&self, gpu: &Gpu, name: &str, rows: usize, cols: usize) -> Result<GpuWeight, CudaError> {
        let fmt = self.formats.get(name).copied().unwrap_or(OfficialFormat::Bf16);
        // e4m3 bytes without NaN (0x7F/0xFF) and magnitudes up to 2^3; FP4 any nibble.
        let data = match fmt {
            OfficialFormat::Fp8 => GpuMatrix::Fp8 {
                w: gpu.upload(&self.bytes(name, rows * cols, |r| (r as u8 & 0x80) | ((r >> 8) as u8 % 0x58)))?,
                scales: gpu.upload(&vec![119u8; rows.div_ceil(128) * cols.div_ceil(128)])?,
            },
            OfficialFormat::Fp4 => GpuMatrix::Fp4 {
                w: gpu.upload(&self.bytes(name, rows * cols / 2, |r| r as u8))?,
                scales: gpu.upload(&vec![121u8; rows * cols.div_ceil(32)])?,
                fold: cols.is_multiple_of(128),
            },
            OfficialFormat::F32 => GpuMatrix::F32(gpu.upload(&self.host(name, &[rows, cols])?)?),
            _ => {
                let v = self.host(name, &[rows, cols])?;
                GpuMatrix::Bf16(gpu.upload(&v.iter().map(|x| flashseek_model::quant::f32_to_bf16(*x)).collect::<Vec<_>>())?)
            }
        };
        Ok(GpuWeight { rows, cols, data })
    }
    fn host(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CudaError> {
        let len: usize = shape.iter().product();
        let (off, scale) = crate::testing::value_rule(name, shape);
        let b = self.bytes(name, len, |r| r as u8);
        let v = b.iter().map(|v| (off + scale * (*v as f64 / 128.0 - 1.0)) as f32);
        // A BF16 tensor (norm weights, weights_proj, …) holds bf16 values, as in a real checkpoint.
        if self.formats.get(name) == Some(&OfficialFormat::Bf16) {
            use flashseek_model::quant::{bf16_to_f32, f32_to_bf16};
            return Ok(v.map(|x| bf16_to_f32(f32_to_bf16(x))).collect());
        }
        Ok(v.collect())
    }
    fn table(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<i64>, CudaError> {
        // Row r: experts (b_r + 37·j) mod E, distinct for E a power of two ≥ cols.
        let e = self.n_experts.max(1);
        let b = self.bytes(name, rows, |r| r as u8);
        Ok((0..rows * cols).map(|i| ((b[i / cols] as usize + i % cols * 37) % e) as i64).collect())
    }
}
