#!/usr/bin/env python3
"""Digest of an Nsight Compute source-level CSV of a warp-specialised MoE launch — moe_ws_* or moe_wt_*
(gemm_q8.cu, switches MOE_FP8_WS / MOE_FP8_WT) or moe_wbs_* (gemm.cu, switch MOE_BF16_WS): stall samples and executed
instructions per role (multiply warpgroups, producer warpgroups, the out-of-line mbarrier retry
loops), per K step, and the top stall locations.

moe_ws / moe_wt: the roles are the code between the two setmaxnreg instructions (multiply) and after
them (producers); K steps = the executions of one QGMMA (moe_wt: the first sub-tile's, so a step's
figures cover both of a warpgroup's sub-tiles). moe_wbs (no setmaxnreg): multiply = the code
before the first EXIT, producer = up to the last EXIT; per warp and K step = instructions /
(block K steps × warps of the role: 8 multiply, 4 producer), block K steps = HGMMA executions / 64
(8 per step and warp, 8 multiply warps).

  ncu --kernel-name moe_ws_fp4_128_swiglu --launch-count 1 --section SourceCounters \\
      --section WarpStateStats --page source --print-source sass --csv flashseek gpu-check ... > src.csv
  python3 scripts/ncu_digest.py src.csv

Any other kernel (e.g. sparse_attention_tc, bench/ncu/sparse_attention_*_T2048_*.txt):
  python3 scripts/ncu_digest.py --any src.csv
prints the whole kernel's stall reasons, stall samples and executed instructions by opcode, and the
top stall locations.
"""
# Digest of an Nsight Compute source-level CSV of moe_ws_*: samples and executed instructions per
# role (consumer = multiply warpgroups, producer), top stall locations.
import csv, collections, sys
generic = '--any' in sys.argv[1:]
lines = open([a for a in sys.argv[1:] if a != '--any'][0]).read().splitlines()
i = [k for k, l in enumerate(lines) if l.startswith('"Address"')][0]
rows = list(csv.reader(lines[i:]))
h = rows[0]
R = [dict(zip(h, r)) for r in rows[1:] if len(r) == len(h)]
num = lambda x: float(x.replace(',', '')) if x.replace(',', '').replace('.', '').isdigit() else 0.0
tot = sum(num(r['Warp Stall Sampling (All Samples)']) for r in R)
if generic:
    stalls = [k for k in h if k.startswith('stall_') and 'Not Issued' not in k]
    agg = {k: sum(num(r[k]) for r in R) for k in stalls}
    all_st = sum(agg.values()) or 1.0
    print(f"kernel instructions {len(R)}, stall samples {tot:.0f}")
    print("stall reasons (share of all samples):")
    for k, v in sorted(agg.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {k:24s} {100 * v / all_st:5.1f}%")
    samples, executed = collections.Counter(), collections.Counter()
    for r in R:
        src = r['Source'].split()
        if not src:
            continue
        op = (src[1] if src[0].startswith('@') else src[0]).split('.')[0]
        samples[op] += num(r['Warp Stall Sampling (All Samples)'])
        executed[op] += num(r['Instructions Executed'])
    print("samples by opcode (share, warp instructions executed):")
    for op, v in samples.most_common(14):
        print(f"  {op:12s} {100 * v / (tot or 1.0):5.1f}%  {executed[op]:.3g}")
    print("top stall locations (share of all samples, top reasons):")
    for r in sorted(R, key=lambda r: -num(r['Warp Stall Sampling (All Samples)']))[:12]:
        top = sorted([(num(r[x]), x) for x in stalls], reverse=True)[:2]
        print(f"  {100 * num(r['Warp Stall Sampling (All Samples)']) / (tot or 1.0):5.1f}%  {r['Source'][:62]:62} {[x for _, x in top]}")
    sys.exit(0)
if not any('USETMAXREG' in r['Source'] for r in R) and not any('HGMMA' in r['Source'] for r in R):
    sys.exit("not a warp-specialised MoE kernel (no setmaxnreg, no HGMMA): use --any for a whole-kernel digest")
exits = [k for k, r in enumerate(R) if r['Source'].strip() == 'EXIT']
end = exits[-1] + 1  # then the out-of-line mbarrier retry loops
if any('USETMAXREG' in r['Source'] for r in R):  # moe_ws
    inc = [k for k, r in enumerate(R) if 'USETMAXREG.TRY_ALLOC' in r['Source']][0]
    dec = [k for k, r in enumerate(R) if 'USETMAXREG.DEALLOC' in r['Source']][0]
    steps = max(num(r['Instructions Executed']) for r in R if 'QGMMA' in r['Source'])
    per = {'multiply warpgroups': steps, 'producer warpgroups': steps, 'mbarrier retry loops (both)': steps}
    print(f"kernel instructions {len(R)}, stall samples {tot:.0f}; per-warp K steps (QGMMA executions) {steps:.0f}")
else:  # moe_wbs
    inc, dec = 0, exits[0] + 1
    block_steps = sum(num(r['Instructions Executed']) for r in R if 'HGMMA' in r['Source']) / 64
    steps = 8 * block_steps
    per = {'multiply warpgroups': 8 * block_steps, 'producer warpgroups': 4 * block_steps, 'mbarrier retry loops (both)': 12 * block_steps}
    print(f"kernel instructions {len(R)}, stall samples {tot:.0f}; block K steps (HGMMA executions / 64) {block_steps:.0f}")
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
        ops[op.split('.')[0]] += num(r['Instructions Executed']) / per[name]
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
