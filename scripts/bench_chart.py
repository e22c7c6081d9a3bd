#!/usr/bin/env python3
"""SVG chart of a `flashseek gpu-bench` report: per context, the prefill time split by stage
(stacked bar, ms per 1,000 prompt tokens) with prefill tok/s and the 43-layer estimate.

Usage: python3 scripts/bench_chart.py REPORT.json OUT.svg   (standard library only)
"""
import json
import sys

COLORS = {"embed": "#999999", "mhc+norms": "#b279a2", "projections": "#4c78a8", "attention": "#f58518",
          "indexer": "#e45756", "compressors": "#72b7b2", "moe": "#54a24b", "head": "#eeca3b"}


def main():
    rep = json.load(open(sys.argv[1]))
    runs = rep["runs"]
    left, width, bar, gap = 150, 560, 26, 22
    per_k = [sum(s["ms"] for s in r["prefill_stages"]) / (r["context"] / 1000) for r in runs]
    scale = width / max(per_k)
    y = 60
    out = []
    for r, total in zip(runs, per_k):
        x = left
        for s in r["prefill_stages"]:
            w = s["ms"] / (r["context"] / 1000) * scale
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar}" fill="{COLORS.get(s["stage"], "#333")}">'
                       f'<title>{s["stage"]}: {s["ms"]:.1f} ms ({100 * s["fraction_of_total"]:.1f}%)</title></rect>')
            x += w
        out.append(f'<text x="{left - 8}" y="{y + 17}" text-anchor="end">{r["context"]:,} tokens</text>')
        out.append(f'<text x="{x + 6:.1f}" y="{y + 11}">{r["prefill_tok_s"]:,.0f} tok/s ({r["layers_measured"]} layers)</text>')
        out.append(f'<text x="{x + 6:.1f}" y="{y + 24}">43-layer estimate {r["prefill_tok_s_43_layer_estimate"]:,.0f}</text>')
        y += bar + gap
    lx = left
    for name, c in COLORS.items():
        out.append(f'<rect x="{lx}" y="{y}" width="12" height="12" fill="{c}"/><text x="{lx + 16}" y="{y + 10}">{name}</text>')
        lx += 16 + 8 * len(name) + 14
    title = (f'flashseek prefill on {rep["gpu"]}: time per 1,000 prompt tokens by stage '
             f'({rep["layers_measured"]} DeepSeek-V4-Flash layers, random official-precision weights; commit {str(rep.get("commit", ""))[:10]})')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 260}" height="{y + 30}" font-family="sans-serif" font-size="12">\n'
           f'<text x="10" y="24" font-size="14">{title}</text>\n' + "\n".join(out) + "\n</svg>\n")
    open(sys.argv[2], "w").write(svg)


if __name__ == "__main__":
    main()
