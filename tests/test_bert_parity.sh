#!/bin/sh
# caccel's BertModel against PyTorch on the same checkpoint (all-MiniLM-L6-v2, tools/fetch-minilm.sh)
# and the same token ids: last_hidden_state and pooler_output agree within 1e-4 of the largest
# reference activation (max abs difference / max abs value), on 4 sequences of 48 tokens with
# padding of different lengths and both token types. The reference is Hugging Face transformers'
# BertModel (eager attention) when /usr/bin/python3 (or python3) imports it, else the hand-written
# PyTorch BertModel of tests/bert_reference.py (CACCEL_BERT_REFERENCE=hand forces it); the log
# says which and prints the differences.
# SKIP (77) without torch or the model files.
set -eu
build=${CACCEL_TEST_BUILDDIR:-.}
srcdir=${CACCEL_TEST_SRCDIR:-${srcdir:-.}}
tool="$build/tests/bert_tool"
model=""
for d in "${CACCEL_MINILM_DIR:-}" "${CACCEL_DATA_DIR:+$CACCEL_DATA_DIR/all-minilm-l6-v2}" \
         "$build/data/all-minilm-l6-v2"; do
    if [ -n "$d" ] && [ -f "$d/model.safetensors" ]; then model=$d; break; fi
done
if [ -z "$model" ]; then
    echo "SKIP: no all-MiniLM-L6-v2 checkpoint: run tools/fetch-minilm.sh"
    exit 77
fi
py=""
for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, safetensors' 2>/dev/null; then py=$p; break; fi
done
if [ -z "$py" ]; then
    echo "SKIP: no python3 with torch and safetensors (tools/install-deps.sh --test installs them)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PYTHONPATH="$srcdir/tests" "$py" - "$tool" "$model" "$tmp" <<'PY'
import subprocess, sys
import numpy as np, torch
import bert_reference as ref
tool, model, tmp = sys.argv[1:4]
torch.manual_seed(0)
b, length = 4, 48
ids = torch.randint(1000, 30000, (b, length))
mask = torch.ones(b, length, dtype=torch.long)
types = torch.zeros(b, length, dtype=torch.long)
for i, n in enumerate([48, 30, 9, 2]):
    ids[i, 0], ids[i, n - 1] = 101, 102
    ids[i, n:], mask[i, n:] = 0, 0
types[1, 15:30] = 1
np.concatenate([[b, length], ids.flatten(), mask.flatten(), types.flatten()]).astype("<i8").tofile(tmp + "/in")
print(subprocess.run([tool, "forward", model, tmp + "/in", tmp + "/out"], check=True,
                     capture_output=True, text=True).stdout.strip())
out = np.fromfile(tmp + "/out", dtype="<f4")
hidden_ref, pooled_ref = ref.bert_outputs(model, ids, mask, types)
h = torch.from_numpy(out[: hidden_ref.numel()].copy()).view_as(hidden_ref)
p = torch.from_numpy(out[hidden_ref.numel():].copy()).view_as(pooled_ref)
ok = True
for name, got, want in [("last_hidden_state", h, hidden_ref), ("pooler_output", p, pooled_ref)]:
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    rel = diff / max(scale, 1e-30)
    print("%s %s: max abs diff %.3g, max abs value %.3g, relative %.3g (bound 1e-4)" %
          (name, list(want.shape), diff, scale, rel))
    ok = ok and rel <= 1e-4
print("reference:", ref.which())
sys.exit(0 if ok else 1)
PY
echo "ok: BertModel parity on $model"
