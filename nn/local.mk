# nn/: modules, layers, optimizers and learning-rate schedules; BERT's config.json and the names
# and shapes of its checkpoint's tensors; BertModel and BertForSequenceClassification.
libcaccel_la_SOURCES += \
	nn/nn_impl.h \
	nn/module.c \
	nn/layers.c \
	nn/optim.c \
	nn/schedule.c \
	nn/bert_config.c \
	nn/bert.c \
	nn/rope.c
