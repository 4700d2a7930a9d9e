# nn/: modules, layers, optimizers and learning-rate schedules; BERT's config.json and the names
# and shapes of its checkpoint's tensors; BertModel and BertForSequenceClassification; decoder
# language models (Llama, Qwen2, Mistral, GPT-2) with their Hugging Face files; rotary position
# tables; LoRA adapters and PEFT's adapter files.
libcaccel_la_SOURCES += \
	nn/nn_impl.h \
	nn/module.c \
	nn/layers.c \
	nn/optim.c \
	nn/schedule.c \
	nn/bert_config.c \
	nn/bert.c \
	nn/causal_lm_config.c \
	nn/causal_lm.c \
	nn/causal_lm_io.c \
	nn/gpt2_lm.c \
	nn/lora_impl.h \
	nn/lora.c \
	nn/lora_files.c \
	nn/rope.c
