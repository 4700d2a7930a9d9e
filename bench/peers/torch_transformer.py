"""PyTorch peers of bench_transformer: a BERT fine-tune step at all-MiniLM-L6-v2's shape
(transformers' BertForSequenceClassification, random initialisation) and a GPT training step of
examples/gpt's model (tests/torch_reference.py, which tests/test_gpt_parity.sh checks). One key=value line per run.
--compile runs the model through torch.compile (the optimizer stays eager; compiling happens in the
warm-up steps); where torch.compile fails (no such function, no C++ compiler for its CPU code) it prints
one line impl=torch-compile ... status=failed reason=... instead of a result.
usage: torch_transformer.py bert --threads T --batch-sizes 8,16 [--seq 128] [--steps N] [--compile]
       torch_transformer.py gpt --threads T --n_layer L --n_head H --n_embd C --block_size T --batch_size B
                             [--vocab_size V] [--device cuda] [--bf16] [--compile]"""
import argparse, os, sys, time
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from torch_reference import gpt_model   # noqa: E402  (the model tests/test_gpt_parity.sh checks)


def window(what, batch, t0, t1):
    """With BENCH_WINDOWS set, the CLOCK_MONOTONIC window of the timed steps on stderr, as bench_util.h prints
    caccel's: bench/run_threads.sh's profile keeps the perf samples inside it."""
    if os.environ.get("BENCH_WINDOWS"):
        print(f"# window {what} batch={batch} from={t0:.6f} to={t1:.6f}", file=sys.stderr, flush=True)


def impl(a):
    return "torch-compile" if a.compile else "torch"


def compiled(m, a):
    return torch.compile(m) if a.compile else m


def bert(a):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, hidden_act="gelu", hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1, max_position_embeddings=512, num_labels=2)
    for B in [int(s) for s in a.batch_sizes.split(",")]:
        torch.manual_seed(42)
        m = BertForSequenceClassification(cfg).train()
        opt = torch.optim.AdamW(m.parameters(), lr=2e-5)
        f = compiled(m, a)
        x = (1000 + (torch.arange(B * a.seq) * 7919) % 20000).view(B, a.seq)
        y = torch.arange(B) % 2
        secs = cpu = 0.0
        for s in range(-2, a.steps):
            if s == 0:
                w0 = time.monotonic()
            t0, c0 = time.perf_counter(), time.process_time()
            loss = F.cross_entropy(f(input_ids=x).logits, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if s >= 0:
                secs += time.perf_counter() - t0
                cpu += time.process_time() - c0
        window("bert", B, w0, time.monotonic())
        print(f"impl={impl(a)} model=bert batch={B} seq={a.seq} threads={torch.get_num_threads()} "
              f"samples_per_s={B * a.steps / secs:.2f} step_ms={secs / a.steps * 1e3:.1f} "
              f"step_cpu_ms={cpu / a.steps * 1e3:.1f}", flush=True)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def gpt(a):
    C, H, T, L = a.n_embd, a.n_head, a.block_size, a.n_layer
    torch.manual_seed(1337)
    V, B, dev = a.vocab_size, a.batch_size, torch.device(a.device)
    m = gpt_model(L, H, C, T, V).to(dev).train()
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.bf16)
    opt = torch.optim.AdamW(m.parameters(), lr=4e-3, weight_decay=0.1)
    f = compiled(m, a)
    g = torch.Generator().manual_seed(0)
    secs = 0.0
    for s in range(-2, a.steps):
        if s == 0:
            w0 = time.monotonic()
        x = torch.randint(0, 256, (B, T + 1), generator=g).to(dev)   # bytes, as examples/gpt
        sync(dev)
        t0 = time.perf_counter()
        with amp:
            loss = F.cross_entropy(f(x[:, :-1]).reshape(-1, V).float(), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(dev)
        if s >= 0:
            secs += time.perf_counter() - t0
    window("gpt", 0, w0, time.monotonic())   # one window, as examples/gpt's
    print(f"impl={impl(a)} model=gpt shape={L}x{H}x{C}xT{T} batch={B} threads={torch.get_num_threads()} "
          f"tokens_per_s={B * T * a.steps / secs:.0f}", flush=True)


p = argparse.ArgumentParser()
p.add_argument("model", choices=["bert", "gpt"])
p.add_argument("--threads", type=int, default=1)
p.add_argument("--batch-sizes", default="8,16")
p.add_argument("--seq", type=int, default=128)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--device", default="cpu")
p.add_argument("--bf16", action="store_true", help="torch.autocast bf16 (the GPU step)")
p.add_argument("--compile", action="store_true", help="the model through torch.compile")
for k, v in dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=32, vocab_size=256).items():
    p.add_argument("--" + k, type=int, default=v)
a = p.parse_args()
torch.set_num_threads(a.threads)
print(f"# torch {torch.__version__}, {torch.__config__.parallel_info().splitlines()[0]}", file=sys.stderr)
try:
    (bert if a.model == "bert" else gpt)(a)
except Exception as e:   # torch.compile's failures surface at the first step, as many exception types
    if not a.compile:
        raise
    reason = "_".join(f"{type(e).__name__}: {e}".split())[:200].replace("=", ":")   # one key=value token
    print(f"impl=torch-compile model={a.model} threads={torch.get_num_threads()} status=failed reason={reason}",
          flush=True)
