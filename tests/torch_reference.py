"""PyTorch references shared by the tests and the benchmark peers (bench/peers/torch_transformer.py):
a reader of safetensors files and examples/gpt's model with nanoGPT's structure and parameter names.
Needs torch and numpy (Debian's python3-torch)."""
import json, math, struct
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def load_safetensors(path):
    """Returns ({name: tensor}, how it was read): through the safetensors package when this python
    has it, otherwise by the documented format (8-byte little-endian header length, JSON header, raw
    little-endian data), which is all /usr/bin/python3 may offer. The fallback reads F32 only."""
    try:
        from safetensors.torch import load_file
        return load_file(path), "safetensors.torch"
    except ImportError:
        pass
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", (name, t["dtype"])
        b, e = t["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[b:e], dtype="<f4").copy()).reshape(t["shape"])
    return out, "the documented format (no safetensors module in this python)"


def gpt_model(n_layer, n_head, n_embd, block_size, vocab_size):
    """examples/gpt's model: pre-LayerNorm blocks, causal attention, tanh GELU, tied output layer."""
    C, H, T = n_embd, n_head, block_size

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(c // H)
            causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
            y = F.softmax(att.masked_fill(causal, float("-inf")), dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(C), Attn(), nn.LayerNorm(C), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(vocab_size, C), wpe=nn.Embedding(T, C),
                                                  h=nn.ModuleList([Block() for _ in range(n_layer)]),
                                                  ln_f=nn.LayerNorm(C)))

        def forward(self, idx):
            tr = self.transformer
            x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1], device=idx.device))
            for blk in tr.h:
                x = blk(x)
            return F.linear(tr.ln_f(x), tr.wte.weight)   # tied output layer

    return GPT()
