"""A float64 numpy forward pass of a Hugging Face Llama-family model, in Hugging
Face's own semantics: it takes the config.json dict and the tensors under their
HF names (q/k rows in HF's permuted order) and rotates with rotate_half, the
way Hugging Face transformers' Llama, Mistral, Qwen2 and Phi-3 models do. It
shares no code with export.py or run.c, so that `export.py --hf` + `run` can be
checked against it.

    x = embed_tokens[tokens]
    per layer:
        h = input_layernorm(x)
        q, k, v = q_proj(h), k_proj(h), v_proj(h)              heads of head_dim; a
                                                               Linear adds its bias when
                                                               the checkpoint has one;
                                                               Phi-3: qkv_proj(h) split
                                                               into q | k | v
        q, k = q*cos + rotate_half(q)*sin, same for k          on the first rot dims
        a = softmax(q k^T / sqrt(head_dim) + mask) v           repeat_kv: query head h
                                                               uses kv head h // (nh/nkv)
        x = x + o_proj(a)
        x = x + down_proj(silu(gate_proj(h2)) * up_proj(h2)),  h2 = post_attention_layernorm(x);
                                                               Phi-3: gate, up =
                                                               gate_up_proj(h2).chunk(2)
    logits = lm_head(norm(x))                                  lm_head = embed_tokens if tied

mask: causal; on a sliding-window layer also key j hidden from query i unless
j > i - sliding_window (transformers' sliding_window_overlay). Which layers
slide (transformers' configs): Mistral and Phi-3 every layer when
sliding_window is set (Mistral's default 4096), Qwen2 the layers i >=
max_window_layers when use_sliding_window is true (or as layer_types says),
Llama none.

rotate_half(x) = cat(-x[rot/2:], x[:rot/2]); cos/sin = cat(c, c) with
c[i] = mscale * cos(pos * inv_freq[i]) (docs/rope.md §4.1, §7.3). Partial rotary
(Phi-3 only): the first rot = int(head_dim * partial_rotary_factor) dims, halves
inside them; Llama, Mistral and Qwen2 rotate all head_dim dims whatever
partial_rotary_factor says.

inv_freq and mscale follow transformers' RoPE initialisation for each rope type
(docs/rope.md §8.3, §8.5-§8.7), written here from those formulas:
    default  inv_i = b^(-2i/rot)
    linear   inv_i / factor
    dynamic  base b * (factor*S/L - (factor-1))^(rot/(rot-2)), L =
             max_position_embeddings, S = max(sequence length, L)
    yarn     ramp linear in the pair index between floor/ceil of the correction
             dims for beta_fast/beta_slow over original_max_position_embeddings;
             mscale = attention_factor, or the mscale ratio, or 0.1 ln(factor) + 1
    llama3   by wavelength against original_max_position_embeddings / low,high
    longrope inv_i = 1 / (ext_i * b^(2i/rot)), ext = long_factor when the sequence
             length is > original_max_position_embeddings, else short_factor;
             mscale = attention_factor, or sqrt(1 + ln(factor) / ln(original)) with
             factor = rope factor or max_position_embeddings / original (1 if <= 1)
    (original_max_position_embeddings: a top-level one wins for llama3, yarn and
    longrope, as transformers v5's standardize_rope_params; Phi-3 defaults it
    to 4096.)

Dynamic NTK and LongRoPE have three semantics (dynamic=...):
    "full"   one base for the whole forward, S = its length (what a
             transformers forward of a whole window does)
    "hf"     position t rotated with the base for length t+1, its key cached
             with that rotation (transformers decoding token by token; run's
             default dynamic mode)
    "exact"  at query position p every key re-rotated with the base for length
             p+1 (a pre-RoPE key cache; run --rope-dynamic exact)
All three agree while the sequence stays within L.
"""

import math

import numpy as np


def _rmsnorm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def _softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def rope_settings(config):
    """(rope_type, params dict, theta, rot) from a config.json dict: rope_scaling
    or (transformers v5) rope_parameters, the type under rope_type or type."""
    rp = config.get("rope_parameters") or {}
    params = config.get("rope_scaling") or rp
    kind = params.get("rope_type", params.get("type")) or "default"
    if kind == "su" or (kind == "yarn" and config.get("model_type") == "phi3"):
        kind = "longrope"
    theta = config.get("rope_theta", rp.get("rope_theta", 10000.0))
    hd = config["hidden_size"] // config["num_attention_heads"]
    prf = config.get("partial_rotary_factor", rp.get("partial_rotary_factor", 1.0))
    if config.get("model_type") != "phi3":
        prf = 1.0  # Llama, Mistral and Qwen2 do not read it
    return kind, params, float(theta), int(hd * prf)


