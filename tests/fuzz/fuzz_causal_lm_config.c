/* Fuzz target: a decoder LM's config.json (ca_causal_lm_config_load: Llama, Qwen2, Mistral,
 * GPT-2). A config it accepts goes where a checkpoint directory's config goes next: a model small
 * enough to build in a moment is built, run on two tokens and its config.json written back, which
 * must load again to the same family and sizes. */
#include "tests/fuzz/fuzz_util.h"

#include <caccel/causal_lm.h>
#include <caccel/tensor.h>

#include <sys/stat.h>

/* The parameters of c (in double: the sizes go up to 2^40 each). */
static double params(const ca_causal_lm_config *c) {
    double h = (double)c->hidden_size, v = (double)c->vocab_size, i = (double)c->intermediate_size;
    return v * h * 2 + (double)c->max_position_embeddings * h + (double)c->num_hidden_layers * (4 * h * h + 3 * h * i);
}

static void run_small(const ca_causal_lm_config *c) {
    ca_module *m = NULL;
    if (ca_causal_lm_create(c, &m) != CA_OK) {
        if (m) abort();                               /* a failed constructor leaves *out NULL */
        return;
    }
    int64_t ids[2] = {0, c->vocab_size - 1}, shape[2] = {1, 2};
    ca_tensor *logits = NULL;
    CA_NO_GRAD {
        ca_tensor *x = ca_from_host(ca_cpu_device(), CA_I64, 2, shape, ids);
        if (x && ca_causal_lm_forward(m, x, NULL, NULL, &logits) == CA_OK &&
            ca_tensor_shape(logits)[2] != c->vocab_size)
            abort();
    }
    char dir[128];
    snprintf(dir, sizeof dir, "%s/saved", fz_tmpdir());
    mkdir(dir, 0700);
    ca_causal_lm_config back;
    if (ca_causal_lm_save_config(m, dir) != CA_OK || ca_causal_lm_config_load(dir, &back) != CA_OK ||
        back.family != c->family || back.hidden_size != c->hidden_size ||
        back.num_key_value_heads != c->num_key_value_heads || back.tie_word_embeddings != c->tie_word_embeddings)
        abort();                                      /* what caccel writes, caccel reads back */
    ca_module_destroy(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    fz_write("config.json", data, size, path, sizeof path);
    ca_causal_lm_config c;
    if (ca_causal_lm_config_load(path, &c) == CA_OK && c.num_hidden_layers <= 4 && params(&c) <= 65536)
        run_small(&c);
    ca_scope_release_all();
    return 0;
}
