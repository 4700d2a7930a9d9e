# bench/cuda.mk: the CUDA benchmark (`make bench-cuda`; not built by `make`): GEMM through the kernel
# table against raw cuBLAS, MLP training on the GPU against PyTorch on the same GPU.
# BENCH_CUDA_ARGS passes e.g. "--reps 5 --precision bf16 --sizes 4096".
EXTRA_DIST += bench/run_cuda.sh bench/peers/torch_mlp_cuda.py
if HAVE_CUDA
EXTRA_PROGRAMS += bench/bench_cuda
ca_bench_programs += bench/bench_cuda$(EXEEXT)
CLEANFILES += bench/bench_cuda
bench_bench_cuda_SOURCES = bench/bench_cuda.c bench/bench_util.h
bench_bench_cuda_CFLAGS = $(AM_CFLAGS) $(CUDA_CPPFLAGS)
bench_bench_cuda_LDADD = libcaccel.la $(CUDA_LIBS) $(CUBLAS_LIBS) -lm

ca_bench_cuda_deps = bench/bench_cuda$(EXEEXT) backends/cuda/caccel_cuda.la
ca_bench_cuda_all = bench-cuda
ca_bench_cuda_run = CACCEL_PLUGIN_PATH='$(abs_top_builddir)/backends/cuda/.libs'$${CACCEL_PLUGIN_PATH:+:$$CACCEL_PLUGIN_PATH} \
	$(SHELL) $(top_srcdir)/bench/run_cuda.sh --bench ./bench/bench_cuda$(EXEEXT) $(BENCH_CUDA_ARGS)
else
ca_bench_cuda_run = echo "bench-cuda: caccel was configured without CUDA (see ./configure --with-cuda)"; exit 1
endif

.PHONY: bench-cuda
bench: $(ca_bench_cuda_all)
bench-cuda: $(ca_bench_cuda_deps)
	$(ca_bench_cuda_run)

# GPT-2-124M-shaped bf16 training step against PyTorch eager on the same GPU (`make bench-gpt-cuda`);
# where no GPU is usable it prints "bench-gpt-cuda skipped: no GPU (<reason>)" and fails with the script's
# 77, so that a check run on a GPU machine never counts a skip as a measurement.
EXTRA_DIST += bench/run_gpt_cuda.sh
.PHONY: bench-gpt-cuda
bench-gpt-cuda: examples/gpt$(EXEEXT) tools/caccel$(EXEEXT)
	CACCEL_PLUGIN_PATH='$(abs_top_builddir)/backends/cuda/.libs' bash $(top_srcdir)/bench/run_gpt_cuda.sh \
	  --gpt ./examples/gpt$(EXEEXT) --caccel ./tools/caccel$(EXEEXT) $(BENCH_GPT_CUDA_ARGS)
