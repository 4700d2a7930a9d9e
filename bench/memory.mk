# bench/memory.mk: peak resident memory of the GPT example and the MLP against PyTorch, with where
# caccel's peak goes (`make bench-memory`; BENCH_MEMORY_ARGS passes e.g. "--threads 1 --steps 3").
EXTRA_DIST += bench/run_memory.sh bench/peers/torch_bert_finetune.py

.PHONY: bench-memory
bench: bench-memory
bench-memory: bench/bench_mlp$(EXEEXT) examples/gpt$(EXEEXT)
	bash $(top_srcdir)/bench/run_memory.sh --gpt ./examples/gpt$(EXEEXT) --mlp ./bench/bench_mlp$(EXEEXT) $(BENCH_MEMORY_ARGS)
