"""Parity of caccel's decoder LMs with transformers (4.39) on tiny random models of each family
(Llama, Qwen2, Mistral, GPT-2).

For each case: a model made by transformers with a fixed seed is saved (f32); causal_lm_tool
loads it and writes its logits (no mask), its logits with a padding mask and position ids, the
loss against labels holding -100 and every parameter's gradient; each must equal transformers'
within 1e-4 relative (max abs difference / max abs value). The directory caccel writes must load
in AutoModelForCausalLM.from_pretrained with the same logits, a sharded checkpoint
(save_pretrained with a small max_shard_size) must load in caccel with the same logits, and bf16
and f16 checkpoints must give transformers' logits of the same files read as f32.
usage: causal_lm_reference.py TOOL TMPDIR"""
import copy
import os
import subprocess
import sys

import numpy as np
import torch
import transformers
from safetensors import safe_open
from transformers import AutoModelForCausalLM

BOUND = 1e-4
SMALL = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=96, initializer_range=0.1)
CASES = [
    ("llama", transformers.LlamaConfig, dict(pad_token_id=0)),
    ("llama-tied-linear-bias", transformers.LlamaConfig,
     dict(tie_word_embeddings=True, attention_bias=True, rope_scaling={"type": "linear", "factor": 2.0},
          rope_theta=500000.0, num_key_value_heads=4)),
    ("llama-dynamic", transformers.LlamaConfig,
     dict(max_position_embeddings=8, rope_scaling={"type": "dynamic", "factor": 2.0}, num_key_value_heads=1)),
    ("qwen2", transformers.Qwen2Config, dict(sliding_window=64, use_sliding_window=False, tie_word_embeddings=True)),
    ("mistral", transformers.MistralConfig, dict(sliding_window=16)),
    ("gpt2", transformers.GPT2Config, dict()),
    ("gpt2-untied-inner-gelu", transformers.GPT2Config,
     dict(tie_word_embeddings=False, n_inner=96, activation_function="gelu", scale_attn_by_inverse_layer_idx=True)),
]
GPT2_SMALL = dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=32, initializer_range=0.1)


def rel(got, want, where=None):
    if where is not None:
        got, want = got[where], want[where]
    return (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)


def inputs(b=3, t=12):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 8:] = 0                        # right padding
    mask[2, :3] = 0                        # left padding
    ids[mask == 0] = 0
    labels = ids.clone()
    labels[mask == 0] = -100
    labels[2, 3] = -100                    # predicted from a padded position
    labels[0, 5] = -100
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)   # as generate() makes them
    return ids, mask, labels, pos


