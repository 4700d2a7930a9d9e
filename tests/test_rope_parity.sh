#!/bin/sh
# ca_rope_tables and ca_rope against Hugging Face transformers: the cos/sin tables within 1e-6 of
# LlamaRotaryEmbedding's (forward with position_ids; its linear and dynamic-NTK subclasses) and the
# rotated x within 1e-6 of apply_rotary_pos_emb, for full and partial rotary (the rotated part as
# GPT-NeoX takes it, x[..., :rot], the rest passed through), shared and per-batch positions.
# llama3 and yarn exist only in transformers >= 4.43: their inverse frequencies come from a reference
# written here, the published formulas of modeling_rope_utils (_compute_llama3_parameters,
# _compute_yarn_parameters) in torch's f32 operations, fed to the same LlamaRotaryEmbedding forward.
# SKIP (77) without a python3 that imports torch and transformers.
set -eu
build=${CACCEL_TEST_BUILDDIR:-.}
tool="$build/tests/rope_tool"
py=""
for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, transformers' 2>/dev/null; then py=$p; break; fi
done
if [ -z "$py" ]; then
    echo "SKIP: no python3 with torch and transformers (tools/install-deps.sh --test installs them)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" - "$tool" "$tmp" <<'PY'
import math, subprocess, sys
import numpy as np, torch
from transformers.models.llama import modeling_llama as ml
tool, tmp = sys.argv[1:3]
torch.manual_seed(0)

def llama3_inv_freq(inv_freq, factor, low, high, old):
    low_wl, high_wl = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    inv_l = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(medium, smoothed, inv_l)

def yarn_inv_freq(dim, base, factor, omax, beta_fast, beta_slow, attn, mscale, mscale_all):
    def corr_dim(rot):
        return (dim * math.log(omax / (rot * 2 * math.pi))) / (2 * math.log(base))
    def get_mscale(s, m=1):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
    if attn is None:
        attn = get_mscale(factor, mscale) / get_mscale(factor, mscale_all) if mscale and mscale_all \
            else get_mscale(factor)
    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrap, interp = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    ef = 1 - ramp
    return interp * (1 - ef) + extrap * ef, attn

def run(name, B, H, T, D, rot, theta, pos, module, keys, inv_freq=None, scale=1.0):
    x = torch.rand(B, H, T, D) * 2 - 1
    x.numpy().astype(np.float32).tofile(f"{tmp}/x.f32")
    args = [tool, tmp, str(B), str(H), str(T), str(D), f"rot={rot}", f"theta={theta}"] + keys
    if pos is not None:
        pos.numpy().astype(np.int64).tofile(f"{tmp}/pos.i64")
        args.append("positions=1")
    subprocess.run(args, check=True)
    pid = pos if pos is not None else torch.arange(T)[None]
    if inv_freq is not None:
        module.inv_freq = inv_freq
    cos, sin = module(x, pid)
    cos, sin = cos * scale, sin * scale
    q_rot, q_pass = x[..., :rot], x[..., rot:]
    y_rot, _ = ml.apply_rotary_pos_emb(q_rot, q_rot, cos, sin)
    want_y = torch.cat((y_rot, q_pass), dim=-1)
    r = rot // 2
    tb = B if pos is not None else 1
    got_c = np.fromfile(f"{tmp}/cos.f32", dtype=np.float32).reshape(tb, T, r)
    got_s = np.fromfile(f"{tmp}/sin.f32", dtype=np.float32).reshape(tb, T, r)
    got_y = np.fromfile(f"{tmp}/y.f32", dtype=np.float32).reshape(B, H, T, D)
    ec = np.abs(got_c - cos[..., :r].numpy()).max()
    es = np.abs(got_s - sin[..., :r].numpy()).max()
    ey = np.abs(got_y - want_y.numpy()).max()
    ok = max(ec, es, ey) <= 1e-6
    print(f"{'ok' if ok else 'FAIL'}: {name}: max |diff| cos {ec:.3g} sin {es:.3g} y {ey:.3g}")
    return ok

