#!/usr/bin/env python3
"""FP8 promotion ablation on the emulator: runs `ptxforge gemm` for the un-promoted kernel
(`--no-promotion`, one FP32 tensor-core accumulator over all of K) and DeepSeek's promoted kernel
(FP32 promotion every 128 K, bf16 out) on all-positive inputs at K = 128 .. 16384 under the given
tensor-core numerics, prints a Markdown table and writes an SVG plot (log-log, max and mean
element-wise relative error against K).

usage: scripts/fp8-ablation.py [--bin target/debug/ptxforge] [--numerics hw] [--svg docs/fp8-ablation.svg]
"""
import argparse, json, math, subprocess

KS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
M, N = 32, 128


def run(bin_, k, numerics, promoted):
    cmd = [bin_, "gemm", "--dtype", "fp8", "--m", str(M), "--n", str(N), "--k", str(k),
           "--numerics", numerics, "--json", "--seed", "3"]
    cmd += ["--positive", "--kernel", "mma"] if promoted else ["--no-promotion"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def svg(rows, path, numerics):
    W, H, ML, MR, MT, MB = 760, 460, 80, 200, 50, 60
    x0, x1 = math.log2(KS[0]), math.log2(KS[-1])
    ys = [v for r in rows for v in r[1:] if v > 0]
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    px = lambda k: ML + (math.log2(k) - x0) / (x1 - x0) * (W - ML - MR)
    py = lambda v: H - MB - (math.log10(v) - y0) / (y1 - y0) * (H - MT - MB)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="DejaVu Sans, sans-serif" font-size="12">',
         '<rect width="100%" height="100%" fill="white"/>',
         f'<text x="{(W - MR + ML) / 2}" y="25" text-anchor="middle" font-size="15">FP8 GEMM error vs K (emulator, {numerics} numerics, sm_90 model)</text>']
    for e in range(y0, y1 + 1):
        y = py(10.0 ** e)
        o.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{W - MR}" y2="{y:.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{ML - 8}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
    for k in KS:
        x = px(k)
        o.append(f'<line x1="{x:.1f}" y1="{MT}" x2="{x:.1f}" y2="{H - MB}" stroke="#eee"/>')
        o.append(f'<text x="{x:.1f}" y="{H - MB + 18}" text-anchor="middle">{k}</text>')
    o.append(f'<text x="{(W - MR + ML) / 2}" y="{H - 15}" text-anchor="middle">K</text>')
    o.append(f'<text x="20" y="{(H - MB + MT) / 2}" transform="rotate(-90 20 {(H - MB + MT) / 2})" text-anchor="middle">relative error</text>')
    series = [(1, "#c0392b", "", "un-promoted, max"), (2, "#c0392b", "5,4", "un-promoted, mean"),
              (3, "#2471a3", "", "promoted, max"), (4, "#2471a3", "5,4", "promoted, mean")]
    for i, (col, color, dash, label) in enumerate(series):
        pts = " ".join(f"{px(r[0]):.1f},{py(r[col]):.1f}" for r in rows)
        o.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        for r in rows:
            o.append(f'<circle cx="{px(r[0]):.1f}" cy="{py(r[col]):.1f}" r="3" fill="{color}"/>')
        ly = MT + 20 + 22 * i
        o.append(f'<line x1="{W - MR + 15}" y1="{ly}" x2="{W - MR + 45}" y2="{ly}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        o.append(f'<text x="{W - MR + 52}" y="{ly + 4}">{label}</text>')
    y2 = py(0.02)
    o.append(f'<line x1="{px(4096) - 12:.1f}" y1="{y2:.1f}" x2="{px(4096) + 12:.1f}" y2="{y2:.1f}" stroke="black" stroke-width="2"/>')
    o.append(f'<text x="{px(4096) + 16:.1f}" y="{y2 + 4:.1f}">DeepSeek-V3: ~2% at K=4096</text>')
    o.append('</svg>')
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/ptxforge")
    ap.add_argument("--numerics", default="hw")
    ap.add_argument("--svg", default=None)
    a = ap.parse_args()
    rows = []
    print("| K | un-promoted max | un-promoted mean | promoted max | promoted mean |")
    print("|---:|---:|---:|---:|---:|")
    for k in KS:
        u = run(a.bin, k, a.numerics, False)
        p = run(a.bin, k, a.numerics, True)
        rows.append((k, u["max_rel_err"], u["mean_rel_err"], p["max_rel_err"], p["mean_rel_err"]))
        print(f"| {k} | {u['max_rel_err']:.2e} | {u['mean_rel_err']:.2e} | {p['max_rel_err']:.2e} | {p['mean_rel_err']:.2e} |", flush=True)
    if a.svg:
        svg(rows, a.svg, a.numerics)


if __name__ == "__main__":
    main()
