"""The Python side of tests/test_tokenizer_parity.sh.

tokenizer_cases.py TMP TOKENIZER_JSON  writes TMP/{fortunes,cases,pairs}.in (hex lines), the
                                       vocabulary as TMP/vocab.txt, and TMP/cased.json and
                                       TMP/raw.json (BertWordPieceTokenizer with other flags)
tokenizer_cases.py TMP --compare       compares TMP/SET.L.TOK.out with Hugging Face's encodings
"""
import sys

from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

RUNS = [("fortunes", 0), ("fortunes", 128), ("cases", 0), ("cases", 128), ("cases", 16),
        ("pairs", 128), ("pairs", 16)]

CASES = [
    "", " ", "\t\n\r  ", "a", "Hello, World!", "HeLLo WORLD hello world",
    # accents: NFD + dropping Mn, before lower-casing
    "Héllo Wörld! Ça va? naïve café résumé façade coöperate", "ÀÉÎÕÜ ñÑ ÅåØø Æ æ ß ẞ",
    "İstanbul IĞDIR ı", "ǅ ǈ ǋ ﬁ ﬂ ﬀ Å Ω K", "Ⅻ ⓐ ①", "a\u0301 e\u0300\u0323 o\u0308\u0304",
    # scripts: CJK split per character, Hangul decomposed by NFD, combining marks stripped
    "我爱北京天安门 漢字かな交じり文 カタカナ ｶﾀｶﾅ", "\uf900\uf901 \U00020000 \u3400 \u2f800",
    "한국어 텍스트 한글", "ΣΊΣΥΦΟΣ ὁ λόγος Ἀθῆναι", "Привет, мир! Ёлка ёж", "مَرْحَبًا بِالْعَالَم",
    "नमस्ते दुनिया", "สวัสดีครับ", "שָׁלוֹם", "ᲐᲑᲒ ა", "Ꭰ ꭰ",
    # punctuation: ASCII symbols and Unicode P*, not S*
    "Hello,world!!!...(a)[b]{c} $5+3=8 ^_^ `~| \\ @#%&* <html> a-b_c/d",
    "«quotes» — dash – ‘single’ “double” …¿¡ ‹›„ 、。「」！？ ·•", "© ® ™ € £ ¥ § ¶ ° ± × ÷ ← ∑ ∞",
    "don't won't it's rock'n'roll O'Neil e.g. U.S.A. 3.14159 1,000,000 2024-01-01 10:30am",
    # words at and past max_input_chars_per_word (100), and long WordPiece chains
    "a" * 99, "a" * 100, "a" * 101, "x" * 500, "antidisestablishmentarianism" * 3,
    "supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
    "ab" * 50 + " " + "é" * 100 + " " + "é" * 101,
    # control and format characters, odd whitespace
    "a\x01b\x7fc\x1bd", "tab\there", "zero\u200bwidth soft\u00adhyphen bom\ufeffx",
    "line\u2028sep para\u2029x nbsp\u00a0x ideo\u3000space em\u2003space", "\x0b\x0cvertical\x85next",
    "rep\ufffdchar private\ue000use unassigned\u0378x a \u0378 b \ufffe \U000e0001tag", "_\bu_\bn_\bd_\be_\br_\bl_\bi_\bn_\be",
    "dir\u200emarks\u200f and \u2066isolates\u2069", "many     spaces\n\n\nand\tlines",
    # emoji: symbols (So, [UNK]), variation selector (Mn, dropped), modifiers
    "😀 👍🏽 ❤️ 🥰 🫠 👨‍👩‍👧", "☃ ♥ ★ ✓",
    # special tokens in the raw text
    "hello [CLS] wor[SEP]ld [cls] [MASK][PAD]", "[UNK]", "[[SEP]]", "[SEP", "[CLS][CLS]",
]

PAIRS = [
    ("How old are you?", "I am 6 years old."), ("", ""), ("", "only b"), ("only a", ""),
    ("a " * 20, "b " * 3), ("a " * 3, "b " * 20), ("a " * 20, "b " * 20), ("a " * 7, "b " * 7),
    ("a " * 6, "b " * 7), ("Héllo [SEP] wörld", "我爱 Σ"),
]


def hexline(s):
    return s.encode("utf-8").hex() or "-"


def prepare(tmp, path):
    import json
    vocab = json.load(open(path, encoding="utf-8"))["model"]["vocab"]
    with open(tmp + "/vocab.txt", "w", encoding="utf-8") as out:
        for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
            out.write(token + "\n")
    # BertProcessing instead of TemplateProcessing, and the normaliser's flags the model lacks.
    BertWordPieceTokenizer(tmp + "/vocab.txt", lowercase=False).save(tmp + "/cased.json")
    BertWordPieceTokenizer(tmp + "/vocab.txt", lowercase=True, strip_accents=False,
                           handle_chinese_chars=False, clean_text=False).save(tmp + "/raw.json")
    with open(tmp + "/entries.txt") as f, open(tmp + "/fortunes.in", "w") as out:
        for line in f:
            out.write(line.split()[2] + "\n")
    with open(tmp + "/cases.in", "w") as out:
        for c in CASES:
            out.write(hexline(c) + "\n")
    with open(tmp + "/pairs.in", "w") as out:
        for a, b in PAIRS:
            out.write(hexline(a) + " " + hexline(b) + "\n")


def reference(tok, line, L):
    parts = [bytes.fromhex(p if p != "-" else "").decode("utf-8") for p in line.split()]
    if L == 0:
        tok.no_truncation()
        tok.no_padding()
        return " ".join(map(str, tok.encode(parts[0], add_special_tokens=False).ids))
    tok.enable_truncation(max_length=L)
    tok.enable_padding(length=L)
    e = tok.encode(*parts)
    return ";".join(" ".join(map(str, v)) for v in (e.ids, e.type_ids, e.attention_mask))


def compare(tmp):
    # The reference for vocab.txt is the model's tokenizer.json it was written from.
    refs = {"model.json": "model.json", "vocab.txt": "model.json", "cased.json": "cased.json",
            "raw.json": "raw.json"}
    bad = 0
    for src, ref in refs.items():
        tok = Tokenizer.from_file(tmp + "/" + ref)
        for name, L in RUNS:
            inputs = open("%s/%s.in" % (tmp, name)).read().split("\n")[:-1]
            got = open("%s/%s.%d.%s.out" % (tmp, name, L, src)).read().split("\n")[:-1]
            assert len(got) == len(inputs), (name, L, src, len(got), len(inputs))
            diff = 0
            for line, g in zip(inputs, got):
                want = reference(tok, line, L)
                if g != want:
                    diff += 1
                    if diff <= 5:
                        text = [bytes.fromhex(p if p != "-" else "").decode() for p in line.split()]
                        print("MISMATCH %s L=%d (%s): %r\n  caccel: %s\n  hf:     %s"
                              % (name, L, src, text, g, want))
            print("%-10s %-8s max_length %3s: %5d inputs, %d differ"
                  % (src, name, L or "-", len(inputs), diff))
            bad += diff
    if bad:
        sys.exit("FAIL: %d encodings differ from Hugging Face tokenizers" % bad)
    print("all encodings equal Hugging Face tokenizers'")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "--compare":
        compare(sys.argv[1])
    else:
        prepare(sys.argv[1], sys.argv[2])
