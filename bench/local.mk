# bench/: benchmarks (not built by `make`; `make bench` builds and runs them all).
ca_bench_programs =
include bench/gemm.mk
include bench/mlp.mk
include bench/optim.mk
include bench/comm.mk
include bench/save.mk
include bench/load.mk
include bench/async_save.mk
include bench/det.mk
include bench/cuda.mk
include bench/xla.mk
include bench/transformer.mk
include bench/actckpt.mk
include bench/zero.mk
include bench/progress.mk
include bench/profile.mk
include bench/threads.mk
include bench/llm.mk
include bench/tokenizer.mk
include bench/load_rss.mk
include bench/memory.mk
include bench/tp.mk
include bench/tp_zero.mk

# Builds every benchmark without running one (tools/test.sh does, so they keep compiling).
.PHONY: bench-build
bench-build: $(ca_bench_programs)
