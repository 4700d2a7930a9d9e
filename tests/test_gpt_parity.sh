#!/bin/sh
# examples/gpt against a hand-written PyTorch GPT (nanoGPT's structure and names) on the same
# weights and tokens. caccel writes the initial weights of a small model (2 layers, 4 heads, 64
# channels, T 32, batch 4, dropout 0) to model.safetensors, and the first training batch, its
# logits, its loss and every parameter's gradient (--parity_dir); PyTorch loads the weights with
# load_state_dict(strict=True), runs the same batch and compares.
#
# Tolerance: both compute in f32; only the order of sums differs (GEMM blocking, the fused
# attention's online softmax, LayerNorm's reductions). The weights are drawn with std 0.2 (not
# GPT-2's 0.02) and the biases and LayerNorm parameters perturbed, so that activations are of order
# 1 and the attention is far from uniform. Logits (up to about 9): max |diff| <= 1e-4. Loss: |diff|
# <= 1e-5. Gradients: for every tensor, max |diff| <= 2e-5 * max |grad| + 1e-7 (relative to the
# tensor's largest entry: the tensors' gradients differ in scale by orders of magnitude). Measured:
# 5.5e-6, 4.7e-7 and 1.7e-6. The exact GELU in place of the tanh form gives 5.8e-4 on the gradients,
# a causal mask one position off 0.84: both fail. The measured differences are printed.
#
# Needs a python3 with torch and numpy (Debian's python3-torch: /usr/bin/python3) and the fortunes
# package; SKIP (77) otherwise. The model and the safetensors reader are tests/torch_reference.py's
# (the benchmark's PyTorch peer uses the same model).
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
srcdir=${CACCEL_TEST_SRCDIR:-${srcdir:-.}}
fail() { echo "FAIL: $*"; exit 1; }

py=""
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, numpy' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "SKIP: no python3 with torch and numpy (apt-get install python3-torch)"; exit 77; }
fdir=${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}
[ -f "$fdir/science" ] || { echo "SKIP: fortunes not found in $fdir (apt-get install fortunes)"; exit 77; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-gpt-parity.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

"$b/examples/gpt" --cpu --n_layer 2 --n_head 4 --n_embd 64 --block_size 32 --batch_size 4 --dropout 0 --init_std 0.2 \
    --seed 7 --parity_dir "$WORK/p" > "$WORK/out" 2>&1 || { cat "$WORK/out"; fail "gpt --parity_dir exited non-zero"; }
cat "$WORK/out"

cat > "$WORK/ref.py" <<'PY'
import sys
import numpy as np
import torch
import torch.nn.functional as F
from torch_reference import gpt_model, load_safetensors

d, L, H, C, T, B = sys.argv[1], 2, 4, 64, 32, 4

state, _ = load_safetensors(d + "/model.safetensors")
V = state["transformer.wte.weight"].shape[0]
model = gpt_model(L, H, C, T, V)
model.load_state_dict(state, strict=True)
x = torch.from_numpy(np.fromfile(d + "/x.bin", dtype="<i8").reshape(B, T))
y = torch.from_numpy(np.fromfile(d + "/y.bin", dtype="<i8").reshape(B, T))
logits = model(x)
loss = F.cross_entropy(logits.view(-1, V), y.view(-1))
loss.backward()

ok = True
c_logits = torch.from_numpy(np.fromfile(d + "/logits.bin", dtype="<f4").reshape(B, T, V))
dl = (c_logits - logits.detach()).abs().max().item()
c_loss = float(open(d + "/loss.txt").read())
dloss = abs(c_loss - loss.item())
print("logits: max |diff| %.3g (tolerance 1e-4; max |logit| %.3g)" % (dl, logits.abs().max().item()))
print("loss: caccel %.7f, PyTorch %.7f, |diff| %.3g (tolerance 1e-5)" % (c_loss, loss.item(), dloss))
ok = dl <= 1e-4 and dloss <= 1e-5
grads = np.fromfile(d + "/grads.bin", dtype="<f4")
params = dict(model.named_parameters())
off, worst, n = 0, 0.0, 0
for line in open(d + "/grads.txt"):
    name, numel = line.split()
    numel = int(numel)
    p = params.pop(name)
    g = torch.from_numpy(grads[off:off + numel].copy()).reshape(p.shape)
    off += numel
    diff, scale = (g - p.grad).abs().max().item(), p.grad.abs().max().item()
    rel = diff / (scale + 1e-30)
    worst = max(worst, rel)
    n += 1
    if diff > 2e-5 * scale + 1e-7:
        ok = False
        print("gradient of %s: max |diff| %.3g, max |grad| %.3g: beyond tolerance" % (name, diff, scale))
assert off == grads.size and not params, ("gradients missing or extra", list(params))
print("gradients: %d tensors, largest max |diff| / max |grad| %.3g (tolerance 2e-5)" % (n, worst))
sys.exit(0 if ok else 1)
PY
PYTHONPATH="$srcdir/tests" "$py" "$WORK/ref.py" "$WORK/p" || fail "caccel's GPT differs from the PyTorch reference beyond the tolerance"
echo "PASS: logits, loss and gradients equal PyTorch's within the tolerance"
