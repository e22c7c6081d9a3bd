//! cuBLASLt GEMMs at prefill shapes (issue 5 §3: "cuBLASLt block-scaled FP8 GEMM where it wins at
//! large M"): the block-scaled FP8 GEMM of the §10.1 linears under `TC_LINEAR=fp8` (switch
//! `FP8_CUBLASLT`), and bf16 GEMMs for the exact split-activation linears (switch `LINEAR_CUBLASLT`:
//! `y = W·hi + W·lo`, two products with f32 accumulation, as gemm.cu's `_x2` kernels compute it).
//!
//! Numerics: DeepSeek's recipe (spec §6), the same as gemm_q8.cu — e4m3 activations with one f32
//! (power-of-two) scale per row and 128 features (`CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F`) times
//! e4m3 weights with one f32 scale per 128 × 128 block (`BLK128x128_32F`, the ue8m0 bytes widened),
//! f32 compute and f32 output (or, for `WQ_B_BF16_OUT`, bf16 output: the f32 result rounded once by
//! cuBLASLt's epilogue, as DeepSeek's `fp8_gemm` writes it); only the accumulation order is cuBLAS's own. Needs cuBLAS ≥ 12.9
//! (block scaling for Hopper) loaded at run time: where the library is missing or older, or has no
//! algorithm for a shape, [`Gpu::linear_q8`](super::gpu::Gpu) uses gemm_q8.cu and says why once.
//!
//! Layout (cuBLASLt is column-major): `D[N × M] = op(A)·B` with A = the weight stored `[N, K]`
//! row-major (= `K × N` column-major, op T), B = the activations `[M, K]` row-major (`K × M`
//! column-major, op N) and D = `y [M, N]` row-major (`N × M` column-major): the "TN" form FP8
//! requires. Activation scales are laid out `[K/128, M]` (token fastest, what VEC128 reads for an
//! operand of K × M), weight scales `[N/128, K/128]` as stored but with rows padded to a multiple of
//! 4 blocks (16 bytes): unpadded rows of 2 blocks gave wrong outputs on the H200 (found by the
//! MoE check's [512, 256] shared expert).
//!
//! Learned from the cuBLAS documentation (cublasLtMatmul, "1D and 2D block scaling") and from how
//! PyTorch's `scaled_gemm` sets these attributes; measured against gemm_q8.cu by `gpu-check --only
//! q8` (`linear_lt …` records). The code is ours.

use super::gpu::{Gpu, GpuMatrix, GpuWeight};
use super::CudaError;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::ffi::c_void;

/// `cublasOperation_t` values (cublas_api.h; the cuBLASLt bindings do not re-export the enum).
const CUBLAS_OP_N: i32 = 0;
const CUBLAS_OP_T: i32 = 1;

/// Workspace handed to cuBLASLt (bytes).
pub const LT_WORKSPACE_BYTES: usize = 32 << 20;

/// Most cached plans (shape × alignment) before the cache is cleared.
pub const LT_MAX_PLANS: usize = 4096;

/// The largest power of two (at most 256) dividing a device address.
fn ptr_align(p: u64) -> u32 {
    if p == 0 {
        256
    } else {
        (1u64 << p.trailing_zeros().min(8)) as u32
    }
}

/// Oldest cuBLASLt with block-scaled FP8 on Hopper (`cublasLtGetVersion`, 12.9.0).
pub const LT_MIN_VERSION: usize = 120_900;

fn check(what: &str, s: sys::cublasStatus_t) -> Result<(), String> {
    if s == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {s:?}"))
    }
}

/// One GEMM shape's descriptors and the algorithm the heuristic chose for it.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulDescCreate / cublasLtMatrixLayoutCreate and destroyed
        // once; statuses on teardown are ignored (nothing useful to do with them).
        unsafe {
            for l in [self.d, self.b, self.a] {
                if !l.is_null() {
                    sys::cublasLtMatrixLayoutDestroy(l);
                }
            }
            sys::cublasLtMatmulDescDestroy(self.desc);
        }
    }
}

