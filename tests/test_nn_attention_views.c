/* The library's models (nn/bert.c, nn/causal_lm.c, nn/gpt2_lm.c) pass q, k and v to the attention as views
 * of their projections and take its output as a view before the output projection, as examples/gpt does:
 * on the cpu device, whose kernels read strides (attention_strides), one forward and backward runs no copy
 * kernel around the attention but RoPE's, and it gives the bits of a device whose kernels read none (the same cpu
 * kernels, given contiguous tensors by the op: the fallback CUDA takes). The copy kernels are counted in the
 * profiler's kernel trace. */
#include "test_util.h"

#include <caccel/backend.h>

static ca_device *cpu(void) { return ca_cpu_device(); }

/* The cpu device with attention_strides false: the op makes q, k, v and out contiguous for it. */
static ca_device *nostrides_device(void) {
    static ca_device_ops ops;
    static const ca_device_ops *devs[1];
    static ca_plugin p;
    static ca_device *d;
    if (d) return d;
    ops = *ca_device_ops_of(cpu());
    ops.name = "cpu_nostrides";
    ops.attention_strides = false;
    devs[0] = &ops;
    p = (ca_plugin){.struct_size = sizeof p, .abi_version = ops.abi_version, .name = ops.name, .version = "test",
                    .num_devices = 1, .devices = devs};
    T_OK(ca_register_plugin(&p, "test_nn_attention_views"));
    T_OK(ca_device_open(ops.name, 0, NULL, &d));
    return d;
}

typedef struct model_case {
    const char *name;
    ca_module *(*create)(void);
    bool classifier;   /* BERT: labels [B], else next-token labels [B, T] */
    int copies;        /* the copy kernels of the step left on the cpu device (see each create) */
    int saved;         /* those the views save per layer (the no-strides device runs them) */
} model_case;

enum { B = 2, T = 6, VOCAB = 24, LAYERS = 2 };

/* BERT (separate q, k and v Linear layers, a key-padding mask). None of the 19 copies of its step is
 * around the attention: the input's id and mask rows, each Linear layer's bias broadcast into its output
 * (the GEMM adds onto it: six a layer, the pooler's and the classifier's), the pooler's token 0, and the
 * backward of that narrow and of token type 0's row (no token types given). The views save 8 a layer (6
 * on the cpu device, whose attention output was a view already): q, k, v and the output, each copied in
 * the forward and its gradient in the backward. */
static ca_module *bert(void) {
    ca_bert_config c = {.vocab_size = VOCAB, .hidden_size = 12, .num_hidden_layers = LAYERS,
                        .num_attention_heads = 3, .intermediate_size = 16, .hidden_act = "gelu",
                        .max_position_embeddings = 16, .type_vocab_size = 2, .layer_norm_eps = 1e-12,
                        .pad_token_id = 0, .num_labels = 3};
    ca_module *m;
    T_OK(ca_bert_for_sequence_classification_create(&c, 3, &m));
    return m;
}

/* A decoder of the family with 4 query heads and kv of them. */
static ca_module *decoder(ca_causal_lm_family family, int64_t kv) {
    ca_causal_lm_config c;
    ca_causal_lm_config_default(family, &c);
    c.vocab_size = VOCAB; c.hidden_size = 16; c.intermediate_size = 20; c.num_hidden_layers = LAYERS;
    c.num_attention_heads = 4; c.num_key_value_heads = kv; c.max_position_embeddings = 16;
    ca_module *m;
    T_OK(ca_causal_lm_create(&c, &m));
    return m;
}

/* Llama with grouped-query attention (4 query heads, 2 kv heads). Its step's 6 copies are outside the
 * layers: the input's id and mask rows, the labels' shift, and the shared rotary tables made one row per
 * token (cos and sin, once a forward for every layer). In the layers none: RoPE turns q and k in the
 * projections' memory (ca_rope over B * T one-token sequences) and the attention reads q, k, v and
 * writes its output as views; a device whose attention reads no strides copies q, k, v and the output
 * each way, 8 a layer. */
static ca_module *llama(void) { return decoder(CA_CAUSAL_LM_LLAMA, 2); }

/* GPT-2: q, k and v are slices of c_attn's output, their gradients written straight into its gradient. Its
 * step's 4 copies are outside the blocks (the input's id and mask rows, the labels' shift); the views save
 * 11 a block (examples/gpt's count: q, k, v and the output each way, and c_attn's gradient put together
 * from the three slices' in the backward of their narrows). */
