#!/usr/bin/env python3
"""PyTorch reference for BluTrain's models (GPT-2 here, Llama in llama_ref.py):
the same model, data order and training step, written independently, for
fidelity tests and benchmarks. model.arch (gpt2 when absent) picks the model.

Subcommands:
  train     train from a BluTrain resolved config (blutrain train --resolved-config)
            and write per-step metrics (JSONL) and weights (HDF5, "blutrain-weights")
  bench     time a nanoGPT-style eager (or --compile) training step; one JSON line
  attention time PyTorch's scaled_dot_product_attention, causal, with each of
            its backends (flash, memory-efficient, cuDNN), forward and backward;
            the ceiling bt_kernel_bench compares BluTrain's attention with
  selftest  CPU checks of this file's own pieces (no data needed)

The model (see bench/README.md for the full contract): token embedding wte
[Vp, C] + position embedding wpe [T, C]; pre-LN blocks x += attn(ln_1(x)),
x += mlp(ln_2(x)); ln_f; logits = ln_f(x) @ wte^T over the padded vocabulary
Vp (vocab_size rounded up to 128); the loss is cross-entropy over the first
vocab_size columns only. Parameter names, HDF5 layout and init match BluTrain's.
The Llama model is described in bench/llama_ref.py.

The weights-file, data and schedule helpers need only numpy and h5py; torch is
needed for the model, train, bench and selftest.
"""

import argparse
import contextlib
import glob as globmod
import json
import math
import os
import resource
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:  # --help and the config helpers still work
    np = None

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the file/data/schedule helpers still work (fidelity.py uses them)
    torch = None

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # llama_ref.py sits beside this file, whoever imports it
    sys.path.insert(0, _HERE)
import llama_ref  # noqa: E402  (imports nothing from here; torch is optional for it too)

WEIGHTS_FORMAT = "blutrain-weights"
WEIGHTS_VERSION = 1
SHARD_MAGIC = 20240520
SHARD_VERSION = 1
SHARD_HEADER_INTS = 256
CONFIG_ATTRS = ("n_layer", "n_head", "n_embd", "seq_len", "vocab_size", "padded_vocab")  # GPT-2's
ARCHS = ("gpt2", "llama")

# BluTrain's presets (runtime/nn/registry.cpp); keys not given take the defaults.
PRESETS = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, seq_len=256, vocab_size=50257),
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, seq_len=1024, vocab_size=50257),
    "llama-tiny": dict(arch="llama", n_layer=4, n_head=4, n_kv_head=2, n_embd=128, ffn_hidden=384, seq_len=256,
                       vocab_size=50257, tie_embeddings=False),
    "llama-150m": dict(arch="llama", n_layer=12, n_head=12, n_kv_head=4, n_embd=768, ffn_hidden=2048,
                       seq_len=1024, vocab_size=50257, tie_embeddings=False),
}

# BluTrain's precisions (train.precision). fp32x3 keeps fp32's numerics with
# error-compensated TF32 matmuls, which PyTorch lacks: its reference is PyTorch
# in strict fp32.
PRECISIONS = ("fp32", "tf32", "fp32x3", "bf16")


def torch_precision(precision):
    """The PyTorch setting that stands for a BluTrain precision."""
    return "fp32" if precision == "fp32x3" else precision


class RefError(Exception):
    """A user-fixable problem (bad config, file or data); printed without a traceback."""


# ----------------------------------------------------------------------------- model config


def padded_vocab(vocab_size):
    """vocab_size rounded up to a multiple of 128 (50257 -> 50304)."""
    return (vocab_size + 127) // 128 * 128


def arch_of(mc):
    return mc.get("arch", "gpt2")


def model_config(d, where="model"):
    """A complete model config dict, BluTrain's ModelConfig keys plus
    padded_vocab, from one with n_layer, n_head, n_embd, seq_len, vocab_size;
    the other keys (arch, n_kv_head, ffn_hidden, rope_theta, norm_eps,
    tie_embeddings, fused_ops) take BluTrain's defaults when absent, and
    padded_vocab, if given, must agree. Values are kept as given (n_kv_head
    and ffn_hidden 0 included); llama_ref.kv_heads / ffn_width resolve them."""
    arch = d.get("arch", "gpt2")
    if arch not in ARCHS:
        raise RefError(f"{where}.arch is {arch!r}; the reference implements {', '.join(ARCHS)}")
    mc = {"arch": arch}
    for k in ("n_layer", "n_head", "n_embd", "seq_len", "vocab_size"):
        if k not in d:
            raise RefError(f"{where}: missing '{k}'")
        v = d[k]
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise RefError(f"{where}.{k} must be a positive integer, got {v!r}")
        mc[k] = v
    if mc["n_embd"] % mc["n_head"]:
        raise RefError(f"{where}: n_embd {mc['n_embd']} is not divisible by n_head {mc['n_head']}")
    try:
        mc.update(llama_ref.read_config_keys(d, where))
        if arch == "llama":
            llama_ref.validate(mc, where)
    except ValueError as e:
        raise RefError(str(e)) from e
    mc["fused_ops"] = d.get("fused_ops", True)
    if not isinstance(mc["fused_ops"], bool):
        raise RefError(f"{where}.fused_ops must be true or false, got {mc['fused_ops']!r}")
    if arch == "gpt2":
        _validate_gpt2(mc, where)
    mc["padded_vocab"] = padded_vocab(mc["vocab_size"])
    if "padded_vocab" in d and d["padded_vocab"] != mc["padded_vocab"]:
        raise RefError(f"{where}.padded_vocab is {d['padded_vocab']}, but vocab_size {mc['vocab_size']} "
                       f"pads to {mc['padded_vocab']}")
    return mc


def _validate_gpt2(mc, where):
    """Refuses llama-only settings, as BluTrain's GPT-2 does (the reference
    runs fused_ops either way: it changes how BluTrain computes, not what)."""
    if mc["n_kv_head"] not in (0, mc["n_head"]):
        raise RefError(f"{where}.n_kv_head ({mc['n_kv_head']}) applies to model.arch=llama: GPT-2 attention "
                       "has one K/V head per query head (leave it 0)")
    if mc["ffn_hidden"] not in (0, 4 * mc["n_embd"]):
        raise RefError(f"{where}.ffn_hidden ({mc['ffn_hidden']}) applies to model.arch=llama: GPT-2's MLP is "
                       f"4 x {where}.n_embd wide (leave it 0)")
    if not mc["tie_embeddings"]:
        raise RefError(f"{where}.tie_embeddings=false applies to model.arch=llama: GPT-2's LM head is its "
                       "token embedding")
    if mc["rope_theta"] != llama_ref.ROPE_THETA:
        raise RefError(f"{where}.rope_theta ({mc['rope_theta']}) applies to model.arch=llama: GPT-2 learns "
                       "its position embeddings")


# The `model` attribute's keys, in the order BluTrain's model_config_json writes them.
MODEL_JSON_KEYS = ("arch", "n_layer", "n_head", "n_embd", "seq_len", "vocab_size", "n_kv_head", "ffn_hidden",
                   "rope_theta", "norm_eps", "tie_embeddings", "fused_ops", "padded_vocab")


def model_json(mc):
    """The config as a weights file's `model` attribute holds it: compact JSON,
    keys and values as runtime/nn/model_config.cpp (model_config_json) writes them."""
    return json.dumps({k: mc[k] for k in MODEL_JSON_KEYS}, separators=(",", ":"))


def shape_attrs(mc):
    """{name: int}: the shape attributes of the model's weights files."""
    if arch_of(mc) == "llama":
        return llama_ref.shape_attrs(mc)
    return {k: mc[k] for k in CONFIG_ATTRS}


def describe_model(mc):
    """The model, in a few words, for a log line."""
    if arch_of(mc) == "llama":
        return llama_ref.describe(mc)
    return (f"{mc['n_layer']} layers, {mc['n_head']} heads, width {mc['n_embd']}, context {mc['seq_len']}, "
            f"vocab {mc['vocab_size']} (padded {mc['padded_vocab']})")


