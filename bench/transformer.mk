# bench/transformer.mk: BERT fine-tune step (MiniLM shape) and GPT training throughput against
# PyTorch, the step's GEMM-only bound on raw OpenBLAS, and the fused attention against a naive
# matmul-softmax-matmul (`make bench-transformer`; not built by `make`).
# BENCH_TRANSFORMER_ARGS passes e.g. "--threads 1 --reps 1 --parts bert".
EXTRA_PROGRAMS += bench/bench_transformer
ca_bench_programs += bench/bench_transformer$(EXEEXT)
CLEANFILES += bench/bench_transformer
bench_bench_transformer_SOURCES = bench/bench_transformer.c bench/bench_util.h
bench_bench_transformer_CFLAGS = $(AM_CFLAGS) $(OPENBLAS_CFLAGS)
bench_bench_transformer_LDADD = libcaccel.la $(OPENBLAS_LIBS) -lm
EXTRA_DIST += bench/run_transformer.sh bench/peers/torch_transformer.py

.PHONY: bench-transformer
bench: bench-transformer
bench-transformer: bench/bench_transformer$(EXEEXT) examples/gpt$(EXEEXT) tools/caccel$(EXEEXT)
	bash $(top_srcdir)/bench/run_transformer.sh --bench ./bench/bench_transformer$(EXEEXT) \
	  --gpt ./examples/gpt$(EXEEXT) --caccel ./tools/caccel$(EXEEXT) $(BENCH_TRANSFORMER_ARGS)
