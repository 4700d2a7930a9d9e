#!/bin/sh
# The real all-MiniLM-L6-v2 checkpoint directory (tools/fetch-minilm.sh) through caccel's readers:
# config.json loads as BertConfig with the values Hugging Face published (6 layers, 384 hidden,
# 12 heads, 1536 intermediate, 30522 tokens), model.safetensors holds every BertModel tensor with
# the shape that config implies, and the tokenizer loads with bert-base-uncased's special ids.
# SKIP (77) without the model files.
set -eu
build=${CACCEL_TEST_BUILDDIR:-.}
tool="$build/tests/text_tool"
model=""
for d in "${CACCEL_MINILM_DIR:-}" "${CACCEL_DATA_DIR:+$CACCEL_DATA_DIR/all-minilm-l6-v2}" \
         "$build/data/all-minilm-l6-v2"; do
    if [ -n "$d" ] && [ -f "$d/model.safetensors" ]; then model=$d; break; fi
done
if [ -z "$model" ]; then
    echo "SKIP: no all-MiniLM-L6-v2 checkpoint: run tools/fetch-minilm.sh (it writes" \
         "\$CACCEL_DATA_DIR/all-minilm-l6-v2, else ./data/all-minilm-l6-v2 in the build)"
    exit 77
fi
out=$("$tool" bert "$model")
echo "$out"
want_config="config: architectures=BertModel vocab_size=30522 hidden_size=384 num_hidden_layers=6 \
num_attention_heads=12 intermediate_size=1536 hidden_act=gelu max_position_embeddings=512 \
type_vocab_size=2 layer_norm_eps=1e-12 pad_token_id=0 num_labels=2"
# 5 embedding tensors + 16 per layer + the pooler's 2; the one extra is the position_ids buffer.
want_check="checkpoint: prefix='' matched=103 of 103 extra=1 pooler=yes gamma_beta=no"
echo "$out" | grep -qxF "$want_config" || { echo "FAIL: expected: $want_config"; exit 1; }
echo "$out" | grep -qxF "$want_check" || { echo "FAIL: expected: $want_check"; exit 1; }
ids=$(printf '%s\n' "$(printf 'Hello, World!' | od -An -tx1 | tr -d ' \n')" \
    | "$tool" encode "$model" 8 | cut -d';' -f1)
# bert-base-uncased: [CLS] hello , world ! [SEP] [PAD] [PAD]
[ "$ids" = "101 7592 1010 2088 999 102 0 0" ] || { echo "FAIL: ids '$ids'"; exit 1; }
echo "ok: $model"
