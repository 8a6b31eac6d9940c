"""PyTorch reference for BluTrain's Llama (runtime/nn/llama/): the model, its
parameter list, init and config keys. bench/gpt2_ref.py imports this module
and picks it when model.arch is "llama"; train, bench and selftest live there.

The model: token embedding [Vp, C]; n_layer pre-norm blocks
  x = x + wo(attention(rope(wq h), rope(wk h), wv h)),  h = rmsnorm(x)
  x = x + w2(silu(w1 h) * w3 h),                        h = rmsnorm(x)
with grouped-query causal attention (query head h reads K/V head
h // (n_head / n_kv_head)) and rotary embeddings in the rotate-half
convention; a final RMSNorm; logits over the padded vocabulary Vp from
output.weight, or from the embedding when tie_embeddings. No biases. Names
follow Meta's reference code, as BluTrain's do.

Config errors raise ValueError (gpt2_ref.py reports them as its RefError);
this module does not import gpt2_ref. Only the torch part needs torch.
"""

import math

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the config helpers still work
    torch = None

# BluTrain's defaults (runtime/nn/model_config.h).
ROPE_THETA = 10000.0
NORM_EPS = 1e-5

# The integer attributes of a Llama weights file (Llama::shape_attrs).
SHAPE_ATTRS = ("n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "seq_len", "vocab_size",
               "padded_vocab", "tie_embeddings")


# ----------------------------------------------------------------------------- config


def read_config_keys(d, where="model"):
    """The model keys beyond the five every family has, from `d` with
    BluTrain's defaults for missing ones: n_kv_head, ffn_hidden (ints, 0 =
    the family's default), rope_theta, norm_eps (floats > 0), tie_embeddings
    (bool). Raises ValueError naming a bad value."""
    out = {}
    for key in ("n_kv_head", "ffn_hidden"):
        v = d.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{where}.{key} must be an integer >= 0 (0: the default), got {v!r}")
        out[key] = v
    for key, default in (("rope_theta", ROPE_THETA), ("norm_eps", NORM_EPS)):
        v = d.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{where}.{key} must be a number > 0, got {v!r}")
        out[key] = float(v)
    v = d.get("tie_embeddings", True)
    if not isinstance(v, bool):
        raise ValueError(f"{where}.tie_embeddings must be true or false, got {v!r}")
    out["tie_embeddings"] = v
    return out


def kv_heads(mc):
    """n_kv_head with 0 resolved (one K/V head per query head)."""
    return mc["n_kv_head"] or mc["n_head"]


