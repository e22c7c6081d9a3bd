//! cuBLASLt's block-scaled FP8 GEMM for the §10.1 linears at prefill shapes (issue 5 §3: "cuBLASLt
//! block-scaled FP8 GEMM where it wins at large M"), the switch `FP8_CUBLASLT` under
//! `TC_LINEAR=fp8`.
//!
//! Numerics: DeepSeek's recipe (spec §6), the same as gemm_q8.cu — e4m3 activations with one f32
//! (power-of-two) scale per row and 128 features (`CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F`) times
//! e4m3 weights with one f32 scale per 128 × 128 block (`BLK128x128_32F`, the ue8m0 bytes widened),
//! f32 compute and f32 output; only the accumulation order is cuBLAS's own. Needs cuBLAS ≥ 12.9
//! (block scaling for Hopper) loaded at run time: where the library is missing or older, or has no
//! algorithm for a shape, [`Gpu::linear_q8`](super::gpu::Gpu) uses gemm_q8.cu and says why once.
//!
//! Layout (cuBLASLt is column-major): `D[N × M] = op(A)·B` with A = the weight stored `[N, K]`
//! row-major (= `K × N` column-major, op T), B = the activations `[M, K]` row-major (`K × M`
//! column-major, op N) and D = `y [M, N]` row-major (`N × M` column-major): the "TN" form FP8
//! requires. Activation scales are laid out `[K/128, M]` (token fastest, what VEC128 reads for an
//! operand of K × M), weight scales `[N/128, K/128]` as stored.
//!
//! Learned from the cuBLAS documentation (cublasLtMatmul, "1D and 2D block scaling") and from how
//! PyTorch's `scaled_gemm` sets these attributes; measured against gemm_q8.cu by `gpu-check --only
//! q8` (`linear_lt …` records). The code is ours.

use cudarc::cublaslt::sys;
use std::collections::HashMap;
use std::ffi::c_void;

/// `cublasOperation_t` values (cublas_api.h; the cuBLASLt bindings do not re-export the enum).
const CUBLAS_OP_N: i32 = 0;
const CUBLAS_OP_T: i32 = 1;

/// Workspace handed to cuBLASLt (bytes).
pub const LT_WORKSPACE_BYTES: usize = 32 << 20;

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
    plans: HashMap<(usize, usize, usize), Option<Plan>>,
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

/// The device pointers of one block-scaled product (all on the stream's device).
pub struct LtOperands {
    /// e4m3 weight `[n, k]`.
    pub w: u64,
    /// f32 weight scales `[n/128, k/128]`.
    pub w_scales: u64,
    /// e4m3 activations `[m, k]` (rows past `m` are not read).
    pub x: u64,
    /// f32 activation scales `[k/128, m]`.
    pub x_scales: u64,
    /// f32 output `[m, n]`.
    pub y: u64,
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
        Ok(Lt { handle, workspace, plans: HashMap::new(), version: version as usize })
    }

    fn plan(&self, m: usize, n: usize, k: usize) -> Result<Plan, String> {
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
        set_attr(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &(sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F as i32))?;
        set_attr(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &(sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F as i32))?;
        // The heuristic wants the scale pointers set; the real ones are set before each call.
        let dummy: *const c_void = self.workspace_ptr() as *const c_void;
        set_attr(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy)?;
        set_attr(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy)?;
        plan.a = layout(sys::cudaDataType_t::CUDA_R_8F_E4M3, k, n, k)?;
        plan.b = layout(sys::cudaDataType_t::CUDA_R_8F_E4M3, k, m, k)?;
        plan.d = layout(sys::cudaDataType_t::CUDA_R_32F, n, m, n)?;
        let mut pref = std::ptr::null_mut();
        // SAFETY: writes the new preference; destroyed below.
        check("cublasLtMatmulPreferenceCreate", unsafe { sys::cublasLtMatmulPreferenceCreate(&mut pref) })?;
        let ws = LT_WORKSPACE_BYTES as u64;
        // SAFETY: a u64 value for MAX_WORKSPACE_BYTES, as documented.
        let r = check("setting the workspace size", unsafe {
            sys::cublasLtMatmulPreferenceSetAttribute(pref, sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws as *const u64 as *const c_void, 8)
        });
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
            return Err(format!("no cuBLASLt algorithm for m {m}, n {n}, k {k}"));
        }
        plan.algo = result.algo;
        Ok(plan)
    }

    fn workspace_ptr(&self) -> u64 {
        use cudarc::driver::DevicePtr;
        self.workspace.device_ptr(self.workspace.stream()).0
    }

    /// `y[m, n] = Σ_b xs[b, m]·ws[n/128, b]·Σ_{k∈b} x[m, k]·w[n, k]` on `stream`, f32 out.
    ///
    /// Returns `Ok(false)` (nothing launched) when cuBLASLt has no algorithm for the shape — the
    /// caller then uses its own kernel; `Err` when a launch fails.
    ///
    /// # Safety
    /// The pointers must hold the sizes above on the stream's device and stay alive until the
    /// stream has run the product.
    pub unsafe fn matmul(&mut self, stream: &cudarc::driver::CudaStream, ops: &LtOperands, m: usize, n: usize, k: usize) -> Result<bool, String> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        if !self.plans.contains_key(&(m, n, k)) {
            let p = match self.plan(m, n, k) {
                Ok(p) => Some(p),
                Err(e) => {
                    eprintln!("FP8_CUBLASLT: {e}; gemm_q8.cu runs this shape");
                    None
                }
            };
            self.plans.insert((m, n, k), p);
        }
        let ws = self.workspace_ptr();
        let Some(Some(plan)) = self.plans.get(&(m, n, k)) else { return Ok(false) };
        set_attr(plan.desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &(ops.w_scales as *const c_void))?;
        set_attr(plan.desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &(ops.x_scales as *const c_void))?;
        let (alpha, beta) = (1f32, 0f32);
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
            eprintln!("FP8_CUBLASLT: cublasLtMatmul {status:?} for m {m}, n {n}, k {k}; gemm_q8.cu runs this shape");
            self.plans.insert((m, n, k), None);
            return Ok(false);
        }
        check("cublasLtMatmul", status)?;
        Ok(true)
    }
}
