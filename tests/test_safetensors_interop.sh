#!/bin/sh
# caccel's model files against Python's reference `safetensors` package: Python reads the file
# ca_save_model writes (same names, dtypes, shapes and bytes), and ca_load_model reads a file that
# safetensors.numpy.save_file writes. SKIP (77) without python3, safetensors or numpy.
set -eu
build=${CACCEL_TEST_BUILDDIR:-.}
prog="$build/tests/test_checkpoint"
if ! python3 -c 'import safetensors, numpy' 2>/dev/null; then
    echo "SKIP: python3 with the safetensors and numpy packages is needed (pip install safetensors numpy)"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/caccel-st-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# 1. caccel writes, Python reads.
"$prog" --save "$tmp" > "$tmp/caccel.txt"
python3 - "$tmp" <<'PY'
import sys
from safetensors.numpy import load_file
d = sys.argv[1]
names = {"f32": "float32", "f16": "float16"}
got = load_file(d + "/model.safetensors")
want = {}
for line in open(d + "/caccel.txt"):
    name, dt, rest = line.split(" ", 2)
    shape, hexdata = rest.rsplit(" ", 1)
    want[name] = (names[dt], eval(shape), hexdata.strip())
assert sorted(got) == sorted(want), (sorted(got), sorted(want))
for name, (dt, shape, hexdata) in want.items():
    a = got[name]
    assert str(a.dtype) == dt, (name, a.dtype, dt)
    assert list(a.shape) == shape, (name, a.shape, shape)
    assert a.tobytes().hex() == hexdata, name
print("python read", len(got), "tensors from caccel's file")
PY

# 2. Python writes (the interop model's names and shapes), caccel reads.
python3 - "$tmp" <<'PY'
import sys
import numpy as np
from safetensors.numpy import save_file
rng = np.random.default_rng(3)
t = {"0.weight": rng.standard_normal((8, 4), dtype=np.float32),
     "0.bias": rng.standard_normal(8, dtype=np.float32),
     "2.weight": rng.standard_normal((3, 8), dtype=np.float32),
     "2.bias": rng.standard_normal(3, dtype=np.float32),
     "scale": np.array([0.25, -1.5, 3.0], dtype=np.float16)}
save_file(t, sys.argv[1] + "/py.safetensors", metadata={"format": "pt"})
with open(sys.argv[1] + "/py.txt", "w") as f:
    for name in ["0.weight", "0.bias", "2.weight", "2.bias", "scale"]:
        a = t[name]
        dt = {"float32": "f32", "float16": "f16"}[str(a.dtype)]
        f.write("%s %s [%s] %s\n" % (name, dt, ", ".join(map(str, a.shape)), a.tobytes().hex()))
PY
"$prog" --dump "$tmp/py.safetensors" > "$tmp/loaded.txt"
sort "$tmp/py.txt" > "$tmp/want.txt"
sort "$tmp/loaded.txt" > "$tmp/got.txt"
if ! cmp -s "$tmp/want.txt" "$tmp/got.txt"; then
    echo "FAIL: caccel loaded other values than Python wrote"; diff "$tmp/want.txt" "$tmp/got.txt" || true
    exit 1
fi
echo "caccel loaded Python's file: same names, dtypes, shapes and bytes"
