#!/usr/bin/env bash
# Warp stall reasons (cycles per issued instruction, by reason) of the grouped-MoE gate/up GEMMs at
# T = 8,192 — the FP8 wgmma kernel and the exact path's split one (launch counts as in
# bench/ncu/moe_layer_T8192_kernels_00123cd.txt):
#   OUT=DIR FLASHSEEK_BIN=... bash scripts/h200_ncu_stalls.sh
set -u
B=${FLASHSEEK_BIN:-.devbin/flashseek}
OUT=${OUT:?set OUT to the output folder}
export FLASHSEEK_CACHE=/tmp/fscache
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for k in "moe_w8_fp4_128_swiglu 4" "moe_wb_fp4_128_x2_swiglu 6"; do set -- $k
timeout 200 "$NCU" --clock-control none --kernel-name "$1" --launch-skip "$2" --launch-count 1 --section WarpStateStats --section SchedulerStats --print-details all --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio "$B" gpu-check --only moe --repeats 1 --moe-tokens 8192 > "$OUT/stall_$1.txt" 2>&1 || echo "exit $?"
grep -E "stalled|Stall" "$OUT/stall_$1.txt" | sort -k3 -n -r | head -40
done
