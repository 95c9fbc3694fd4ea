"""A numpy reference forward pass for the Llama-2 architecture, in float64.

Written from the math, not from run.c, so that the two can check each other:
it processes a whole sequence at once (a causal mask instead of a KV cache)
and builds RoPE from its definition.

    x = token_embedding[tokens]                          (T, dim)
    per layer:
        h = rmsnorm(x, rms_att_weight)
        q, k, v = h @ wq.T, h @ wk.T, h @ wv.T           heads of head_size
        q, k = rope(q), rope(k)                          first rot_dim dims of each head
        a = softmax(q k^T / sqrt(head_size) + causal mask) v
                                                         query head h uses kv head h // (n_heads/n_kv_heads)
        x = x + a @ wo.T
        h = rmsnorm(x, rms_ffn_weight)
        x = x + (silu(h @ w1.T) * (h @ w3.T)) @ w2.T     SwiGLU
    logits = rmsnorm(x, rms_final_weight) @ (token_embedding if shared else wcls).T

rmsnorm(x, w) = x * w / sqrt(mean(x^2) + eps).
RoPE (docs/rope.md §2.1, §2.2, §4.1): inv_freq_i = base^(-2i/rot_dim), angle = pos * inv_freq_i;
pair i is (2i, 2i+1) in the interleaved layout, (i, i + rot_dim/2) in neox;
(x, y) -> (x cos - y sin, x sin + y cos). Only unscaled RoPE is modelled.

ppl_reference() applies the windowing contract of `run -m ppl` (docs/rope.md §12.2).

trace_attention() is the same model one token at a time through a KV cache,
with every key strategy of run (docs/rope.md §11): keys rotated once as they
arrive, or kept before RoPE and rotated for each query (exact dynamic NTK,
Self-Extend, the rolling cache of attention sinks), a sliding window, and an
f16 cache; RoPE comes from an angle rule the caller writes from docs/rope.md.
It returns each query's attention weights besides its NLL, for the attention
statistics of `run -m ppl --attn-stats`.
"""

import math

import numpy as np


def rmsnorm(x, w, eps):
    """x (..., n) * w (n) / sqrt(mean(x^2) + eps), over the last axis."""
    return x * w / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope_cos_sin(n_pos, rot_dim, base):
    """cos, sin tables (n_pos, rot_dim/2) for positions 0..n_pos-1."""
    inv_freq = base ** (-np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
    angle = np.outer(np.arange(n_pos, dtype=np.float64), inv_freq)
    return np.cos(angle), np.sin(angle)


def apply_rope(x, cos, sin, rot_dim, layout):
    """Rotate the first rot_dim dims of every head. x: (T, heads, head_size);
    cos, sin: (T, rot_dim/2). Returns a new array."""
    half = rot_dim // 2
    out = x.copy()
    r = x[..., :rot_dim]
    if layout == "interleaved":
        a, b = r[..., 0::2], r[..., 1::2]
    elif layout == "neox":
        a, b = r[..., :half], r[..., half:]
    else:
        raise ValueError(f"unknown layout {layout!r}")
    c, s = cos[:, None, :], sin[:, None, :]
    a2, b2 = a * c - b * s, a * s + b * c
    if layout == "interleaved":
        out[..., 0:rot_dim:2], out[..., 1:rot_dim:2] = a2, b2
    else:
        out[..., :half], out[..., half:rot_dim] = a2, b2
    return out


def _softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)  # exp of large values would overflow
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def _silu(x):
    return x / (1.0 + np.exp(-x))