def per_batch(B, T, starts):
    return torch.stack([torch.arange(s, s + T) for s in starts[:B]])

R = ml.LlamaRotaryEmbedding
ok = True
ok &= run("default, full rotary [2,3,17,64]", 2, 3, 17, 64, 64, 10000.0, None, R(64, base=10000.0), [])
ok &= run("default, per-batch positions, theta 5e5 [2,2,9,128]", 2, 2, 9, 128, 128, 500000.0,
          per_batch(2, 9, [5, 300]), R(128, base=500000.0), [])
ok &= run("default, partial rotary 16 of 32 (GPT-NeoX)", 2, 2, 11, 32, 16, 10000.0, None, R(16, base=10000.0), [])
ok &= run("default, partial rotary 24 of 80, per-batch", 3, 2, 7, 80, 24, 10000.0, per_batch(3, 7, [0, 40, 1000]),
          R(24, base=10000.0), [])
ok &= run("linear factor 4", 2, 2, 13, 64, 64, 10000.0, per_batch(2, 13, [0, 77]),
          ml.LlamaLinearScalingRotaryEmbedding(64, base=10000.0, scaling_factor=4.0), ["type=linear", "factor=4"])
ok &= run("dynamic factor 2, positions past max 16", 2, 2, 20, 64, 64, 10000.0, per_batch(2, 20, [0, 20]),
          ml.LlamaDynamicNTKScalingRotaryEmbedding(64, max_position_embeddings=16, base=10000.0, scaling_factor=2.0),
          ["type=dynamic", "factor=2", "max_pos=16"])
ok &= run("dynamic factor 2, positions within max 64", 1, 2, 20, 32, 32, 10000.0, None,
          ml.LlamaDynamicNTKScalingRotaryEmbedding(32, max_position_embeddings=64, base=10000.0, scaling_factor=2.0),
          ["type=dynamic", "factor=2", "max_pos=64"])
ok &= run("dynamic factor 3, partial rotary 16 of 64", 2, 1, 33, 64, 16, 10000.0, None,
          ml.LlamaDynamicNTKScalingRotaryEmbedding(16, max_position_embeddings=8, base=10000.0, scaling_factor=3.0),
          ["type=dynamic", "factor=3", "max_pos=8", "rot=16"])
for old, theta in ((8192, 500000.0), (64, 10000.0)):
    base_inv = R(64, base=theta).inv_freq
    ok &= run(f"llama3 factor 8, low 1, high 4, original {old}", 2, 2, 15, 64, 64, theta,
              per_batch(2, 15, [0, 3000]), R(64, base=theta), ["type=llama3", "factor=8", "low=1", "high=4",
              f"orig_max={old}"], inv_freq=llama3_inv_freq(base_inv, 8.0, 1.0, 4.0, old))
for attn, ms, msa, keys in ((None, 0, 0, []), (None, 0.707, 0.707, ["mscale=0.707", "mscale_all_dim=0.707"]),
                            (None, 1.0, 0.5, ["mscale=1", "mscale_all_dim=0.5"]), (1.3, 0, 0, ["attn=1.3"])):
    inv, a = yarn_inv_freq(64, 10000.0, 4.0, 32, 32, 1, attn, ms, msa)
    ok &= run(f"yarn factor 4, original 32 {' '.join(keys)}", 2, 2, 12, 64, 64, 10000.0, per_batch(2, 12, [0, 100]),
              R(64, base=10000.0), ["type=yarn", "factor=4", "orig_max=32"] + keys, inv_freq=inv, scale=a)
inv, a = yarn_inv_freq(32, 10000.0, 2.0, 64, 16, 2, None, 0, 0)
ok &= run("yarn factor 2, beta 16/2, partial 32 of 48", 1, 2, 9, 48, 32, 10000.0, None, R(32, base=10000.0),
          ["type=yarn", "factor=2", "orig_max=64", "beta_fast=16", "beta_slow=2", "rot=32"], inv_freq=inv, scale=a)
sys.exit(0 if ok else 1)
PY
