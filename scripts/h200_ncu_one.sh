#!/usr/bin/env bash
# Nsight Compute sections of one launch of one kernel in `gpu-check --only moe --moe-tokens T`:
#   OUT=DIR FLASHSEEK_BIN=... bash scripts/h200_ncu_one.sh KERNEL SKIP [T]
# (SKIP = how many launches of KERNEL come first; find it in h200_ncu.sh's ncu_all.csv).
set -euo pipefail
B=${FLASHSEEK_BIN:-.devbin/flashseek}
OUT=${OUT:?set OUT to the output folder}
export FLASHSEEK_CACHE=${FLASHSEEK_CACHE:-/tmp/fscache}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 240 "$NCU" --clock-control none --kernel-name "$1" --launch-skip "$2" --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
  --section ComputeWorkloadAnalysis --section LaunchStats --section SourceCounters \
  "$B" gpu-check --only moe --repeats 1 --moe-tokens "${3:-8192}" > "$OUT/ncu_$1.txt" 2>&1 || echo "ncu $1: exit $?"
grep -A60 "Section: Warp State" "$OUT/ncu_$1.txt" | head -5 || true
