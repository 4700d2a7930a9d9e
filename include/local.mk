# Public headers, installed under $includedir/caccel.
caccelincludedir = $(includedir)/caccel
caccelinclude_HEADERS = \
	include/caccel/caccel.h \
	include/caccel/status.h \
	include/caccel/log.h \
	include/caccel/types.h \
	include/caccel/config.h \
	include/caccel/backend.h \
	include/caccel/device.h \
	include/caccel/xla.h \
	include/caccel/collective.h \
	include/caccel/tensor.h \
	include/caccel/ops.h \
	include/caccel/nn.h \
	include/caccel/optim.h \
	include/caccel/data.h \
	include/caccel/tokenizer.h \
	include/caccel/bert_config.h \
	include/caccel/bert.h \
	include/caccel/lora.h \
	include/caccel/causal_lm.h \
	include/caccel/accelerator.h \
	include/caccel/checkpoint.h \
	include/caccel/tracking.h \
	include/caccel/progress.h \
	include/caccel/profile.h \
	include/caccel/throughput.h
nodist_caccelinclude_HEADERS = include/caccel/version.h
