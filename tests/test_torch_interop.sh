#!/bin/sh
# A model trained by caccel, evaluated by PyTorch. examples/fashion_mnist trains one epoch and saves
# the model (--output_dir); PyTorch builds the same MLP (nn.Sequential with caccel's child names:
# flatten, fc1, relu1, fc2, relu2, fc3), loads the file with load_state_dict(strict=True) and
# evaluates it on the Fashion-MNIST test set, scaled by 1/255 as the example's loader does.
#
# Bound: the two agree on the number of correct predictions within 5 of 10000 (0.05 points).
# Both evaluate the same f32 weights; only the order of the sums inside the GEMMs differs (a
# relative difference of a few 1e-7 in the logits), which can flip a prediction whose two top
# logits tie to that precision. Observed: identical counts.
#
# Needs a python3 with torch (Debian's python3-torch: /usr/bin/python3). The file is read with
# safetensors.torch when that python has it, else with a reader of the documented format
# (tests/torch_reference.py); the reference package is checked by test_safetensors_interop.sh. SKIP (77)
# without torch or the dataset.
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
srcdir=${CACCEL_TEST_SRCDIR:-${srcdir:-.}}
fail() { echo "FAIL: $*"; exit 1; }

py=""
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, numpy' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "SKIP: no python3 with torch and numpy (apt-get install python3-torch)"; exit 77; }
data=${CACCEL_DATA_DIR:+$CACCEL_DATA_DIR/fashion-mnist}
[ -n "$data" ] && [ -f "$data/t10k-images-idx3-ubyte.gz" ] || data=/usr/share/datasets/fashion-mnist
[ -f "$data/t10k-images-idx3-ubyte.gz" ] || { echo "SKIP: Fashion-MNIST not found (apt-get install dataset-fashion-mnist)"; exit 77; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-torch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/evaluate.py" <<'PY'
import collections, gzip, sys
import numpy as np
import torch
from torch_reference import load_safetensors

def mlp():
    nn = torch.nn
    return nn.Sequential(collections.OrderedDict([
        ("flatten", nn.Flatten()), ("fc1", nn.Linear(784, 256)), ("relu1", nn.ReLU()),
        ("fc2", nn.Linear(256, 128)), ("relu2", nn.ReLU()), ("fc3", nn.Linear(128, 10))]))

def test_set(d):
    with gzip.open(d + "/t10k-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(d + "/t10k-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    return torch.from_numpy(x.astype(np.float32) * np.float32(1.0 / 255.0)), torch.from_numpy(y.astype(np.int64))

path, data = sys.argv[1], sys.argv[2]
model = mlp()
state, how = load_safetensors(path)
model.load_state_dict(state, strict=True)
print("loaded with", how, file=sys.stderr)
model.eval()
x, y = test_set(data)
with torch.no_grad():
    correct = int((model(x).argmax(1) == y).sum())
print(correct)
PY

# 1. caccel trains and saves; PyTorch loads and evaluates.
out=$("$b/examples/fashion_mnist" --cpu --epochs 1 --output_dir "$WORK/caccel" 2>&1) || { echo "$out"; fail "fashion_mnist exited non-zero"; }
acc=$(echo "$out" | sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' | tail -1)
[ -n "$acc" ] && [ -f "$WORK/caccel/model.safetensors" ] || { echo "$out"; fail "no accuracy line or no model file"; }
ours=$(awk -v a="$acc" 'BEGIN { printf "%d", a * 100 + 0.5 }')
theirs=$(PYTHONPATH="$srcdir/tests" "$py" "$WORK/evaluate.py" "$WORK/caccel/model.safetensors" "$data") || fail "PyTorch could not load or evaluate caccel's model"
echo "caccel: $ours of 10000 correct; PyTorch on caccel's file: $theirs"
d=$((ours - theirs)); [ $d -lt 0 ] && d=$((-d))
[ $d -le 5 ] || fail "PyTorch's accuracy on caccel's model differs by $d predictions (bound 5)"
echo "PASS: PyTorch loads caccel's model and evaluates it to the same accuracy"
