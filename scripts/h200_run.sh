#!/usr/bin/env bash
# The GPU runs behind bench/, for the device machine (no Rust toolchain there): build the binary
# here with the commit recorded, carry it, run one step per call (each stays under 10 minutes).
#
#   FLASHSEEK_COMMIT=$(git rev-parse HEAD) cargo build --release
#   mkdir -p .devbin && cp target/release/flashseek .devbin/ && strip .devbin/flashseek
#   # .devbin/ is git-ignored: name it in the device call's carry list
#   # device: bash scripts/h200_run.sh STEP   (outputs under $OUT)
#
# Steps (H200 wall times of 2026-11-30; a fresh machine first compiles every kernel, 25 s with the
# programs compiled in parallel (81 s one after another), cached under $FLASHSEEK_CACHE afterwards):
#   check     every parity check + timings                          ~150 s
#   switches  the switch matrix on the full-width model             ~150 s (writes a ~3 GB model once)
#   qualify   8K/32K/128K × every switch configuration, 4 layers    ~210–330 s
#   bench     20 Flash layers at 8K/32K/128K, stage breakdown        ~145 s
#   moe       grouped-MoE parity matrix + layer timings             ~50 s
#   tc        tensor-core linear checks + timings (gemm.cu: mma.sync and wgmma tiles, cuBLASLt)
#   q8        FP8-activation linear checks + timings (TC_LINEAR=fp8)  ~60 s
#   bench-fp8 the bench step with TC_LINEAR=fp8 (official numerics) ~100 s
#   bench-fp8-bf16att  the bench step with TC_LINEAR=fp8 and MLA_BF16=on                ~110 s
#   bench-fp8-bf16att-idx8  bench-fp8-bf16att with INDEXER_FP8=on (FP8 indexer scores, as the
#             serving stacks' FP8 indexer cache)                        ~110 s
#   bench-serving  bench-fp8-bf16att-idx8 with wq_b's output in bf16 as DeepSeek's fp8_gemm writes it, the residual streams in bf16, wo_a in FP8 as vLLM runs it, the compressors on the bf16-rounded input as HF and vLLM compute them and the routed experts' outputs in bf16 as DeepSeek's GEMMs write them (WQ_B_BF16_OUT=on, MHC_BF16_STREAMS=on, MHC_MIX_TC=on, WO_A_FP8=on, COMPRESSOR_BF16=on, MOE_DOWN_BF16_OUT=on)
#             ~150 s
#   bench-serving-bf16-wo-a  bench-serving with wo_a as one bf16 product (WO_A_FP8=off)  ~150 s
#   bench-serving-f32-compressors  bench-serving with the compressors on split activations (COMPRESSOR_BF16 off)  ~150 s
#   bench-serving-f32-down  bench-serving with the routed down projection's rows in f32 (MOE_DOWN_BF16_OUT off)  ~150 s
#   bench-serving-f32-streams  bench-serving with f32 residual streams (MHC_BF16_STREAMS off) ~150 s
#   bench-serving-cuda-mix  bench-serving with the bf16 streams' mix on the CUDA cores (MHC_MIX_TC off) ~150 s
#   bench-serving-moe-detail  bench-serving at 8K and 32K with --moe-detail: the profiled prefill's MoE stage
#             by sub-stage and every MoE layer's routing (pairs per expert, tile fill)   ~150 s
#   bench-chunks  bench-fp8-bf16att-idx8 at 32K and 128K with 16,384- and 32,768-token prefill chunks
#             (chunk size is a pure performance knob: LONG_CONTEXT_CHUNK), and the Flash MoE layer timed
#             at those token counts                                   ~330 s
#   bench-lt  the bench step with LINEAR_CUBLASLT=on (cuBLASLt bf16 GEMMs for the split linears) ~145 s
#   bench-fp8-lt  bench-fp8 with FP8_CUBLASLT=on and LINEAR_CUBLASLT=on                ~100 s
#   attention the attention/compressor/indexer checks + timings     ~40 s
#   mhc       the mHC / norm / RoPE checks + timings (gpu-check --only mhc)  ~30 s
#   gemv      the small-batch gemvs: wo_a strided / one launch, LINEAR_T1_PREFETCH bits and T = 1 timings
#             (gpu-check --only gemv)  ~20 s
#   moe-gemv  the MoE checks (gpu-check --only moe) with the decode sizes' timings (1, 16, 32 tokens): MOE_DECODE_GEMV
#             and MOE_GEMV_MMA on / off  ~200 s
#   decode-ab-gemv-mma  MOE_GEMV_MMA on / off alternated twice: 10 layers, serving numerics, 32 decode steps after an
#             8,192-token prefill  ~200 s
#   gemv-mma  the small-batch gemv checks and timings (gpu-check --only gemv, LINEAR_GEMV_MMA's records included)  ~60 s
#   decode-ab-linear-gemv-mma  LINEAR_GEMV_MMA on / off alternated twice, as decode-ab-gemv-mma  ~200 s
#   decode-ab SWITCH  SWITCH on / off alternated twice, as decode-ab-gemv-mma (the line of stage
#             DECODE_AB_STAGE, default 'decode  compressors', quoted with each)  ~200 s
#   moe-defines  one Flash MoE layer timed (official numerics, 8K and 32K) once per compile-time
#             variant in MOE_DEFINES (space-separated FLASHSEEK_KERNEL_DEFINES values, e.g.
#             "MOE_WT_DIAG=0 MOE_WT_DIAG=64"; each recompiles the kernels, ~40 s a variant on a fresh machine)
#   prefill-defines  gpu-bench of AB_LAYERS (10) layers at 8K and 32K in the serving configuration once per kernel-define
#             set in PREFILL_DEFINES (space-separated FLASHSEEK_KERNEL_DEFINES values, "-" for none), each a fresh process
#             (~40 s each at 10 layers)
#   prefill-ab  gpu-bench of AB_LAYERS (10) layers at 8K and 32K once per configuration in PREFILL_AB
#             ("label:NAME=V,NAME=V …", in the order given; "base" alone: the serving configuration) on top of
#             the serving configuration, each a fresh process (~40 s each at 10 layers)
#   serve     serve --device cuda vs serve --device cpu over HTTP (scripts/serve_parity.py) ~60 s
#   bench-decode  20 layers at 8K/128K: decode with MOE_GROUPED_DECODE and DECODE_CUDA_GRAPH on (and
#             the same steps without graphs), 32 steps each
#   bench-decode-base  the same with the default switches (per-expert MoE at decode sizes)
set -euo pipefail
usage() { echo "usage: OUT=DIR bash scripts/h200_run.sh check|switches|qualify|bench|moe|moe-gemv|decode-ab-gemv-mma|gemv-mma|decode-ab-linear-gemv-mma|decode-ab SWITCH|tc|gemv|q8|bench-fp8|bench-fp8-bf16att|bench-fp8-bf16att-idx8|bench-serving|bench-serving-moe-detail|bench-serving-cuda-mix|bench-serving-f32-streams|bench-serving-bf16-wo-a|bench-serving-f32-compressors|bench-serving-f32-down|bench-chunks|prefill-ab|prefill-defines|bench-lt|bench-fp8-lt|moe-defines|attention|mhc|serve|bench-decode|bench-decode-base" >&2; exit 2; }
# No step (or help): the usage line, before anything needs OUT.
case "${1:-}" in ""|-h|--help) usage ;; esac
B=${FLASHSEEK_BIN:-.devbin/flashseek}
OUT=${OUT:?set OUT to the output folder}
# The serving stacks' numerics (bench-serving and bench-serving-f32-streams add MHC_BF16_STREAMS on / off);
# WO_A_FP8 from 1307a82 (bench-serving runs before it ran wo_a in bf16: bench-serving-bf16-wo-a). It acts on
# prefill chunks of >= 256 tokens only, so the decode steps (decode-ab …) run as before. COMPRESSOR_BF16 and
# MOE_DOWN_BF16_OUT from the forty-first session (bench-serving-f32-compressors, bench-serving-f32-down: each off); they act on
# prefill chunks too (>= 64 tokens; the 256-row MoE tiles).
SERVING="FLASHSEEK_TC_LINEAR=fp8 FLASHSEEK_MLA_BF16=on FLASHSEEK_INDEXER_FP8=on FLASHSEEK_WQ_B_BF16_OUT=on FLASHSEEK_WO_A_FP8=on FLASHSEEK_COMPRESSOR_BF16=on FLASHSEEK_MOE_DOWN_BF16_OUT=on"
export FLASHSEEK_CACHE=${FLASHSEEK_CACHE:-/tmp/fscache}
# One prefill A/B run (prefill-ab, prefill-defines): gpu-bench of AB_LAYERS (10) layers at 8K and 32K in the
# serving configuration plus the NAME=V words after the first three arguments, into $OUT/NAME.{json,log}
# ($1); prints LABEL ($2) with the prefill lines and the stages matching STAGES ($3, an ERE). A failed or
# timed-out run is reported and the caller's next configuration still runs.
prefill_run() {
  local name=$1 label=$2 stages=$3 rc=0
  shift 3
  env $SERVING FLASHSEEK_MHC_BF16_STREAMS=on FLASHSEEK_MHC_MIX_TC=on "$@" timeout 200 "$B" gpu-bench --layers "${AB_LAYERS:-10}" --contexts 8192,32768 --prefill-repeats 2 --decode-steps 2 --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then echo "$label: gpu-bench failed (exit $rc), see $OUT/$name.log"; return 0; fi
  echo "$label: $(grep -E 'context .*prefill' "$OUT/$name.log" | sed 's/, decode.*//' | tr '\n' ' ' || true)"
  grep -E "prefill ($stages) " "$OUT/$name.log" | sed "s/^/  /" || true
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null || true
# cuBLASLt (>= 12.9) for the switch FP8_CUBLASLT, from the CUDA toolkit or PyTorch's nvidia-cublas
# wheel; without it that switch falls back to gemm_q8.cu and says so.
lt=$(find /usr/local/cuda*/lib64 /usr/local/lib /opt -name 'libcublasLt.so.1[3-9]*' 2>/dev/null | head -1 || true)
if [ -n "$lt" ]; then export LD_LIBRARY_PATH="$(dirname "$lt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
case "${1:-}" in
  check) timeout 300 "$B" gpu-check --repeats 10 --moe-tokens 2048,8192 --out "$OUT/gpu_check_h200.json" > "$OUT/gpu_check_h200.log" 2>&1
         echo "failures: $(grep -c FAIL "$OUT/gpu_check_h200.log" || true)" ;;
  switches) timeout 400 "$B" gpu-check --only switches --greedy-steps 16 --out "$OUT/switch_matrix_h200.json" > "$OUT/switch_matrix_h200.log" 2>&1
         grep -E "^switches " "$OUT/switch_matrix_h200.log" ;;
  qualify) timeout 560 "$B" qualify --layers 4 --contexts 8192,32768,131072 --out "$OUT/qualify" > "$OUT/qualify_h200.log" 2>&1
         grep -E "^qualify " "$OUT/qualify_h200.log" ;;
  bench) timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers.json" > "$OUT/gpu_bench_h200_20layers.log" 2>&1
         grep -E "uploaded|context" "$OUT/gpu_bench_h200_20layers.log" ;;
  moe) timeout 300 "$B" gpu-check --only moe --repeats 5 --moe-tokens 1,64,2048,8192 --out "$OUT/moe_grouped_h200.json" > "$OUT/moe_grouped_h200.log" 2>&1
         grep -E "time moe|FAIL" "$OUT/moe_grouped_h200.log" ;;
  moe-gemv) timeout 300 "$B" gpu-check --only moe --repeats 10 --moe-tokens 1,16,32 --out "$OUT/moe_gemv_mma_h200.json" > "$OUT/moe_gemv_mma_h200.log" 2>&1
         grep -E "time moe|gemv|FAIL" "$OUT/moe_gemv_mma_h200.log" ;;
  decode-ab-gemv-mma)
         for i in 1 2; do for v in on off; do
           env $SERVING FLASHSEEK_MHC_BF16_STREAMS=on FLASHSEEK_MHC_MIX_TC=on FLASHSEEK_MOE_GEMV_MMA=$v timeout 150 "$B" gpu-bench --layers 10 --contexts 8192 --prefill-repeats 1 --decode-steps 32 --out "$OUT/decode_ab_gemv_mma_${v}_$i.json" > "$OUT/decode_ab_gemv_mma_${v}_$i.log" 2>&1
           echo "MOE_GEMV_MMA=$v run $i: $(grep -E 'decode with CUDA graphs' "$OUT/decode_ab_gemv_mma_${v}_$i.log" | head -1) | $(grep -E 'decode  moe' "$OUT/decode_ab_gemv_mma_${v}_$i.log" | head -1)"
           rm -f "$OUT/decode_ab_gemv_mma_${v}_$i.log"
         done; done ;;
  decode-ab) sw=${2:?decode-ab needs a switch name}; tag=$(echo "$sw" | tr 'A-Z' 'a-z')
         for i in 1 2; do for v in on off; do
           env $SERVING FLASHSEEK_MHC_BF16_STREAMS=on FLASHSEEK_MHC_MIX_TC=on "FLASHSEEK_$sw=$v" timeout 150 "$B" gpu-bench --layers 10 --contexts 8192 --prefill-repeats 1 --decode-steps 32 --out "$OUT/decode_ab_${tag}_${v}_$i.json" > "$OUT/decode_ab_${tag}_${v}_$i.log" 2>&1
           echo "$sw=$v run $i: $(grep -E 'decode with CUDA graphs' "$OUT/decode_ab_${tag}_${v}_$i.log" | head -1) | $(grep -E "${DECODE_AB_STAGE:-decode  compressors}" "$OUT/decode_ab_${tag}_${v}_$i.log" | head -1)"
           rm -f "$OUT/decode_ab_${tag}_${v}_$i.log"
         done; done ;;
  gemv-mma) timeout 200 "$B" gpu-check --only gemv --repeats 20 --out "$OUT/gemv_mma_h200.json" > "$OUT/gemv_mma_h200.log" 2>&1
         grep -E "mma|FAIL" "$OUT/gemv_mma_h200.log" ;;
  decode-ab-linear-gemv-mma)
         for i in 1 2; do for v in on off; do
           env $SERVING FLASHSEEK_MHC_BF16_STREAMS=on FLASHSEEK_MHC_MIX_TC=on FLASHSEEK_LINEAR_GEMV_MMA=$v timeout 150 "$B" gpu-bench --layers 10 --contexts 8192 --prefill-repeats 1 --decode-steps 32 --out "$OUT/decode_ab_linear_gemv_mma_${v}_$i.json" > "$OUT/decode_ab_linear_gemv_mma_${v}_$i.log" 2>&1
           echo "LINEAR_GEMV_MMA=$v run $i: $(grep -E 'decode with CUDA graphs' "$OUT/decode_ab_linear_gemv_mma_${v}_$i.log" | head -1) | $(grep -E 'decode  projections' "$OUT/decode_ab_linear_gemv_mma_${v}_$i.log" | head -1) | $(grep -E 'decode  moe' "$OUT/decode_ab_linear_gemv_mma_${v}_$i.log" | head -1)"
           rm -f "$OUT/decode_ab_linear_gemv_mma_${v}_$i.log"
         done; done ;;
  tc) timeout 300 "$B" gpu-check --only tc --repeats 10 --out "$OUT/tc_h200.json" > "$OUT/tc_h200.log" 2>&1
         grep -E "^time tc|FAIL" "$OUT/tc_h200.log" ;;
  gemv) timeout 200 "$B" gpu-check --only gemv --repeats 20 --out "$OUT/gemv_t1_h200.json" > "$OUT/gemv_t1_h200.log" 2>&1
         grep -E "^time|FAIL" "$OUT/gemv_t1_h200.log" ;;
  q8) timeout 300 "$B" gpu-check --only q8 --repeats 10 --out "$OUT/q8_h200.json" > "$OUT/q8_h200.log" 2>&1
         grep -E "^time (q8|act_quant)|FAIL" "$OUT/q8_h200.log" ;;
  bench-fp8) FLASHSEEK_TC_LINEAR=fp8 timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers_fp8.json" > "$OUT/gpu_bench_h200_20layers_fp8.log" 2>&1
         grep -E "uploaded|context" "$OUT/gpu_bench_h200_20layers_fp8.log" ;;
  bench-fp8-bf16att) FLASHSEEK_TC_LINEAR=fp8 FLASHSEEK_MLA_BF16=on timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers_fp8_bf16att.json" > "$OUT/gpu_bench_h200_20layers_fp8_bf16att.log" 2>&1
         grep -E "uploaded|context" "$OUT/gpu_bench_h200_20layers_fp8_bf16att.log" ;;
  bench-fp8-bf16att-idx8) FLASHSEEK_TC_LINEAR=fp8 FLASHSEEK_MLA_BF16=on FLASHSEEK_INDEXER_FP8=on timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers_fp8_bf16att_idx8.json" > "$OUT/gpu_bench_h200_20layers_fp8_bf16att_idx8.log" 2>&1
         grep -E "uploaded|context" "$OUT/gpu_bench_h200_20layers_fp8_bf16att_idx8.log" ;;
  bench-serving) env $SERVING FLASHSEEK_MHC_BF16_STREAMS=on FLASHSEEK_MHC_MIX_TC=on timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers_serving.json" > "$OUT/gpu_bench_h200_20layers_serving.log" 2>&1
         grep -E "uploaded|context" "$OUT/gpu_bench_h200_20layers_serving.log" ;;
  bench-serving-moe-detail) env $SERVING FLASHSEEK_MHC_BF16_STREAMS=on FLASHSEEK_MHC_MIX_TC=on timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768 --prefill-repeats 2 --decode-steps 4 --moe-detail --out "$OUT/gpu_bench_h200_20layers_serving_moe_detail.json" > "$OUT/gpu_bench_h200_20layers_serving_moe_detail.log" 2>&1
         grep -E "uploaded|context|prefill  |routing" "$OUT/gpu_bench_h200_20layers_serving_moe_detail.log" | head -120 ;;
  bench-serving-cuda-mix) env $SERVING FLASHSEEK_MHC_BF16_STREAMS=on FLASHSEEK_MHC_MIX_TC=off timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers_serving_cuda_mix.json" > "$OUT/gpu_bench_h200_20layers_serving_cuda_mix.log" 2>&1
         grep -E "uploaded|context" "$OUT/gpu_bench_h200_20layers_serving_cuda_mix.log" ;;
  bench-serving-bf16-wo-a) env $SERVING FLASHSEEK_MHC_BF16_STREAMS=on FLASHSEEK_MHC_MIX_TC=on FLASHSEEK_WO_A_FP8=off timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers_serving_bf16_wo_a.json" > "$OUT/gpu_bench_h200_20layers_serving_bf16_wo_a.log" 2>&1
         grep -E "uploaded|context" "$OUT/gpu_bench_h200_20layers_serving_bf16_wo_a.log" ;;
  bench-serving-f32-compressors) env $SERVING FLASHSEEK_MHC_BF16_STREAMS=on FLASHSEEK_MHC_MIX_TC=on FLASHSEEK_COMPRESSOR_BF16=off timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers_serving_f32_compressors.json" > "$OUT/gpu_bench_h200_20layers_serving_f32_compressors.log" 2>&1
         grep -E "uploaded|context" "$OUT/gpu_bench_h200_20layers_serving_f32_compressors.log" ;;
  bench-serving-f32-down) env $SERVING FLASHSEEK_MHC_BF16_STREAMS=on FLASHSEEK_MHC_MIX_TC=on FLASHSEEK_MOE_DOWN_BF16_OUT=off timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers_serving_down_f32.json" > "$OUT/gpu_bench_h200_20layers_serving_down_f32.log" 2>&1
         grep -E "uploaded|context" "$OUT/gpu_bench_h200_20layers_serving_down_f32.log" ;;
  bench-serving-f32-streams) env $SERVING FLASHSEEK_MHC_BF16_STREAMS=off timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers_serving_f32_streams.json" > "$OUT/gpu_bench_h200_20layers_serving_f32_streams.log" 2>&1
         grep -E "uploaded|context" "$OUT/gpu_bench_h200_20layers_serving_f32_streams.log" ;;
  prefill-ab)
    # PREFILL_AB="label:NAME=V,NAME=V label2:…" (label "base": the serving configuration alone), each a
    # gpu-bench of AB_LAYERS (10) layers at 8K and 32K on top of the serving configuration, in the order given.
    for cfg in ${PREFILL_AB:?set PREFILL_AB to space-separated label:NAME=V,NAME=V configurations, e.g. PREFILL_AB="base comp:COMPRESSOR_BF16=on"}; do
      label=${cfg%%:*}; envs=""
      if [ "$cfg" != "$label" ]; then for kv in $(echo "${cfg#*:}" | tr ',' ' '); do envs="$envs FLASHSEEK_$kv"; done; fi
      # shellcheck disable=SC2086  # $envs: NAME=V words
      prefill_run "prefill_ab_$label" "$label ($envs)" "moe|compressors" $envs
    done ;;
  prefill-defines)
    # PREFILL_DEFINES="A=1,B=2 - …" (space-separated FLASHSEEK_KERNEL_DEFINES values; "-" none: the kernels'
    # defaults), each a gpu-bench of AB_LAYERS (10) layers at 8K and 32K in the serving configuration, in the
    # order given, each a fresh process (the kernels recompile per value unless cached).
    i=0
    for v in ${PREFILL_DEFINES:?set PREFILL_DEFINES to space-separated kernel-define sets, e.g. PREFILL_DEFINES='- AQ_WIDE_INDEX=1 -'}; do
      i=$((i + 1)); dv=""; [ "$v" != "-" ] && dv="$v"
      prefill_run "prefill_defines_$i" "$i [$v]" "moe|mhc\+norms|projections" FLASHSEEK_KERNEL_DEFINES="$dv"
    done ;;
  bench-chunks)
    for c in 16384 32768; do
      FLASHSEEK_TC_LINEAR=fp8 FLASHSEEK_MLA_BF16=on FLASHSEEK_INDEXER_FP8=on timeout 280 "$B" gpu-bench --layers 20 --contexts 32768,131072 --chunk $c --prefill-repeats 2 --decode-steps 4 --out "$OUT/gpu_bench_h200_20layers_fp8_bf16att_idx8_chunk$c.json" > "$OUT/gpu_bench_h200_20layers_fp8_bf16att_idx8_chunk$c.log" 2>&1
      grep -E "uploaded|context|prefill moe" "$OUT/gpu_bench_h200_20layers_fp8_bf16att_idx8_chunk$c.log"
    done
    timeout 200 "$B" gpu-check --only moe --skip-checks --repeats 5 --moe-tokens 8192,16384,32768 --out "$OUT/moe_chunks_h200.json" > "$OUT/moe_chunks_h200.log" 2>&1
    grep -E "fp8 wgmma all on|split all on" "$OUT/moe_chunks_h200.log" ;;
  bench-lt) FLASHSEEK_LINEAR_CUBLASLT=on timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers_lt.json" > "$OUT/gpu_bench_h200_20layers_lt.log" 2>&1
         grep -E "uploaded|context|cuBLASLt" "$OUT/gpu_bench_h200_20layers_lt.log" ;;
  bench-fp8-lt) FLASHSEEK_TC_LINEAR=fp8 FLASHSEEK_FP8_CUBLASLT=on FLASHSEEK_LINEAR_CUBLASLT=on timeout 560 "$B" gpu-bench --layers 20 --contexts 8192,32768,131072 --prefill-repeats 2 --decode-steps 16 --out "$OUT/gpu_bench_h200_20layers_fp8_lt.json" > "$OUT/gpu_bench_h200_20layers_fp8_lt.log" 2>&1
         grep -E "uploaded|context|cuBLASLt" "$OUT/gpu_bench_h200_20layers_fp8_lt.log" ;;
  moe-defines)
    for v in ${MOE_DEFINES:-MOE_WT_DIAG=0}; do
      echo "== FLASHSEEK_KERNEL_DEFINES=$v"
      FLASHSEEK_KERNEL_DEFINES=$v FLASHSEEK_TC_LINEAR=fp8 timeout 150 "$B" gpu-check --only moe --skip-checks --repeats 10 --moe-tokens "${MOE_TOKENS:-8192,32768}" 2>&1 | grep -E "fp8 wgmma all on|error" || true
    done | tee "$OUT/moe_defines_h200.log" ;;
  mhc) timeout 200 "$B" gpu-check --only mhc --repeats 10 --out "$OUT/mhc_h200.json" > "$OUT/mhc_h200.log" 2>&1
         grep -E "^time|FAIL" "$OUT/mhc_h200.log" ;;
  attention) timeout 300 "$B" gpu-check --only attention --repeats 10 --out "$OUT/attention_h200.json" > "$OUT/attention_h200.log" 2>&1
         grep -E "^time|FAIL" "$OUT/attention_h200.log" ;;
  serve) timeout 400 python3 scripts/serve_parity.py "$B" "$OUT/serve_parity_h200.json" --device cuda > "$OUT/serve_parity_h200.log" 2>&1
         tail -12 "$OUT/serve_parity_h200.log" ;;
  bench-decode) FLASHSEEK_MOE_GROUPED_DECODE=on FLASHSEEK_DECODE_CUDA_GRAPH=on timeout 400 "$B" gpu-bench --layers 20 --contexts 8192,131072 --prefill-repeats 1 --decode-steps 32 --out "$OUT/gpu_bench_h200_20layers_decode_graph.json" > "$OUT/gpu_bench_h200_20layers_decode_graph.log" 2>&1
         grep -E "uploaded|context|warning" "$OUT/gpu_bench_h200_20layers_decode_graph.log" ;;
  bench-decode-base) timeout 400 "$B" gpu-bench --layers 20 --contexts 8192,131072 --prefill-repeats 1 --decode-steps 32 --out "$OUT/gpu_bench_h200_20layers_decode_base.json" > "$OUT/gpu_bench_h200_20layers_decode_base.log" 2>&1
         grep -E "uploaded|context|warning" "$OUT/gpu_bench_h200_20layers_decode_base.log" ;;
  *) usage ;;
esac
