#!/usr/bin/env bash
# Nsight Compute profiles of the grouped-MoE kernels (device machine; ncu reads the hardware
# counters only on the Firecracker runtime, see the device tool's KINDS.md), from
# `gpu-check --only moe --repeats 1 --moe-tokens T`:
#   OUT=DIR FLASHSEEK_BIN=... bash scripts/h200_ncu.sh all [T]
#       ncu_all.csv: every kernel with its duration, grid, block, registers and shared memory
#       (bench/ncu/moe_layer_T8192_kernels_00123cd.txt is a digest of one)
#   ... bash scripts/h200_ncu.sh one KERNEL SKIP [T]
#       ncu_KERNEL.txt: the main sections of one launch of KERNEL (SKIP = how many launches of it
#       come first; find it in ncu_all.csv)
#   ... bash scripts/h200_ncu.sh bench LAYERS CONTEXT [NAME-REGEX]
#       ncu_bench_CONTEXT.csv: every kernel (or those matching NAME-REGEX) of the prefills and decode steps of
#       `gpu-bench --layers LAYERS --contexts CONTEXT` (switches from the environment, e.g.
#       FLASHSEEK_TC_LINEAR=fp8) with duration, grid, block, registers and shared memory
#   ... bash scripts/h200_ncu.sh stalls
#       stall_KERNEL.txt: warp stall reasons (cycles per issued instruction, by reason) of the FP8
#       and the split gate/up GEMMs at T = 8,192 (launch counts as in the digest above)
#   ... bash scripts/h200_ncu.sh stalls-prefill [CONTEXT]
#       prefill_stall_KERNEL.txt: the same sections (plus speed of light and source counters) for the
#       first launch, in one `gpu-bench --layers 4` prefill of CONTEXT (8,192) tokens, of each of
#       the default prefill's heaviest kernels: the warp-specialised gate/up GEMMs of both numerics
#       (moe_wbs_fp4_128_x2_swiglu exact, moe_wt_fp4_256_swiglu with TC_LINEAR=fp8) and the
#       streaming attention with split-plane output
set -euo pipefail
B=${FLASHSEEK_BIN:-.devbin/flashseek}
OUT=${OUT:?set OUT to the output folder}
export FLASHSEEK_CACHE=${FLASHSEEK_CACHE:-/tmp/fscache}
# Per-launch metrics of the `all` and `bench` modes.
LAUNCH_METRICS=gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
one() {  # KERNEL SKIP T FILE SECTION-OPTIONS…
  local k=$1 skip=$2 t=$3 f=$4
  shift 4
  timeout 240 "$NCU" --clock-control none --kernel-name "$k" --launch-skip "$skip" --launch-count 1 "$@" \
    "$B" gpu-check --only moe --repeats 1 --moe-tokens "$t" > "$OUT/$f" 2>&1 || echo "ncu $k: exit $?"
}
case "${1:-}" in
  all) "$NCU" --version | tail -1
       timeout 300 "$NCU" --clock-control none --csv --page raw \
         --metrics "$LAUNCH_METRICS" \
         "$B" gpu-check --only moe --repeats 1 --moe-tokens "${2:-8192}" > "$OUT/ncu_all.csv" 2> "$OUT/ncu_all.err" || echo "ncu all: exit $?" ;;
  bench) k=(); if [ -n "${4:-}" ]; then k=(--kernel-name "regex:$4"); fi
       timeout 420 "$NCU" --clock-control none --csv --page raw "${k[@]}" \
         --metrics "$LAUNCH_METRICS" \
         "$B" gpu-bench --layers "$2" --contexts "$3" --prefill-repeats 1 --decode-steps 1 > "$OUT/ncu_bench_$3.csv" 2> "$OUT/ncu_bench_$3.err" || echo "ncu bench: exit $?" ;;
  one) one "$2" "$3" "${4:-8192}" "ncu_$2.txt" --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
         --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats --section SourceCounters
       grep -A5 "Section: Warp State" "$OUT/ncu_$2.txt" || true ;;
  stalls) for k in "moe_w8_fp4_128_swiglu 4" "moe_wb_fp4_128_x2_swiglu 6"; do
         set -- $k
         one "$1" "$2" 8192 "stall_$1.txt" --section WarpStateStats --section SchedulerStats --print-details all \
           --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio'
         grep -E "^ *Stall " "$OUT/stall_$1.txt" | awk '{print $NF "\t" $0}' | sort -rn | cut -f2 | head -8
       done ;;
  stalls-prefill) c=${2:-8192}
       for k in "moe_wbs_fp4_128_x2_swiglu split" "moe_wt_fp4_256_swiglu fp8" "sparse_attention_tc_split split"; do
         set -- $k
         FLASHSEEK_TC_LINEAR=$2 timeout 240 "$NCU" --clock-control none --kernel-name "$1" --launch-skip 0 --launch-count 1 \
           --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --print-details all \
           --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio' \
           "$B" gpu-bench --layers 4 --contexts "$c" --prefill-repeats 1 --decode-steps 1 > "$OUT/prefill_stall_$1.txt" 2>&1 || echo "ncu $1: exit $?"
         grep -E "^ *Stall " "$OUT/prefill_stall_$1.txt" | awk '{print $NF "\t" $0}' | sort -rn | cut -f2 | head -8
       done ;;
  *) echo "usage: OUT=DIR bash scripts/h200_ncu.sh all [T] | one KERNEL SKIP [T] | bench LAYERS CONTEXT [NAME-REGEX] | stalls | stalls-prefill [CONTEXT]" >&2; exit 2 ;;
esac
