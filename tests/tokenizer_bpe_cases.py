"""The Python side of tests/test_tokenizer_bpe_parity.sh.

tokenizer_bpe_cases.py TMP            trains BPE tokenizers with Hugging Face's tokenizers on
                                      TMP/entries.txt (the fortunes, "COLL INDEX HEX" lines) and
                                      writes them as TMP/*.json, the inputs TMP/{fortunes,cases,
                                      pairs}.in (hex lines) and TMP/TOK.decode.in (ids to decode)
tokenizer_bpe_cases.py TMP --compare  compares the C side's TMP/SET.L.TOK.out and TOK.decode.out
                                      with tokenizers' encodings and decodings

The tokenizers, each shaped as a real model family's tokenizer.json:
  gpt2       ByteLevel pre-tokenizer (GPT-2's regex), ByteLevel decoder and post-processor,
             <|endoftext|> special, merges as "a b" strings
  gpt2p      the same with add_prefix_space (RoBERTa-style)
  llama3     Split with Llama 3's regex (Isolated) + ByteLevel(use_regex=false), ignore_merges
             (when this tokenizers has it) with whole words added to the vocabulary without merges,
             special tokens after the vocabulary, <|begin_of_text|> template, merges as [a, b]
             lists (when this tokenizers reads them), added tokens with lstrip / rstrip /
             single_word / normalized
  qwen2      the same vocabulary with Qwen2's regex (single digits), its NFC normaliser, ByteLevel
             post-processor (no BOS) and no ignore_merges
  llama2     SentencePiece-style: Metaspace (prepend_scheme first, split false), byte_fallback
             with <0x00>..<0xFF>, <unk> fused, <s> template, Replace+ByteFallback+Fuse+Strip decoder
  llama2n    the older Llama 2 file: normaliser Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer
  mistral    Metaspace (prepend_scheme always, split true) with its Metaspace decoder, NFC
"""
import json
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TOKS = ["gpt2", "gpt2p", "llama3", "qwen2", "llama2", "llama2n", "mistral"]
RUNS = [("fortunes", 0), ("fortunes", 64), ("cases", 0), ("cases", 64), ("cases", 8),
        ("pairs", 64), ("pairs", 8)]

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]

CASES = [
    "", " ", "  ", "\n", "\n\n\n", "\t\n\r  ", "a", "Hello, World!", "HeLLo WORLD hello world",
    "don't won't it's I'M YOU'LL we'RE they'Ve she'D 'ſ 'S", "rock'n'roll O'Neil e.g. U.S.A.",
    "3.14159 1,000,000 2024-01-01 10:30am 12345678901234567890", "x²³ ½ ٣٤ ⅻ ①",
    # combining marks, NFC / NFD forms
    "e\u0301 \u00e9 a\u0300\u0323 o\u0308\u0304 \u1e9b\u0323", "Ç\u0327 ñ n\u0303 Å A\u030a",
    # emoji and ZWJ sequences, variation selectors, flags, skin tones
    "😀 👍🏽 ❤️ 🥰 🫠 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 🇯🇵", "☃ ♥ ★ ✓ \u2764\ufe0f", "👩🏿‍💻👨‍🚀",
    # scripts
    "我爱北京天安门 漢字かな交じり文 カタカナ ｶﾀｶﾅ", "한국어 텍스트 한글", "ΣΊΣΥΦΟΣ ὁ λόγος",
    "Привет, мир! Ёлка", "مَرْحَبًا بِالْعَالَم", "नमस्ते दुनिया", "สวัสดีครับ", "\U00020000\U0002a6d6",
    # long words and runs
    "a" * 1000, "ab" * 700, "supercalifragilisticexpialidocious" * 20, "é" * 300, "我" * 400,
    " " * 100, "\n" * 100, " \n" * 50, "\t" * 30 + "x", "x" + " " * 57 + "y", "   leading",
    "trailing   ", "a  b   c    d", "line\r\nbreaks\r\n\r\nhere", "!!!???...,,,;;;" * 10,
    # odd whitespace and controls (U+0085 is \s in Oniguruma, U+180E is not; no NUL: a C string
    # ends there)
    "nel\x85x nbsp\u00a0x ideo\u3000y em\u2003z ls\u2028ps\u2029", "mvs\u180e\u180ex \u180e y\u180e",
    "a\x01b\x02c\x7f\x1b[0m\x1f",
    "zero\u200bwidth soft\u00adhyphen bom\ufeffx \u200e\u200f", "\ufffd \ue000 \U0010fffd",
    # special and added tokens inside text
    "hello<|endoftext|>world <|endoftext|> <|endoftext|><|endoftext|>", "<|endoftext",
    "<|begin_of_text|>Hi<|eot_id|> <|start_header_id|>user<|end_header_id|>\n\nyo<|eot_id|>",
    "<s>hello</s> <s> </s><unk> x<s>", "a <mask> b<mask>c   <mask>   d",
    "wordtok xwordtok wordtokx (wordtok) wordtok_", " rtok   next rtok", "<s><s>",
    "In 1776, the U.S. Declaration of Independence: \"We hold these truths...\"",
]

