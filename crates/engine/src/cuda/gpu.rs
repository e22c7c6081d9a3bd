//! A CUDA device: context (event tracking off, before any allocation), one stream, the compiled
//! kernel modules, and the op launchers.

use super::{guard, nvrtc, CudaError, KERNEL_SOURCES};
use crate::cpu::rope::Rope;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::sync::Arc;

fn drv<T>(what: &str, r: Result<T, cudarc::driver::DriverError>) -> Result<T, CudaError> {
    r.map_err(|e| CudaError::Driver { what: what.into(), detail: format!("{e:?}") })
}

/// A weight matrix `[rows, cols]` on the device in its stored format (spec §6).
pub enum GpuMatrix {
    /// f32 `[rows, cols]`.
    F32(CudaSlice<f32>),
    /// bf16 bits `[rows, cols]`.
    Bf16(CudaSlice<u16>),
    /// e4m3 `[rows, cols]` + ue8m0 scales `[ceil(rows/128), ceil(cols/128)]`.
    Fp8 {
        /// Values.
        w: CudaSlice<u8>,
        /// Block scales.
        scales: CudaSlice<u8>,
    },
    /// Packed e2m1 `[rows, cols/2]` + ue8m0 scales `[rows, cols/32]`.
    Fp4 {
        /// Packed values.
        w: CudaSlice<u8>,
        /// Group scales.
        scales: CudaSlice<u8>,
    },
}

/// A matrix with its shape.
pub struct GpuWeight {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Storage.
    pub data: GpuMatrix,
}

/// One CUDA device with the flashseek kernels loaded.
pub struct Gpu {
    /// The context.
    pub ctx: Arc<CudaContext>,
    /// The stream all ops run on.
    pub stream: Arc<CudaStream>,
    /// Target architecture, e.g. `sm_90a`.
    pub arch: String,
    functions: HashMap<&'static str, CudaFunction>,
}

/// The kernel entry points per source file.
const ENTRY_POINTS: &[(&str, &[&str])] = &[
    ("norm.cu", &["rms_norm_f32"]),
    ("rope.cu", &["rope_f32"]),
    (
        "linear.cu",
        &[
            "linear_f32",
            "linear_bf16",
            "linear_fp8",
            "linear_fp4",
            "linear_f32_t1",
            "linear_bf16_t1",
            "linear_fp8_t1",
            "linear_fp4_t1",
        ],
    ),
    ("attention.cu", super::ops_attention::ATTENTION_ENTRY_POINTS),
    ("compressor.cu", super::ops_attention::COMPRESSOR_ENTRY_POINTS),
    ("indexer.cu", super::ops_attention::INDEXER_ENTRY_POINTS),
    ("mhc.cu", super::ops_mhc::MHC_ENTRY_POINTS),
    ("moe.cu", super::ops_mhc::MOE_ENTRY_POINTS),
];