static ca_module *gpt2(void) { return decoder(CA_CAUSAL_LM_GPT2, 4); }

/* The logits and every parameter's gradient (host, concatenated) of one step of m on dev, and the copy
 * kernels it ran. Row 1 of the batch has two padding tokens (the key-padding mask). */
static float *step(const model_case *mc, ca_module *m, ca_device *dev, size_t *n, int *copies) {
    int64_t x[B * 2 * T], lab[B * T];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            bool pad = b == 1 && t >= T - 2;
            x[b * 2 * T + t] = pad ? 0 : 1 + (b * 7 + t * 5) % (VOCAB - 1);
            x[b * 2 * T + T + t] = !pad;
            lab[b * T + t] = pad ? -100 : (b * 3 + t * 11) % VOCAB;
        }
    T_OK(ca_module_to(m, dev));
    ca_module_zero_grad(m);
    char dir[128];
    snprintf(dir, sizeof dir, "test_nn_attention_views.%ld.%s.%s.trace", (long)getpid(), mc->name,
             ca_device_name(dev));
    size_t total = (size_t)ca_module_param_count(m), off = 0;
    float *res = NULL;
    CA_SCOPE {
        ca_tensor *xt = T_NN(ca_from_host(dev, CA_I64, 3, (int64_t[]){B, 2, T}, x)), *loss;
        T_OK(ca_profile_begin(&(ca_profile_config){.output_trace_dir = dir}));
        ca_tensor *out = T_NN(ca_module_forward(m, xt));
        if (mc->classifier)
            loss = T_NN(ca_cross_entropy(out, ca_from_host(dev, CA_I64, 1, (int64_t[]){B}, (int64_t[]){0, 2})));
        else
            loss = T_NN(ca_causal_lm_loss(out, ca_from_host(dev, CA_I64, 2, (int64_t[]){B, T}, lab)));
        T_OK(ca_autograd_backward(loss));
        T_OK(ca_profile_end());
        size_t nout = (size_t)ca_tensor_numel(out);
        *n = nout + total;
        res = malloc(*n * sizeof *res);
        T_OK(ca_tensor_to_host(out, res, nout * sizeof *res));
        off = nout;
        for (int i = 0; i < ca_module_num_params(m); i++) {
            ca_tensor *g = ca_tensor_grad(ca_module_param_at(m, i));
            if (!g) fail_msg("%s: no gradient for %s", mc->name, ca_module_param_name(m, i));
            T_OK(ca_tensor_to_host(g, res + off, ca_tensor_nbytes(g)));
            off += (size_t)ca_tensor_numel(g);
        }
    }
    const char *path = ca_profile_last_path();
    assert_int_equal(t_trace_count(path, "\"name\":\"attention\""), LAYERS);
    assert_int_equal(t_trace_count(path, "\"name\":\"attention_backward\""), LAYERS);
    *copies = t_trace_count(path, "\"name\":\"copy_strided\"");
    t_rm_tree(dir);
    return res;
}

static void test_models_read_views(void **state) {
    (void)state;
    static const model_case cases[] = {
        {"bert", bert, true, 19, 8},
        {"llama", llama, false, 6, 8},
        {"gpt2", gpt2, false, 4, 11},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const model_case *mc = &cases[i];
        ca_manual_seed(11);
        ca_module *m = mc->create();
        ca_module_train(m, false);   /* no dropout: the two devices see the same numbers */
        size_t n, n2;
        int copies, copies_nost;
        float *views = step(mc, m, cpu(), &n, &copies);
        float *contig = step(mc, m, nostrides_device(), &n2, &copies_nost);
        assert_int_equal(n, n2);
        for (size_t j = 0; j < n; j++)
            if (memcmp(&views[j], &contig[j], sizeof(float)) != 0)
                fail_msg("%s: value %zu (logits then gradients) is %a through views, %a through copies", mc->name, j,
                         (double)views[j], (double)contig[j]);
        if (copies != mc->copies)
            fail_msg("%s: %d copy kernels in one step on the cpu device, %d expected", mc->name, copies, mc->copies);
        if (copies_nost != mc->copies + LAYERS * mc->saved)
            fail_msg("%s: %d copy kernels on a device whose attention reads no strides, %d expected", mc->name,
                     copies_nost, mc->copies + LAYERS * mc->saved);
        free(views);
        free(contig);
        ca_module_destroy(m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models_read_views),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