def check(name, cls, extra, tool, tmp):
    torch.manual_seed(0)
    cfg = cls(**{**(GPT2_SMALL if cls is transformers.GPT2Config else SMALL), **extra})
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    hf, ca = os.path.join(tmp, name + "-hf"), os.path.join(tmp, name + "-ca")
    os.makedirs(ca)
    model.save_pretrained(hf)
    ids, mask, labels, pos = inputs()
    b, t = ids.shape
    np.concatenate([[b, t], ids.flatten(), mask.flatten(), labels.flatten(), pos.flatten()]).astype("<i8").tofile(
        tmp + "/in")
    print(subprocess.run([tool, "run", hf, tmp + "/in", tmp + "/out", ca], check=True, capture_output=True,
                         text=True).stdout.strip())
    out = torch.from_numpy(np.fromfile(tmp + "/out", dtype="<f4").copy())
    names = [line.split() for line in open(tmp + "/out.names")]
    with torch.no_grad():
        ref_plain = model(ids).logits
    o = model(ids, attention_mask=mask, position_ids=pos, labels=labels)
    o.loss.backward()
    n = ref_plain.numel()
    got_plain, got_mask, got_loss = out[:n].view_as(ref_plain), out[n:2 * n].view_as(ref_plain), out[2 * n:2 * n + 1]
    real = mask.bool()
    results = [("logits", rel(got_plain, ref_plain)),
               ("logits with mask and position_ids (real tokens)", rel(got_mask, o.logits.detach(), real)),
               ("loss", rel(got_loss, o.loss.detach().view(1)))]
    params = dict(model.named_parameters())
    off, worst = 2 * n + 1, ("", 0.0)
    if sorted(p for p, _ in names) != sorted(params):
        print("%s: parameter names differ: caccel %s, transformers %s" % (name, sorted(p for p, _ in names),
                                                                         sorted(params)))
        return False
    for pname, numel in names:
        numel = int(numel)
        g = out[off:off + numel].view_as(params[pname].grad)
        off += numel
        r = rel(g, params[pname].grad)
        if r >= worst[1]:
            worst = (pname, r)
    results.append(("gradients (worst: %s)" % worst[0], worst[1]))
    again = AutoModelForCausalLM.from_pretrained(ca, attn_implementation="eager")
    with torch.no_grad():
        results.append(("caccel's files in %s" % type(again).__name__, rel(again(ids).logits, ref_plain)))
    transformers.GenerationConfig.from_pretrained(ca)
    sharded = os.path.join(tmp, name + "-sharded")
    model.save_pretrained(sharded, max_shard_size="40KB")
    assert os.path.exists(os.path.join(sharded, "model.safetensors.index.json")), "not sharded"
    print(subprocess.run([tool, "logits", sharded, tmp + "/in", tmp + "/out2"], check=True, capture_output=True,
                         text=True).stdout.strip())
    got = torch.from_numpy(np.fromfile(tmp + "/out2", dtype="<f4").copy()).view_as(ref_plain)
    results.append(("sharded checkpoint logits", rel(got, ref_plain)))
    if cfg.tie_word_embeddings:             # a base model's file (GPT2Model, LlamaModel): no prefix
        base = os.path.join(tmp, name + "-base")
        model.base_model.save_pretrained(base)
        subprocess.run([tool, "logits", base, tmp + "/in", tmp + "/out4"], check=True, capture_output=True)
        got = torch.from_numpy(np.fromfile(tmp + "/out4", dtype="<f4").copy()).view_as(ref_plain)
        results.append(("%s's file (no prefix) logits" % type(model.base_model).__name__, rel(got, ref_plain)))
    for dtype in (torch.bfloat16, torch.float16):     # read as f32, as from_pretrained(torch_dtype=f32)
        low = os.path.join(tmp, "%s-%s" % (name, str(dtype)[6:]))
        copy.deepcopy(model).to(dtype).save_pretrained(low)
        with safe_open(os.path.join(low, "model.safetensors"), "pt") as f:
            assert all(f.get_tensor(k).dtype == dtype for k in f.keys()), "not saved as %s" % dtype
        subprocess.run([tool, "logits", low, tmp + "/in", tmp + "/out3"], check=True, capture_output=True)
        got = torch.from_numpy(np.fromfile(tmp + "/out3", dtype="<f4").copy()).view_as(ref_plain)
        with torch.no_grad():
            want = AutoModelForCausalLM.from_pretrained(low, torch_dtype=torch.float32,
                                                        attn_implementation="eager")(ids).logits
        results.append(("%s checkpoint logits" % str(dtype)[6:], rel(got, want)))
    ok = True
    for what, r in results:
        print("%s: %s: relative %.3g (bound %g)" % (name, what, r, BOUND))
        ok = ok and r <= BOUND
    return ok


def main():
    tool, tmp = sys.argv[1:3]
    only = os.environ.get("CACCEL_CAUSAL_LM_CASES")
    ok = True
    for name, cls, extra in CASES:
        if only and name not in only.split(","):
            continue
        ok = check(name, cls, extra, tool, tmp) and ok
    print("reference: transformers", transformers.__version__, "torch", torch.__version__)
    sys.exit(0 if ok else 1)


main()
