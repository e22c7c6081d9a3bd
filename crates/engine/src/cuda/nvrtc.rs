//! NVRTC compilation of the kernel sources to CUBIN for one architecture, with an on-disk cache
//! keyed by SHA-256 of (source, options, NVRTC version).

use super::{guard, CudaError, COMMON};
use cudarc::nvrtc::{result, sys};
use sha2::{Digest, Sha256};
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

/// NVRTC's version `(major, minor)`.
pub fn version() -> Result<(i32, i32), CudaError> {
    guard("NVRTC", || {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: plain out-parameters.
        let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
        (r, major, minor)
    })
    .and_then(|(r, major, minor)| {
        r.result().map_err(|e| CudaError::Unavailable { lib: "NVRTC", detail: format!("{e:?}") })?;
        Ok((major, minor))
    })
}

/// The compile options used for `arch` (e.g. `sm_90a`).
pub fn options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}"), "--std=c++17".into(), "--fmad=true".into(), "-default-device".into()]
}

/// The full source compiled for kernel file `file`: the common prelude, then the file.
///
/// Development knob: `FLASHSEEK_KERNEL_DEFINES="NAME=VALUE,NAME2=VALUE2"` prepends `#define NAME
/// VALUE` lines (part of the cache key), so that a kernel's compile-time variants — constants a
/// kernel file declares under `#ifndef NAME` — can be timed against each other with one binary
/// (`bench/moe_wt_variants_h200.log`). gemm_q8.cu's `moe_wt` declares `GWT_LAG`, `GWT_STAGES`,
/// `GWT_EPI_STAGED` (0: the direct output stores), `GWT_SUB_INTERLEAVE` (0: the multiply
/// warpgroups' sub-tiles as before 800d456) and the timing diagnostics `MOE_WT_DIAG` (wrong
/// results; see the kernel); attention.cu declares `AWC_TAIL_SKIP` and `ATC_Q_AHEAD` (0: the Q
/// staging's loads one pair of head rows at a time); gemm_q8.cu also `AQ_WIDE_INDEX` (1:
/// `act_quant_fp8`'s and `moe_gather_q8`'s 64-bit indices). Entries
/// that are not `NAME=VALUE` with NAME an identifier, or whose value holds a line break or a
/// backslash, are ignored; [`kernel_defines_in_effect`] says what applies (`Gpu::open` prints it and
/// gpu-check records it).
pub fn full_source(file: &str, src: &str) -> String {
    let defines = kernel_defines_in_effect().unwrap_or_default();
    format!("// flashseek kernel {file}\n{defines}{COMMON}\n#line 1 \"{file}\"\n{src}")
}

/// The `#define` lines `FLASHSEEK_KERNEL_DEFINES` adds to every kernel source (see [`full_source`]),
/// `None` when it adds none.
pub fn kernel_defines_in_effect() -> Option<String> {
    std::env::var(crate::switches::KERNEL_DEFINES_VAR).ok().map(|v| kernel_defines(&v)).filter(|d| !d.is_empty())
}

/// Whether gemm_q8.cu's `moe_wt` stores its outputs through the staging blocks (`GWT_EPI_STAGED`, 1 by
/// default): false when `FLASHSEEK_KERNEL_DEFINES` sets it to 0, the direct stores of a timing
/// variant, which have no bf16 form (`MOE_DOWN_BF16_OUT` then keeps the f32 scatter).
pub fn gwt_epi_staged() -> bool {
    kernel_defines_in_effect().is_none_or(|d| gwt_epi_staged_in(&d))
}

/// [`gwt_epi_staged`] for the `#define` lines `defines` ([`kernel_defines`]' output).
fn gwt_epi_staged_in(defines: &str) -> bool {
    !defines.lines().any(|l| l.trim() == "#define GWT_EPI_STAGED 0")
}

