"""PyTorch peer of bench/run_tp.sh: examples/gpt's model (pre-LayerNorm blocks, causal attention, tanh
GELU, tied output layer; AdamW, clipping at 1.0) trained on random tokens, at 1 process (plain python) or
at tensor-parallel size = the world (torchrun, gloo) through torch.distributed.tensor.parallel's
parallelize_module with caccel's plan: attn.c_attn and mlp.c_fc ColwiseParallel, attn.c_proj and
mlp.c_proj RowwiseParallel; embeddings, norms and the LM head whole on every rank.
c_attn's output features are laid out head by head (q, k, v of head 0, then of head 1, ...), so that
ColwiseParallel's contiguous split gives each rank whole heads, as caccel's fused split does
(ca_tp_plan_fused): the same model up to a permutation of c_attn's rows at a random initialisation).
Clipping at 1.0 by the whole model's norm is done by hand (clip_grad_norm below). One line per run:
impl=torch procs=P tp=P tokens_per_s=X step_ms=Y peak_rss_kib=Z (rank 0's median over the steps after
the first two); where tensor parallelism fails it prints impl=torch ... status=failed reason=...
usage: torch_tp_gpt.py --n_layer L --n_head H --n_embd C --block_size T --batch_size B [--steps N]"""
import argparse, math, os, resource, statistics, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F


def model(L, H, C, T, V):
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)

        def forward(self, x):
            b, t, _ = x.shape
            d = C // H
            # local heads: the output may be this rank's part only (whole heads, q k v each)
            qkv = self.c_attn(x).view(b, t, -1, 3, d)
            q, k, v = (z.transpose(1, 2) for z in qkv.unbind(3))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(b, t, -1))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(C), Attn(), nn.LayerNorm(C), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.h = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.h:
                x = blk(x)
            y = self.ln_f(x)
            if hasattr(y, "full_tensor"):   # --sequence_parallel: ln_f's output is this rank's tokens (a DTensor)
                y = y.full_tensor()
            return F.linear(y, self.wte.weight)

    m = GPT()
    for name, p in m.named_parameters():   # the example's initialisation (biases 0, LayerNorm 1 and 0)
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif "ln_" in name:
            nn.init.ones_(p)
        else:
            nn.init.normal_(p, std=0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02)
    return m


def tensor_parallel(m, world, sp):
    """sp (--sequence_parallel): torchtitan's plan, the norms SequenceParallel, the attention's and the
    MLP's inputs all-gathered (PrepareModuleInput Shard(1) -> Replicate), the rowwise layers' outputs
    reduce-scattered (output_layouts Shard(1)); the first block's input split (Replicate -> Shard(1)),
    ln_f's output gathered before the tied head, as the GPT example does."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    plan = {}
    row = (lambda: RowwiseParallel(output_layouts=Shard(1))) if sp else RowwiseParallel
    for i in range(len(m.h)):
        plan.update({f"h.{i}.attn.c_attn": ColwiseParallel(), f"h.{i}.attn.c_proj": row(),
                     f"h.{i}.mlp.c_fc": ColwiseParallel(), f"h.{i}.mlp.c_proj": row()})
        if sp:
            gather = lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan.update({f"h.{i}.ln_1": SequenceParallel(), f"h.{i}.ln_2": SequenceParallel(),
                         f"h.{i}.attn": gather(), f"h.{i}.mlp": gather()})
    if sp:
        plan.update({"h.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                               use_local_output=True),
                     "ln_f": SequenceParallel()})
    return parallelize_module(m, mesh, plan)


def clip_grad_norm(params, max_norm):
    """clip_grad_norm_ by the whole model's norm: torch's own refuses a mix of DTensor (the split layers)
    and plain tensors ("got mixed torch.Tensor and DTensor"), so the split gradients' squares are summed
    over the tp ranks and the whole ones' added once, as caccel's ca_clip_grad_norm does."""
    from torch.distributed.tensor import DTensor, Shard
    split, whole = torch.zeros(()), torch.zeros(())
    grads = [p.grad for p in params if p.grad is not None]
    for g in grads:
        if isinstance(g, DTensor):
            sq = g.to_local().float().pow(2).sum()
            if any(isinstance(pl, Shard) for pl in g.placements):
                split += sq
            else:
                whole += sq
        else:
            whole += g.float().pow(2).sum()
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(split)
    coef = min(1.0, max_norm / (math.sqrt(float(split + whole)) + 1e-6))
    for g in grads:
        g.mul_(coef)


def main():
    p = argparse.ArgumentParser()
    for k in ("n_layer", "n_head", "n_embd", "block_size", "batch_size"):
        p.add_argument("--" + k, type=int, required=True)
    p.add_argument("--vocab_size", type=int, default=256)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--sequence_parallel", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))   # run_tp.sh --threads
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    head = f"impl=torch procs={world} tp={world}{' sp' if a.sequence_parallel else ''} shape={a.n_layer}x{a.n_embd}"
    torch.manual_seed(1337)   # the same whole weights on every rank before the split
    m = model(a.n_layer, a.n_head, a.n_embd, a.block_size, a.vocab_size)
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        try:
            m = tensor_parallel(m, world, a.sequence_parallel)
        except Exception as e:   # noqa: BLE001  (reported, not hidden)
            if rank == 0:
                print(f"{head} status=failed reason={type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
            dist.destroy_process_group()
            return
    opt = torch.optim.AdamW(m.parameters(), lr=4e-3, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(7)   # every rank of the tp group reads the same batch
    ms = []
    try:
        for s in range(a.steps):
            x = torch.randint(0, 256, (a.batch_size, a.block_size + 1), generator=g)
            t0 = time.perf_counter()
            loss = F.cross_entropy(m(x[:, :-1]).reshape(-1, a.vocab_size), x[:, 1:].reshape(-1))
            loss.backward()
            clip_grad_norm(list(m.parameters()), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            ms.append((time.perf_counter() - t0) * 1e3)
    except Exception as e:   # noqa: BLE001
        if rank == 0:
            print(f"{head} status=failed reason={type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        return
    step = statistics.median(ms[2:] if len(ms) > 2 else ms)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux
    print(f"{head} rank={rank} tokens_per_s={a.batch_size * a.block_size / step * 1e3:.0f} step_ms={step:.0f} "
          f"peak_rss_kib={rss} loss={loss.item():.4f}", flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
