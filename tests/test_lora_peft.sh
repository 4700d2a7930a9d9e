#!/bin/sh
# caccel's LoRA against PEFT (peft 0.10) on a small random BertModel made by transformers, LoRA on
# query and value (r 4, alpha 8):
#  (a)+(c) PEFT's get_peft_model with nonzero lora_B, saved by save_pretrained, loads in caccel
#      (ca_lora_load) and gives PEFT's last_hidden_state and pooler_output within 1e-5 relative;
#      the gradients of sum(last_hidden_state * sin(0.37 i + 0.1)) reach only lora_A/lora_B and equal PEFT's;
#  (b) caccel's own adapter (ca_lora_apply + ca_lora_save) loads with PeftModel.from_pretrained and
#      gives caccel's outputs;
#  (d) caccel's merge_and_unload and `caccel merge-weights --adapter` write PEFT's
#      merge_and_unload weights, and transformers loads the merged directory.
# SKIP (77) without a python3 that has torch, transformers and peft.
set -eu
build=${CACCEL_TEST_BUILDDIR:-.}
tool="$build/tests/lora_tool"
cli="$build/tools/caccel"
[ -x "$cli" ] || cli="$build/caccel"
py=""
for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, transformers, peft, safetensors' 2>/dev/null; then
        py=$p
        break
    fi
done
if [ -z "$py" ]; then
    echo "SKIP: no python3 with torch, transformers, safetensors and peft (tools/install-deps.sh --test installs them)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" - "$tool" "$cli" "$tmp" <<'PY'
import os, subprocess, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np, torch
from safetensors.torch import load_file
from transformers import BertConfig, BertModel
from peft import LoraConfig, PeftModel, get_peft_model
tool, cli, tmp = sys.argv[1:4]
torch.manual_seed(0)
cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)
base_dir, peft_dir = tmp + "/base", tmp + "/peft"
BertModel(cfg).save_pretrained(base_dir, safe_serialization=True)

def base():
    return BertModel.from_pretrained(base_dir).eval()

b, length = 3, 10
ids = torch.randint(1, 64, (b, length))
mask = torch.ones(b, length, dtype=torch.long)
mask[1, 7:] = 0
types = torch.zeros(b, length, dtype=torch.long)
np.concatenate([[b, length], ids.flatten(), mask.flatten(), types.flatten()]).astype("<i8").tofile(tmp + "/in")
fails = []

def check(what, got, want, bound=1e-5):
    rel = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    print("%s: relative difference %.3g (bound %g)" % (what, rel, bound))
    if not rel <= bound:
        fails.append(what)

def run_tool(adapter):
    r = subprocess.run([tool, "forward", base_dir, adapter, tmp + "/in", tmp + "/out"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("lora_tool forward failed: " + r.stderr)
    out = torch.from_numpy(np.fromfile(tmp + "/out", dtype="<f4").copy())
    h, out = out[: b * length * 16].view(b, length, 16), out[b * length * 16:]
    p, out = out[: b * 16].view(b, 16), out[b * 16:]
    grads = {}
    for line in r.stdout.splitlines():
        if line.startswith("grad "):
            _, name, n = line.split()
            grads[name], out = out[: int(n)], out[int(n):]
    return h, p, grads

def outputs(model):
    o = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
    return o.last_hidden_state, o.pooler_output

# (a), (c): PEFT's adapter with nonzero B into caccel
torch.manual_seed(1)
pm = get_peft_model(base(), LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"]))
with torch.no_grad():
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            p.normal_(0, 0.5)
pm.eval()
pm.save_pretrained(peft_dir)
h_ref, p_ref = outputs(pm)
with torch.no_grad():
    h_base = outputs(base())[0]
if (h_ref - h_base).abs().max().item() < 1e-3:
    fails.append("(a) PEFT's adapter changes nothing")
w = torch.sin(0.37 * torch.arange(h_ref.numel(), dtype=torch.float32) + 0.1).view_as(h_ref)
(h_ref * w).sum().backward()
h, p, grads = run_tool(peft_dir)
check("(a) PEFT adapter in caccel: last_hidden_state", h, h_ref.detach())
check("(a) PEFT adapter in caccel: pooler_output", p, p_ref.detach())
want = {n.replace("base_model.model.", "").replace(".default", ""): q.grad for n, q in pm.named_parameters()
        if q.requires_grad}
if sorted(grads) != sorted(want):
    fails.append("gradient names: caccel %s, PEFT %s" % (sorted(grads), sorted(want)))
for n in sorted(want):
    if n in grads:
        check("(e) gradient of %s" % n, grads[n].view_as(want[n]), want[n], 1e-4)

# (b): caccel's adapter into PEFT
h, p, _ = run_tool("new:" + tmp + "/mine")
print(open(tmp + "/mine/adapter_config.json").read())
mine = PeftModel.from_pretrained(base(), tmp + "/mine").eval()
with torch.no_grad():
    h_ref2, p_ref2 = outputs(mine)
check("(b) caccel adapter in PEFT: last_hidden_state", h, h_ref2)
check("(b) caccel adapter in PEFT: pooler_output", p, p_ref2)
if (h_ref2 - outputs(base())[0].detach()).abs().max().item() < 1e-4:
    fails.append("(b) caccel's adapter changes nothing (lora_B zero?)")

# (d): merged weights
merged = pm.merge_and_unload().state_dict()
subprocess.run([tool, "merge", base_dir, peft_dir, tmp + "/merged"], check=True)
r = subprocess.run([cli, "merge-weights", "--adapter", peft_dir, base_dir, tmp + "/cli"], capture_output=True, text=True)
print(r.stdout.strip(), r.stderr.strip())
if r.returncode != 0:
    fails.append("caccel merge-weights --adapter exit %d" % r.returncode)
for d in ["merged", "cli"]:
    if not os.path.exists(tmp + "/" + d + "/model.safetensors"):
        fails.append(d + ": no model.safetensors")
        continue
    got = load_file(tmp + "/" + d + "/model.safetensors")
    for n, w in merged.items():
        if n not in got:
            if n != "embeddings.position_ids":
                fails.append("%s: %s missing" % (d, n))
            continue
        rel = (got[n] - w).abs().max().item() / max(w.abs().max().item(), 1e-30)
        if rel > 1e-6:
            fails.append("(d) %s: %s differs by %.3g" % (d, n, rel))
    print("(d) %s: %d tensors equal PEFT's merge_and_unload" % (d, len(merged)))
    with torch.no_grad():
        check("(d) %s loaded by transformers" % d, outputs(BertModel.from_pretrained(tmp + "/" + d).eval())[0],
              h_ref.detach())
if fails:
    sys.exit("FAIL: " + "; ".join(fails))
print("ok")
PY
