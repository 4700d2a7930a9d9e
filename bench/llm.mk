# bench/llm.mk: LoRA and full fine-tuning steps of a Llama against PyTorch + PEFT (`make bench-llm`).
# BENCH_LLM_ARGS passes e.g. "--threads 1,2 --reps 3 --shapes tiny,100m"; TORCH_PYTHON picks the python.
EXTRA_DIST += bench/run_llm.sh bench/peers/torch_llm.py

.PHONY: bench-llm
bench: bench-llm
bench-llm: examples/llm_finetune$(EXEEXT)
	bash $(top_srcdir)/bench/run_llm.sh --build . $(BENCH_LLM_ARGS)