class Reference:
    """The model as float64 arrays. cfg: a config dict as export.py takes it
    (export.normalize_config fills in defaults); tensors: name -> array."""

    def __init__(self, cfg, tensors):
        if cfg.get("rope_scaling", "none") not in ("none", 0):
            raise NotImplementedError("the reference models unscaled RoPE only")
        self.cfg = cfg
        self.dim = cfg["dim"]
        self.n_heads = cfg["n_heads"]
        self.n_kv_heads = cfg["n_kv_heads"]
        self.head_size = self.dim // self.n_heads
        self.rot_dim = cfg.get("rot_dim") or self.head_size
        self.layout = cfg.get("rope_layout", "interleaved")
        # the header stores these as float32: use the value the checkpoint holds
        self.base = float(np.float32(cfg.get("rope_theta", 10000.0)))
        self.eps = float(np.float32(cfg.get("norm_eps", 1e-5)))
        self.w = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
        shared = cfg.get("shared_classifier", True)
        self.wcls = self.w["token_embedding"] if shared else self.w["wcls"]

    def logits(self, tokens):
        """Logits (T, vocab_size) for every position of tokens (T,), causally."""
        tokens = np.asarray(tokens, dtype=np.int64)
        T, hs, nh, nkv = len(tokens), self.head_size, self.n_heads, self.n_kv_heads
        w = self.w
        x = w["token_embedding"][tokens]
        cos, sin = rope_cos_sin(T, self.rot_dim, self.base)
        mask = np.triu(np.full((T, T), -np.inf), k=1)  # position t sees 0..t
        group = nh // nkv
        for l in range(w["wq"].shape[0]):
            h = rmsnorm(x, w["rms_att_weight"][l], self.eps)
            q = (h @ w["wq"][l].T).reshape(T, nh, hs)
            k = (h @ w["wk"][l].T).reshape(T, nkv, hs)
            v = (h @ w["wv"][l].T).reshape(T, nkv, hs)
            q = apply_rope(q, cos, sin, self.rot_dim, self.layout)
            k = apply_rope(k, cos, sin, self.rot_dim, self.layout)
            att_out = np.empty((T, nh, hs))
            for head in range(nh):
                kv = head // group
                scores = q[:, head, :] @ k[:, kv, :].T / math.sqrt(hs) + mask
                att_out[:, head, :] = _softmax(scores) @ v[:, kv, :]
            x = x + att_out.reshape(T, nh * hs) @ w["wo"][l].T
            h = rmsnorm(x, w["rms_ffn_weight"][l], self.eps)
            x = x + (_silu(h @ w["w1"][l].T) * (h @ w["w3"][l].T)) @ w["w2"][l].T
        x = rmsnorm(x, w["rms_final_weight"], self.eps)
        return x @ self.wcls.T

    def nll(self, tokens):
        """-log p(tokens[t] | tokens[:t]) for t = 1..T-1, natural log, shape (T-1,)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        logits = self.logits(tokens[:-1])
        m = logits.max(axis=-1, keepdims=True)
        logz = (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))[:, 0]
        return logz - logits[np.arange(len(tokens) - 1), tokens[1:]]

    def greedy(self, prompt, n, stop_ids=()):
        """Greedy continuation of prompt (ids, BOS first): up to n new ids,
        stopping after (and including) any id in stop_ids. Also returns the
        smallest top-1 minus top-2 logit gap seen, to judge near-ties."""
        ids, new, min_gap = list(prompt), [], math.inf
        for _ in range(n):
            last = self.logits(ids)[-1]
            top2 = np.sort(last)[-2:]
            min_gap = min(min_gap, top2[1] - top2[0])
            nxt = int(np.argmax(last))
            new.append(nxt)
            ids.append(nxt)
            if nxt in stop_ids:
                break
        return new, min_gap


def bucket_bounds(seq_len, ctx):
    """Position buckets of `run -m ppl`: boundaries 0, L/2, L, 2L, 4L, ...
    capped at ctx, as [(start, end)]."""
    edges = [0, seq_len // 2, seq_len]
    while edges[-1] < ctx:
        edges.append(edges[-1] * 2)
    edges = sorted(set(min(e, ctx) for e in edges))
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def ppl_reference(model, text_ids, ctx, bos_id, seq_len, stride=None):
    """Teacher-forced evaluation with run's windowing contract (docs/rope.md §12.2).

    text_ids: the text's ids without BOS. With a bos_id, windows hold ctx-1
    text tokens each and are fed as [BOS] + tokens; each text token after BOS
    is scored given its in-window prefix. With bos_id None (a tokenizer that
    adds no BOS), windows hold ctx text tokens and the first one is context
    only. Windows start every `stride` tokens (default ctx-1); a window scores
    only tokens no earlier window scored. The bucket of a scored token is its
    in-window position (1..ctx-1).

    Returns a dict like run's --json: tokens, nll, ppl, ctx, buckets, plus
    'per_token': [(text index, in-window position, nll)] and 'per_window':
    [[nll of each token the window scored]]."""
    bos = 0 if bos_id is None else 1
    n, span = len(text_ids), ctx - bos
    stride = ctx - 1 if stride is None else stride
    assert 1 <= stride <= ctx - 1
    per_token, per_window, start, scored_until = [], [], 0, 0
    while scored_until < n:
        chunk = list(text_ids[start:start + span])
        # nll[q] scores the token after input position q, at in-window position q + 1
        nll = model.nll([bos_id] + chunk if bos else chunk)
        per_window.append([])
        for q in range(len(chunk) - 1 + bos):
            idx = start + q + 1 - bos
            if idx >= scored_until:
                per_token.append((idx, q + 1, float(nll[q])))
                per_window[-1].append(float(nll[q]))
        scored_until = start + len(chunk)
        start += stride
    buckets = []
    for a, b in bucket_bounds(seq_len, ctx):
        vals = [v for _, pos, v in per_token if a <= pos < b]
        mean = float(np.mean(vals)) if vals else float("nan")
        buckets.append({"start": a, "end": b, "tokens": len(vals), "nll": mean,
                        "ppl": math.exp(mean) if vals else float("nan")})
    mean = float(np.mean([v for _, _, v in per_token]))
    return {"tokens": len(per_token), "nll": mean, "ppl": math.exp(mean), "ctx": ctx,
            "buckets": buckets, "per_token": per_token, "per_window": per_window}


def rotate_angles(x, angles, att, layout, rot_dim):
    """x (..., heads, head_size) with pair i of the first rot_dim dims of every
    head rotated by angles (..., rot_dim/2), then times att (YaRN's mscale:
    run multiplies cos and sin by it). Returns a new array."""
    half = rot_dim // 2
    out = np.array(x, dtype=np.float64)
    if layout == "interleaved":
        ia, ib = np.arange(0, rot_dim, 2), np.arange(1, rot_dim, 2)
    else:
        ia, ib = np.arange(half), np.arange(half, rot_dim)
    a, b = out[..., ia], out[..., ib]
    c, s = att * np.cos(angles)[..., None, :], att * np.sin(angles)[..., None, :]
    out[..., ia], out[..., ib] = a * c - b * s, a * s + b * c
    return out


def trace_attention(model, tokens, n_ctx, angles, rotated_once, window=0, window_first_layer=0, sinks=None,
                    kv="f32"):
    """Feed tokens one at a time from position 0 through a cache of n_ctx
    slots; for each fed token return its query's record:

        pos      its position (with sinks: in the text)
        nll      -log p(next token), None for the last token
        weights  (n_layers, n_heads, n) the softmax weights over cache slots 0..n-1
        dist     (n,) the distance in the text from each slot's token to this one
        sink     (n,) True for the slots of sink tokens

    angles(p, t) -> (query angles, key angles, att): the rotation of the query
    at place p and the key at place t for their score (arrays of rot_dim/2
    angles; att multiplies both). rotated_once: each key is rotated once, by
    angles(t, t)'s key angles, when it enters the cache, and keeps that
    rotation (run's default); else the cache holds keys before RoPE, rotated
    for each query. sinks=S: the cache rolls once full, keeping the first S
    tokens and overwriting the oldest of the rest; a key's place is its slot
    while the cache has not wrapped, then n_ctx - 1 for the newest token and
    one less per token back (docs/rope.md §13). window=W: layers from
    window_first_layer on see the W most recent slots only. kv="f16": the
    cache stores keys (rotated, or before RoPE) and values rounded to IEEE
    half."""
    w, nh, nkv, hs = model.w, model.n_heads, model.n_kv_heads, model.head_size
    n_layers, group = w["wq"].shape[0], model.n_heads // model.n_kv_heads
    store = (lambda a: a.astype(np.float16).astype(np.float64)) if kv == "f16" else (lambda a: a)
    K = np.zeros((n_layers, n_ctx, nkv, hs))
    V = np.zeros((n_layers, n_ctx, nkv, hs))
    R = n_ctx - (sinks or 0)
    owner = np.zeros(n_ctx, dtype=np.int64)  # the position in the text of each slot's token
    records = []
    for p, tok in enumerate(tokens):
        wrapped = sinks is not None and p >= n_ctx
        slot = sinks + (p - sinks) % R if wrapped else p
        n = n_ctx if wrapped else p + 1

        def place(j):
            return n_ctx - 1 - (slot - j) % R if wrapped and j >= sinks else j

        places = np.array([place(j) for j in range(n)])
        qplace = place(slot)
        owner[slot] = p
        x = w["token_embedding"][tok]
        weights = np.zeros((n_layers, nh, n))
        for l in range(n_layers):
            h = rmsnorm(x, w["rms_att_weight"][l], model.eps)
            q = (w["wq"][l] @ h).reshape(nh, hs)
            k = (w["wk"][l] @ h).reshape(nkv, hs)
            if rotated_once:
                ka = angles(qplace, qplace)
                k = rotate_angles(k[None], ka[1][None, :], ka[2], model.layout, model.rot_dim)[0]
            K[l, slot] = store(k)
            V[l, slot] = store((w["wv"][l] @ h).reshape(nkv, hs))
            rules = [angles(qplace, t) for t in places]
            att = rules[0][2]
            qa = np.array([r[0] for r in rules])  # (n, rot/2): the query's angles for each key
            qr = rotate_angles(np.broadcast_to(q, (n, nh, hs)), qa, att, model.layout, model.rot_dim)
            if rotated_once:
                kr = K[l, :n]
            else:
                kr = rotate_angles(K[l, :n], np.array([r[1] for r in rules]), att, model.layout, model.rot_dim)
            lo = max(0, n - window) if window and l >= window_first_layer else 0
            out = np.empty((nh, hs))
            for head in range(nh):
                kv_head = head // group
                scores = np.einsum("td,td->t", qr[lo:, head], kr[lo:, kv_head]) / math.sqrt(hs)
                weights[l, head, lo:] = _softmax(scores)
                out[head] = weights[l, head] @ V[l, :n, kv_head]
            x = x + w["wo"][l] @ out.reshape(-1)
            h = rmsnorm(x, w["rms_ffn_weight"][l], model.eps)
            x = x + w["w2"][l] @ (_silu(w["w1"][l] @ h) * (w["w3"][l] @ h))
        nll = None
        if p + 1 < len(tokens):
            logits = model.wcls @ rmsnorm(x, w["rms_final_weight"], model.eps)
            m = logits.max()
            nll = float(m + math.log(np.exp(logits - m).sum()) - logits[tokens[p + 1]])
        sink = np.array([sinks is not None and j < sinks for j in range(n)])
        records.append({"pos": p, "nll": nll, "weights": weights, "dist": p - owner[:n], "sink": sink})
    return records


def decode_llama2c(pieces, prev, token):
    """Bytes that llama2.c prints for `token` after `prev`: a byte token
    "<0xAB>" is the raw byte; after BOS (id 1) a leading space is dropped."""
    piece = pieces[token]
    if prev == 1 and piece.startswith(b" "):
        piece = piece[1:]
    if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece
