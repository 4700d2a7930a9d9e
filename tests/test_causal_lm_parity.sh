#!/bin/sh
# caccel's decoder LMs (Llama, Qwen2, Mistral) against transformers on tiny random models made on
# the spot: logits with and without a padding mask, the loss with ignored labels, every gradient,
# the files caccel writes loading in from_pretrained, a sharded checkpoint loading in caccel
# (tests/causal_lm_reference.py says what and prints each relative difference; bound 1e-4).
# SKIP (77) without a python3 that imports torch and transformers.
set -eu
build=${CACCEL_TEST_BUILDDIR:-.}
srcdir=${CACCEL_TEST_SRCDIR:-${srcdir:-.}}
py=""
for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, transformers, safetensors' 2>/dev/null; then
        py=$p; break
    fi
done
if [ -z "$py" ]; then
    echo "SKIP: no python3 with torch, transformers and safetensors (tools/install-deps.sh --test installs them)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" "$srcdir/tests/causal_lm_reference.py" "$build/tests/causal_lm_tool" "$tmp"
echo "ok: decoder LM parity with transformers"
