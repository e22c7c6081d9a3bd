#!/usr/bin/env python3
"""Digest of an Nsight Compute source-level CSV of a moe_ws_* launch (gemm_q8.cu, switch MOE_FP8_WS):
stall samples and executed instructions per role (multiply warpgroups, producer warpgroups, the
out-of-line mbarrier retry loops), per K step, and the top stall locations.

  ncu --kernel-name moe_ws_fp4_128_swiglu --launch-count 1 --section SourceCounters \\
      --section WarpStateStats --page source --print-source sass --csv flashseek gpu-check ... > src.csv
  python3 scripts/ncu_digest.py src.csv
"""
# Digest of an Nsight Compute source-level CSV of moe_ws_*: samples and executed instructions per
# role (consumer = multiply warpgroups, producer), top stall locations.
import csv, collections, sys
lines = open(sys.argv[1]).read().splitlines()
i = [k for k, l in enumerate(lines) if l.startswith('"Address"')][0]
rows = list(csv.reader(lines[i:]))
h = rows[0]
R = [dict(zip(h, r)) for r in rows[1:] if len(r) == len(h)]
num = lambda x: float(x.replace(',', '')) if x.replace(',', '').replace('.', '').isdigit() else 0.0
tot = sum(num(r['Warp Stall Sampling (All Samples)']) for r in R)
inc = [k for k, r in enumerate(R) if 'USETMAXREG.TRY_ALLOC' in r['Source']][0]
dec = [k for k, r in enumerate(R) if 'USETMAXREG.DEALLOC' in r['Source']][0]
end = [k for k, r in enumerate(R) if r['Source'].strip() == 'EXIT'][-1] + 1  # then the out-of-line mbarrier retry loops
steps = max(num(r['Instructions Executed']) for r in R if 'QGMMA' in r['Source'])
print(f"kernel instructions {len(R)}, stall samples {tot:.0f}; per-warp K steps (QGMMA executions) {steps:.0f}")
for name, (a, b) in {'multiply warpgroups': (inc, dec), 'producer warpgroups': (dec, end), 'mbarrier retry loops (both)': (end, len(R))}.items():
    s = sum(num(r['Warp Stall Sampling (All Samples)']) for r in R[a:b])
    c = collections.Counter()
    ops = collections.Counter()
    for r in R[a:b]:
        for k in h:
            if k.startswith('stall_') and 'Not Issued' not in k:
                c[k] += num(r[k])
        src = r['Source'].split()
        op = src[1] if src[0].startswith('@') else src[0]
        ops[op.split('.')[0]] += num(r['Instructions Executed']) / steps
    ins = sum(ops.values())
    print(f"{name}: {100 * s / tot:.1f}% of samples, {ins:.0f} instructions per warp per K step; stalls {[(k, round(100 * v / s, 1)) for k, v in c.most_common(5)]}")
    print(f"  instructions per warp per K step by opcode: {[(k, round(v, 1)) for k, v in ops.most_common(12)]}")
for k in range(end, len(R)):
    if 'TRYWAIT' in R[k]['Source']:
        print(f"retry loop {R[k]['Source'].split('[')[1].split(']')[0]}: {num(R[k]['Instructions Executed']) / steps:.1f} retries per warp per K step")
print("top stall locations (share of all samples, top reasons):")
for k, r in sorted(enumerate(R), key=lambda kr: -num(kr[1]['Warp Stall Sampling (All Samples)']))[:12]:
    s = num(r['Warp Stall Sampling (All Samples)'])
    top = sorted([(num(r[x]), x) for x in h if x.startswith('stall_') and 'Not Issued' not in x], reverse=True)[:2]
    role = 'multiply' if inc <= k < dec else ('producer' if dec <= k < end else ('retry' if k >= end else 'start'))
    print(f"  {100 * s / tot:5.1f}%  {role:8} {r['Source'][:58]:58} {[x for _, x in top]}")
