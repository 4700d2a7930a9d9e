#!/bin/sh
# caccel's BPE tokenizer against Hugging Face's `tokenizers`, both loading the same tokenizer.json
# files, which tests/tokenizer_bpe_cases.py trains with tokenizers on the fortunes (every entry
# of every collection of Debian's fortunes package) in the shapes of GPT-2, RoBERTa, Llama 3,
# Qwen2, Llama 2 (new and old file) and Mistral: the ids (untruncated; and with the template, truncated
# and padded, single and paired) are equal on every entry and on hand-picked hard cases (invalid
# UTF-8 refused where Python cannot decode it, combining marks, emoji and ZWJ sequences, CJK,
# long words, runs of spaces and newlines, special tokens inside text, the empty string), and
# ca_tokenizer_decode gives tokenizers' decode of the same ids, with and without special tokens.
# Under the sanitizers, four collections instead of every one.
# SKIP (77), with the reason, without python3 + tokenizers or Debian's fortunes package.
set -eu
build=${CACCEL_TEST_BUILDDIR:-.}
src=${CACCEL_TEST_SRCDIR:-.}
tool="$build/tests/text_tool"
if ! python3 -c 'import tokenizers' 2>/dev/null; then
    echo "SKIP: python3 with Hugging Face's tokenizers package is needed (pip install tokenizers)"
    exit 77
fi
fdir=${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}
if [ ! -f "$fdir/science" ]; then
    echo "SKIP: no fortune files in $fdir: install the Debian package fortunes"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/caccel-bpe-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 -c 'import tokenizers; print("tokenizers", tokenizers.__version__)'
# Every collection (the files without an extension; .dat and .u8 are strfile's).
colls=$(cd "$fdir" && ls | grep -v '\.')
# Under the sanitizers (CACCEL_TEST_SANITIZED=yes) four collections of unlike text (prose, shell
# snippets, pictures drawn in characters, other languages' letters) instead of all: the tokenizer's
# code paths are the same, at a sixth of the text.
if [ "${CACCEL_TEST_SANITIZED:-no}" = yes ]; then
    colls=$(for c in science linux ascii-art translate-me; do [ -f "$fdir/$c" ] && echo "$c"; done)
fi
# shellcheck disable=SC2086
"$tool" fortunes "$fdir" $colls > "$tmp/entries.txt"
python3 "$src/tests/tokenizer_bpe_cases.py" "$tmp"
for tok in gpt2 gpt2p llama3 qwen2 llama2 llama2n mistral; do
    for run in fortunes:0 fortunes:64 cases:0 cases:64 cases:8 pairs:64 pairs:8; do
        set=${run%:*}; L=${run#*:}
        "$tool" encode "$tmp/$tok.json" "$L" < "$tmp/$set.in" > "$tmp/$set.$L.$tok.out"
    done
    for skip in 0 1; do
        "$tool" decode "$tmp/$tok.json" "$skip" < "$tmp/$tok.decode.in" > "$tmp/$tok.decode.$skip.out"
    done
done
python3 "$src/tests/tokenizer_bpe_cases.py" "$tmp" --compare
