"""The network run.c evaluates (tools/train.py's docstring writes it out):
RMSNorm, RoPE on interleaved pairs (rope_rotation, apply_rope), the transformer
Block, the whole Llama with its tied classifier, and the config of a run
(make_config), which is also what export.py writes in model.bin's header."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .data import BOS_ID, EOS_ID


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def theta_frequencies(head_size, theta):
    """Plain RoPE's inverse frequencies theta^(-2i/head_size), i < head_size/2, in double."""
    return theta ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)


def rope_rotation(seq_len, inv_freq, mscale=1.0):
    """The complex rotations (seq_len, n_pairs) mscale * (cos + i sin) of angle pos * inv_freq[i],
    as run's rope_fill_table builds its table: angle and product in double, then float.
    mscale (YaRN's magnitude) scales both q and k, so every q.k by mscale^2, as in run."""
    inv = torch.as_tensor(inv_freq, dtype=torch.float64)
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    return torch.complex((mscale * ang.cos()).float(), (mscale * ang.sin()).float())


def apply_rope(x, rot):
    """x: (B, T, heads, head_size); rotate interleaved pairs (2i, 2i+1) by the angles of rot.

    Pair (x0, x1) read as the complex number x0 + i x1 and multiplied by
    rot = cos + i sin gives (x0 cos - x1 sin, x0 sin + x1 cos): run.c's rotation.
    """
    B, T, H, D = x.shape
    xc = torch.view_as_complex(x.reshape(B, T, H, D // 2, 2))
    return torch.view_as_real(xc * rot[:T].view(1, T, 1, D // 2)).view(B, T, H, D)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads, self.n_kv = c["n_heads"], c["n_kv_heads"]
        self.hs = c["dim"] // c["n_heads"]
        kv_dim = self.n_kv * self.hs
        self.attention_norm = RMSNorm(c["dim"], c["norm_eps"])
        self.wq = nn.Linear(c["dim"], c["dim"], bias=False)
        self.wk = nn.Linear(c["dim"], kv_dim, bias=False)
        self.wv = nn.Linear(c["dim"], kv_dim, bias=False)
        self.wo = nn.Linear(c["dim"], c["dim"], bias=False)
        self.ffn_norm = RMSNorm(c["dim"], c["norm_eps"])
        self.w1 = nn.Linear(c["dim"], c["hidden_dim"], bias=False)
        self.w2 = nn.Linear(c["hidden_dim"], c["dim"], bias=False)
        self.w3 = nn.Linear(c["dim"], c["hidden_dim"], bias=False)

    def forward(self, x, rot, mask):
        B, T, _ = x.shape
        h = self.attention_norm(x)
        q = apply_rope(self.wq(h).view(B, T, self.n_heads, self.hs), rot)
        k = apply_rope(self.wk(h).view(B, T, self.n_kv, self.hs), rot)
        v = self.wv(h).view(B, T, self.n_kv, self.hs)
        if self.n_kv != self.n_heads:  # GQA: query head h uses kv head h // group
            g = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
        # (B*H, T, hs); scores = mask + q k^T / sqrt(hs) in one baddbmm (mask: 0 or -inf)
        q, k, v = (t.transpose(1, 2).reshape(B * self.n_heads, T, self.hs) for t in (q, k, v))
        att = torch.baddbmm(mask[:T, :T], q, k.transpose(1, 2), alpha=1.0 / math.sqrt(self.hs))
        y = torch.bmm(att.softmax(-1), v).view(B, self.n_heads, T, self.hs)
        y = y.transpose(1, 2).reshape(B, T, -1)
        x = x + self.wo(y)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    """run.c's network for config c (make_config's keys). RoPE rotates pair i by pos * inv_freq[i]
    with magnitude mscale: by default plain RoPE of base c["rope_theta"]; tools/finetune.py passes
    a scaling method's frequencies and magnitude, computed as run computes them."""

    def __init__(self, c, inv_freq=None, mscale=1.0):
        super().__init__()
        self.c = c
        self.tok_embeddings = nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.norm = RMSNorm(c["dim"], c["norm_eps"])
        if inv_freq is None:
            inv_freq = theta_frequencies(c["dim"] // c["n_heads"], c["rope_theta"])
        self.register_buffer("rot", rope_rotation(c["seq_len"], inv_freq, mscale), persistent=False)
        mask = torch.full((c["seq_len"], c["seq_len"]), float("-inf")).triu(1)  # causal, additive
        self.register_buffer("mask", mask, persistent=False)
        # llama2.c's init: N(0, 0.02); residual projections scaled by 1/sqrt(2 L).
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c["n_layers"]) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.rot, self.mask)
        return F.linear(self.norm(x), self.tok_embeddings.weight)  # tied classifier


def default_hidden(dim: int) -> int:
    """llama's SwiGLU width: 2/3 of 4*dim, rounded up to a multiple of 16."""
    h = int(2 * 4 * dim / 3)
    return 16 * ((h + 15) // 16)


def make_config(args):
    return dict(
        dim=args.dim, hidden_dim=args.hidden_dim or default_hidden(args.dim), n_layers=args.n_layers,
        n_heads=args.n_heads, n_kv_heads=args.n_kv_heads or args.n_heads, vocab_size=args.vocab_size,
        seq_len=args.seq_len, shared_classifier=True, bos_id=BOS_ID, eos_id=EOS_ID, norm_eps=1e-5,
        rope_theta=args.rope_theta, rope_layout="interleaved", rot_dim=args.dim // args.n_heads,
    )