/// `#define` lines of a `FLASHSEEK_KERNEL_DEFINES` value (see [`full_source`]).
fn kernel_defines(v: &str) -> String {
    let ident = |s: &str| s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    v.split(',')
        .filter_map(|d| d.split_once('='))
        .filter(|(n, val)| ident(n.trim()) && !val.contains(['\n', '\r', '\\']))
        .map(|(n, val)| format!("#define {} {}\n", n.trim(), val.trim()))
        .collect()
}

/// Compiles `src` (a file of `KERNEL_SOURCES`) to CUBIN for `arch`.
///
/// Errors: NVRTC missing ([`CudaError::Unavailable`]) or a compile error with the log.
pub fn compile(file: &str, src: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    let code = CString::new(full_source(file, src)).map_err(|_| CudaError::Compile {
        file: file.into(),
        arch: arch.into(),
        log: "source contains a NUL byte".into(),
    })?;
    let name = CString::new(file).unwrap_or_default();
    let opts = options(arch);
    guard("NVRTC", || -> Result<Vec<u8>, CudaError> {
        let prog = result::create_program(&code, Some(&name))
            .map_err(|e| CudaError::Unavailable { lib: "NVRTC", detail: format!("{e:?}") })?;
        // SAFETY: prog is a live program; options are valid C strings built by cudarc.
        let compiled = unsafe { result::compile_program(prog, &opts) };
        let log = unsafe { result::get_program_log(prog) }
            .map(|l| unsafe { CStr::from_ptr(l.as_ptr()) }.to_string_lossy().into_owned())
            .unwrap_or_default();
        let out = match compiled {
            Err(e) => Err(CudaError::Compile { file: file.into(), arch: arch.into(), log: format!("{e:?}\n{log}") }),
            Ok(()) => {
                let mut size = 0usize;
                // SAFETY: out-parameter; then a buffer of that size.
                let r = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
                let mut buf = vec![0u8; size];
                let r2 = unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char) };
                match (r.result(), r2.result()) {
                    (Ok(()), Ok(())) if size > 0 => Ok(buf),
                    _ => Err(CudaError::Compile {
                        file: file.into(),
                        arch: arch.into(),
                        log: format!("no CUBIN produced (is {arch} a real architecture?)\n{log}"),
                    }),
                }
            }
        };
        let _ = unsafe { result::destroy_program(prog) };
        out
    })?
}

/// The cache key of a compilation.
pub fn cache_key(file: &str, src: &str, arch: &str, nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(full_source(file, src).as_bytes());
    h.update(options(arch).join(" ").as_bytes());
    h.update(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Compiles with the on-disk cache under `dir` (`<dir>/<file>-<arch>-<key>.cubin`).
pub fn compile_cached(dir: &Path, file: &str, src: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    let key = cache_key(file, src, arch, version()?);
    let path: PathBuf = dir.join(format!("{}-{arch}-{}.cubin", file.trim_end_matches(".cu"), &key[..16]));
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            return Ok(bytes);
        }
    }
    let cubin = compile(file, src, arch)?;
    if std::fs::create_dir_all(dir).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &cubin).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok(cubin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::KERNEL_SOURCES;

    #[test]
    fn kernel_defines_parse() {
        assert_eq!(kernel_defines("GWT_A_BY_CONSUMER=0, X_1 = 2"), "#define GWT_A_BY_CONSUMER 0\n#define X_1 2\n");
        assert_eq!(kernel_defines("bad name=1,1X=2,NOEQ,=3"), "");
        // A trailing backslash would join the next line onto the macro; a line break would start one.
        assert_eq!(kernel_defines("A=1\\,B=2\r,C=3\n#define D 4,E=5"), "#define E 5\n");
    }

    /// MOE_DOWN_BF16_OUT's guard: only GWT_EPI_STAGED set to 0 turns the staged stores off.
    #[test]
    fn gwt_epi_staged_reads_the_define() {
        assert!(gwt_epi_staged_in(""));
        assert!(gwt_epi_staged_in(&kernel_defines("GWT_EPI_STAGED=1,GWT_LAG=2")));
        assert!(gwt_epi_staged_in(&kernel_defines("GWT_EPI_STAGED_X=0")));
        assert!(!gwt_epi_staged_in(&kernel_defines("GWT_LAG=2, GWT_EPI_STAGED = 0")));
    }

    /// Compiles every kernel for sm_90a when NVRTC is present. CI sets FLASHSEEK_REQUIRE_NVRTC=1
    /// (with the pinned `nvidia-cuda-nvrtc==13.0.88` wheel on LD_LIBRARY_PATH), so a kernel that does
    /// not compile — or a missing NVRTC — fails there.
    #[test]
    fn every_kernel_compiles_for_sm90a() {
        let required = std::env::var("FLASHSEEK_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        let v = match version() {
            Ok(v) => v,
            Err(e) => {
                assert!(!required, "NVRTC required but unavailable: {e}");
                eprintln!("skipping: {e}");
                return;
            }
        };
        // In parallel, as `Gpu::open` compiles them (NVRTC compiles separate programs concurrently).
        let cubins: Vec<(&str, Vec<u8>)> = std::thread::scope(|scope| {
            let jobs: Vec<_> = KERNEL_SOURCES.iter().map(|(file, src)| scope.spawn(move || (*file, compile(file, src, "sm_90a").unwrap_or_else(|e| panic!("{e}"))))).collect();
            jobs.into_iter().map(|j| j.join().expect("a compiling thread panicked")).collect()
        });
        let has = |cubin: &[u8], name: &str| {
            let sym: Vec<u8> = name.bytes().chain(std::iter::once(0)).collect();
            cubin.windows(sym.len()).any(|w| w == sym.as_slice())
        };
        let entries = |file: &str| crate::cuda::gpu::ENTRY_POINTS.iter().find(|(f, _)| *f == file).map(|(_, n)| *n).unwrap_or(&[]);
        for (file, cubin) in &cubins {
            assert!(cubin.len() > 100, "{file}: CUBIN of {} bytes", cubin.len());
            // Every entry point the loader looks up is a symbol of the CUBIN.
            let names = entries(file);
            assert!(!names.is_empty(), "{file} lists no entry points");
            for name in names {
                assert!(has(cubin, name), "{file}: entry point {name} missing from the CUBIN");
            }
            println!("{file}: {} bytes of sm_90a CUBIN (NVRTC {}.{})", cubin.len(), v.0, v.1);
        }
        // gemm.cu's two programs split its entry points: neither emits the other's.
        for (file, other) in [("gemm.cu", "gemm_wb.cu"), ("gemm_wb.cu", "gemm.cu")] {
            let cubin = &cubins.iter().find(|(f, _)| *f == file).expect("both programs are listed").1;
            for name in entries(other) {
                assert!(!has(cubin, name), "{file} also emits {other}'s entry point {name}");
            }
        }
        // Blackwell: the wgmma kernels compile to traps there (gemm_q8.cu, gemm_wb.cu), so the
        // programs must build.
        for file in ["gemm_q8.cu", "gemm_wb.cu"] {
            let cubin = compile(file, crate::cuda::KERNEL_SOURCES.iter().find(|(f, _)| *f == file).map(|(_, s)| *s).unwrap_or(""), "sm_100").unwrap_or_else(|e| panic!("{e}"));
            assert!(cubin.len() > 100, "{file} for sm_100");
        }
        // A broken kernel is reported with the compiler log, not a panic.
        match compile("broken.cu", "extern \"C\" __global__ void k() { undefined_thing(); }", "sm_90a") {
            Err(CudaError::Compile { log, .. }) => assert!(log.contains("undefined_thing"), "{log}"),
            other => panic!("expected a compile error, got {:?}", other.map(|b| b.len())),
        }
    }

    #[test]
    fn cache_key_depends_on_source_arch_and_version() {
        let a = cache_key("a.cu", "x", "sm_90a", (13, 0));
        assert_ne!(a, cache_key("a.cu", "y", "sm_90a", (13, 0)));
        assert_ne!(a, cache_key("a.cu", "x", "sm_80", (13, 0)));
        assert_ne!(a, cache_key("a.cu", "x", "sm_90a", (13, 1)));
    }
}
