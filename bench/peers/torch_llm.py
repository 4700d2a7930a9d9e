"""The PyTorch + PEFT side of bench/run_llm.sh: a LlamaForCausalLM of the config in DIR with fresh
weights, LoRA (PEFT, r 8, alpha 16, q_proj and v_proj, no dropout) or every parameter trained by
AdamW, causal-LM loss on random token batches [B, T]. Prints one line:
  torch <mode> threads N: X tokens/s (median of the timed steps), trainable P of A params
usage: torch_llm.py DIR lora|full THREADS BATCH T STEPS"""
import statistics, sys, time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

d, mode, threads, batch, t, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = AutoConfig.from_pretrained(d)
model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
if mode == "lora":
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
model.train()
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=2e-4 if mode == "lora" else 5e-5, weight_decay=0.0)
g = torch.Generator().manual_seed(1)
times = []
for i in range(steps):
    ids = torch.randint(0, min(cfg.vocab_size, 257), (batch, t), generator=g)
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
timed = times[max(1, steps // 3):]
trainable = sum(p.numel() for p in params)
total = sum(p.numel() for p in model.parameters())
print(f"torch {mode} threads {threads}: {batch * t / statistics.median(timed):.1f} tokens/s, trainable {trainable} of {total} params")
