"""The PyTorch peer of bench/bench_load.c: the same model (N Linear(4096, 4096) without bias, as
torch.nn.Sequential, so that its keys are "0.weight", ...), its storage allocated without an
initialisation (meta, then to_empty), then safetensors.torch.load_file + load_state_dict timed.
usage: torch_load.py FILE [LAYERS]; prints the seconds."""
import sys
import time

import torch
from safetensors.torch import load_file


def main():
    path = sys.argv[1]
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(layers)])
    model = model.to_empty(device="cpu")
    t0 = time.perf_counter()
    model.load_state_dict(load_file(path))
    print(f"{time.perf_counter() - t0:.3f}")


if __name__ == "__main__":
    main()
