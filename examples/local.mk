# examples/: training programs written once for every device and launcher.
noinst_PROGRAMS += examples/fashion_mnist examples/linear_regression
examples_fashion_mnist_SOURCES = examples/fashion_mnist.c
examples_fashion_mnist_LDADD = libcaccel.la -lm
examples_linear_regression_SOURCES = examples/linear_regression.c
examples_linear_regression_LDADD = libcaccel.la -lm
noinst_PROGRAMS += examples/gpt
examples_gpt_SOURCES = examples/gpt.c
examples_gpt_LDADD = libcaccel.la -lm
noinst_PROGRAMS += examples/bert_classifier
examples_bert_classifier_SOURCES = examples/bert_classifier.c
examples_bert_classifier_LDADD = libcaccel.la -lm
# The batch script for Slurm (docs/DISTRIBUTED.md); tests/dist/slurm.sh submits it.
EXTRA_DIST += examples/slurm/train.sbatch
noinst_PROGRAMS += examples/llm_finetune
examples_llm_finetune_SOURCES = examples/llm_finetune.c
examples_llm_finetune_LDADD = libcaccel.la -lm
EXTRA_DIST += examples/llama-tiny.json
