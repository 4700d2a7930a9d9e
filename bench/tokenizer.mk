# bench/tokenizer.mk: tokenizer throughput against Hugging Face's tokenizers, one thread, on the same
# tokenizer.json files and texts (`make bench-tokenizer`; BENCH_TOKENIZER_ARGS passes e.g. "--reps 5").
EXTRA_PROGRAMS += bench/bench_tokenizer
ca_bench_programs += bench/bench_tokenizer$(EXEEXT)
CLEANFILES += bench/bench_tokenizer
bench_bench_tokenizer_SOURCES = bench/bench_tokenizer.c bench/bench_util.h
bench_bench_tokenizer_LDADD = libcaccel.la -lm
EXTRA_DIST += bench/run_tokenizer.sh bench/peers/tokenizers_speed.py

.PHONY: bench-tokenizer
bench: bench-tokenizer
bench-tokenizer: bench/bench_tokenizer$(EXEEXT) tests/text_tool$(EXEEXT)
	bash $(top_srcdir)/bench/run_tokenizer.sh --build . $(BENCH_TOKENIZER_ARGS)
