"""The tokenizers side of bench/run_tokenizer.sh: Tokenizer.from_file(TOKENIZER.json).encode_batch_fast
(no offsets; encode_batch where this tokenizers lacks it) over
every text of TEXTS.hex (hex-encoded UTF-8, one per line) without special tokens, best of REPS passes, on
one thread (RAYON_NUM_THREADS=1, set by the caller). Prints "MB/s tokens".
usage: tokenizers_speed.py TOKENIZER.json TEXTS.hex REPS"""
import sys
import time

from tokenizers import Tokenizer

tok = Tokenizer.from_file(sys.argv[1])
with open(sys.argv[2]) as f:
    texts = [bytes.fromhex(h if h != "-" else "").decode("utf-8") for h in f.read().split()]
nbytes = sum(len(t.encode("utf-8")) for t in texts)
encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
best, tokens = float("inf"), 0
for _ in range(max(1, int(sys.argv[3]))):
    t0 = time.perf_counter()
    enc = encode(texts, add_special_tokens=False)
    best = min(best, time.perf_counter() - t0)
    tokens = sum(len(e.ids) for e in enc)
print("%.3f %d" % (nbytes / best / 1e6, tokens))