def param_shapes(mc):
    """[(name, shape)] of every parameter, in BluTrain's order; Linear weights [out, in]."""
    if arch_of(mc) == "llama":
        return llama_ref.param_shapes(mc)
    C, L = mc["n_embd"], mc["n_layer"]
    out = [("wte", (mc["padded_vocab"], C)), ("wpe", (mc["seq_len"], C))]
    for l in range(L):
        h = f"h.{l}."
        out += [
            (h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
            (h + "attn.c_attn.weight", (3 * C, C)), (h + "attn.c_attn.bias", (3 * C,)),
            (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
            (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
            (h + "mlp.c_fc.weight", (4 * C, C)), (h + "mlp.c_fc.bias", (4 * C,)),
            (h + "mlp.c_proj.weight", (C, 4 * C)), (h + "mlp.c_proj.bias", (C,)),
        ]
    out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return out


def lr_at(s, peak, floor, warmup, total):
    """Learning rate of 0-based step s: linear warmup to `peak` over `warmup`
    steps, then cosine decay to `floor` at step `total` (p clamped to [0, 1])."""
    if s < warmup:
        return peak * (s + 1) / warmup
    p = (s - warmup) / max(1, total - warmup)
    p = min(1.0, max(0.0, p))
    return floor + 0.5 * (1.0 + math.cos(math.pi * p)) * (peak - floor)


# ----------------------------------------------------------------------------- weights files


def _h5py():
    try:
        import h5py
    except ImportError as e:
        raise RefError("h5py is needed to read or write weights files (pip install h5py)") from e
    return h5py


def write_weights(path, named, attrs, text=None):
    """Writes [(name, array)] as float32 datasets in the root group, with int64
    attributes `attrs`, string attributes `text` ({name: str}) and
    format/version; PATH.tmp then rename (atomic)."""
    h5py = _h5py()
    text = text or {}
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise RefError(f"cannot save weights to '{path}': directory '{parent}' does not exist")
    seen = set()
    for name, _ in named:
        if not name or "/" in name or name in seen:
            raise RefError(f"bad or duplicate tensor name {name!r} for weights file '{path}'")
        seen.add(name)
    for k, v in text.items():
        if not k or k in ("format", "version") or k in attrs or not isinstance(v, str):
            raise RefError(f"text attribute {k!r} is empty, reserved, also an integer attribute or not a string")
    tmp = path + ".tmp"
    try:
        with h5py.File(tmp, "w", track_order=True) as f:
            f.attrs["format"] = WEIGHTS_FORMAT
            f.attrs["version"] = np.int64(WEIGHTS_VERSION)
            for k, v in attrs.items():
                if k in ("format", "version"):
                    raise RefError(f"attribute '{k}' is reserved")
                f.attrs[k] = np.int64(v)
            for k, v in text.items():
                f.attrs[k] = v  # a variable-length UTF-8 string
            for name, a in named:
                f.create_dataset(name, data=np.ascontiguousarray(a, dtype=np.float32))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.isfile(tmp):
            os.remove(tmp)
        raise


def read_weights(path):
    """Reads a weights file strictly: returns (attrs {name: int} without
    format/version, {name: float32 array} in the file's listing order)."""
    attrs, _, tensors = read_weights_text(path)
    return attrs, tensors


def read_weights_text(path):
    """read_weights, also returning the string attributes other than format
    (`model`: the config as JSON): (attrs, {name: str}, tensors)."""
    h5py = _h5py()
    if not os.path.exists(path):
        raise RefError(f"weights file '{path}' does not exist")
    if not h5py.is_hdf5(path):
        raise RefError(f"weights file '{path}' is not an HDF5 file (corrupt, or not a weights file)")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise RefError(f"cannot open weights file '{path}' (truncated or corrupt?): {e}") from e
    with f:
        fmt = f.attrs.get("format")
        if isinstance(fmt, bytes):
            fmt = fmt.decode()
        if fmt is None:
            raise RefError(f"weights file '{path}' has no 'format' attribute (expected '{WEIGHTS_FORMAT}')")
        if str(fmt) != WEIGHTS_FORMAT:
            raise RefError(f"weights file '{path}' has format '{fmt}', expected '{WEIGHTS_FORMAT}'")
        attrs, text = {}, {}
        for k, v in f.attrs.items():
            if k == "format":
                continue
            if isinstance(v, bytes):  # a fixed-length string
                v = v.decode()
            if isinstance(v, str):
                text[k] = v
                continue
            a = np.asarray(v)
            if a.size != 1 or not np.issubdtype(a.dtype, np.integer):
                raise RefError(f"weights file '{path}': attribute '{k}' is not an integer or string scalar "
                               f"({a.dtype})")
            attrs[k] = int(a.reshape(()))
        version = attrs.pop("version", None)
        if version != WEIGHTS_VERSION:
            raise RefError(f"weights file '{path}' has version {version}, expected {WEIGHTS_VERSION}")
        tensors = {}
        for name in f.keys():
            obj = f[name]
            if not isinstance(obj, h5py.Dataset):
                raise RefError(f"weights file '{path}': root object '{name}' is not a dataset")
            if obj.dtype != np.float32:
                raise RefError(f"weights file '{path}': tensor '{name}' is {obj.dtype}, expected float32")
            tensors[name] = obj[()]
    return attrs, text, tensors


def file_arch(path, text):
    """The family of a weights file's model: the arch in its `model` attribute;
    gpt2 for a file without one (written before model.arch) or without the key."""
    s = (text or {}).get("model")
    if s is None:
        return "gpt2"
    try:
        j = json.loads(s)
    except ValueError as e:
        raise RefError(f"weights file '{path}': its 'model' attribute is not JSON ({e})") from e
    if not isinstance(j, dict):
        raise RefError(f"weights file '{path}': its 'model' attribute is not a JSON object")
    return j.get("arch", "gpt2")


def check_weights(path, attrs, tensors, mc, text=None):
    """Raises RefError unless the file holds a model of mc's arch (by its
    `model` attribute in `text`; none = gpt2) and its shape attributes, tensor
    names and shapes are exactly those of the model `mc`."""
    arch = file_arch(path, text)
    if arch != arch_of(mc):
        raise RefError(f"weights file '{path}' holds a {arch} model, and model.arch is {arch_of(mc)}")
    for k, v in shape_attrs(mc).items():
        if k not in attrs:
            raise RefError(f"weights file '{path}' has no attribute '{k}' (expected {v})")
        if attrs[k] != v:
            raise RefError(f"weights file '{path}' has {k} = {attrs[k]}, but the model has {k} = {v}")
    want = dict(param_shapes(mc))
    for name in want:
        if name not in tensors:
            raise RefError(f"weights file '{path}' has no tensor '{name}'")
    for name, a in tensors.items():
        if name not in want:
            raise RefError(f"weights file '{path}' has a tensor '{name}' {list(a.shape)} the model does not have")
        if tuple(a.shape) != want[name]:
            raise RefError(f"weights file '{path}': tensor '{name}' has shape {list(a.shape)}, "
                           f"but the model's parameter has shape {list(want[name])}")


# ----------------------------------------------------------------------------- data


def read_shard(path):
    """Token ids of one llm.c shard as a read-only uint16 memmap (validated)."""
    if np is None:
        raise RefError("numpy is needed to read token shards (pip install numpy)")
    size = os.path.getsize(path)
    if size < 4 * SHARD_HEADER_INTS:
        raise RefError(f"token shard '{path}' is {size} bytes, smaller than its header")
    header = np.fromfile(path, dtype="<i4", count=SHARD_HEADER_INTS)
    if header[0] != SHARD_MAGIC:
        raise RefError(f"token shard '{path}' has magic {header[0]}, expected {SHARD_MAGIC}")
    if header[1] != SHARD_VERSION:
        raise RefError(f"token shard '{path}' has version {header[1]}, expected {SHARD_VERSION}")
    n = int(header[2])
    if n < 0 or size != 4 * SHARD_HEADER_INTS + 2 * n:
        raise RefError(f"token shard '{path}' declares {n} tokens but is {size} bytes")
    if n == 0:
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r", offset=4 * SHARD_HEADER_INTS, shape=(n,))


class ShardSamples:
    """Unshuffled samples in BluTrain's order: windows of T+1 tokens at offsets
    0, T, 2T, ... of each shard (a window that does not fit is dropped; none
    spans shards), shards in sorted glob order. Micro-batch g is samples
    [pB, (p+1)B) with p = g mod (samples // B): an epoch ends when fewer than
    B samples remain and the list restarts at sample 0."""

    def __init__(self, pattern, B, T):
        self.files = sorted(globmod.glob(pattern))
        if not self.files:
            raise RefError(f"no files match the data pattern '{pattern}'")
        self.B, self.T = B, T
        self.shards = [read_shard(p) for p in self.files]
        self.samples = []  # (shard index, token offset)
        for i, tok in enumerate(self.shards):
            n_windows = max(0, (len(tok) - 1) // T)
            self.samples += [(i, k * T) for k in range(n_windows)]
        self.batches_per_epoch = len(self.samples) // B
        if self.batches_per_epoch == 0:
            raise RefError(f"'{pattern}' has {len(self.samples)} windows of {T + 1} tokens, "
                           f"fewer than one micro-batch of {B}")

    def micro_batch(self, g):
        """(inputs, targets) int64 arrays [B, T] of 0-based micro-batch g."""
        p = g % self.batches_per_epoch
        rows = [self.shards[i][o:o + self.T + 1] for i, o in self.samples[p * self.B:(p + 1) * self.B]]
        w = np.stack(rows).astype(np.int64)
        return w[:, :-1], w[:, 1:]


# ----------------------------------------------------------------------------- the model

if torch is not None:

    def explicit_causal_attention(q, k, v):
        """softmax(q k^T / sqrt(D) + causal mask) v, spelled out ([B, H, T, D])."""
        T, D = q.shape[-2], q.shape[-1]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        return torch.softmax(att, dim=-1) @ v

    class CausalSelfAttention(nn.Module):
        def __init__(self, n_embd, n_head):
            super().__init__()
            self.n_head = n_head
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.c_proj = nn.Linear(n_embd, n_embd)
            self.explicit = False  # selftest switches to explicit_causal_attention

        def forward(self, x):
            B, T, C = x.shape
            H = self.n_head
            q, k, v = self.c_attn(x).split(C, dim=-1)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
            if self.explicit:
                y = explicit_causal_attention(q, k, v)
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    class MLP(nn.Module):
        def __init__(self, n_embd):
            super().__init__()
            self.c_fc = nn.Linear(n_embd, 4 * n_embd)
            self.c_proj = nn.Linear(4 * n_embd, n_embd)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, n_embd, n_head, eps=1e-5):
            super().__init__()
            self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
            self.attn = CausalSelfAttention(n_embd, n_head)
            self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
            self.mlp = MLP(n_embd)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        """named_parameters() gives exactly BluTrain's names, in its order."""

        def __init__(self, mc):
            super().__init__()
            self.mc = mc
            C, eps = mc["n_embd"], mc.get("norm_eps", 1e-5)  # LayerNorm eps: model.norm_eps
            self.wte = nn.Parameter(torch.empty(mc["padded_vocab"], C))
            self.wpe = nn.Parameter(torch.empty(mc["seq_len"], C))
            self.h = nn.ModuleList(Block(C, mc["n_head"], eps) for _ in range(mc["n_layer"]))
            self.ln_f = nn.LayerNorm(C, eps=eps)

        def set_explicit_attention(self, on):
            for b in self.h:
                b.attn.explicit = on

        def forward(self, idx):
            """idx [B, T] int64 -> logits [B, T, padded_vocab] (tied head)."""
            T = idx.shape[1]
            if T > self.mc["seq_len"]:
                raise RefError(f"sequence of {T} tokens exceeds seq_len {self.mc['seq_len']}")
            x = F.embedding(idx, self.wte) + self.wpe[:T]
            for block in self.h:
                x = block(x)
            return F.linear(self.ln_f(x), self.wte)

        def loss(self, logits, targets):
            """Mean cross-entropy over the first vocab_size columns (padded ones
            excluded), in fp32, ignoring targets of -1."""
            V = self.mc["vocab_size"]
            lg = logits[..., :V].float()
            return F.cross_entropy(lg.reshape(-1, V), targets.reshape(-1), ignore_index=-1)

    def init_weights(model, seed):
        """GPT-2 init with torch.manual_seed(seed), drawn on the CPU in parameter
        order: N(0, 0.02) for wte, wpe and Linear weights, N(0, 0.02/sqrt(2L)) for
        the residual projections (attn.c_proj, mlp.c_proj), biases 0, LayerNorm 1/0."""
        torch.manual_seed(seed)
        proj_std = 0.02 / math.sqrt(2 * model.mc["n_layer"])
        with torch.no_grad():
            for name, p in model.named_parameters():
                cpu = torch.empty(p.shape, dtype=torch.float32)
                if ".ln_" in name or name.startswith("ln_f."):
                    cpu.fill_(1.0 if name.endswith(".weight") else 0.0)
                elif name.endswith(".bias"):
                    cpu.zero_()
                elif name.endswith("c_proj.weight"):
                    cpu.normal_(0.0, proj_std)
                else:
                    cpu.normal_(0.0, 0.02)
                p.copy_(cpu)

    def build_model(mc):
        """The model of mc's arch (parameters not yet initialized: init_model)."""
        return llama_ref.Llama(mc) if arch_of(mc) == "llama" else GPT(mc)

    def init_model(model, seed):
        """The init of the model's family, seeded with `seed`."""
        if arch_of(model.mc) == "llama":
            llama_ref.init_weights(model, seed)
        else:
            init_weights(model, seed)

    def model_blocks(model):
        """The model's transformer blocks (FSDP2 shards each)."""
        return model.layers if arch_of(model.mc) == "llama" else model.h

    def load_weights_into(model, path):
        attrs, text, tensors = read_weights_text(path)
        check_weights(path, attrs, tensors, model.mc, text)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(np.ascontiguousarray(tensors[name])))

    def save_model(model, path):
        """The parameters, the shape attributes and the config (`model`, as JSON)."""
        named = [(n, p.detach().float().cpu().numpy()) for n, p in model.named_parameters()]
        write_weights(path, named, shape_attrs(model.mc), {"model": model_json(model.mc)})

    def make_optimizer(model, lr, weight_decay, betas, eps, device):
        """AdamW with weight decay on parameters of dim >= 2 only; fused on CUDA,
        foreach on the CPU."""
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        kw = {"fused": True} if device.type == "cuda" else {"foreach": True}
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **kw)

    def set_precision(precision, device):
        """fp32: no TF32; tf32: TF32 matmuls and convolutions; fp32x3: strict fp32,
        as fp32 (BluTrain's fp32x3 runs its matmuls as error-compensated TF32 to
        keep fp32's numerics; PyTorch has no such mode, and strict fp32 is what
        it is compared with); bf16: autocast to bf16 around forward + loss (fp32
        master weights). Returns the autocast context factory."""
        if precision not in PRECISIONS:
            raise RefError(f"train.precision must be fp32, tf32, fp32x3 or bf16, got '{precision}'")
        tf32 = torch_precision(precision) == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        if precision == "bf16":
            return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext

    def clip_grad_norm_accurate_(params, max_norm):
        """torch.nn.utils.clip_grad_norm_ semantics (scale by max_norm / (norm + 1e-6)
        when that is < 1; max_norm inf = never), but the global norm is accumulated in
        float64: torch's float32 reduction can be off by ~1e-5 relative for
        millions of elements, more than the fidelity test should attribute to
        BluTrain. Returns the pre-clip norm as a Python float."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return 0.0
        sq = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64).square() for g in grads])
        norm = float(sq.sum().sqrt().item())
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            with torch.no_grad():
                for g in grads:
                    g.mul_(coef)
        return norm

    def peak_mem_bytes(device):
        if device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(device))
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def sync(device):
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def _need_torch():
    if torch is None:
        raise RefError("this subcommand needs PyTorch (import torch failed)")


def resolve_device(name):
    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RefError(f"device '{name}' asked for, but torch sees no CUDA device")
    if name != "cpu" and not name.startswith("cuda"):
        raise RefError(f"device must be cpu, cuda, cuda:N or auto, got '{name}'")
    return torch.device(name)


# ----------------------------------------------------------------------------- train


def load_config(path):
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise RefError(f"cannot read the resolved config '{path}': {e}") from e
    for sec in ("model", "data", "train"):
        if not isinstance(cfg.get(sec), dict):
            raise RefError(f"config '{path}' has no '{sec}' section")
    return cfg


def cmd_train(args):
    _need_torch()
    cfg = load_config(args.config)
    mc = model_config(cfg["model"])
    t, d = cfg["train"], cfg["data"]

    def get(key):
        if key not in t:
            raise RefError(f"config '{args.config}' has no train.{key}")
        return t[key]

    if d.get("shuffle", False):
        raise RefError("data.shuffle is true, but the reference only implements the unshuffled order; "
                       "run blutrain with --set data.shuffle=false")
    if int(t.get("world_size", 1)) != 1:
        raise RefError(f"train.world_size is {t['world_size']}; the reference is one process")
    B, batch = int(get("micro_batch")), int(get("batch_size"))
    if B <= 0 or batch % B:
        raise RefError(f"train.batch_size {batch} is not a multiple of train.micro_batch {B}")
    A = batch // B
    if "grad_accum" in t and int(t["grad_accum"]) != A:
        raise RefError(f"train.grad_accum is {t['grad_accum']}, but batch_size / micro_batch = {A}")
    T = mc["seq_len"]
    total_steps = int(get("steps"))
    run_steps = total_steps if args.steps is None else args.steps
    peak, floor, warmup = float(get("lr")), float(get("min_lr")), int(get("warmup_steps"))
    wd, betas, eps = float(get("weight_decay")), (float(get("beta1")), float(get("beta2"))), float(get("eps"))
    grad_clip = float(get("grad_clip"))
    seed = int(get("seed"))
    eval_every, eval_batches = int(t.get("eval_every", 0)), int(t.get("eval_batches", 0))

    device = resolve_device(args.device or t.get("device", "auto"))
    # Always deterministic, as BluTrain is (it has no switch: Note [Deterministic
    # by construction] in runtime/train/trainer.h); a config's old
    # train.deterministic is ignored.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first cuBLAS call
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    autocast = set_precision(t.get("precision", "fp32"), device)

    train_data = ShardSamples(d["train"], B, T)
    val_data = ShardSamples(d["val"], B, T) if d.get("val") else None

    model = build_model(mc)
    if args.init:
        load_weights_into(model, args.init)
    else:
        init_model(model, seed)
    torch.manual_seed(seed)
    model.to(device)
    if args.save_init:
        save_model(model, args.save_init)
    opt = make_optimizer(model, peak, wd, betas, eps, device)
    params = list(model.parameters())
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def to_dev(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    def evaluate():
        n = min(eval_batches, val_data.batches_per_epoch)
        total = None
        with torch.no_grad():
            for i in range(n):
                x, y = val_data.micro_batch(i)
                with autocast():
                    l = model.loss(model(to_dev(x)), to_dev(y)).detach().float()
                total = l if total is None else total + l
        return float(total.item()) / n

    print(f"gpt2_ref train: {describe_model(mc)}; {run_steps} of {total_steps} "
          f"steps of {A} micro-batch(es) of {B} sequences on {device}, {t.get('precision', 'fp32')}"
          f", deterministic; torch {torch.__version__}", flush=True)
    metrics = open(args.metrics, "w") if args.metrics else None
    try:
        for s in range(run_steps):
            t0 = time.perf_counter()
            lr = lr_at(s, peak, floor, warmup, total_steps)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss_sum = None
            for j in range(A):
                x, y = train_data.micro_batch(s * A + j)
                with autocast():
                    loss = model.loss(model(to_dev(x)), to_dev(y))
                # Scale by 1/A as BluTrain does (a multiply, not a divide: same bits for any A).
                (loss if A == 1 else loss * (1.0 / A)).backward()
                l = loss.detach().float()
                loss_sum = l if loss_sum is None else loss_sum + l
            # Pre-clip global L2 norm; grad_clip 0 = report only (an infinite max_norm never clips).
            norm = clip_grad_norm_accurate_(params, grad_clip if grad_clip > 0 else float("inf"))
            opt.step()
            loss_val = float(loss_sum.item()) / A
            sync(device)
            dt = time.perf_counter() - t0
            rec = {"step": s + 1, "loss": loss_val, "lr": lr, "grad_norm": norm,
                   "tokens_per_s": A * B * T / dt, "peak_mem_bytes": peak_mem_bytes(device)}
            if val_data is not None and ((eval_every > 0 and (s + 1) % eval_every == 0) or s + 1 == total_steps):
                rec["val_loss"] = evaluate()
            if not math.isfinite(loss_val):
                print(f"step {s + 1}: loss is {loss_val}", file=sys.stderr)
            print(f"step {s + 1:5d} | loss {loss_val:.6f} | lr {lr:.3e} | grad norm {rec['grad_norm']:.4f} | "
                  f"{rec['tokens_per_s']:.0f} tok/s" + (f" | val {rec['val_loss']:.4f}" if "val_loss" in rec else ""),
                  flush=True)
            if metrics:
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
    finally:
        if metrics:
            metrics.close()
    if args.save_weights:
        save_model(model, args.save_weights)
        print(f"saved weights to {args.save_weights}")
    return 0


# ----------------------------------------------------------------------------- bench


def cmd_bench(args):
    _need_torch()
    mc = model_config(PRESETS[args.preset], args.preset)
    B, T = args.micro_batch, args.seq
    if T > mc["seq_len"]:
        raise RefError(f"--seq {T} exceeds the preset's seq_len {mc['seq_len']}")
    world, rank = 1, 0
    if args.dist:
        # Under torchrun: one GPU per rank, NCCL; DDP or FSDP2 (fully_shard per block, then the root).
        import torch.distributed as dist
        local = int(os.environ.get("LOCAL_RANK", "-1"))
        if local < 0:
            raise RefError("--dist needs torchrun (LOCAL_RANK is not set)")
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        world, rank = dist.get_world_size(), dist.get_rank()
        args.device = f"cuda:{local}"
    device = resolve_device(args.device)
    autocast = set_precision(args.precision, device)
    model = build_model(mc)
    init_model(model, 1337)
    model.to(device)
    if args.dist == "ddp":
        opt = make_optimizer(model, 6e-4, 0.1, (0.9, 0.95), 1e-8, device)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index],
                                                          bucket_cap_mb=args.bucket_mb)
    elif args.dist == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in model_blocks(model):
            fully_shard(block)
        fully_shard(model)
        opt = make_optimizer(model, 6e-4, 0.1, (0.9, 0.95), 1e-8, torch.device("cpu"))  # foreach: sharded params
    else:
        opt = make_optimizer(model, 6e-4, 0.1, (0.9, 0.95), 1e-8, device)
    params = list(model.parameters())

    class StepLoss(nn.Module):  # forward + loss in one module, so --compile covers the loss too
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x, y):
            inner = self.m.module if isinstance(self.m, torch.nn.parallel.DistributedDataParallel) else self.m
            return inner.loss(self.m(x), y)

    step_loss = StepLoss(model)
    if args.compile:
        step_loss = torch.compile(step_loss)

    n_total = args.warmup + args.steps
    if args.data:
        data = ShardSamples(args.data, B, T)
        batches = [data.micro_batch(i) for i in range(n_total)]
        batches = [(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)) for x, y in batches]
    else:
        g = torch.Generator().manual_seed(0)
        batches = []
        for _ in range(min(n_total, 8)):
            w = torch.randint(0, mc["vocab_size"], (B, T + 1), generator=g)
            batches.append((w[:, :-1].contiguous().to(device), w[:, 1:].contiguous().to(device)))

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = step_loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss

    for i in range(args.warmup):
        step(i)
    sync(device)
    times_ms = []
    loss = None
    for i in range(args.warmup, n_total):
        if device.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            loss = step(i)
            e1.record()
            times_ms.append((e0, e1))
        else:
            t0 = time.perf_counter()
            loss = step(i)
            times_ms.append((time.perf_counter() - t0) * 1e3)
    sync(device)
    if device.type == "cuda":
        times_ms = [e0.elapsed_time(e1) for e0, e1 in times_ms]
    if args.profile:  # after the timed steps, so the figures above are unaffected
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(args.profile):
                step(i)
            sync(device)
        print(f"torch.profiler, {args.profile} steps:\n" +
              prof.key_averages().table(sort_by="cuda_time_total", row_limit=30), file=sys.stderr)
    step_ms = float(np.mean(times_ms))
    out = {
        "system": ("pytorch-compile" if args.compile else "pytorch-eager") + (f"-{args.dist}" if args.dist else ""),
        "world_size": world,
        "precision": args.precision,
        "torch_precision": torch_precision(args.precision),
        "preset": args.preset,
        "micro_batch": B,
        "seq": T,
        "steps": args.steps,
        "warmup": args.warmup,
        "bucket_mb": args.bucket_mb if args.dist == "ddp" else None,
        "tokens_per_s": world * B * T * 1e3 / step_ms,  # all ranks
        "step_ms": step_ms,
        "step_ms_median": float(np.median(times_ms)),
        "step_ms_min": float(np.min(times_ms)),
        "peak_mem_bytes": peak_mem_bytes(device),
        "final_loss": float(loss.item()),
        "data": args.data or "random",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch_version": torch.__version__,
    }
    if args.dist:
        import torch.distributed as dist
        dist.destroy_process_group()
        if rank != 0:
            return 0
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['system']} {args.preset} {args.precision} B={B} T={T}: {out['tokens_per_s']:.0f} tokens/s, "
              f"{step_ms:.2f} ms/step (median {out['step_ms_median']:.2f}), peak "
              f"{out['peak_mem_bytes'] / 2**30:.2f} GiB, torch {torch.__version__} on {out['device']}")
    return 0


# ----------------------------------------------------------------------------- selftest


def cmd_selftest(args):
    """CPU checks of the reference itself: a tiny-shaped, small-vocab model."""
    _need_torch()
    torch.manual_seed(0)
    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)

    def close(a, b, tol):
        err = (a - b).abs().max().item()
        return err <= tol, f"max abs diff {err:.3g} (tol {tol:g})"

    mc = model_config(dict(n_layer=2, n_head=4, n_embd=32, seq_len=16, vocab_size=100))  # padded to 128
    check("padded vocab", padded_vocab(50257) == 50304 and mc["padded_vocab"] == 128 and padded_vocab(128) == 128)

    model = GPT(mc)
    names = [n for n, _ in model.named_parameters()]
    shapes = [tuple(p.shape) for _, p in model.named_parameters()]
    check("parameter names and order", names == [n for n, _ in param_shapes(mc)], str(names[:6]))
    check("parameter shapes", shapes == [s for _, s in param_shapes(mc)])

    # Init statistics on a larger model (so the sample std is meaningful).
    big = GPT(model_config(dict(n_layer=6, n_head=4, n_embd=128, seq_len=64, vocab_size=1000)))
    init_weights(big, 1337)
    sd = dict(big.named_parameters())
    proj_std = 0.02 / math.sqrt(12)
    check("init: wte std 0.02", abs(sd["wte"].std().item() - 0.02) < 0.0005, f"{sd['wte'].std().item():.5f}")
    check("init: c_proj std 0.02/sqrt(2L)",
          abs(torch.cat([sd[f"h.{l}.mlp.c_proj.weight"].flatten() for l in range(6)]).std().item() - proj_std) < 3e-4)
    check("init: c_attn std 0.02", abs(sd["h.0.attn.c_attn.weight"].std().item() - 0.02) < 0.001)
    check("init: biases 0, LayerNorm 1/0",
          all((p == 0).all() for n, p in sd.items() if n.endswith(".bias"))
          and all((p == 1).all() for n, p in sd.items() if ".ln_" in n and n.endswith(".weight"))
          and (sd["ln_f.weight"] == 1).all().item())
    again = GPT(big.mc)
    init_weights(again, 1337)
    check("init: same seed, same weights", all(torch.equal(p, q) for p, q in zip(big.parameters(), again.parameters())))

    # Attention: SDPA(is_causal) == explicit masked softmax, forward and backward (float64).
    q, k, v = (torch.randn(2, 3, 7, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    y1 = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    g1 = torch.autograd.grad(y1.square().sum(), (q, k, v))
    y2 = explicit_causal_attention(q, k, v)
    g2 = torch.autograd.grad(y2.square().sum(), (q, k, v))
    check("attention = explicit causal softmax (fwd)", *close(y1, y2, 1e-12))
    check("attention = explicit causal softmax (bwd)", all(close(a, b, 1e-11)[0] for a, b in zip(g1, g2)))
    # Causality: changing the last token does not change earlier outputs.
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, -1] += 1.0
    v2[:, :, -1] += 1.0
    y3 = F.scaled_dot_product_attention(q.detach(), k2, v2, is_causal=True)
    check("attention is causal", torch.equal(y3[:, :, :-1], y1.detach()[:, :, :-1]))

    # GELU, tanh approximation.
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    ref = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    check("GELU tanh = formula", *close(F.gelu(x, approximate="tanh"), ref, 1e-14))
    check("GELU tanh != exact erf GELU", (F.gelu(x, approximate="tanh") - F.gelu(x)).abs().max().item() > 1e-5)

    # LayerNorm eps 1e-5, biased variance.
    m64 = GPT(mc).double()
    init_weights(m64, 7)
    with torch.no_grad():
        for n, p in m64.named_parameters():  # non-trivial LayerNorm and bias values
            if n.endswith(".bias") or ".ln_" in n or n.startswith("ln_f"):
                p.add_(0.1 * torch.randn_like(p))
    xx = torch.randn(3, 5, 32, dtype=torch.float64)
    ln = m64.h[0].ln_1
    ln_ref = (xx - xx.mean(-1, keepdim=True)) / torch.sqrt(xx.var(-1, unbiased=False, keepdim=True) + 1e-5)
    check("LayerNorm eps 1e-5", *close(ln(xx), ln_ref * ln.weight + ln.bias, 1e-12))

    # The whole forward against an explicit re-implementation from raw tensors.
    idx = torch.randint(0, mc["vocab_size"], (2, 16))
    tgt = torch.randint(0, mc["vocab_size"], (2, 16))
    P = dict(m64.named_parameters())

    def manual_forward(idx):
        B, T = idx.shape
        C, H = mc["n_embd"], mc["n_head"]
        h = P["wte"][idx] + P["wpe"][:T]

        def lnorm(x, w, b):
            mu = x.mean(-1, keepdim=True)
            var = ((x - mu) ** 2).mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(var + 1e-5) * w + b

        for l in range(mc["n_layer"]):
            p = lambda s: P[f"h.{l}.{s}"]
            a = lnorm(h, p("ln_1.weight"), p("ln_1.bias")) @ p("attn.c_attn.weight").T + p("attn.c_attn.bias")
            qq, kk, vv = a[..., :C], a[..., C:2 * C], a[..., 2 * C:]
            heads = []
            for hd in range(H):
                sl = slice(hd * C // H, (hd + 1) * C // H)
                s = qq[..., sl] @ kk[..., sl].transpose(-1, -2) / math.sqrt(C // H)
                s = s + torch.triu(torch.full((T, T), float("-inf"), dtype=s.dtype), diagonal=1)
                heads.append(torch.softmax(s, -1) @ vv[..., sl])
            h = h + torch.cat(heads, -1) @ p("attn.c_proj.weight").T + p("attn.c_proj.bias")
            f = lnorm(h, p("ln_2.weight"), p("ln_2.bias")) @ p("mlp.c_fc.weight").T + p("mlp.c_fc.bias")
            f = 0.5 * f * (1 + torch.tanh(math.sqrt(2 / math.pi) * (f + 0.044715 * f ** 3)))
            h = h + f @ p("mlp.c_proj.weight").T + p("mlp.c_proj.bias")
        return lnorm(h, P["ln_f.weight"], P["ln_f.bias"]) @ P["wte"].T

    with torch.no_grad():
        logits = m64(idx)
        check("logits shape [B, T, padded_vocab]", tuple(logits.shape) == (2, 16, 128))
        check("forward = manual forward", *close(logits, manual_forward(idx), 1e-10))
        m64.set_explicit_attention(True)
        check("forward with SDPA = with explicit attention", *close(m64(idx), logits, 1e-12))
        m64.set_explicit_attention(False)

        # Loss: only the first vocab_size columns count; -1 targets are ignored.
        V = mc["vocab_size"]
        lse = torch.logsumexp(logits[..., :V], -1)
        manual = (lse - logits[..., :V].gather(-1, tgt.unsqueeze(-1)).squeeze(-1)).mean()
        loss = m64.loss(logits, tgt)
        # The loss is computed in fp32 (as BluTrain's), even for this float64 model.
        check("loss = manual CE over the first V columns", *close(loss.double(), manual, 1e-5))
        bumped = logits.clone()
        bumped[..., V:] += 1000.0
        check("loss ignores the padded columns", m64.loss(bumped, tgt).item() == loss.item())
        full = F.cross_entropy(logits.reshape(-1, 128), tgt.reshape(-1))
        check("loss differs from CE over all padded columns", abs(full.item() - loss.item()) > 1e-6)
        tgt_ign = tgt.clone()
        tgt_ign[0, :5] = -1
        keep = tgt_ign != -1
        per = lse - logits[..., :V].gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        check("loss ignores targets of -1", *close(m64.loss(logits, tgt_ign).double(), per[keep].mean(), 1e-5))

    # Gradient accumulation: two micro-batches scaled by 1/2 = one batch of both.
    m64.zero_grad()
    idx2, tgt2 = torch.randint(0, V, (4, 16)), torch.randint(0, V, (4, 16))
    m64.loss(m64(idx2), tgt2).backward()
    g_full = [p.grad.clone() for p in m64.parameters()]
    m64.zero_grad()
    for j in range(2):
        (m64.loss(m64(idx2[2 * j:2 * j + 2]), tgt2[2 * j:2 * j + 2]) * 0.5).backward()
    check("grad accumulation = full batch", all(close(a, p.grad, 1e-12)[0] for a, p in zip(g_full, m64.parameters())))
    check("padded wte rows get no gradient", (m64.wte.grad[V:] == 0).all().item())

    # Gradient clipping reports the pre-clip norm and scales to grad_clip.
    norm = torch.nn.utils.clip_grad_norm_(list(m64.parameters()), 1e-3)
    pre = math.sqrt(sum(float(a.square().sum()) for a in g_full))
    post = math.sqrt(sum(float(p.grad.square().sum()) for p in m64.parameters()))
    check("clip: pre-clip norm reported", abs(norm.item() - pre) <= 1e-9 * pre, f"{norm.item():.6g} vs {pre:.6g}")
    check("clip: post-clip norm = grad_clip", abs(post / 1e-3 - 1) < 1e-5, f"{post:.9g}")
    m64.zero_grad()
    m64.loss(m64(idx2), tgt2).backward()
    mine = clip_grad_norm_accurate_(list(m64.parameters()), 1e-3)
    post_mine = [p.grad.clone() for p in m64.parameters()]
    m64.zero_grad()
    m64.loss(m64(idx2), tgt2).backward()
    torch.nn.utils.clip_grad_norm_(list(m64.parameters()), 1e-3)
    check("clip (float64 norm) = clip_grad_norm_",
          abs(mine - pre) <= 1e-9 * pre and all(close(a, p.grad, 1e-9 * 1e-3)[0] for a, p in zip(post_mine, m64.parameters())))
    m64.zero_grad()
    m64.loss(m64(idx2), tgt2).backward()
    n_inf = torch.nn.utils.clip_grad_norm_(list(m64.parameters()), float("inf"))
    check("grad_clip 0: norm reported, grads unchanged",
          abs(n_inf.item() - pre) <= 1e-9 * pre and all(torch.equal(a, p.grad) for a, p in zip(g_full, m64.parameters())))

    # Weight decay groups: every parameter with dim >= 2 decays, the rest do not.
    opt = make_optimizer(model, 1e-3, 0.1, (0.9, 0.95), 1e-8, torch.device("cpu"))
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    want = {n for n, s in param_shapes(mc) if len(s) >= 2}
    check("weight decay on wte, wpe and Linear weights only",
          {n for n, p in model.named_parameters() if id(p) in decayed} == want and opt.param_groups[1]["weight_decay"] == 0)

    # LR schedule (lr 6e-4, min 6e-5, warmup 10, steps 20).
    sched = [lr_at(s, 6e-4, 6e-5, 10, 20) for s in (0, 4, 9, 10, 15, 19, 20, 25)]
    want_lr = [6e-5, 3e-4, 6e-4, 6e-4, 3.3e-4, 6e-5 + 0.5 * (1 + math.cos(0.9 * math.pi)) * 5.4e-4, 6e-5, 6e-5]
    check("LR schedule", all(abs(a - b) < 1e-15 for a, b in zip(sched, want_lr)), str([f"{a:.4g}" for a in sched]))
    check("LR schedule, warmup 0", lr_at(0, 1.0, 0.0, 0, 10) == 1.0 and abs(lr_at(5, 1.0, 0.0, 0, 10) - 0.5) < 1e-15)

    with tempfile.TemporaryDirectory() as tmp:
        # Data order: windows at multiples of T, none across shards, epochs wrap.
        T = 4
        for i, n in enumerate((14, 9)):  # shard 0: (14-1)//4 = 3 windows; shard 1: 2 windows
            header = np.zeros(SHARD_HEADER_INTS, dtype="<i4")
            header[:3] = (SHARD_MAGIC, SHARD_VERSION, n)
            with open(os.path.join(tmp, f"s_{i:03d}.bin"), "wb") as f:
                f.write(header.tobytes())
                f.write((np.arange(n) + 1000 * i).astype("<u2").tobytes())
        data = ShardSamples(os.path.join(tmp, "s_*.bin"), 2, T)
        check("data: windows", data.samples == [(0, 0), (0, 4), (0, 8), (1, 0), (1, 4)], str(data.samples))
        x0, y0 = data.micro_batch(0)
        x1, _ = data.micro_batch(1)
        x2, _ = data.micro_batch(2)
        check("data: micro-batch 0", x0.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and y0.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]])
        check("data: micro-batch 1 spans shards by window", x1.tolist() == [[8, 9, 10, 11], [1000, 1001, 1002, 1003]])
        check("data: epoch wraps (tail dropped)", x2.tolist() == x0.tolist() and data.batches_per_epoch == 2)

        # Weights file round trip and strictness.
        path = os.path.join(tmp, "w.h5")
        init_weights(model, 3)
        save_model(model, path)
        attrs, tensors = read_weights(path)
        check("weights: attrs", attrs == {k: mc[k] for k in CONFIG_ATTRS}, str(attrs))
        check("weights: round trip bitwise",
              all(np.array_equal(tensors[n], p.detach().numpy()) for n, p in model.named_parameters()))
        other = GPT(mc)
        load_weights_into(other, path)
        check("weights: load", all(torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters())))

        def refused(fn, needle):
            try:
                fn()
            except RefError as e:
                return needle in str(e)
            return False

        bad = dict(tensors)
        del bad["h.1.ln_2.bias"]
        check("weights: missing tensor named", refused(lambda: check_weights(path, attrs, bad, mc), "'h.1.ln_2.bias'"))
        bad = dict(tensors, extra=np.zeros(3, np.float32))
        check("weights: extra tensor named", refused(lambda: check_weights(path, attrs, bad, mc), "'extra'"))
        bad = dict(tensors, wpe=np.zeros((8, 32), np.float32))
        check("weights: shape mismatch", refused(lambda: check_weights(path, attrs, bad, mc), "[8, 32]"))
        check("weights: config mismatch", refused(lambda: check_weights(path, dict(attrs, n_layer=3), tensors, mc),
                                                  "n_layer = 3"))
        text = read_weights_text(path)[1]
        want_json = ('{"arch":"gpt2","n_layer":2,"n_head":4,"n_embd":32,"seq_len":16,"vocab_size":100,"n_kv_head":0,'
                     '"ffn_hidden":0,"rope_theta":10000.0,"norm_eps":1e-05,"tie_embeddings":true,"fused_ops":true,'
                     '"padded_vocab":128}')
        check("weights: `model` attribute = BluTrain's JSON", text == {"model": want_json}, str(text))
        old = os.path.join(tmp, "old.h5")
        write_weights(old, list(tensors.items()), attrs)  # as files were before model.arch: no `model`
        other = GPT(mc)
        load_weights_into(other, old)
        check("weights: a file without `model` loads as gpt2",
              all(torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters())))
        check("weights: another arch refused",
              refused(lambda: check_weights(path, attrs, tensors, mc, {"model": '{"arch":"llama"}'}),
                      "holds a llama model, and model.arch is gpt2"))
        import h5py
        with h5py.File(path, "r+") as f:
            f.attrs["format"] = "something-else"
        check("weights: wrong format refused", refused(lambda: read_weights(path), "something-else"))
        with open(path, "wb") as f:
            f.write(b"not hdf5" * 100)
        check("weights: garbage refused", refused(lambda: read_weights(path), "not an HDF5 file"))

        selftest_llama(check, close, refused, tmp)

    failed = results.count(False)
    print(f"selftest: {len(results) - failed} passed, {failed} failed (torch {torch.__version__})")
    return 1 if failed else 0


def selftest_llama(check, close, refused, tmp):
    """selftest's checks of the Llama model (bench/llama_ref.py); files go in `tmp`."""
    L = llama_ref

    # Config: presets, defaults, refusals.
    big = model_config(PRESETS["llama-150m"], "llama-150m")
    n = sum(math.prod(s) for _, s in param_shapes(big))
    check("llama-150m: 152,783,616 parameters", n == 152_783_616, f"{n:,}")
    tiny = model_config(PRESETS["llama-tiny"], "llama-tiny")
    check("llama-tiny: shape attributes",
          shape_attrs(tiny) == dict(n_layer=4, n_head=4, n_kv_head=2, n_embd=128, ffn_hidden=384, seq_len=256,
                                    vocab_size=50257, padded_vocab=50304, tie_embeddings=0), str(shape_attrs(tiny)))
    d = model_config(dict(arch="llama", n_layer=1, n_head=12, n_embd=768, seq_len=8, vocab_size=100))
    check("llama: defaults (one K/V head per head, ffn 8C/3 up to 64, tied, theta 1e4, eps 1e-5)",
          d["n_kv_head"] == 0 and L.kv_heads(d) == 12 and L.ffn_width(d) == 2048 and d["tie_embeddings"]
          and d["rope_theta"] == 10000.0 and d["norm_eps"] == 1e-5)
    base = dict(arch="llama", n_layer=1, n_head=4, n_embd=32, seq_len=8, vocab_size=100)
    check("llama: n_kv_head must divide n_head", refused(lambda: model_config(dict(base, n_kv_head=3)), "must divide"))
    check("llama: odd head dim refused", refused(lambda: model_config(dict(base, n_embd=12)), "even head dim"))
    check("gpt2: llama-only keys refused",
          refused(lambda: model_config(dict(base, arch="gpt2", n_kv_head=2)), "n_kv_head")
          and refused(lambda: model_config(dict(base, arch="gpt2", tie_embeddings=False)), "tie_embeddings"))
    check("unknown arch refused", refused(lambda: model_config(dict(base, arch="mamba")), "'mamba'"))

    # Parameters: names, shapes and order; the tied head.
    mc = model_config(dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48, seq_len=16,
                           vocab_size=100, tie_embeddings=False, rope_theta=500.0, norm_eps=1e-6))
    V, H, Hkv, D = 100, 4, 2, 8
    model = build_model(mc)
    names = [n for n, _ in model.named_parameters()]
    layer0 = ["layers.0." + s for s in ("attention_norm.weight", "attention.wq.weight", "attention.wk.weight",
                                        "attention.wv.weight", "attention.wo.weight", "ffn_norm.weight",
                                        "feed_forward.w1.weight", "feed_forward.w3.weight", "feed_forward.w2.weight")]
    check("llama: parameter names and order",
          names == [n for n, _ in param_shapes(mc)] and names[:10] == ["tok_embeddings.weight"] + layer0
          and names[-2:] == ["norm.weight", "output.weight"] and len(names) == 1 + 2 * 9 + 2, str(names[:4]))
    shapes = dict(param_shapes(mc))
    check("llama: parameter shapes",
          [tuple(p.shape) for p in model.parameters()] == [s for _, s in param_shapes(mc)]
          and shapes["layers.1.attention.wq.weight"] == (32, 32) and shapes["layers.1.attention.wk.weight"] == (16, 32)
          and shapes["layers.1.attention.wo.weight"] == (32, 32) and shapes["layers.1.feed_forward.w3.weight"] == (48, 32)
          and shapes["layers.1.feed_forward.w2.weight"] == (32, 48) and shapes["output.weight"] == (128, 32))
    tied = model_config(dict(mc, tie_embeddings=True))
    tnames = [n for n, _ in build_model(tied).named_parameters()]
    check("llama: tied head has no output.weight", tnames == [n for n, _ in param_shapes(tied)]
          and tnames[-1] == "norm.weight" and len(tnames) == len(names) - 1)
    check("llama: norm_eps reaches every RMSNorm",
          all(m.eps == 1e-6 for m in model.modules() if isinstance(m, L.RMSNorm)))

    # Init: N(0, 0.02) drawn in parameter order from the seed; norm weights 1.
    L.init_weights(model, 1337)
    sd = dict(model.named_parameters())
    torch.manual_seed(1337)
    first, second = torch.empty(128, 32).normal_(0.0, 0.02), torch.empty(32, 32).normal_(0.0, 0.02)
    check("llama init: drawn in parameter order (norm weights draw nothing)",
          torch.equal(sd["tok_embeddings.weight"], first) and torch.equal(sd["layers.0.attention.wq.weight"], second))
    check("llama init: std 0.02, norm weights 1",
          abs(sd["output.weight"].std().item() - 0.02) < 0.001
          and abs(torch.cat([p.flatten() for n, p in sd.items() if "feed_forward" in n]).std().item() - 0.02) < 0.001
          and all((p == 1).all().item() for n, p in sd.items() if n.endswith("norm.weight")))

    # RMSNorm against its formula in float64, and in fp32.
    norm = L.RMSNorm(32, 1e-6).double()
    with torch.no_grad():
        norm.weight.add_(0.1 * torch.randn(32, dtype=torch.float64))
    xx = torch.randn(3, 5, 32, dtype=torch.float64)
    want = xx / torch.sqrt((xx * xx).mean(-1, keepdim=True) + 1e-6) * norm.weight
    check("RMSNorm = x / sqrt(mean(x^2) + eps) * w", *close(norm(xx), want, 1e-12))
    norm32 = L.RMSNorm(32, 1e-6)
    with torch.no_grad():
        norm32.weight.copy_(norm.weight)
    check("RMSNorm in fp32", *close(norm32(xx.float()).double(), want, 1e-5))

    # RoPE: the tables as BluTrain builds them, and the rotation in float64.
    T, theta = 16, 500.0
    cos, sin = L.rope_tables(T, D, theta)
    ok = cos.dtype == torch.float32 and tuple(cos.shape) == (T, D) and tuple(sin.shape) == (T, D)
    for t in range(T):
        for i in range(D // 2):
            inv = np.float32(1.0) / np.float32(theta ** (2 * i / D))  # RopeTables::make, step by step
            a = float(np.float32(t) * inv)
            for tab, fn in ((cos, math.cos), (sin, math.sin)):
                ok = ok and tab[t, i].item() == float(np.float32(fn(a))) and tab[t, i + D // 2].item() == tab[t, i].item()
    check("RoPE tables: BluTrain's float32 recipe, both halves", ok)
    x = torch.randn(2, 3, T, D, dtype=torch.float64)
    got = L.apply_rope(x, cos, sin)
    want = torch.empty_like(x)
    for t in range(T):
        for i in range(D // 2):
            a = t * theta ** (-2 * i / D)
            c, s = math.cos(a), math.sin(a)
            x0, x1 = x[..., t, i], x[..., t, i + D // 2]
            want[..., t, i] = x0 * c - x1 * s
            want[..., t, i + D // 2] = x1 * c + x0 * s
    check("RoPE = rotation of pairs (i, i + D/2) by t theta^(-2i/D)", *close(got, want, 3e-5))
    check("RoPE: position 0 unchanged", torch.equal(got[..., 0, :], x[..., 0, :]))

    # Grouped-query attention: SDPA = explicit softmax on repeated K/V, fwd and bwd (float64).
    q = torch.randn(2, H, 7, D, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, Hkv, 7, D, dtype=torch.float64, requires_grad=True) for _ in range(2))
    y1 = L.causal_attention(q, k, v)
    g1 = torch.autograd.grad(y1.square().sum(), (q, k, v))
    y2 = L.causal_attention(q, k, v, explicit=True)
    g2 = torch.autograd.grad(y2.square().sum(), (q, k, v))
    how = "enable_gqa" if L.SDPA_GQA else "K/V repeated"
    check(f"GQA: SDPA ({how}) = explicit softmax (fwd)", *close(y1, y2, 1e-12))
    check(f"GQA: SDPA ({how}) = explicit softmax (bwd)", all(close(a, b, 1e-11)[0] for a, b in zip(g1, g2)))
    G = H // Hkv
    per_head = torch.cat([explicit_causal_attention(q[:, h:h + 1], k[:, h // G:h // G + 1], v[:, h // G:h // G + 1])
                          for h in range(H)], dim=1)
    check("GQA: query head h reads K/V head h // (H / Hkv)", *close(y1, per_head, 1e-12))

    # The whole forward and backward against a re-implementation from raw tensors (float64).
    m64 = build_model(mc).double()
    L.init_weights(m64, 7)
    with torch.no_grad():
        for n, p in m64.named_parameters():  # norm weights other than 1
            if n.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    P = dict(m64.named_parameters())
    idx, tgt = torch.randint(0, V, (2, T)), torch.randint(0, V, (2, T))

    def manual_forward(idx):
        B, T = idx.shape
        eps = mc["norm_eps"]
        c, s = m64.rope_cos[:T, :D // 2], m64.rope_sin[:T, :D // 2]  # [T, D/2]: pair i of position t
        mask = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), diagonal=1)

        def rms(x, w):
            return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

        def rot(x):  # [B, T, heads, D]
            x0, x1 = x[..., :D // 2], x[..., D // 2:]
            cc, ss = c[:, None, :], s[:, None, :]
            return torch.cat([x0 * cc - x1 * ss, x1 * cc + x0 * ss], dim=-1)

        h = P["tok_embeddings.weight"][idx]
        for l in range(mc["n_layer"]):
            p = lambda n: P[f"layers.{l}.{n}"]
            a = rms(h, p("attention_norm.weight"))
            qq = rot((a @ p("attention.wq.weight").T).view(B, T, H, D))
            kk = rot((a @ p("attention.wk.weight").T).view(B, T, Hkv, D))
            vv = (a @ p("attention.wv.weight").T).view(B, T, Hkv, D)
            heads = []
            for hd in range(H):
                j = hd // (H // Hkv)
                sc = qq[:, :, hd] @ kk[:, :, j].transpose(-1, -2) / math.sqrt(D) + mask
                heads.append(torch.softmax(sc, -1) @ vv[:, :, j])
            h = h + torch.cat(heads, -1) @ p("attention.wo.weight").T
            f = rms(h, p("ffn_norm.weight"))
            gate, up = f @ p("feed_forward.w1.weight").T, f @ p("feed_forward.w3.weight").T
            h = h + (gate / (1 + torch.exp(-gate)) * up) @ p("feed_forward.w2.weight").T
        return rms(h, P["norm.weight"]) @ P["output.weight"].T

    with torch.no_grad():
        logits = m64(idx)
        check("llama: logits shape [B, T, padded_vocab]", tuple(logits.shape) == (2, T, 128))
        check("llama: forward = manual forward", *close(logits, manual_forward(idx), 1e-10))
        m64.set_explicit_attention(True)
        check("llama: forward with SDPA = with explicit attention", *close(m64(idx), logits, 1e-12))
        m64.set_explicit_attention(False)
        idx2 = idx.clone()
        idx2[:, -1] = (idx2[:, -1] + 1) % V
        check("llama: causal (the last token changes only the last logits)",
              *close(m64(idx2)[:, :-1], logits[:, :-1], 1e-12))
    wgt = torch.randn(2, T, 128, dtype=torch.float64)
    params = list(P.values())
    ga = torch.autograd.grad((m64(idx) * wgt).sum(), params)
    gb = torch.autograd.grad((manual_forward(idx) * wgt).sum(), params)
    check("llama: backward = manual backward", all(close(a, b, 1e-9)[0] for a, b in zip(ga, gb)))
    m64.zero_grad()
    m64.loss(m64(idx), tgt).backward()
    check("llama: every parameter gets a finite, nonzero gradient",
          all(p.grad is not None and torch.isfinite(p.grad).all().item() and p.grad.abs().sum().item() > 0
              for p in m64.parameters()))
    check("llama: padded rows of tok_embeddings and output get no gradient",
          (P["tok_embeddings.weight"].grad[V:] == 0).all().item() and (P["output.weight"].grad[V:] == 0).all().item())

    # Training in fp32: weight-decay groups, and a few AdamW steps on one batch lower the loss.
    m32 = build_model(mc)
    init_model(m32, 1)
    opt = make_optimizer(m32, 1e-2, 0.1, (0.9, 0.95), 1e-8, torch.device("cpu"))
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    check("llama: weight decay on the embedding, the head and Linear weights only",
          {n for n, p in m32.named_parameters() if id(p) in decayed} == {n for n, s in param_shapes(mc) if len(s) >= 2})
    losses = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        loss = m32.loss(m32(idx), tgt)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    check("llama: 5 AdamW steps on one batch lower the loss", losses[-1] < losses[0] - 0.1,
          " -> ".join(f"{l:.4f}" for l in losses))

    # Weights file: round trip with the `model` attribute; arch and shape strictness.
    path = os.path.join(tmp, "llama.h5")
    save_model(m32, path)
    attrs, text, tensors = read_weights_text(path)
    check("llama weights: shape attributes", attrs == dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48,
                                                           seq_len=16, vocab_size=100, padded_vocab=128,
                                                           tie_embeddings=0), str(attrs))
    want_json = ('{"arch":"llama","n_layer":2,"n_head":4,"n_embd":32,"seq_len":16,"vocab_size":100,"n_kv_head":2,'
                 '"ffn_hidden":48,"rope_theta":500.0,"norm_eps":1e-06,"tie_embeddings":false,"fused_ops":true,'
                 '"padded_vocab":128}')
    check("llama weights: `model` attribute = BluTrain's JSON", text == {"model": want_json}, str(text))
    check("llama weights: tensors in parameter order, bitwise", list(tensors) == names
          and all(np.array_equal(tensors[n], p.detach().numpy()) for n, p in m32.named_parameters()))
    other = build_model(mc)
    load_weights_into(other, path)
    check("llama weights: load", all(torch.equal(p, q) for p, q in zip(m32.parameters(), other.parameters())))
    gmc = model_config(dict(n_layer=2, n_head=4, n_embd=32, seq_len=16, vocab_size=100))
    gpt = build_model(gmc)
    init_model(gpt, 1)
    gpath = os.path.join(tmp, "gpt2_for_llama.h5")
    save_model(gpt, gpath)
    check("llama weights: a llama file refused by a gpt2 model",
          refused(lambda: load_weights_into(gpt, path), "holds a llama model, and model.arch is gpt2"))
    check("llama weights: a gpt2 file refused by a llama model",
          refused(lambda: load_weights_into(other, gpath), "holds a gpt2 model, and model.arch is llama"))
    check("llama weights: n_kv_head mismatch refused",
          refused(lambda: check_weights(path, dict(attrs, n_kv_head=4), tensors, mc, text), "n_kv_head = 4"))
    no_ffn = {k: a for k, a in attrs.items() if k != "ffn_hidden"}
    check("llama weights: missing attribute refused",
          refused(lambda: check_weights(path, no_ffn, tensors, mc, text), "no attribute 'ffn_hidden'"))
    tm = build_model(tied)
    init_model(tm, 2)
    tpath = os.path.join(tmp, "llama_tied.h5")
    save_model(tm, tpath)
    tattrs, _, ttensors = read_weights_text(tpath)
    check("llama weights: tied file has tie_embeddings 1 and no output.weight",
          tattrs["tie_embeddings"] == 1 and "output.weight" not in ttensors)
    check("llama weights: tied file refused by the untied model",
          refused(lambda: load_weights_into(other, tpath), "tie_embeddings = 1"))


# ----------------------------------------------------------------------------- attention


def cmd_attention(args):
    """Median CUDA-event times of causal SDPA per backend, in the layout the
    GPT block gives it: q, k, v [B, H, T, D] views of one [B, T, 3, H, D]
    projection (transposed, not copied), as bt_kernel_bench times BluTrain's.
    One JSON line: {dtype: {backend: {fwd_ms, bwd_ms} or {error}}}."""
    _need_torch()
    if not torch.cuda.is_available():
        raise RefError("attention timing needs a CUDA device")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION}
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    B, H, T, D = args.batch, args.heads, args.seq, args.head_dim

    def median_ms(fn):
        for _ in range(args.warmup):
            fn()
        times = []
        for _ in range(args.reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return sorted(times)[len(times) // 2]

    out = {"torch_version": torch.__version__, "shape": [B, H, T, D]}
    for name in args.dtypes.split(","):
        dt = {"bf16": torch.bfloat16, "f32": torch.float32}[name]
        g = torch.Generator(device=dev).manual_seed(1)
        qkv = torch.randn(B, T, 3, H, D, device=dev, dtype=dt, generator=g)
        # Leaves of their own (still strided views): the backward is timed
        # without autograd assembling a gradient of the fused buffer.
        q, k, v = (qkv[:, :, i].transpose(1, 2).requires_grad_() for i in range(3))
        dout = torch.randn(B, H, T, D, device=dev, dtype=dt, generator=g)
        res = {}
        for bname, backend in backends.items():
            try:
                with sdpa_kernel([backend]):
                    fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    bwd = median_ms(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
                res[bname] = {"fwd_ms": fwd, "bwd_ms": bwd}
            except RuntimeError as e:  # the backend does not take this dtype or shape
                res[bname] = {"error": str(e).splitlines()[0][:200]}
        out[name] = res
    print(json.dumps(out))
    return 0


# ----------------------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train", help="train from a BluTrain resolved config (JSON)")
    tr.add_argument("--config", required=True, help="resolved config JSON (blutrain train --resolved-config)")
    tr.add_argument("--init", help="start from this weights file (else init with the config's seed)")
    tr.add_argument("--save-init", help="write the initial weights here")
    tr.add_argument("--save-weights", help="write the final weights here")
    tr.add_argument("--metrics", help="per-step metrics JSONL")
    tr.add_argument("--device", help="cpu, cuda, cuda:N or auto (default: the config's train.device)")
    tr.add_argument("--steps", type=int, help="run only the first N steps (the LR schedule keeps train.steps)")
    be = sub.add_parser("bench", help="time a nanoGPT-style training step")
    be.add_argument("--preset", default="gpt2-124m", choices=sorted(PRESETS))
    be.add_argument("--precision", default="bf16", choices=PRECISIONS,
                    help="fp32x3 runs as strict fp32 (PyTorch has no 3xTF32)")
    be.add_argument("--micro-batch", type=int, default=16)
    be.add_argument("--seq", type=int, default=1024)
    be.add_argument("--steps", type=int, default=30, help="timed steps (after the warm-up steps)")
    be.add_argument("--warmup", type=int, default=10, help="untimed warm-up steps")
    be.add_argument("--data", help="glob of llm.c token shards (default: random tokens)")
    be.add_argument("--device", default="cuda")
    be.add_argument("--compile", action="store_true", help="torch.compile forward + loss")
    be.add_argument("--dist", choices=("ddp", "fsdp2"),
                    help="under torchrun: data parallel over the ranks (tokens/s counts all; memory is rank 0's)")
    be.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's gradient bucket size (PyTorch's default: 25)")
    be.add_argument("--json", action="store_true", help="print only one JSON line")
    be.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="after timing, profile this many more steps and print the kernels' table to stderr")
    at = sub.add_parser("attention", help="time causal SDPA per backend (one JSON line)")
    at.add_argument("--batch", type=int, default=16)
    at.add_argument("--heads", type=int, default=12)
    at.add_argument("--seq", type=int, default=1024)
    at.add_argument("--head-dim", type=int, default=64)
    at.add_argument("--dtypes", default="bf16,f32", help="comma-separated: bf16, f32 (strict, TF32 off)")
    at.add_argument("--warmup", type=int, default=10)
    at.add_argument("--reps", type=int, default=30)
    sub.add_parser("selftest", help="CPU checks of this reference (no data needed)")
    args = ap.parse_args(argv)
    try:
        return {"train": cmd_train, "bench": cmd_bench, "attention": cmd_attention,
                "selftest": cmd_selftest}[args.cmd](args)
    except RefError as e:
        print(f"gpt2_ref.py {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
