#!/usr/bin/env python3
"""The PyTorch rows of scripts/gpu-dist's scaling table.

    python3 bench/dist_table.py WORK N

Reads WORK/pt-1.json (bench/gpt2_ref.py bench on one GPU) and WORK/pt-ddp.json,
WORK/pt-fsdp2.json (the same under torchrun on N GPUs) and prints a markdown
table: tokens/s over all GPUs, weak-scaling efficiency (tokens/s on N GPUs over
N times tokens/s on one) and rank 0's peak memory.
"""
import json
import sys


def load(path):
    try:
        with open(path) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def main():
    work, n = sys.argv[1], int(sys.argv[2])
    one = load(f"{work}/pt-1.json")
    print("| PyTorch (eager, bf16 autocast) | GPUs | tokens/s | weak-scaling efficiency | peak memory per GPU (rank 0) |")
    print("|---|---|---|---|---|")
    if one:
        print(f"| single GPU | 1 | {one['tokens_per_s'] / 1e3:.1f}K | 1.000 | {one['peak_mem_bytes'] / 2**30:.2f} GiB |")
    for d in ("ddp", "fsdp2"):
        r = load(f"{work}/pt-{d}.json")
        if not r or not one:
            print(f"| {d} | {n} | FAILED (see pt-{d}.log) | | |")
            continue
        eff = r["tokens_per_s"] / (n * one["tokens_per_s"])
        print(f"| {d} | {n} | {r['tokens_per_s'] / 1e3:.1f}K | {eff:.3f} | {r['peak_mem_bytes'] / 2**30:.2f} GiB |")


if __name__ == "__main__":
    main()