impl Gpu {
    /// Opens device `ordinal`, compiles (or loads from `cache_dir`) every kernel for its
    /// architecture (`sm_{major}{minor}`, with the `a` suffix on Hopper to allow wgmma).
    ///
    /// Errors: no driver/device ([`CudaError::Unavailable`]), NVRTC missing or failing, load failures.
    pub fn open(ordinal: usize, cache_dir: &std::path::Path) -> Result<Self, CudaError> {
        let ctx = guard("driver", || CudaContext::new(ordinal))?;
        let ctx = drv("creating the context", ctx)?;
        // SAFETY: called right after creation, before any allocation (cudarc PR #555).
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = drv("reading the compute capability", ctx.compute_capability())?;
        let arch = if major == 9 { format!("sm_{major}{minor}a") } else { format!("sm_{major}{minor}") };
        let stream = ctx.default_stream();
        let mut functions = HashMap::new();
        for (file, src) in KERNEL_SOURCES {
            let cubin = nvrtc::compile_cached(cache_dir, file, src, &arch)?;
            let module = drv(&format!("loading {file}"), ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)))?;
            let names = ENTRY_POINTS.iter().find(|(f, _)| f == file).map(|(_, n)| *n).unwrap_or(&[]);
            for name in names {
                functions.insert(*name, drv(&format!("finding {name}"), module.load_function(name))?);
            }
        }
        Ok(Gpu { ctx, stream, arch, functions })
    }

    /// The loaded kernel `name` (an entry point listed for its source file).
    pub fn f(&self, name: &str) -> &CudaFunction {
        &self.functions[name]
    }

    /// Copies host data to the device.
    pub fn upload<T: cudarc::driver::DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, CudaError> {
        drv("upload", self.stream.clone_htod(data))
    }

    /// Copies device data to the host (synchronizes the stream).
    pub fn download<T: cudarc::driver::DeviceRepr + Default + Clone>(&self, data: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        drv("download", self.stream.clone_dtoh(data))
    }

    /// Zero-filled device buffer.
    pub fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>, CudaError> {
        drv("alloc", self.stream.alloc_zeros(n))
    }

    /// Waits for the stream.
    pub fn sync(&self) -> Result<(), CudaError> {
        drv("synchronize", self.stream.synchronize())
    }

    /// RMSNorm of `rows` rows of width `n` (spec §3.1): `y = w ⊙ x / sqrt(mean(x²)+eps)`, unweighted
    /// when `w` is None.
    pub fn rms_norm(&self, x: &CudaSlice<f32>, w: Option<&CudaSlice<f32>>, y: &mut CudaSlice<f32>, rows: usize, n: usize, eps: f32) -> Result<(), CudaError> {
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let n_i = n as i32;
        let mut b = self.stream.launch_builder(self.f("rms_norm_f32"));
        b.arg(x);
        let null = 0u64;
        match w {
            Some(w) => b.arg(w),
            None => b.arg(&null),
        };
        b.arg(y).arg(&n_i).arg(&eps);
        // SAFETY: argument list matches rms_norm_f32's signature; buffers hold rows·n floats.
        drv("rms_norm_f32", unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// Interleaved RoPE (inverse when `inverse`) on the trailing `rope.dim` channels of each head of
    /// `x` (`[tokens, heads, head_dim]`), token t at position `pos0 + t` (spec §3.2).
    #[allow(clippy::too_many_arguments)]
    pub fn rope(&self, x: &mut CudaSlice<f32>, inv_freq: &CudaSlice<f32>, rope: &Rope, tokens: usize, heads: usize, head_dim: usize, pos0: usize, inverse: bool) -> Result<(), CudaError> {
        let cfg = LaunchConfig { grid_dim: ((tokens * heads) as u32, 1, 1), block_dim: ((rope.dim / 2).max(1) as u32, 1, 1), shared_mem_bytes: 0 };
        let (h, hd, rd, p0) = (heads as i32, head_dim as i32, rope.dim as i32, pos0 as i32);
        let sign = if inverse { -1.0f32 } else { 1.0 };
        let mut b = self.stream.launch_builder(self.f("rope_f32"));
        b.arg(x).arg(inv_freq).arg(&h).arg(&hd).arg(&rd).arg(&p0).arg(&sign);
        // SAFETY: matches rope_f32's signature.
        drv("rope_f32", unsafe { b.launch(cfg) }).map(|_| ())
    }

    /// `y[t, n] = Σ_k x[t, k]·W[n, k]` for `t` tokens, dequantizing W in the kernel.
    ///
    /// Errors: `cols` not a multiple of the format's vector width (4 f32, 8 bf16, 16 FP8, 32 FP4).
    pub fn linear(&self, x: &CudaSlice<f32>, w: &GpuWeight, y: &mut CudaSlice<f32>, t: usize) -> Result<(), CudaError> {
        let (n, k) = (w.rows as i32, w.cols as i32);
        let tt = t as i32;
        let need = match w.data {
            GpuMatrix::F32(_) => 4,
            GpuMatrix::Bf16(_) => 8,
            GpuMatrix::Fp8 { .. } => 16,
            GpuMatrix::Fp4 { .. } => 32,
        };
        if !w.cols.is_multiple_of(need) {
            return Err(CudaError::Unsupported { what: "linear", detail: format!("input width {} is not a multiple of {need}", w.cols) });
        }
        // Row blocks are capped (each block loops over rows) so x is staged once per block.
        const MAX_ROW_BLOCKS: usize = 132 * 8;
        let cfg = LaunchConfig {
            grid_dim: (w.rows.div_ceil(8).min(MAX_ROW_BLOCKS) as u32, t.div_ceil(8) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (fmt, s): (&str, Option<&CudaSlice<u8>>) = match &w.data {
            GpuMatrix::F32(_) => ("f32", None),
            GpuMatrix::Bf16(_) => ("bf16", None),
            GpuMatrix::Fp8 { scales, .. } => ("fp8", Some(scales)),
            GpuMatrix::Fp4 { scales, .. } => ("fp4", Some(scales)),
        };
        let name = format!("linear_{fmt}{}", if t == 1 { "_t1" } else { "" });
        let null = 0u64;
        let mut b = self.stream.launch_builder(self.f(&name));
        b.arg(x);
        match &w.data {
            GpuMatrix::F32(m) => b.arg(m),
            GpuMatrix::Bf16(m) => b.arg(m),
            GpuMatrix::Fp8 { w: m, .. } | GpuMatrix::Fp4 { w: m, .. } => b.arg(m),
        };
        match s {
            Some(s) => b.arg(s),
            None => b.arg(&null),
        };
        b.arg(y).arg(&tt).arg(&n).arg(&k);
        // SAFETY: matches the (x, W, S, y, T, N, K) signature of every linear entry point.
        let r = unsafe { b.launch(cfg) };
        drv(&name, r).map(|_| ())
    }
}
