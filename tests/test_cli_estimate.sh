#!/bin/sh
# `caccel estimate-memory`: the figures of a safetensors file and of a sharded index the test
# writes, checked against their parameter counts (Accelerate's formulas: total = 4 bytes a float32
# parameter, training with Adam = 4x that in float32 and 2x in mixed precision; ZeRO's model states),
# the table's layout, the errors; and the all-MiniLM-L6-v2 checkpoint when one is at hand.
set -u

src=${CACCEL_TEST_SRCDIR:-.}
build=${CACCEL_TEST_BUILDDIR:-.}
caccel="$build/tools/caccel"
if [ ! -x "$caccel" ]; then
    echo "SKIP: $caccel not built"
    exit 77
fi
: "$src"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/caccel-estimate-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
expect_text() {
    if grep -F -- "$2" "$1" >/dev/null; then
        echo "ok: output has '$2'"
    else
        fail "output lacks '$2':"
        cat "$1"
    fi
}
# expect_json FILE KEY VALUE: a "key":value pair of the --json output (json-c's pretty spelling)
expect_json() {
    if tr -d ' \n' <"$1" | grep -F -- "\"$2\":$3" >/dev/null; then
        echo "ok: \"$2\":$3"
    else
        fail "no \"$2\":$3 in:"
        cat "$1"
    fi
}

