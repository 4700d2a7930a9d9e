"""The PyTorch peer of bench/run_load_tp.sh: rank R of tp T reads, with safetensors' safe_open and
get_slice, the same slices of FILE that bench_load_rss --tp-plan keeps (layer i even: colwise, its rows
[R*W/T, (R+1)*W/T); odd: rowwise, that block of columns of every row) and copies them into the
parameters of its shard of the model (allocated without initialisation), as torch's
parallelize_module would hold them. usage: torch_load_tp.py FILE TP RANK; prints the seconds and the
peak RSS (ru_maxrss, KB)."""
import resource
import sys
import time

import torch
from safetensors import safe_open


def main():
    path, tp, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    t0 = time.perf_counter()
    with safe_open(path, framework="pt") as f:
        for name in sorted(f.keys(), key=lambda k: int(k.split(".")[0])):
            i = int(name.split(".")[0])
            s = f.get_slice(name)
            rows, cols = s.get_shape()
            if i % 2 == 0:
                n = rows // tp
                part = s[rank * n:(rank + 1) * n, :]
            else:
                n = cols // tp
                part = s[:, rank * n:(rank + 1) * n]
            dst = torch.empty(part.shape, dtype=torch.float32)
            dst.copy_(part)
    print(f"{time.perf_counter() - t0:.3f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")


if __name__ == "__main__":
    main()