/// A cuBLASLt handle with its workspace and per-shape plans (shapes without an algorithm are
/// remembered as such).
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: cudarc::driver::CudaSlice<u8>,
    plans: HashMap<(LtShape, u32), Option<Plan>>,
    /// (kind, n, k) whose decline was already reported on stderr.
    said: std::collections::HashSet<(LtKind, usize, usize)>,
    /// `cublasLtGetVersion()`, e.g. 130000.
    pub version: usize,
}

// SAFETY: the handle and descriptors are plain host objects of cuBLASLt; `Lt` is only used behind
// the `Mutex` in `Gpu`, so one thread at a time calls into it.
unsafe impl Send for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created by cublasLtCreate, destroyed once, after every plan.
        unsafe {
            sys::cublasLtDestroy(self.handle);
        }
    }
}

/// The element types of a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LtKind {
    /// e4m3 × e4m3 with 128 × 128 weight and 1 × 128 activation scales (f32), f32 out.
    Fp8BlockScaled,
    /// [`LtKind::Fp8BlockScaled`] with bf16 out (the f32 result rounded by cuBLASLt's epilogue; C =
    /// D bf16, `beta` 0 only): DeepSeek's `fp8_gemm` output type (spec §6), switch `WQ_B_BF16_OUT`.
    Fp8BlockScaledBf16Out,
    /// bf16 × bf16, f32 accumulation and output (`CUBLAS_COMPUTE_32F`).
    Bf16,
}

impl LtKind {
    /// Whether the operands are block-scaled e4m3 (either output type).
    pub fn is_fp8(self) -> bool {
        matches!(self, LtKind::Fp8BlockScaled | LtKind::Fp8BlockScaledBf16Out)
    }
}

/// One product's shape: `y[m, n] (row stride ldd) = x[m, k] (row stride ldb) · W[n, k]ᵀ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LtShape {
    /// Element types.
    pub kind: LtKind,
    /// Tokens.
    pub m: usize,
    /// Outputs.
    pub n: usize,
    /// Inputs.
    pub k: usize,
    /// Elements between consecutive activation rows (≥ k).
    pub ldb: usize,
    /// Elements between consecutive output rows (≥ n).
    pub ldd: usize,
}

/// The device pointers of one product (all on the stream's device).
pub struct LtOperands {
    /// Weight `[n, k]` (e4m3 or bf16).
    pub w: u64,
    /// f32 weight scales `[n/128, k/128 rounded up to 4]` (block-scaled FP8 only, else 0).
    pub w_scales: u64,
    /// Activations `[m, ldb]` (e4m3 or bf16; rows past `m` are not read).
    pub x: u64,
    /// f32 activation scales `[k/128, m]` (block-scaled FP8 only, else 0).
    pub x_scales: u64,
    /// Output `[m, ldd]`: f32, or bf16 for [`LtKind::Fp8BlockScaledBf16Out`].
    pub y: u64,
    /// `y = product + beta·y` (0 overwrites, 1 accumulates; 0 only for [`LtKind::Fp8BlockScaledBf16Out`]).
    pub beta: f32,
}

fn set_attr<T>(desc: sys::cublasLtMatmulDesc_t, attr: sys::cublasLtMatmulDescAttributes_t, v: &T) -> Result<(), String> {
    // SAFETY: `v` points to a live value of the size passed, of the type the attribute documents.
    check(&format!("setting {attr:?}"), unsafe { sys::cublasLtMatmulDescSetAttribute(desc, attr, v as *const T as *const c_void, std::mem::size_of::<T>()) })
}

