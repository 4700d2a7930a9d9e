#!/usr/bin/env bash
# Installs what caccel needs (Debian packages), builds it in _build/, and trains the Fashion-MNIST
# MLP on the CPU. Arguments go to the example: tools/quickstart.sh --epochs 10 --mixed_precision bf16
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
tools/install-deps.sh
if [ ! -x _build/examples/fashion_mnist ] || [ -n "$(find base config core comm tensor nn data accelerator backends collectives include examples tools \
        -newer _build/examples/fashion_mnist -name '*.[ch]' -print -quit 2>/dev/null)" ]; then
    [ -x configure ] || ./bootstrap >/dev/null
    mkdir -p _build
    echo "building caccel in _build/ (log: _build/build.log)"
    (cd _build && { { [ -f Makefile ] || ../configure -q; } && make -j"$(nproc)"; } > build.log 2>&1) ||
        { tail -40 _build/build.log; echo "quickstart: the build failed (full log: _build/build.log)"; exit 1; }
fi
exec _build/examples/fashion_mnist "$@"
