#!/usr/bin/env python3
"""Fidelity test: BluTrain against the PyTorch reference (bench/gpt2_ref.py).

1. `blutrain train` runs N deterministic steps on the given shards (no shuffle,
   no validation, no sample) and saves its initial weights, final weights,
   per-step metrics and resolved config into --out;
2. gpt2_ref.py trains from the same resolved config, starting from BluTrain's
   initial weights (BluTrain's fp32x3 against PyTorch in strict fp32);
3. per-step losses, gradient norms and learning rates and the final weights are
   compared; a Markdown table and a summary are printed (and written to
   OUT/report.md). Exit status 1 when the largest relative loss difference
   exceeds --tol or any value is NaN (2 when a run itself fails).

With --golden FILE, a passing run also writes the reference losses with the
resolved config, for a CPU test that checks BluTrain against them.
"""

import argparse
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gpt2_ref  # noqa: E402  (weights/data helpers; torch is optional for them)


def run_logged(cmd, log_path, env=None):
    """Runs cmd, streaming its output to the terminal and to log_path."""
    print("+ " + shlex.join(cmd), flush=True)
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for line in p.stdout:
            sys.stdout.write(line)
            log.write(line)
        return p.wait()


def read_metrics(path):
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise SystemExit(f"fidelity: {path}:{i} is not JSON: {e}")
    return rows


def rel_diff(a, b):
    """|a - b| / |b| (b the reference); inf if b is 0 and a is not; NaN propagates."""
    if math.isnan(a) or math.isnan(b):
        return float("nan")
    if a == b:
        return 0.0
    return abs(a - b) / abs(b) if b != 0 else float("inf")