impl Lt {
    /// Loads cuBLASLt, checks its version and creates a handle with a workspace on `stream`.
    ///
    /// Errors (as text, for the one-time fallback message): the library missing from the library
    /// path, older than [`LT_MIN_VERSION`], or failing to initialise.
    pub fn new(stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<Lt, String> {
        // SAFETY: only tries to dlopen the candidate names.
        if !unsafe { sys::is_culib_present() } {
            return Err("libcublasLt was not found on the library path (e.g. the nvidia-cublas wheel's lib folder on LD_LIBRARY_PATH)".into());
        }
        let version = super::guard("cuBLASLt", || {
            // SAFETY: no arguments; the library is present.
            unsafe { sys::cublasLtGetVersion() }
        })
        .map_err(|e| e.to_string())?;
        if version < LT_MIN_VERSION {
            return Err(format!("cuBLASLt {version} is older than {LT_MIN_VERSION} (block-scaled FP8 on Hopper needs 12.9)"));
        }
        let mut handle = std::ptr::null_mut();
        // SAFETY: writes the new handle.
        check("cublasLtCreate", unsafe { sys::cublasLtCreate(&mut handle) })?;
        // SAFETY: scratch memory for cuBLASLt only; never read by us.
        let workspace = match unsafe { stream.alloc::<u8>(LT_WORKSPACE_BYTES) } {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: created above.
                unsafe { sys::cublasLtDestroy(handle) };
                return Err(format!("allocating the cuBLASLt workspace: {e:?}"));
            }
        };
        Ok(Lt { handle, workspace, plans: HashMap::new(), said: Default::default(), version })
    }

