#!/usr/bin/env bash
# Installs the Debian packages caccel builds, tests and trains with (skips what is already there).
# --test adds what only the tests use: Slurm and munge (tests/dist/slurm.sh runs its own one-node
# cluster), OpenSSH (tests/dist/hostfile_netns.sh runs an sshd per network namespace), Debian's PyTorch, and Python's safetensors and tokenizers (and transformers and peft for Debian's
# python) from PyPI.
set -euo pipefail
tests=false
[ "${1:-}" = "--test" ] && tests=true
pkgs=(build-essential autoconf automake libtool libtool-bin pkg-config
      libopenblas-dev libopenblas-openmp-dev libyaml-dev zlib1g-dev libjson-c-dev libutf8proc-dev libpcre2-dev libhwloc-dev libcmocka-dev
      libopenmpi-dev openmpi-bin libgloo-dev libprotobuf-c-dev protobuf-c-compiler
      libdnnl2 dataset-fashion-mnist fortunes iproute2 procps valgrind tmux
      clang libclang-rt-14-dev)   # clang's libFuzzer: configure CC=clang --enable-fuzzing (tests/fuzz)
$tests && pkgs+=(python3-torch python3-numpy slurm-wlm munge openssh-server openssh-client)   # ssh: tests/dist/hostfile*.sh
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    # munge's postinst starts the system's munged (slurmd's and slurmctld's start theirs where an
    # /etc/slurm/slurm.conf exists), also in a container without an init: while installing, a
    # policy-rc.d refuses every start. tests/dist/slurm.sh starts its own daemons, configured its way.
    if [[ " ${missing[*]} " =~ \ (munge|slurm-wlm)\  ]] && [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\n# installing caccel test dependencies: no service starts\nexit 101\n' |
            $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod 755 /usr/sbin/policy-rc.d
        trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
$tests || exit 0
# The checkpoint interop test compares with Python's reference safetensors package; it is optional
# (the test skips without it), so an unreachable PyPI never fails the install.
if command -v python3 >/dev/null && ! python3 -c 'import safetensors, numpy' 2>/dev/null; then
    python3 -m pip --version >/dev/null 2>&1 && { python3 -m pip install -q safetensors numpy || true; }
fi
# The PyTorch interop test loads caccel's files with safetensors.torch when Debian's python (which
# has python3-torch) has the package; --user keeps it out of the system's directories.
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null &&
   ! /usr/bin/python3 -c 'import safetensors' 2>/dev/null; then
    /usr/bin/python3 -m pip install -q --user --break-system-packages safetensors 2>/dev/null || true
fi
# The BERT parity tests use Hugging Face's transformers for the python with torch (the last
# release series that supports Debian's torch 1.13); without it they use a hand-written reference.
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null &&
   ! /usr/bin/python3 -c 'import transformers' 2>/dev/null; then
    /usr/bin/python3 -m pip install -q --user --break-system-packages 'transformers<4.40' 2>/dev/null || true
fi
# The LoRA parity tests compare with PEFT on the same python: peft 0.10 with an accelerate that still
# takes torch 1.13 (an unpinned accelerate would pull a new torch of several GB into the user site).
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch, transformers' 2>/dev/null &&
   ! /usr/bin/python3 -c 'import peft' 2>/dev/null; then
    /usr/bin/python3 -m pip install -q --user --break-system-packages 'peft==0.10.0' 'accelerate<0.30' 2>/dev/null || true
fi
# The TensorBoard test reads caccel's event files back with TensorBoard's own reader; optional in
# the same way (the test skips without it).
if command -v python3 >/dev/null && ! python3 -c 'import tensorboard' 2>/dev/null; then
    python3 -m pip --version >/dev/null 2>&1 &&
        { python3 -m pip install -q --user --break-system-packages tensorboard 2>/dev/null || true; }
fi
# The MLflow test reads caccel's file store back with MLflow's client; optional in the same way.
if command -v python3 >/dev/null && ! python3 -c 'import mlflow' 2>/dev/null; then
    python3 -m pip --version >/dev/null 2>&1 &&
        { python3 -m pip install -q --user --break-system-packages mlflow-skinny 2>/dev/null || true; }
fi
# The tokenizer parity tests (WordPiece and BPE) compare with Hugging Face's `tokenizers`; optional in
# the same way. The BPE test trains its tokenizer.json files with it; any version from 0.15 on.
if command -v python3 >/dev/null && ! python3 -c 'import tokenizers' 2>/dev/null; then
    python3 -m pip --version >/dev/null 2>&1 && { python3 -m pip install -q tokenizers || true; }
fi
exit 0
