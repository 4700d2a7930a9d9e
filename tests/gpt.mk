# tests/gpt.mk: examples/gpt: training on 1 and 2 processes with generation, and parity of its
# logits, loss and gradients with a PyTorch reference.
TESTS += tests/test_gpt.sh tests/test_gpt_parity.sh
EXTRA_DIST += tests/test_gpt.sh tests/test_gpt_parity.sh tests/torch_reference.py
# --gradient_checkpointing trains exactly as without it.
TESTS += tests/test_actckpt_gpt.sh
EXTRA_DIST += tests/test_actckpt_gpt.sh
# examples/llm_finetune: a small Llama from scratch, then LoRA on 1 and 2 processes, read by transformers and PEFT
TESTS += tests/test_llm_finetune.sh
EXTRA_DIST += tests/test_llm_finetune.sh
# The throughput/MFU line of examples/gpt, its peak cache and its tracker metrics.
TESTS += tests/test_gpt_mfu.sh
EXTRA_DIST += tests/test_gpt_mfu.sh