    fn plan(&self, sh: LtShape, align: u32) -> Result<Plan, String> {
        let LtShape { kind, m, n, k, ldb, ldd } = sh;
        let fp8 = kind.is_fp8();
        let ty = if fp8 { sys::cudaDataType_t::CUDA_R_8F_E4M3 } else { sys::cudaDataType_t::CUDA_R_16BF };
        use sys::cublasLtMatmulDescAttributes_t as A;
        let mut desc = std::ptr::null_mut();
        // SAFETY: writes the new descriptor.
        check("cublasLtMatmulDescCreate", unsafe { sys::cublasLtMatmulDescCreate(&mut desc, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType_t::CUDA_R_32F) })?;
        let layout = |ty: sys::cudaDataType_t, rows: usize, cols: usize, ld: usize| -> Result<sys::cublasLtMatrixLayout_t, String> {
            let mut l = std::ptr::null_mut();
            // SAFETY: writes the new layout.
            check("cublasLtMatrixLayoutCreate", unsafe { sys::cublasLtMatrixLayoutCreate(&mut l, ty, rows as u64, cols as u64, ld as i64) })?;
            Ok(l)
        };
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            // SAFETY: a plain C struct of integers; overwritten by the heuristic's choice below.
            algo: unsafe { std::mem::zeroed() },
        };
        set_attr(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &(CUBLAS_OP_T))?;
        set_attr(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &(CUBLAS_OP_N))?;
        if fp8 {
            set_attr(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &(sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F as i32))?;
            set_attr(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &(sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F as i32))?;
            // The heuristic wants the scale pointers set; the real ones are set before each call.
            let dummy: *const c_void = self.workspace_ptr() as *const c_void;
            set_attr(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy)?;
            set_attr(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy)?;
        }
        plan.a = layout(ty, k, n, k)?;
        plan.b = layout(ty, k, m, ldb)?;
        let out_ty = if kind == LtKind::Fp8BlockScaledBf16Out { sys::cudaDataType_t::CUDA_R_16BF } else { sys::cudaDataType_t::CUDA_R_32F };
        plan.d = layout(out_ty, n, m, ldd)?;
        let mut pref = std::ptr::null_mut();
        // SAFETY: writes the new preference; destroyed below.
        check("cublasLtMatmulPreferenceCreate", unsafe { sys::cublasLtMatmulPreferenceCreate(&mut pref) })?;
        let ws = LT_WORKSPACE_BYTES as u64;
        // SAFETY: a u64 value for MAX_WORKSPACE_BYTES, as documented.
        let mut r = check("setting the workspace size", unsafe {
            sys::cublasLtMatmulPreferenceSetAttribute(pref, sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws as *const u64 as *const c_void, 8)
        });
        // The operands' actual alignment (cuBLASLt assumes 256 bytes unless told): strided group
        // slices and planes may start at any multiple of 16.
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        for attr in [P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES] {
            r = r.and_then(|_| {
                // SAFETY: a u32 value for a MIN_ALIGNMENT attribute, as documented.
                check("setting the alignment", unsafe { sys::cublasLtMatmulPreferenceSetAttribute(pref, attr, &align as *const u32 as *const c_void, 4) })
            });
        }
        // SAFETY: a plain C struct (integers, an enum whose 0 is SUCCESS, a float); written by the heuristic.
        let mut result: sys::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        let mut count = 0i32;
        let r = r.and_then(|_| {
            // SAFETY: every descriptor is live; room for one result.
            check("cublasLtMatmulAlgoGetHeuristic", unsafe {
                sys::cublasLtMatmulAlgoGetHeuristic(self.handle, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, 1, &mut result, &mut count)
            })
        });
        // SAFETY: created above.
        unsafe { sys::cublasLtMatmulPreferenceDestroy(pref) };
        r?;
        if count < 1 {
            return Err("no algorithm".into());
        }
        plan.algo = result.algo;
        Ok(plan)
    }

    /// Says once per (kind, n, k) on stderr that cuBLASLt declined it.
    fn declined(&mut self, sh: LtShape, why: &str) {
        if self.said.insert((sh.kind, sh.n, sh.k)) {
            eprintln!("cuBLASLt declined {sh:?}: {why}; flashseek's own kernel runs it (said once per kind, n and k)");
        }
    }

    fn workspace_ptr(&self) -> u64 {
        self.workspace.device_ptr(self.workspace.stream()).0
    }

    /// `y = x·Wᵀ + beta·y` on `stream` for `sh` (block-scaled FP8: the product sums
    /// `xs[b, m]·ws[n/128, b]·Σ_{k∈b} x[m, k]·w[n, k]` over the 128-blocks b), f32 out (bf16 for
    /// [`LtKind::Fp8BlockScaledBf16Out`], whose `beta` must be 0: an error otherwise).
    ///
    /// Returns `Ok(false)` (the product not launched) when cuBLASLt has no algorithm for the shape
    /// and the operands' alignment — the caller then uses its own kernel (said once per kind, n and
    /// k on stderr); `Err` when a launch fails.
    ///
    /// # Safety
    /// The pointers must hold the sizes above on the stream's device and stay alive until the
    /// stream has run the product.
    pub unsafe fn matmul(&mut self, stream: &cudarc::driver::CudaStream, ops: &LtOperands, sh: LtShape) -> Result<bool, String> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        if sh.kind == LtKind::Fp8BlockScaledBf16Out && ops.beta != 0.0 {
            return Err("a bf16-output product cannot accumulate (beta must be 0)".into());
        }
        let align = [ops.w, ops.x, ops.y].iter().map(|&p| ptr_align(p)).min().unwrap_or(256);
        let key = (sh, align);
        if !self.plans.contains_key(&key) {
            if self.plans.len() >= LT_MAX_PLANS {
                // Token counts vary with how prompts are chunked: keep the cache bounded.
                self.plans.clear();
            }
            let p = match self.plan(sh, align) {
                Ok(p) => Some(p),
                Err(e) => {
                    self.declined(sh, &format!("{e} (alignment {align} bytes)"));
                    None
                }
            };
            self.plans.insert(key, p);
        }
        let ws = self.workspace_ptr();
        let Some(Some(plan)) = self.plans.get(&key) else { return Ok(false) };
        if sh.kind.is_fp8() {
            set_attr(plan.desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &(ops.w_scales as *const c_void))?;
            set_attr(plan.desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &(ops.x_scales as *const c_void))?;
        }
        let (alpha, beta) = (1f32, ops.beta);
        let s = stream.cu_stream() as sys::cudaStream_t;
        // SAFETY: the caller guarantees the operands; C = D with beta 0; the workspace is ours.
        let status = unsafe {
            sys::cublasLtMatmul(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                ops.w as *const c_void,
                plan.a,
                ops.x as *const c_void,
                plan.b,
                &beta as *const f32 as *const c_void,
                ops.y as *const c_void,
                plan.d,
                ops.y as *mut c_void,
                plan.d,
                &plan.algo,
                ws as *mut c_void,
                LT_WORKSPACE_BYTES,
                s,
            )
        };
        if matches!(status, sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED | sys::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE) {
            // Rejected before launching anything: this shape stays on the caller's kernel.
            self.declined(sh, &format!("cublasLtMatmul {status:?} (alignment {align} bytes)"));
            self.plans.insert(key, None);
            return Ok(false);
        }
        check("cublasLtMatmul", status)?;
        Ok(true)
    }
}