PAIRS = [
    ("How old are you?", "I am 6 years old."), ("", ""), ("", "only b"), ("only a", ""),
    ("a " * 20, "b " * 3), ("a " * 3, "b " * 20), ("Héllo <s> wörld", "我爱 Σ 😀"),
]


def hexline(s):
    return s.encode("utf-8").hex() or "-"


def accepts(d):
    """Whether this tokenizers loads d and keeps what d says (key by key of model)."""
    try:
        back = json.loads(Tokenizer.from_str(json.dumps(d)).to_str())
    except Exception:
        return False
    return all(back["model"].get(k) == v for k, v in d["model"].items() if k != "merges")


def train(entries, pre, special, alphabet=None, vocab=3000, **kw):
    tok = Tokenizer(models.BPE(**kw))
    tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special, show_progress=False,
                                  **(alphabet or {}))
    tok.train_from_iterator(entries, trainer)
    return json.loads(tok.to_str())


def added(id_, content, special=True, **flags):
    d = {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": not special, "special": special}
    d.update(flags)
    return d


def template(bos, bos_id):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


def byte_level(entries):
    alpha = {"initial_alphabet": pre_tokenizers.ByteLevel.alphabet()}
    gpt2 = train(entries, pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"],
                 alphabet=alpha)
    gpt2["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                       "use_regex": True}
    gpt2["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": False, "use_regex": True}
    gpt2["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                               for m in gpt2["model"]["merges"]]
    gpt2p = json.loads(json.dumps(gpt2))
    gpt2p["pre_tokenizer"]["add_prefix_space"] = True
    return gpt2, gpt2p


def llama3(entries):
    from tokenizers import Regex
    split = pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False)
    pre = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                   use_regex=False)])
    d = train(entries, pre, [], alphabet={"initial_alphabet":
                                          pre_tokenizers.ByteLevel.alphabet()})
    vocab = d["model"]["vocab"]
    # Whole words the merges cannot build: ignore_merges takes them as they are.
    for w in ["Ġzqxjkw", "zqxj", "Ġmmmmmmmmmm", "ĠHello,"]:
        vocab.setdefault(w, len(vocab))
    n = len(vocab)
    toks = [added(n + i, s) for i, s in enumerate(LLAMA3_SPECIAL)]
    toks += [added(n + 5, "<mask>", lstrip=True), added(n + 6, "wordtok", single_word=True),
             added(n + 7, " rtok", special=False, rstrip=True, normalized=False),
             added(n + 8, "Ġzqxj", special=False, normalized=True)]
    d["added_tokens"] = toks
    d["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True}
    d["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        template("<|begin_of_text|>", n)]}
    d["model"]["ignore_merges"] = True
    if not accepts(d):
        print("note: this tokenizers has no ignore_merges; llama3 is tested without it")
        d["model"]["ignore_merges"] = False
    lists = json.loads(json.dumps(d))
    lists["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m
                                for m in d["model"]["merges"]]
    if accepts(lists):
        d = lists
    else:
        print("note: this tokenizers reads no [a, b] merges; llama3 keeps \"a b\" strings")
        d["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                                for m in d["model"]["merges"]]
    return d


def sentencepiece(entries):
    pre = pre_tokenizers.Metaspace(replacement="\u2581")
    d = train(entries, pre, ["<unk>", "<s>", "</s>"], byte_fallback=True, unk_token="<unk>",
              fuse_unk=True, alphabet={"limit_alphabet": 120})
    vocab = d["model"]["vocab"]
    for b in range(256):
        vocab.setdefault("<0x%02X>" % b, len(vocab))
    d["model"]["byte_fallback"] = True
    d["model"]["fuse_unk"] = True
    d["added_tokens"] = [added(vocab["<unk>"], "<unk>"), added(vocab["<s>"], "<s>"),
                         added(vocab["</s>"], "</s>")]
    d["normalizer"] = None
    d["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                          "split": False}
    d["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    d["post_processor"] = template("<s>", vocab["<s>"])
    d["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                            for m in d["model"]["merges"]]
    older = json.loads(json.dumps(d))
    older["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    older["pre_tokenizer"] = None
    mistral = json.loads(json.dumps(d))
    mistral["normalizer"] = {"type": "NFC"}
    mistral["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                                "prepend_scheme": "always", "split": True}
    mistral["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                          "split": True}
    return d, older, mistral


def older_metaspace(d):
    """Metaspace as tokenizers before 0.19 writes it: add_prefix_space, no split (always on)."""
    if isinstance(d, dict):
        if d.get("type") == "Metaspace":
            d.pop("split", None)
            d["add_prefix_space"] = True
        for v in d.values():
            older_metaspace(v)
    elif isinstance(d, list):
        for v in d:
            older_metaspace(v)
    return d


def prepare(tmp):
    entries = []
    with open(tmp + "/entries.txt") as f, open(tmp + "/fortunes.in", "w") as out:
        for line in f:
            h = line.split()[2]
            out.write(h + "\n")
            entries.append(bytes.fromhex(h).decode("utf-8"))
    made = dict(zip(["gpt2", "gpt2p"], byte_level(entries)))
    made["llama3"] = llama3(entries)
    qwen2 = json.loads(json.dumps(made["llama3"]))
    qwen2["normalizer"] = {"type": "NFC"}
    qwen2["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2
    qwen2["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False,
                               "trim_offsets": False, "use_regex": False}
    qwen2["model"]["ignore_merges"] = False
    made["qwen2"] = qwen2
    made.update(zip(["llama2", "llama2n", "mistral"], sentencepiece(entries)))
    for name, d in made.items():
        if name in ("llama2", "mistral") and not accepts(d):
            print("note: this tokenizers has no Metaspace split; %s is tested with its older "
                  "Metaspace (add_prefix_space, always split)" % name)
            older_metaspace(d)
            # Its prepend_scheme "first" also put a "▁" after an added token at the start;
            # caccel follows tokenizers 0.19 and later there, so this file says "always".
            if d["pre_tokenizer"]["prepend_scheme"] == "first":
                d["pre_tokenizer"]["prepend_scheme"] = "always"
        with open("%s/%s.json" % (tmp, name), "w", encoding="utf-8") as out:
            json.dump(d, out, ensure_ascii=False)
    cases = [hexline(c) for c in CASES]
    # Bytes Python cannot decode: the C side must refuse them as well.
    cases += ["ff", "c3", "e282", "eda080", "f4908080", "c0af", "61ff62", "f09f98"]
    with open(tmp + "/cases.in", "w") as out:
        out.write("\n".join(cases) + "\n")
    with open(tmp + "/pairs.in", "w") as out:
        for a, b in PAIRS:
            out.write(hexline(a) + " " + hexline(b) + "\n")
    for name in TOKS:
        tok = Tokenizer.from_file("%s/%s.json" % (tmp, name))
        with open("%s/%s.decode.in" % (tmp, name), "w") as out:
            for text in CASES + entries[:3000]:
                out.write(" ".join(map(str, tok.encode(text).ids)) or "-")
                out.write("\n")


def texts(line):
    try:
        return [bytes.fromhex(p if p != "-" else "").decode("utf-8") for p in line.split()]
    except UnicodeDecodeError:
        return None


def reference(tok, line, L, pad):
    parts = texts(line)
    if parts is None:
        return "ERR"
    if L == 0:
        tok.no_truncation()
        tok.no_padding()
        return " ".join(map(str, tok.encode(parts[0], add_special_tokens=False).ids))
    tok.enable_truncation(max_length=L)
    tok.enable_padding(length=L, pad_id=pad, pad_token=tok.id_to_token(pad))
    e = tok.encode(*parts)
    return ";".join(" ".join(map(str, v)) for v in (e.ids, e.type_ids, e.attention_mask))


def compare_encodings(tmp, name):
    tok = Tokenizer.from_file("%s/%s.json" % (tmp, name))
    pad = json.load(open("%s/%s.json" % (tmp, name))).get("padding") or {}
    pad = pad.get("pad_id", 0)
    bad = total = 0
    for set_, L in RUNS:
        inputs = open("%s/%s.in" % (tmp, set_)).read().split("\n")[:-1]
        got = open("%s/%s.%d.%s.out" % (tmp, set_, L, name)).read().split("\n")[:-1]
        assert len(got) == len(inputs), (set_, L, name, len(got), len(inputs))
        diff = 0
        for line, g in zip(inputs, got):
            want = reference(tok, line, L, pad)
            if g != want:
                diff += 1
                if diff <= 3:
                    print("MISMATCH %s %s L=%d: %r\n  caccel: %s\n  hf:     %s"
                          % (name, set_, L, texts(line) or line, g[:300], want[:300]))
        print("%-8s %-8s max_length %3s: %5d inputs, %d differ"
              % (name, set_, L or "-", len(inputs), diff))
        bad += diff
        total += len(inputs)
    return bad, total


def compare_decodings(tmp, name):
    tok = Tokenizer.from_file("%s/%s.json" % (tmp, name))
    bad = total = same = 0
    for skip in (1, 0):
        inputs = open("%s/%s.decode.in" % (tmp, name)).read().split("\n")[:-1]
        got = open("%s/%s.decode.%d.out" % (tmp, name, skip)).read().split("\n")[:-1]
        assert len(got) == len(inputs), (name, skip, len(got), len(inputs))
        diff = 0
        for k, (line, g) in enumerate(zip(inputs, got)):
            ids = [int(x) for x in line.split()] if line != "-" else []
            want = tok.decode(ids, skip_special_tokens=bool(skip))
            text = bytes.fromhex(g if g != "-" else "").decode("utf-8", "replace")
            if text != want:
                diff += 1
                if diff <= 3:
                    print("DECODE MISMATCH %s skip=%d %s\n  caccel: %r\n  hf:     %r"
                          % (name, skip, line[:80], text[:200], want[:200]))
            if skip and k < len(CASES) and want == CASES[k]:
                same += 1
        print("%-8s decode skip_special=%d: %5d id lists, %d differ%s"
              % (name, skip, len(inputs), diff,
                 " (%d of the %d cases come back as they were)" % (same, len(CASES))
                 if skip else ""))
        bad += diff
        total += len(inputs)
    return bad, total


def compare(tmp):
    bad = total = 0
    for name in TOKS:
        for f in (compare_encodings, compare_decodings):
            b, t = f(tmp, name)
            bad += b
            total += t
    if bad:
        sys.exit("FAIL: %d of %d results differ from Hugging Face tokenizers" % (bad, total))
    print("all %d encodings and decodings equal Hugging Face tokenizers'" % total)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "--compare":
        compare(sys.argv[1])
    else:
        prepare(sys.argv[1])