def compare_weights(bt_path, ref_path, w0_path):
    """Per tensor of the final weights: max |bt - ref|; the largest element-wise
    relative difference |bt - ref| / max(|ref|, 1e-3 rms(ref)) (the floor keeps
    near-zero entries from dominating); ||bt - ref|| / ||ref||; and
    ||bt - ref|| / ||ref - w0||, the difference relative to the training update.
    Returns ({name: dict}, problems)."""
    _, bt = gpt2_ref.read_weights(bt_path)
    _, ref = gpt2_ref.read_weights(ref_path)
    w0 = gpt2_ref.read_weights(w0_path)[1] if os.path.exists(w0_path) else {}
    problems = []
    if set(bt) != set(ref):
        problems.append(f"tensor names differ: only in BluTrain {sorted(set(bt) - set(ref))}, "
                        f"only in the reference {sorted(set(ref) - set(bt))}")
    out = {}
    for name in ref:
        if name not in bt:
            continue
        a, b = bt[name].astype(np.float64), ref[name].astype(np.float64)
        if a.shape != b.shape or b.size == 0:
            if a.shape != b.shape:
                problems.append(f"tensor '{name}': shape {list(a.shape)} vs {list(b.shape)}")
            continue
        d = np.abs(a - b)
        rms = float(np.sqrt(np.mean(b * b)))
        dn, bn = float(np.linalg.norm(d)), float(np.linalg.norm(b))
        r = {"nan": bool(np.isnan(a).any() or np.isnan(b).any()), "max_abs": float(d.max()),
             "max_rel": float((d / np.maximum(np.abs(b), max(1e-3 * rms, 1e-30))).max()),
             "rel_l2": dn / bn if bn > 0 else (0.0 if dn == 0 else float("inf")), "update_rel": float("nan")}
        if name in w0 and w0[name].shape == b.shape:
            un = float(np.linalg.norm(b - w0[name].astype(np.float64)))
            r["update_rel"] = dn / un if un > 0 else (0.0 if dn == 0 else float("inf"))
        out[name] = r
    return out, problems


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fmt(x):
    return "nan" if isinstance(x, float) and math.isnan(x) else f"{x:.3e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blutrain", required=True, help="the blutrain binary")
    ap.add_argument("--config", default="tiny",
                    help="preset (tiny, gpt2-124m: configs/NAME.yaml) or a YAML config path")
    ap.add_argument("--data", required=True, help="glob of llm.c token shards (train.data)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--precision", default="fp32", choices=gpt2_ref.PRECISIONS,
                    help="train.precision; the reference runs fp32x3 as strict fp32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--micro-batch", type=int, help="train.micro_batch (default: the config's)")
    ap.add_argument("--batch-size", type=int, help="train.batch_size (default: the config's)")
    ap.add_argument("--out", default="fidelity-out", help="folder for weights, metrics, logs and report")
    ap.add_argument("--tol", type=float, default=1e-5, help="largest allowed relative loss difference")
    ap.add_argument("--final-tol", type=float,
                    help="instead of --tol at every step, require the last step's loss (and the mean of the "
                         "last 10) within this relative difference (bf16: 0.01)")
    ap.add_argument("--grad-tol", type=float, help="also fail above this relative grad-norm difference")
    ap.add_argument("--weight-tol", type=float, help="also fail above this ||bt-ref||/||ref|| of any final tensor")
    ap.add_argument("--golden", help="after a passing run, write the reference losses here (JSON)")
    ap.add_argument("--python", default=sys.executable, help="Python that runs gpt2_ref.py (with torch)")
    ap.add_argument("--compare-only", action="store_true", help="skip both runs; compare what --out holds")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a further BluTrain config override (repeatable), e.g. train.compile=true")
    args = ap.parse_args()

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    P = {k: os.path.join(out, v) for k, v in dict(
        w0="w0.h5", bt_final="bt_final.h5", bt_metrics="bt.jsonl", cfg="cfg.json", ref_final="ref_final.h5",
        ref_metrics="ref.jsonl", bt_log="bt.log", ref_log="ref.log", report="report.md").items()}
    config = args.config
    if not config.endswith((".yaml", ".yml")):
        config = os.path.join(REPO, "configs", config + ".yaml")

    bt_cmd = [args.blutrain, "train", "--config", config,
              "--set", f"data.train={args.data}", "--set", "data.val=", "--set", "data.shuffle=false",
              "--set", f"train.steps={args.steps}", "--set", f"train.precision={args.precision}",
              "--set", f"train.device={args.device}"]
    if args.micro_batch is not None:
        bt_cmd += ["--set", f"train.micro_batch={args.micro_batch}"]
    if args.batch_size is not None:
        bt_cmd += ["--set", f"train.batch_size={args.batch_size}"]
    for kv in args.set:
        bt_cmd += ["--set", kv]
    bt_cmd += ["--set", "train.eval_every=0", "--set", "train.sample_tokens=0",
               "--save-init", P["w0"], "--save-weights", P["bt_final"], "--metrics", P["bt_metrics"],
               "--resolved-config", P["cfg"]]
    ref_cmd = [args.python, os.path.join(HERE, "gpt2_ref.py"), "train", "--config", P["cfg"], "--init", P["w0"],
               "--save-weights", P["ref_final"], "--metrics", P["ref_metrics"], "--device", args.device]

    if not args.compare_only:
        for k in ("w0", "bt_final", "bt_metrics", "cfg", "ref_final", "ref_metrics"):
            if os.path.exists(P[k]):
                os.remove(P[k])  # never compare stale outputs
        if run_logged(bt_cmd, P["bt_log"]) != 0:
            print(f"fidelity: blutrain train failed; log in {P['bt_log']}", file=sys.stderr)
            return 2
        env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1")
        if run_logged(ref_cmd, P["ref_log"], env=env) != 0:
            print(f"fidelity: gpt2_ref.py train failed; log in {P['ref_log']}", file=sys.stderr)
            return 2

    bt, ref = read_metrics(P["bt_metrics"]), read_metrics(P["ref_metrics"])
    problems = []
    for name, rows in (("BluTrain", bt), ("reference", ref)):
        steps = [r.get("step") for r in rows]
        if steps != list(range(1, len(rows) + 1)):
            problems.append(f"{name} metrics steps are {steps[:5]}..., not 1..{len(rows)}")
    if len(bt) != len(ref):
        problems.append(f"BluTrain wrote {len(bt)} steps, the reference {len(ref)}")
    n = min(len(bt), len(ref))
    if n == 0:
        problems.append("no steps to compare")

    loss_rel = [rel_diff(float(bt[i]["loss"]), float(ref[i]["loss"])) for i in range(n)]
    gn_rel = [rel_diff(float(bt[i]["grad_norm"]), float(ref[i]["grad_norm"])) for i in range(n)]
    lr_rel = [rel_diff(float(bt[i]["lr"]), float(ref[i]["lr"])) for i in range(n)]
    nan = any(math.isnan(x) for x in loss_rel + gn_rel + lr_rel)

    lines = ["| step | bt loss | ref loss | rel diff | bt grad norm | ref grad norm | rel diff |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for i in range(n):
        lines.append(f"| {i + 1} | {bt[i]['loss']:.7f} | {ref[i]['loss']:.7f} | {fmt(loss_rel[i])} | "
                     f"{bt[i]['grad_norm']:.6f} | {ref[i]['grad_norm']:.6f} | {fmt(gn_rel[i])} |")

    def worst(xs):
        if not xs:
            return float("nan"), 0
        if any(math.isnan(x) for x in xs):
            return float("nan"), next(i for i, x in enumerate(xs) if math.isnan(x)) + 1
        i = int(np.argmax(xs))
        return xs[i], i + 1

    max_loss, at_loss = worst(loss_rel)
    max_gn, at_gn = worst(gn_rel)
    max_lr, _ = worst(lr_rel)
    summary = [f"- loss: max relative difference {fmt(max_loss)} at step {at_loss}, mean "
               f"{fmt(float(np.mean(loss_rel)) if n else float('nan'))} "
               + (f"(tolerance {args.tol:g})" if args.final_tol is None else "(no per-step tolerance: --final-tol)"),
               f"- grad norm: max relative difference {fmt(max_gn)} at step {at_gn}",
               f"- lr: max relative difference {fmt(max_lr)}"]
    if max_lr > 1e-12:
        problems.append(f"the learning-rate schedules differ (max relative difference {max_lr:.3e})")

    weights, wprob = ({}, [])
    if os.path.exists(P["bt_final"]) and os.path.exists(P["ref_final"]):
        weights, wprob = compare_weights(P["bt_final"], P["ref_final"], P["w0"])
    else:
        wprob = ["a final weights file is missing"]
    problems += wprob
    max_wrel = float("nan")
    wlines = []
    if weights:
        def worst_of(key):
            k = max(weights, key=lambda n: (math.isnan(weights[n][key]), weights[n][key]))
            return k, weights[k][key]

        (n_l2, max_wrel), (n_up, up), (n_el, el), (n_abs, mabs) = (
            worst_of("rel_l2"), worst_of("update_rel"), worst_of("max_rel"), worst_of("max_abs"))
        summary.append(f"- final weights ({len(weights)} tensors): worst ||bt-ref||/||ref|| {fmt(max_wrel)} in "
                       f"'{n_l2}'; worst ||bt-ref||/||ref-w0|| {fmt(up)} in '{n_up}'; max element-wise relative "
                       f"{fmt(el)} in '{n_el}'; max abs {fmt(mabs)} in '{n_abs}'")
        if any(v["nan"] for v in weights.values()):
            nan = True
            problems.append("NaN in the final weights: " + ", ".join(k for k, v in weights.items() if v["nan"]))
        wlines = ["", "| tensor | max abs diff | max rel diff | rel L2 diff | diff / update |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for k in sorted(weights, key=lambda n: -weights[n]["rel_l2"])[:8]:
            v = weights[k]
            wlines.append(f"| {k} | {fmt(v['max_abs'])} | {fmt(v['max_rel'])} | {fmt(v['rel_l2'])} | "
                          f"{fmt(v['update_rel'])} |")

    def mean_tps(rows):
        xs = [float(r["tokens_per_s"]) for r in rows[1:]]  # step 1 includes warm-up
        return float(np.mean(xs)) if xs else float("nan")

    summary.append(f"- speed (information only, steps 2..): BluTrain {mean_tps(bt):.0f} tokens/s, reference "
                   f"{mean_tps(ref):.0f} tokens/s")

    if args.final_tol is not None and n:
        last = loss_rel[n - 1]
        k = min(10, n)
        mean_bt = float(np.mean([float(r["loss"]) for r in bt[n - k:n]]))
        mean_ref = float(np.mean([float(r["loss"]) for r in ref[n - k:n]]))
        last_mean = rel_diff(mean_bt, mean_ref)
        summary.append(f"- final loss (step {n}): BluTrain {float(bt[n - 1]['loss']):.5f}, reference "
                       f"{float(ref[n - 1]['loss']):.5f}, relative difference {fmt(last)}; mean of the last {k} "
                       f"steps {mean_bt:.5f} vs {mean_ref:.5f}, relative difference {fmt(last_mean)} "
                       f"(tolerance {args.final_tol:g})")
        failed = bool(problems) or nan or not (last <= args.final_tol and last_mean <= args.final_tol)
    else:
        failed = bool(problems) or nan or not (max_loss <= args.tol)
    if args.grad_tol is not None and not (max_gn <= args.grad_tol):
        failed = True
        problems.append(f"grad norm difference {fmt(max_gn)} above --grad-tol {args.grad_tol:g}")
    if args.weight_tol is not None and not (max_wrel <= args.weight_tol):
        failed = True
        problems.append(f"weight difference {fmt(max_wrel)} above --weight-tol {args.weight_tol:g}")
    verdict = "FAIL" if failed else "PASS"

    cfg = json.load(open(P["cfg"])) if os.path.exists(P["cfg"]) else {}
    ref_precision = gpt2_ref.torch_precision(args.precision)
    against = f" (the reference in strict {ref_precision})" if ref_precision != args.precision else ""
    header = (f"## Fidelity: {args.config}, {n} steps, {args.precision}{against} on {args.device}: {verdict}\n\n"
              f"BluTrain `{args.blutrain}` against `bench/gpt2_ref.py`, data `{args.data}`, outputs in `{out}`.\n")
    report = "\n".join([header, *lines, *wlines, "", *summary, *[f"- problem: {p}" for p in problems],
                        "", f"fidelity: {verdict}"]) + "\n"
    print()
    print(report)
    with open(P["report"], "w") as f:
        f.write(report)

    if not failed and args.golden:
        produced = {"precision": args.precision, "device": args.device}
        try:
            import torch
            produced["torch"] = torch.__version__
            if args.device.startswith("cuda") and torch.cuda.is_available():
                produced["device_name"] = torch.cuda.get_device_name(0)
        except ImportError:
            pass
        files = sorted(__import__("glob").glob(args.data))
        golden = {
            "format": "blutrain-golden-losses",
            "version": 1,
            "config": cfg,
            "steps": n,
            "losses": [float(r["loss"]) for r in ref[:n]],
            "grad_norms": [float(r["grad_norm"]) for r in ref[:n]],
            "lrs": [float(r["lr"]) for r in ref[:n]],
            "blutrain_losses": [float(r["loss"]) for r in bt[:n]],
            "max_loss_rel_diff": max_loss,
            "tol": args.tol,
            "data": {"glob": args.data,
                     "files": [{"name": os.path.basename(p), "bytes": os.path.getsize(p), "sha256": sha256(p)}
                               for p in files]},
            "produced_by": produced,
            "command": shlex.join([sys.executable] + sys.argv),
        }
        with open(args.golden + ".tmp", "w") as f:
            json.dump(golden, f, indent=1)
            f.write("\n")
        os.replace(args.golden + ".tmp", args.golden)
        print(f"wrote golden losses to {args.golden}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