/// Fewest tokens for which `FP8_CUBLASLT` / `LINEAR_CUBLASLT` hand a GEMM to cuBLASLt (prefill
/// shapes; decode-sized products stay on flashseek's kernels).
pub const LT_MIN_TOKENS: usize = 256;

/// Fewest output features for which `LINEAR_CUBLASLT` hands a split-activation GEMM to cuBLASLt.
/// Narrower products (the indexer's `weights_proj`, 64 outputs) stay on gemm.cu, whose bits do not
/// depend on the token count: measured on the H200 (qualify at 4c78896), with `weights_proj` on
/// cuBLASLt the logits of 2,048-token chunks differed in bits from 8,192-token ones (the chunk-size
/// promise of `LONG_CONTEXT_CHUNK`) — the heuristic's choice for a 64-wide output depends on T.
pub const LT_MIN_ROWS: usize = 128;

impl Gpu {
    /// Whether cuBLASLt is usable, loading it at the first call (and saying once on stderr which
    /// version loaded or why it is unavailable).
    pub fn lt_available(&self) -> bool {
        let mut guard = self.lt.lock().unwrap_or_else(|e| e.into_inner());
        guard
            .get_or_insert_with(|| {
                let r = self.ctx.bind_to_thread().map_err(|e| format!("binding the CUDA context: {e:?}")).and_then(|_| Lt::new(&self.stream));
                match &r {
                    Ok(lt) => eprintln!("cuBLASLt {} loaded (FP8_CUBLASLT / LINEAR_CUBLASLT)", lt.version),
                    Err(e) => eprintln!("cuBLASLt unavailable: {e}; flashseek's own GEMMs run instead"),
                }
                r
            })
            .is_ok()
    }