def inv_freq_and_attention(config, seq_len=None):
    """(inv_freq (rot/2,), attention factor) in float64 for a config.json dict;
    seq_len (current length) matters only for dynamic."""
    kind, p, b, d = rope_settings(config)
    max_pos = config.get("max_position_embeddings", 2048)
    f = b ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if kind == "default":
        return f, 1.0
    top = config.get("original_max_position_embeddings")
    if top is None and config.get("model_type") == "phi3":
        top = 4096
    if kind in ("llama3", "yarn", "longrope") and top is not None:
        p = dict(p, original_max_position_embeddings=top)
    s = float(p["factor"]) if p.get("factor") is not None else None
    if kind == "linear":
        return f / s, 1.0
    if kind == "dynamic":
        S = max(seq_len or max_pos, max_pos)
        b2 = b * (s * S / max_pos - (s - 1)) ** (d / (d - 2))
        return b2 ** (-np.arange(0, d, 2, dtype=np.float64) / d), 1.0
    if kind == "yarn":
        L = p.get("original_max_position_embeddings") or max_pos
        if s is None:
            s = max_pos / L
        beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        mscale = p.get("attention_factor")
        if mscale is None:
            if p.get("mscale") and p.get("mscale_all_dim"):
                mscale = get_mscale(s, p["mscale"]) / get_mscale(s, p["mscale_all_dim"])
            else:
                mscale = get_mscale(s)

        def corr_dim(n_rot):
            return d * math.log(L / (n_rot * 2 * math.pi)) / (2 * math.log(b))
        low = max(math.floor(corr_dim(beta_fast)), 0)
        high = min(math.ceil(corr_dim(beta_slow)), d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
        extrapolate = 1 - ramp
        return (f / s) * (1 - extrapolate) + f * extrapolate, float(mscale)
    if kind == "llama3":
        L = p.get("original_max_position_embeddings") or max_pos
        lo, hi = float(p["low_freq_factor"]), float(p["high_freq_factor"])
        wavelen = 2 * math.pi / f
        out = np.where(wavelen > L / lo, f / s, f)
        smooth = (L / wavelen - lo) / (hi - lo)
        band = ~(wavelen < L / hi) & ~(wavelen > L / lo)
        return np.where(band, (1 - smooth) * f / s + smooth * f, out), 1.0
    if kind == "longrope":
        L = p.get("original_max_position_embeddings") or max_pos
        if s is None:
            s = max_pos / L
        mscale = p.get("attention_factor")
        if mscale is None:
            mscale = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(L))
        ext = p["long_factor"] if seq_len and seq_len > L else p["short_factor"]
        ext = np.asarray(ext, dtype=np.float32).astype(np.float64)  # transformers: a float32 tensor
        return 1.0 / (ext * b ** (np.arange(0, d, 2, dtype=np.float64) / d)), float(mscale)
    raise ValueError(f"rope type {kind!r} is not modelled")


