//! CUDA backend (issue 5, first increment): run-time kernel compilation with NVRTC, a device
//! context, and the first ops (RMSNorm, RoPE, linear layers over f32/bf16/FP8/FP4 weights), each
//! checked against the CPU reference by `flashseek gpu-check`.
//!
//! Libraries are loaded at run time (cudarc `dynamic-loading`), so the CPU build needs no CUDA and a
//! missing driver or NVRTC is a clear error, not a panic. Kernels live in `kernels/*.cu` (one file per
//! op family, each opening with its inputs, layouts and launch geometry), are plain header-free CUDA
//! C++ prefixed with `kernels/common.cuh`, and are compiled for the device's architecture (`sm_90a`
//! on Hopper) and cached on disk keyed by source, options and NVRTC version.

pub mod bench;
pub mod check;
pub mod check_attention;
pub mod check_graph;
pub mod check_mhc;
pub mod check_model;
pub mod check_moe;
pub mod check_q8;
pub mod check_sample;
pub mod check_switches;
pub mod cublaslt;
pub mod gpu;
pub mod graph;
pub mod model;
pub mod nvrtc;
pub mod ops_attention;
pub mod ops_mhc;
pub mod ops_moe;
pub mod ops_q8;
pub mod qualify;
pub mod session;
pub mod upload;

/// Every kernel program: (name, source). CI compiles each of these for `sm_90a`; `Gpu::open`
/// compiles them in parallel.
pub const KERNEL_SOURCES: &[(&str, &str)] = &[
    ("norm.cu", include_str!("kernels/norm.cu")),
    ("rope.cu", include_str!("kernels/rope.cu")),
    ("linear.cu", include_str!("kernels/linear.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("compressor.cu", include_str!("kernels/compressor.cu")),
    ("indexer.cu", include_str!("kernels/indexer.cu")),
    ("mhc.cu", include_str!("kernels/mhc.cu")),
    ("moe.cu", include_str!("kernels/moe.cu")),
    ("gemm.cu", include_str!("kernels/gemm.cu")),
    // gemm.cu's wgmma entry points, compiled as a second program so the two halves compile in
    // parallel (gemm.cu defines both; the macro picks which entry points this program emits).
    ("gemm_wb.cu", concat!("#define FS_GEMM_WGMMA_ONLY 1\n#line 1 \"gemm.cu\"\n", include_str!("kernels/gemm.cu"))),
    ("gemm_q8.cu", include_str!("kernels/gemm_q8.cu")),
];

/// The shared prelude prepended to every kernel source.
pub const COMMON: &str = include_str!("kernels/common.cuh");

/// Errors of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA library (driver or NVRTC) could not be loaded.
    #[error("CUDA {lib} is not available: {detail}. Install the NVIDIA driver (and NVRTC 13.0, e.g. `pip install nvidia-cuda-nvrtc==13.0.88` with its lib folder on LD_LIBRARY_PATH)")]
    Unavailable {
        /// Which library.
        lib: &'static str,
        /// What happened.
        detail: String,
    },
    /// NVRTC rejected a kernel.
    #[error("NVRTC failed to compile {file} for {arch}: {log}")]
    Compile {
        /// Kernel file.
        file: String,
        /// Target architecture.
        arch: String,
        /// Compiler log.
        log: String,
    },
    /// A driver call failed.
    #[error("CUDA driver error in {what}: {detail}")]
    Driver {
        /// The operation.
        what: String,
        /// Driver message.
        detail: String,
    },
    /// Shapes or formats an op does not support.
    #[error("unsupported {what}: {detail}")]
    Unsupported {
        /// The op.
        what: &'static str,
        /// Why.
        detail: String,
    },
}

/// `r` with a driver error turned into [`CudaError::Driver`] for the operation `what`.
pub(crate) fn drv<T>(what: &str, r: Result<T, cudarc::driver::DriverError>) -> Result<T, CudaError> {
    r.map_err(|e| CudaError::Driver { what: what.into(), detail: format!("{e:?}") })
}

thread_local! {
    /// Whether this thread is inside [`guard`] (its panics are caught and reported as errors).
    static IN_GUARD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic (cudarc panics when a library is missing) into [`CudaError::Unavailable`].
/// The panic message is kept quiet on this thread only: the process's panic hook is wrapped once by
/// one that stays silent while the panicking thread is inside `guard` and otherwise calls the hook
/// it replaced, so threads may call `guard` concurrently (`Gpu::open` compiles in parallel) without
/// losing other threads' panic messages.
pub fn guard<T>(lib: &'static str, f: impl FnOnce() -> T) -> Result<T, CudaError> {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_GUARD.with(|g| g.get()) {
                previous(info)
            }
        }));
    });
    let outer = IN_GUARD.with(|g| g.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    IN_GUARD.with(|g| g.set(outer));
    r.map_err(|e| {
        let detail = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "library could not be loaded".into());
        // cudarc lists every file name it tried; keep the message short.
        let detail = match detail.find(" - searched for library names") {
            Some(i) => format!("{} (not found on the library path)", &detail[..i]),
            None => detail,
        };
        CudaError::Unavailable { lib, detail }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `guard` from several threads at once: each panic becomes that thread's error, the others'
    /// values come through, and no thread is left marked as guarded (its later panics would be
    /// silenced).
    #[test]
    fn guard_is_per_thread() {
        let results: Vec<(usize, Result<usize, String>, bool)> = std::thread::scope(|s| {
            let jobs: Vec<_> = (0..8usize)
                .map(|i| {
                    s.spawn(move || {
                        let r = guard("test", || if i % 2 == 0 { panic!("library {i} missing") } else { i * 10 });
                        (i, r.map_err(|e| e.to_string()), IN_GUARD.with(|g| g.get()))
                    })
                })
                .collect();
            jobs.into_iter().map(|j| j.join().expect("guard caught the panic")).collect()
        });
        for (i, r, still_guarded) in results {
            assert!(!still_guarded, "thread {i} left inside guard");
            match r {
                Ok(v) => assert_eq!(v, i * 10),
                Err(e) => assert!(i % 2 == 0 && e.contains(&format!("library {i} missing")), "{i}: {e}"),
            }
        }
        // Nested: the inner guard restores the outer state.
        let outer = guard("outer", || {
            let inner = guard("inner", || -> usize { panic!("inner") });
            (inner.is_err(), IN_GUARD.with(|g| g.get()))
        });
        assert_eq!(outer.ok(), Some((true, true)));
        assert!(!IN_GUARD.with(|g| g.get()));
    }
}
