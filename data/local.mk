# data/: datasets (in-memory, custom, IDX / Fashion-MNIST, fortunes), the dataloader and BERT's
# WordPiece tokenizer and the BPE tokenizer of decoder models.
libcaccel_la_SOURCES += \
	data/data_impl.h \
	data/dataset.c \
	data/sampler.c \
	data/idx.c \
	data/fashion_mnist.c \
	data/dataloader.c \
	data/tokenizer_impl.h \
	data/tokenizer.c \
	data/tokenizer_load.c \
	data/tokenizer_bpe_impl.h \
	data/tokenizer_bpe.c \
	data/tokenizer_bpe_load.c \
	data/fortunes.c