def _rotate(x, pos, inv_freq, mscale, rot):
    """rotate_half RoPE of x (T, heads, hd) at positions pos (T,), first rot dims.
    inv_freq: (rot/2,) shared, or (T, rot/2) one per row."""
    inv = inv_freq if inv_freq.ndim == 2 else np.broadcast_to(inv_freq, (len(pos), rot // 2))
    ang = pos[:, None] * inv
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)[:, None, :] * mscale
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)[:, None, :] * mscale
    r = x[..., :rot]
    rotated_half = np.concatenate([-r[..., rot // 2:], r[..., :rot // 2]], axis=-1)
    out = x.copy()
    out[..., :rot] = r * cos + rotated_half * sin
    return out


class HFReference:
    """config: the config.json dict; tensors: HF name -> array (the values the
    safetensors files hold, e.g. already rounded to bf16). dynamic: "full",
    "hf" or "exact" (see the module docstring)."""

    def __init__(self, config, tensors, dynamic="full"):
        self.c = config
        self.w = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
        self.nh = config["num_attention_heads"]
        self.nkv = config.get("num_key_value_heads") or self.nh
        self.hd = config["hidden_size"] // self.nh
        self.kind, _, _, self.rot = rope_settings(config)
        self.L = config.get("max_position_embeddings", 2048)
        self.eps = config.get("rms_norm_eps", 1e-6)
        self.dynamic = dynamic
        self.window = self._windows(config)
        tied = config.get("tie_word_embeddings", False) or "lm_head.weight" not in self.w
        self.lm_head = self.w["model.embed_tokens.weight"] if tied else self.w["lm_head.weight"]

    @staticmethod
    def _windows(c):
        """The sliding window of each layer (None: full attention), as the
        family's config class and attention module decide it."""
        n, mt = c["num_hidden_layers"], c.get("model_type")
        if mt == "mistral":
            w = c["sliding_window"] if "sliding_window" in c else 4096
            return [w] * n
        if mt == "phi3":
            return [c.get("sliding_window")] * n
        if mt == "qwen2":
            w = c.get("sliding_window", 4096) if c.get("use_sliding_window", False) else None
            types = c.get("layer_types") or ["sliding_attention" if w is not None and
                                             i >= c.get("max_window_layers", 28) else
                                             "full_attention" for i in range(n)]
            return [w if t == "sliding_attention" else None for t in types]
        return [None] * n

    def _mask(self, T, layer):
        """(T, T) additive mask: causal, and the layer's sliding window."""
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        visible = j <= i
        w = self.window[layer]
        if w is not None:
            visible &= j > i - w
        return np.where(visible, 0.0, -np.inf)

    def _attention(self, q, k, v, layer=0):
        """Attention output (T, nh*hd) for raw q (T, nh, hd), k, v (T, nkv, hd)."""
        T, rot = q.shape[0], self.rot
        pos = np.arange(T, dtype=np.float64)
        group = self.nh // self.nkv
        mask = self._mask(T, layer)
        out = np.empty((T, self.nh, self.hd))
        by_length = self.kind in ("dynamic", "longrope")  # frequencies depend on the length
        if by_length and self.dynamic == "exact":
            for p in range(T):  # query p: everything rotated with the frequencies for length p+1
                inv, mscale = inv_freq_and_attention(self.c, p + 1)
                qp = _rotate(q[p:p + 1], pos[p:p + 1], inv, mscale, rot)
                kp = _rotate(k[:p + 1], pos[:p + 1], inv, mscale, rot)
                for h in range(self.nh):
                    s = kp[:, h // group] @ qp[0, h] / math.sqrt(self.hd) + mask[p, :p + 1]
                    out[p, h] = _softmax(s) @ v[:p + 1, h // group]
            return out.reshape(T, -1)
        if by_length and self.dynamic == "hf":  # per-row frequencies for length t+1
            inv = np.stack([inv_freq_and_attention(self.c, t + 1)[0] for t in range(T)])
            mscale = inv_freq_and_attention(self.c, T)[1]  # LongRoPE's factor: one for all lengths
        else:
            inv, mscale = inv_freq_and_attention(self.c, T)
        q, k = _rotate(q, pos, inv, mscale, rot), _rotate(k, pos, inv, mscale, rot)
        for h in range(self.nh):
            s = q[:, h] @ k[:, h // group].T / math.sqrt(self.hd) + mask
            out[:, h] = _softmax(s) @ v[:, h // group]
        return out.reshape(T, -1)

    def _linear(self, x, name):
        """nn.Linear: x @ W^T, plus the bias when the checkpoint has one."""
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if name + ".bias" in self.w else y

    def logits(self, tokens):
        w, T = self.w, len(tokens)
        nq, nk = self.nh * self.hd, self.nkv * self.hd
        x = w["model.embed_tokens.weight"][np.asarray(tokens)]
        for l in range(self.c["num_hidden_layers"]):
            p = f"model.layers.{l}."
            h = _rmsnorm(x, w[p + "input_layernorm.weight"], self.eps)
            if p + "self_attn.qkv_proj.weight" in w:  # Phi-3: one projection, q | k | v
                qkv = self._linear(h, p + "self_attn.qkv_proj")
                q, k, v = qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:]
            else:
                q, k, v = (self._linear(h, p + f"self_attn.{n}_proj") for n in "qkv")
            q, k, v = q.reshape(T, self.nh, self.hd), k.reshape(T, self.nkv, self.hd), \
                v.reshape(T, self.nkv, self.hd)
            x = x + self._linear(self._attention(q, k, v, l), p + "self_attn.o_proj")
            h = _rmsnorm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            if p + "mlp.gate_up_proj.weight" in w:  # Phi-3: gate | up, chunk(2) on the last axis
                gate, up = np.split(self._linear(h, p + "mlp.gate_up_proj"), 2, axis=-1)
            else:
                gate, up = self._linear(h, p + "mlp.gate_proj"), self._linear(h, p + "mlp.up_proj")
            x = x + self._linear(_silu(gate) * up, p + "mlp.down_proj")
        return _rmsnorm(x, w["model.norm.weight"], self.eps) @ self.lm_head.T

    def nll(self, tokens):
        """-log p(tokens[t] | tokens[:t]) for t = 1..T-1 (the interface
        reference.forward.ppl_reference uses)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        logits = self.logits(tokens[:-1])
        m = logits.max(axis=-1, keepdims=True)
        logz = (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))[:, 0]
        return logz - logits[np.arange(len(tokens) - 1), tokens[1:]]
