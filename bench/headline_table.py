#!/usr/bin/env python3
"""The table of scripts/gpu-headline: BluTrain against PyTorch DDP, per precision.

    python3 bench/headline_table.py WORK N PRECISION...

Reads, for each precision P, from WORK:
  P-bt-1.jsonl, P-bt-{ddp,zero1,zero2,zero3}.jsonl   blutrain train --metrics (30 steps)
  P-pt-1.out, P-pt-ddpB.out                          bench/gpt2_ref.py bench --json
  TAG.smi                                            nvidia-smi "index, MiB" samples of each run

BluTrain's tokens/s is the median of steps 11-30 over all GPUs (each step's
wall time, the data loader included); PyTorch's is the mean of 20 timed steps
after 5 warm-up steps (CUDA events, batches already on the GPU). Efficiency is
tokens/s on N GPUs over N times the same system's tokens/s on one GPU. The
ratio columns divide by PyTorch DDP with its default 25 MiB buckets.
"""
import glob
import json
import os
import re
import statistics
import sys

from dist_table import load as last_json  # the last line of a file, as JSON (None: none)

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")


def jsonl(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def smi_peak(path):
    """The most MiB any GPU showed in an nvidia-smi sample file, in bytes (None: no samples)."""
    peak = None
    try:
        with open(path) as f:
            for line in f:
                m = re.match(r"\s*(\d+),\s*(\d+)\s*$", line)
                if m:
                    peak = max(peak or 0, int(m.group(2)))
    except OSError:
        return None
    return None if peak is None else peak * 2**20


def blutrain(work, tag):
    rows = jsonl(f"{work}/{tag}.jsonl")
    if len(rows) < 30:
        return None
    return {"tps": statistics.median(r["tokens_per_s"] for r in rows[10:]),
            "alloc": max(r["peak_mem_bytes"] for r in rows), "smi": smi_peak(f"{work}/{tag}.smi")}


def pytorch(work, tag):
    r = last_json(f"{work}/{tag}.out")
    if not r:
        return None
    return {"tps": r["tokens_per_s"], "alloc": r["peak_mem_bytes"], "smi": smi_peak(f"{work}/{tag}.smi")}


def gib(b):
    return f"{b / 2**30:.2f} GiB" if b else "-"


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def table(work, n, precision):
    bt1, pt1 = blutrain(work, f"{precision}-bt-1"), pytorch(work, f"{precision}-pt-1")
    ref = pytorch(work, f"{precision}-pt-ddp25")
    rows = [("BluTrain", "one GPU", 1, bt1, bt1)]
    rows += [("BluTrain", s, n, blutrain(work, f"{precision}-bt-{s}"), bt1) for s in STRATEGIES]
    rows.append(("PyTorch eager", "one GPU", 1, pt1, pt1))
    buckets = sorted(int(m.group(1)) for m in
                     (re.search(r"-pt-ddp(\d+)\.out$", p) for p in glob.glob(f"{work}/{precision}-pt-ddp*.out")) if m)
    rows += [("PyTorch eager", f"DDP, {b} MiB buckets", n, pytorch(work, f"{precision}-pt-ddp{b}"), pt1)
             for b in buckets or [25]]
    note = {"fp32": " (strict: no TF32)", "fp32x3": " (3xTF32 matmuls; the PyTorch rows run strict fp32)"}
    out = [f"**{precision}**" + note.get(precision, "") + "\n",
           "| system | mode | GPUs | tokens/s | weak-scaling efficiency | allocator peak per GPU | nvidia-smi peak per GPU "
           "| tokens/s vs PyTorch DDP | allocator peak vs PyTorch DDP | nvidia-smi peak vs PyTorch DDP |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for system, mode, g, r, one in rows:
        if not r:
            out.append(f"| {system} | {mode} | {g} | FAILED | | | | | | |")
            continue
        eff = f"{r['tps'] / (g * one['tps']):.3f}" if one else "-"
        cmp = ["-"] * 3 if g == 1 or not ref else [ratio(r[k], ref[k]) for k in ("tps", "alloc", "smi")]
        out.append(f"| {system} | {mode} | {g} | {r['tps'] / 1e3:.1f}K | {eff} | {gib(r['alloc'])} | {gib(r['smi'])} "
                   f"| {cmp[0]} | {cmp[1]} | {cmp[2]} |")
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    work, n, precisions = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if not os.path.isdir(work):
        print(f"headline_table.py: {work} is not a directory", file=sys.stderr)
        return 2
    print("\n".join(table(work, n, p) for p in precisions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