def ffn_width(mc):
    """ffn_hidden, or (0) 8 C / 3 rounded up to a multiple of 64 (768 -> 2048)."""
    return mc["ffn_hidden"] or (8 * mc["n_embd"] // 3 + 63) // 64 * 64


def head_dim(mc):
    return mc["n_embd"] // mc["n_head"]


def validate(mc, where="model"):
    """Llama's own checks (validate_llama in llama.cpp); raises ValueError."""
    kv = kv_heads(mc)
    if mc["n_head"] % kv:
        raise ValueError(f"{where}.n_kv_head ({kv}) must divide {where}.n_head ({mc['n_head']}): "
                         "each K/V head serves a group of query heads")
    if head_dim(mc) % 2:
        raise ValueError(f"RoPE needs an even head dim, but {where}.n_embd / {where}.n_head = "
                         f"{mc['n_embd']} / {mc['n_head']} = {head_dim(mc)}")


def param_shapes(mc):
    """[(name, shape)] of every parameter, in BluTrain's order; Linear weights [out, in]."""
    C, Vp, F_ = mc["n_embd"], mc["padded_vocab"], ffn_width(mc)
    HD, KD = mc["n_head"] * head_dim(mc), kv_heads(mc) * head_dim(mc)
    out = [("tok_embeddings.weight", (Vp, C))]
    for l in range(mc["n_layer"]):
        p = f"layers.{l}."
        out += [
            (p + "attention_norm.weight", (C,)),
            (p + "attention.wq.weight", (HD, C)),
            (p + "attention.wk.weight", (KD, C)),
            (p + "attention.wv.weight", (KD, C)),
            (p + "attention.wo.weight", (C, HD)),
            (p + "ffn_norm.weight", (C,)),
            (p + "feed_forward.w1.weight", (F_, C)),  # gate
            (p + "feed_forward.w3.weight", (F_, C)),  # up
            (p + "feed_forward.w2.weight", (C, F_)),  # down
        ]
    out.append(("norm.weight", (C,)))
    if not mc["tie_embeddings"]:
        out.append(("output.weight", (Vp, C)))
    return out


def shape_attrs(mc):
    """{name: int} of a weights file's shape attributes, resolved as BluTrain writes them."""
    return {
        "n_layer": mc["n_layer"],
        "n_head": mc["n_head"],
        "n_kv_head": kv_heads(mc),
        "n_embd": mc["n_embd"],
        "ffn_hidden": ffn_width(mc),
        "seq_len": mc["seq_len"],
        "vocab_size": mc["vocab_size"],
        "padded_vocab": mc["padded_vocab"],
        "tie_embeddings": int(mc["tie_embeddings"]),
    }


def describe(mc):
    """One line for a log."""
    return (f"llama: {mc['n_layer']} layers, {mc['n_head']} heads ({kv_heads(mc)} K/V), width {mc['n_embd']}, "
            f"SwiGLU {ffn_width(mc)}, context {mc['seq_len']}, vocab {mc['vocab_size']} "
            f"(padded {mc['padded_vocab']}), {'tied' if mc['tie_embeddings'] else 'untied'} head")


# ----------------------------------------------------------------------------- the model

if torch is not None:

    def _sdpa_takes_gqa():
        """Whether this torch's scaled_dot_product_attention has enable_gqa (2.5 on)."""
        q, kv = torch.zeros(1, 2, 1, 2), torch.zeros(1, 1, 1, 2)
        try:
            F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        except (TypeError, RuntimeError, AttributeError):
            return False
        return True

    SDPA_GQA = _sdpa_takes_gqa()  # probed once, here: not inside a torch.compile trace

    def explicit_causal_attention(q, k, v):
        """softmax(q k^T / sqrt(D) + causal mask) v, spelled out; q, k, v [B, H, T, D]."""
        T, D = q.shape[-2], q.shape[-1]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        return torch.softmax(att, dim=-1) @ v

    def causal_attention(q, k, v, explicit=False):
        """Grouped-query causal attention: q [B, H, T, D], k and v [B, Hkv, T, D];
        query head h reads K/V head h // (H / Hkv). SDPA (enable_gqa where this
        torch has it, else K/V repeated per group), or with `explicit` the
        softmax spelled out on repeated K/V."""
        G = q.shape[1] // k.shape[1]
        if explicit:
            if G > 1:
                k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
            return explicit_causal_attention(q, k, v)
        if G == 1:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if SDPA_GQA:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1),
                                              is_causal=True)

    def rope_tables(positions, dim, theta):
        """cos, sin [positions, dim] float32 (each half the same), as BluTrain's
        RopeTables::make and Hugging Face compute them: inv_freq[i] =
        1 / float32(theta^(2i / dim)) (the power in float64, the division in
        float32), angle = float32(t) * inv_freq[i] in float32; cos and sin of
        that float32 angle, rounded to float32."""
        half = dim // 2
        powers = torch.tensor([theta ** (2 * i / dim) for i in range(half)], dtype=torch.float64).float()
        inv_freq = torch.ones(half, dtype=torch.float32) / powers
        angle = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        cos, sin = angle.double().cos().float(), angle.double().sin().float()
        return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def apply_rope(x, cos, sin):
        """x [B, heads, T, D] rotated: pair (i, i + D/2) of position t by angle[t, i].
        cos, sin [T, D], cast to x's dtype first (as Hugging Face does)."""
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        return x * cos + rotate_half(x) * sin

    class RMSNorm(nn.Module):
        """Hugging Face's LlamaRMSNorm: the statistic in (at least) fp32, the
        normalized x rounded back to x's dtype, then scaled by the weight."""

        def __init__(self, dim, eps):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            xf = x if x.dtype == torch.float64 else x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * y.to(x.dtype)

    class Attention(nn.Module):
        def __init__(self, n_embd, n_head, n_kv_head):
            super().__init__()
            self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, n_embd // n_head
            D = self.head_dim
            self.wq = nn.Linear(n_embd, n_head * D, bias=False)
            self.wk = nn.Linear(n_embd, n_kv_head * D, bias=False)
            self.wv = nn.Linear(n_embd, n_kv_head * D, bias=False)
            self.wo = nn.Linear(n_head * D, n_embd, bias=False)
            self.explicit = False  # selftest switches to the explicit softmax

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
            q = self.wq(x).view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
            k = self.wk(x).view(B, T, Hkv, D).transpose(1, 2)
            v = self.wv(x).view(B, T, Hkv, D).transpose(1, 2)
            y = causal_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, self.explicit)
            return self.wo(y.transpose(1, 2).reshape(B, T, H * D))

    class FeedForward(nn.Module):
        """SwiGLU: w2(silu(w1 x) * w3 x); registered w1, w3, w2 (BluTrain's order)."""

        def __init__(self, n_embd, hidden):
            super().__init__()
            self.w1 = nn.Linear(n_embd, hidden, bias=False)  # gate
            self.w3 = nn.Linear(n_embd, hidden, bias=False)  # up
            self.w2 = nn.Linear(hidden, n_embd, bias=False)  # down

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class TransformerBlock(nn.Module):
        def __init__(self, mc):
            super().__init__()
            C, eps = mc["n_embd"], mc["norm_eps"]
            self.attention_norm = RMSNorm(C, eps)
            self.attention = Attention(C, mc["n_head"], kv_heads(mc))
            self.ffn_norm = RMSNorm(C, eps)
            self.feed_forward = FeedForward(C, ffn_width(mc))

        def forward(self, x, cos, sin):
            x = x + self.attention(self.attention_norm(x), cos, sin)
            return x + self.feed_forward(self.ffn_norm(x))

    class Llama(nn.Module):
        """named_parameters() gives exactly BluTrain's names (param_shapes), in its order."""

        def __init__(self, mc):
            super().__init__()
            self.mc = mc
            C, Vp = mc["n_embd"], mc["padded_vocab"]
            self.tok_embeddings = nn.Embedding(Vp, C)
            self.layers = nn.ModuleList(TransformerBlock(mc) for _ in range(mc["n_layer"]))
            self.norm = RMSNorm(C, mc["norm_eps"])
            if not mc["tie_embeddings"]:
                self.output = nn.Linear(C, Vp, bias=False)
            cos, sin = rope_tables(mc["seq_len"], head_dim(mc), mc["rope_theta"])
            # Buffers (not parameters, not saved): .to() and .double() carry them.
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

        def set_explicit_attention(self, on):
            for layer in self.layers:
                layer.attention.explicit = on

        def forward(self, idx):
            """idx [B, T] int64 -> logits [B, T, padded_vocab]."""
            T = idx.shape[1]
            if T > self.mc["seq_len"]:
                raise ValueError(f"sequence of {T} tokens exceeds seq_len {self.mc['seq_len']}")
            x = self.tok_embeddings(idx)
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
            for layer in self.layers:
                x = layer(x, cos, sin)
            head = self.tok_embeddings.weight if self.mc["tie_embeddings"] else self.output.weight
            return F.linear(self.norm(x), head)

        def loss(self, logits, targets):
            """Mean cross-entropy over the first vocab_size columns (padded ones
            excluded), in fp32, ignoring targets of -1."""
            V = self.mc["vocab_size"]
            lg = logits[..., :V].float()
            return F.cross_entropy(lg.reshape(-1, V), targets.reshape(-1), ignore_index=-1)

    def init_weights(model, seed):
        """torch.manual_seed(seed), then in parameter order, drawn on the CPU:
        N(0, 0.02) for the embedding, every Linear weight and the untied head;
        RMSNorm weights 1 (drawing nothing)."""
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                cpu = torch.empty(p.shape, dtype=torch.float32)
                if name.endswith("norm.weight"):
                    cpu.fill_(1.0)
                else:
                    cpu.normal_(0.0, 0.02)
                p.copy_(cpu)
