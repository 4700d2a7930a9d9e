#!/bin/sh
# caccel's WordPiece tokenizer against Hugging Face's `tokenizers`, both loading the same
# tokenizer.json (all-MiniLM-L6-v2's, bert-base-uncased's vocabulary): input ids, token type ids and
# attention masks are equal on every entry of the fortunes collections the dataset uses (at the
# dataset's max_length 128, and untruncated), and on hand-picked hard cases, single and paired;
# also with the vocabulary as vocab.txt and with other normaliser flags.
# SKIP (77), with the reason, without python3 + tokenizers, the model files
# (tools/fetch-minilm.sh) or Debian's fortunes package.
set -eu
build=${CACCEL_TEST_BUILDDIR:-.}
src=${CACCEL_TEST_SRCDIR:-.}
tool="$build/tests/text_tool"
if ! python3 -c 'import tokenizers' 2>/dev/null; then
    echo "SKIP: python3 with Hugging Face's tokenizers package is needed (pip install tokenizers)"
    exit 77
fi
model=""
for d in "${CACCEL_MINILM_DIR:-}" "${CACCEL_DATA_DIR:+$CACCEL_DATA_DIR/all-minilm-l6-v2}" \
         "$build/data/all-minilm-l6-v2"; do
    if [ -n "$d" ] && [ -f "$d/tokenizer.json" ]; then model=$d; break; fi
done
if [ -z "$model" ]; then
    echo "SKIP: no all-MiniLM-L6-v2 tokenizer.json: run tools/fetch-minilm.sh (it writes" \
         "\$CACCEL_DATA_DIR/all-minilm-l6-v2, else ./data/all-minilm-l6-v2 in the build)"
    exit 77
fi
fdir=${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}
if [ ! -f "$fdir/science" ]; then
    echo "SKIP: no fortune files in $fdir: install the Debian package fortunes"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/caccel-tok-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "tokenizer: $model/tokenizer.json; fortunes: $fdir"

"$tool" fortunes "$fdir" > "$tmp/entries.txt"
"$tool" dataset "$model" "$fdir"
python3 "$src/tests/tokenizer_cases.py" "$tmp" "$model/tokenizer.json"
# Runs: fortunes and single hard cases untruncated (0), at 128 and at 16; pairs at 128 and 16.
# Tokenizers: the model's tokenizer.json; the same vocabulary as a vocab.txt; and two
# tokenizer.json files the script writes with Hugging Face's BertWordPieceTokenizer (BertProcessing
# instead of the template; cased / no CJK splitting / no cleaning), to cover the flags.
cp "$model/tokenizer.json" "$tmp/model.json"
for tok in model.json vocab.txt cased.json raw.json; do
    for run in fortunes:0 fortunes:128 cases:0 cases:128 cases:16 pairs:128 pairs:16; do
        set=${run%:*}; L=${run#*:}
        "$tool" encode "$tmp/$tok" "$L" < "$tmp/$set.in" > "$tmp/$set.$L.$tok.out"
    done
done
python3 "$src/tests/tokenizer_cases.py" "$tmp" --compare