    /// [`Lt::matmul`] on this GPU's stream. `Ok(false)`: cuBLASLt is unavailable or has no
    /// algorithm for `shape` (the product is not launched).
    ///
    /// Errors: a failed launch.
    ///
    /// # Safety
    /// As [`Lt::matmul`]: `ops` must point to buffers of `shape`'s sizes on this GPU that stay alive
    /// until the stream has run the product.
    pub(crate) unsafe fn lt_matmul(&self, ops: &LtOperands, shape: LtShape) -> Result<bool, CudaError> {
        let mut guard = self.lt.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Ok(lt)) = guard.as_mut() else { return Ok(false) };
        // SAFETY: forwarded from the caller's contract.
        unsafe { lt.matmul(&self.stream, ops, shape) }.map_err(|e| CudaError::Driver { what: "cuBLASLt GEMM".into(), detail: e })
    }

    /// The split-activation product `y[t, out0 + n] (row stride ldd) = W·hi + W·lo` through
    /// cuBLASLt's bf16 GEMM (switch `LINEAR_CUBLASLT`): `xb` holds gemm.cu's bf16 planes (hi at 0,
    /// lo at `plane`, rows of stride `ldb`; the input columns are `col0 .. col0 + W.cols`); with
    /// `plane` None the activations are the hi plane alone (bf16 activations: `y = W·hi`). BF16
    /// weights are used as stored, FP8 weights converted to bf16 first (`w_fp8_bf16`, exact: the
    /// values gemm.cu's tiles hold). Returns whether it ran (`false`: another format, fewer than
    /// [`LT_MIN_ROWS`] outputs, cuBLASLt unavailable or without an algorithm; `y` is not written
    /// then, though the weight conversion may have run).
    ///
    /// Errors: allocation or launch failures; buffers shorter than the shape.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_split_lt(&self, xb: &CudaSlice<u16>, plane: Option<usize>, ldb: usize, col0: usize, w: &GpuWeight, y: &mut CudaSlice<f32>, ldd: usize, out0: usize, t: usize) -> Result<bool, CudaError> {
        let (n, k) = (w.rows, w.cols);
        let lo_at = plane.unwrap_or(0);
        let fits = |t: usize| xb.len() >= lo_at + (t - 1) * ldb + col0 + k && y.len() >= (t - 1) * ldd + out0 + n && col0 + k <= ldb && out0 + n <= ldd && (plane.is_none() || lo_at >= t * ldb);
        if t == 0 || n == 0 || !fits(t) {
            return Err(CudaError::Unsupported { what: "linear_split_lt", detail: format!("buffers of {} and {} values for {t} rows of [{n}, {k}] (ldb {ldb}, ldd {ldd})", xb.len(), y.len()) });
        }
        let aligned = k.is_multiple_of(16) && ldb.is_multiple_of(8) && col0.is_multiple_of(8) && lo_at.is_multiple_of(8);
        if !aligned || n < LT_MIN_ROWS || !matches!(w.data, GpuMatrix::Bf16(_) | GpuMatrix::Fp8 { .. }) || !self.lt_available() {
            return Ok(false);
        }
        let s = &self.stream;
        let converted;
        let wptr = match &w.data {
            GpuMatrix::Bf16(m) => m.device_ptr(s).0,
            GpuMatrix::Fp8 { w: m, scales } => {
                // SAFETY: fully written by w_fp8_bf16 below.
                let mut out = unsafe { s.alloc::<u16>(n * k) }.map_err(|e| CudaError::Driver { what: "alloc".into(), detail: format!("{e:?}") })?;
                let groups = n * k / 16;
                let cfg = LaunchConfig { grid_dim: (groups.div_ceil(256).min(132 * 16) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                let (n_i, k_i) = (i32::try_from(n), i32::try_from(k));
                let (Ok(n_i), Ok(k_i)) = (n_i, k_i) else { return Ok(false) };
                let mut b = s.launch_builder(self.f("w_fp8_bf16"));
                b.arg(m).arg(scales).arg(&n_i).arg(&k_i).arg(&mut out);
                // SAFETY: matches w_fp8_bf16(W, S, N, K, out): W N·K bytes, S the stored block scales,
                // out N·K bf16; K % 16 == 0 (checked).
                unsafe { b.launch(cfg) }.map_err(|e| CudaError::Driver { what: "w_fp8_bf16".into(), detail: format!("{e:?}") })?;
                converted = out;
                converted.device_ptr(s).0
            }
            _ => return Ok(false),
        };
        let x0 = xb.device_ptr(s).0 + 2 * col0 as u64;
        let y0 = y.device_ptr_mut(s).0 + 4 * out0 as u64;
        let shape = LtShape { kind: LtKind::Bf16, m: t, n, k, ldb, ldd };
        let hi = LtOperands { w: wptr, w_scales: 0, x: x0, x_scales: 0, y: y0, beta: 0.0 };
        // SAFETY: the weight (or its conversion, alive to the end of this function and freed
        // stream-ordered), the planes and y hold the shape's sizes (checked above).
        if !unsafe { self.lt_matmul(&hi, shape) }? {
            return Ok(false);
        }
        let Some(plane) = plane else { return Ok(true) };
        let lo = LtOperands { x: x0 + 2 * plane as u64, beta: 1.0, ..hi };
        // SAFETY: as above; the lo plane starts `plane` elements after the hi plane.
        if !unsafe { self.lt_matmul(&lo, shape) }? {
            return Err(CudaError::Unsupported { what: "linear_split_lt", detail: "cuBLASLt took the hi plane but not the lo plane of the same shape".into() });
        }
        Ok(true)
    }
}
