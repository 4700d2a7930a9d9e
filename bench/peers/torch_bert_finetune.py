"""PyTorch peer of examples/bert_classifier for peak memory: the pretrained all-MiniLM-L6-v2 fine-tuned
as a 4-way classifier of fortune collections (science, work, politics, men-women) with transformers'
AutoModelForSequenceClassification, AdamW, batch 8, each batch padded to its longest sentence (at most
--max_length tokens), --max_steps optimizer steps, then the held-out sentences predicted in batches of
64. The held-out set is every 5th sentence of each collection (examples/bert_classifier holds out its
own split: the sizes, not the sentences, matter for memory). Prints one key=value line with the peak
resident memory (getrusage, KiB, as /usr/bin/time -f %M) and the time.
usage: torch_bert_finetune.py --model DIR [--threads T] [--max_steps N] [--max_length L] [--fortunes DIR]"""
import argparse, os, random, resource, time
import torch

COLLECTIONS = ["science", "work", "politics", "men-women"]


def sentences(d):
    out = []
    for label, name in enumerate(COLLECTIONS):
        with open(os.path.join(d, name), encoding="utf-8", errors="replace") as f:
            texts = [t.strip() for t in f.read().split("\n%\n") if t.strip()]
        out += [(t, label) for t in texts]
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=40)
    p.add_argument("--max_length", type=int, default=64)
    p.add_argument("--fortunes", default="/usr/share/games/fortunes")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForSequenceClassification.from_pretrained(a.model, num_labels=len(COLLECTIONS)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = sentences(a.fortunes)
    held = data[::5]
    train = [x for i, x in enumerate(data) if i % 5]
    random.Random(42).shuffle(train)
    t0 = time.perf_counter()
    for s in range(a.max_steps):
        batch = train[s * 8:(s + 1) * 8]
        enc = tok([t for t, _ in batch], padding="longest", truncation=True, max_length=a.max_length,
                  return_tensors="pt")
        loss = model(**enc, labels=torch.tensor([y for _, y in batch])).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    right = 0
    with torch.no_grad():
        for i in range(0, len(held), 64):
            batch = held[i:i + 64]
            enc = tok([t for t, _ in batch], padding="longest", truncation=True, max_length=a.max_length,
                      return_tensors="pt")
            right += int((model(**enc).logits.argmax(-1) == torch.tensor([y for _, y in batch])).sum())
    secs = time.perf_counter() - t0
    print("impl=torch threads=%d steps=%d held_out=%d accuracy=%.4f seconds=%.1f peak_kib=%d"
          % (a.threads, a.max_steps, len(held), right / len(held), secs,
             resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


if __name__ == "__main__":
    main()