# write_st FILE NAME:D0xD1... ...: a float32 safetensors file (zeros) with those tensors.
write_st() {
    out=$1
    shift
    hdr='{"__metadata__":{"format":"pt"}'
    off=0
    for spec in "$@"; do
        name=${spec%%:*}
        dims=${spec#*:}
        n=1
        for d in $(echo "$dims" | tr x ' '); do n=$((n * d)); done
        end=$((off + 4 * n))
        hdr="$hdr,\"$name\":{\"dtype\":\"F32\",\"shape\":[$(echo "$dims" | tr x ,)],\"data_offsets\":[$off,$end]}"
        off=$end
    done
    hdr="$hdr}"
    while [ $((${#hdr} % 8)) -ne 0 ]; do hdr="$hdr "; done
    len=${#hdr}
    # the header's length as 8 bytes, little-endian (headers here are under 64 KiB)
    printf "\\$(printf %03o $((len % 256)))\\$(printf %03o $((len / 256)))\\000\\000\\000\\000\\000\\000" >"$out"
    printf '%s' "$hdr" >>"$out"
    head -c "$off" /dev/zero >>"$out"
}

# A small BERT-like model: 1000x64 embedding (the largest layer, 64000), two LayerNorm vectors,
# a 256x64 linear layer with its bias, a top-level tensor of 10: 80778 parameters.
write_st "$tmp/model.safetensors" \
    embeddings.word_embeddings.weight:1000x64 embeddings.LayerNorm.weight:64 \
    embeddings.LayerNorm.bias:64 encoder.layer.0.dense.weight:256x64 encoder.layer.0.dense.bias:256 head:10
P=80778

"$caccel" estimate-memory "$tmp/model.safetensors" --json --num_processes 2 >"$tmp/out" 2>&1 ||
    fail "--json exited $?"
expect_json "$tmp/out" parameters $P
expect_json "$tmp/out" largest_layer_name '"embeddings.word_embeddings"'
expect_json "$tmp/out" largest_layer_parameters 64000
# float32: total 4P, largest 4*64000, Adam 16P; ZeRO at 2 processes: 16P, 8P+4P, 4P+6P, 8P
expect_json "$tmp/out" dtype "\"float32\",\"largest_layer\":256000,\"total_size\":$((4 * P)),\"training_adam\":$((16 * P))"
expect_json "$tmp/out" per_process_by_stage "[$((16 * P)),$((12 * P)),$((10 * P)),$((8 * P))]"
# bfloat16/float16 (mixed precision): total 2P, Adam 8P (Accelerate's 2x); ZeRO: 16P, 4P+6P, 2P+7P, 8P
expect_json "$tmp/out" dtype "\"bfloat16\",\"largest_layer\":128000,\"total_size\":$((2 * P)),\"training_adam\":$((8 * P))"
expect_json "$tmp/out" dtype "\"float16\",\"largest_layer\":128000,\"total_size\":$((2 * P)),\"training_adam\":$((8 * P))"
expect_json "$tmp/out" per_process_by_stage "[$((16 * P)),$((10 * P)),$((9 * P)),$((8 * P))]"

# The table, as Accelerate prints it (convert_bytes: 323112 bytes = 315.54 KB, 1292448 = 1.23 MB);
# a relative path keeps the title narrower than the columns.
case $caccel in /*) ;; *) caccel="$(pwd)/$caccel" ;; esac
cd "$tmp" || exit 1
"$caccel" estimate-memory model.safetensors >"$tmp/out" 2>&1 || fail "table exited $?"
expect_text "$tmp/out" "│ dtype  │Largest Layer│Total Size│Training using Adam│"
expect_text "$tmp/out" "│float32 │   250.0 KB  │315.54 KB │      1.23 MB      │"
expect_text "$tmp/out" "│float16 │   125.0 KB  │157.77 KB │     631.08 KB     │"
expect_text "$tmp/out" "│ dtype  │processes│ ZeRO 0│  ZeRO 1 │  ZeRO 2 │  ZeRO 3 │"
expect_text "$tmp/out" "│float32 │    8    │1.23 MB│709.96 KB│433.87 KB│157.77 KB│"
"$caccel" estimate-memory model.safetensors --dtypes int8 int4 >"$tmp/out" 2>&1 || fail "int8 exited $?"
expect_text "$tmp/out" "│ int8│   62.5 KB   │ 78.88 KB │        N/A        │"

# The same model as two shards and an index, given by the index and by its directory.
mkdir -p "$tmp/sharded"
write_st "$tmp/sharded/model-00001-of-00002.safetensors" \
    embeddings.word_embeddings.weight:1000x64 embeddings.LayerNorm.weight:64 embeddings.LayerNorm.bias:64
write_st "$tmp/sharded/model-00002-of-00002.safetensors" \
    encoder.layer.0.dense.weight:256x64 encoder.layer.0.dense.bias:256 head:10
s1=model-00001-of-00002.safetensors s2=model-00002-of-00002.safetensors
cat >"$tmp/sharded/model.safetensors.index.json" <<JSON
{"metadata": {"total_size": $((4 * P))}, "weight_map": {
 "embeddings.word_embeddings.weight": "$s1", "embeddings.LayerNorm.weight": "$s1",
 "embeddings.LayerNorm.bias": "$s1", "encoder.layer.0.dense.weight": "$s2",
 "encoder.layer.0.dense.bias": "$s2", "head": "$s2"}}
JSON
for where in "$tmp/sharded/model.safetensors.index.json" "$tmp/sharded"; do
    "$caccel" estimate-memory "$where" --json >"$tmp/out" 2>&1 || fail "$where exited $?"
    expect_json "$tmp/out" parameters $P
    expect_json "$tmp/out" largest_layer_parameters 64000
done

# Errors name the file and exit 1; bad usage exits 2.
"$caccel" estimate-memory "$tmp/none.safetensors" >"$tmp/out" 2>&1
[ $? -eq 1 ] || fail "a missing file did not exit 1"
expect_text "$tmp/out" "caccel estimate-memory: error: $tmp/none.safetensors: No such file or directory"
printf 'not a model' >"$tmp/bad.safetensors"
"$caccel" estimate-memory "$tmp/bad.safetensors" >"$tmp/out" 2>&1
[ $? -eq 1 ] || fail "a bad file did not exit 1"
expect_text "$tmp/out" "$tmp/bad.safetensors: not a safetensors file"
# A FIFO or /dev/zero in place of the model or its index is refused at once, naming it (a FIFO
# blocked the command for ever).
mkfifo "$tmp/fifo.safetensors" "$tmp/fifo.index.json"
ln -s /dev/zero "$tmp/zero.safetensors"
for f in fifo.safetensors fifo.index.json zero.safetensors; do
    timeout 20 "$caccel" estimate-memory "$tmp/$f" >"$tmp/out" 2>&1
    rc=$?
    [ $rc -eq 1 ] || fail "$f: exit $rc, not 1 (124: it blocked)"
    case $f in fifo*) what="a FIFO" ;; *) what="a character device" ;; esac
    expect_text "$tmp/out" "$tmp/$f: not a regular file ($what)"
done
"$caccel" estimate-memory "$tmp/sharded" --dtypes fp8 >"$tmp/out" 2>&1
[ $? -eq 2 ] || fail "--dtypes fp8 did not exit 2"
expect_text "$tmp/out" "--dtypes: unknown dtype 'fp8'"
# an index that stops early: the reason in words (json-c's last error said "continue")
mkdir -p "$tmp/cut"
printf '{"weight_map": {' >"$tmp/cut/model.safetensors.index.json"
"$caccel" estimate-memory "$tmp/cut" >"$tmp/out" 2>&1
[ $? -eq 1 ] || fail "a truncated index did not exit 1"
expect_text "$tmp/out" "$tmp/cut/model.safetensors.index.json: cannot read the index: unexpected end of input at byte 16"
mkdir -p "$tmp/empty"
"$caccel" estimate-memory "$tmp/empty" >"$tmp/out" 2>&1
expect_text "$tmp/out" "holds neither model.safetensors nor model.safetensors.index.json"

# 200,000 tensors (50,000 blocks of attn.weight 2, attn.bias 1, mlp.weight 3 (9 in block 31337)
# and a scale of 1 that the block holds itself, so the block has submodules and is not a layer):
# the largest layer is found in n log n. Comparing every tensor with every other took 93 s for
# 100,000 tensors, so with the old code this check alone runs for many minutes.
awk 'BEGIN {
    printf "{\"__metadata__\":{\"format\":\"pt\"}"
    off = 0
    for (i = 0; i < 50000; i++) {
        split("attn.weight attn.bias mlp.weight scale", t, " ")
        split("2 1 3 1", d, " ")
        if (i == 31337) d[3] = 9
        for (j = 1; j <= 4; j++) {
            printf ",\"layers.%d.%s\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%d,%d]}", i, t[j], d[j], off, off + 4 * d[j]
            off += 4 * d[j]
        }
    }
    printf "}"
}' >"$tmp/big.json"
len=$(wc -c <"$tmp/big.json")
pad=$(((8 - len % 8) % 8))
len=$((len + pad))
for i in 0 1 2 3 4 5 6 7; do printf "\\$(printf %03o $((len >> (8 * i) & 255)))"; done >"$tmp/big.safetensors"
cat "$tmp/big.json" >>"$tmp/big.safetensors"
printf '%*s' "$pad" '' >>"$tmp/big.safetensors"
head -c $((4 * 350006)) /dev/zero >>"$tmp/big.safetensors"
t0=$(date +%s)
"$caccel" estimate-memory "$tmp/big.safetensors" --json >"$tmp/out" 2>&1 || fail "200,000 tensors: exited $?"
echo "note: 200,000 tensors estimated in $(($(date +%s) - t0)) s"
expect_json "$tmp/out" parameters 350006
expect_json "$tmp/out" largest_layer_name '"layers.31337.mlp"'
expect_json "$tmp/out" largest_layer_parameters 9

# all-MiniLM-L6-v2: 22713216 parameters of BertModel (embeddings 11918592, 6 layers of 1774464,
# pooler 147840) and its saved position_ids buffer (512).
if [ -n "${CACCEL_MINILM_DIR:-}" ] && [ -f "$CACCEL_MINILM_DIR/model.safetensors" ]; then
    "$caccel" estimate-memory "$CACCEL_MINILM_DIR" --json >"$tmp/out" 2>&1 || fail "MiniLM exited $?"
    expect_json "$tmp/out" parameters $((22713216 + 512))
    expect_json "$tmp/out" largest_layer_parameters $((30522 * 384))
else
    echo "note: CACCEL_MINILM_DIR unset: the MiniLM checkpoint's figures were not checked"
fi

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all estimate-memory checks passed"
