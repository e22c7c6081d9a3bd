#!/usr/bin/env bash
# Kernel-level profile of one grouped-MoE layer at T tokens (device machine; Nsight Compute reads
# the hardware counters only on the Firecracker runtime, see the device tool's KINDS.md):
#   OUT=DIR FLASHSEEK_BIN=... bash scripts/h200_ncu.sh [T]
# ncu_all.csv: every kernel of `gpu-check --only moe --moe-tokens T --repeats 1` with its duration,
# grid, block, registers and shared memory (bench/ncu/moe_layer_T8192_kernels_00123cd.txt is a
# digest of one). Sections of one launch: scripts/h200_ncu_one.sh.
set -euo pipefail
B=${FLASHSEEK_BIN:-.devbin/flashseek}
OUT=${OUT:?set OUT to the output folder}
T=${1:-8192}
export FLASHSEEK_CACHE=${FLASHSEEK_CACHE:-/tmp/fscache}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
"$NCU" --version | tail -1
timeout 300 "$NCU" --clock-control none --csv --page raw \
  --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic \
  "$B" gpu-check --only moe --repeats 1 --moe-tokens "$T" > "$OUT/ncu_all.csv" 2> "$OUT/ncu_all.err" || echo "ncu all: exit $?"
