/* gradcheck_util.h: what the CPU and CUDA gradient checks share: the op wrappers, and the loss
 * sum(w * f(x)) that backward is checked against by central differences. */
#ifndef CACCEL_GRADCHECK_UTIL_H
#define CACCEL_GRADCHECK_UTIL_H

/* An op under test: builds its output from the inputs. */
typedef ca_tensor *(*op_fn)(ca_tensor **in, void *ctx);
typedef ca_tensor *(*unary_fn)(ca_tensor *);

typedef struct gc_opts {
    double eps, atol, rtol;
    bool reset_rng;            /* dropout: the same mask for every evaluation */
} gc_opts;

static const gc_opts SMOOTH = {.eps = 1e-2, .atol = 2e-3, .rtol = 2e-2};

/* The value of sum(w * out), accumulated in double on the host. */
static inline double dot_host(const ca_tensor *out, const float *w) {
    ca_tensor *o = ca_cast(ca_detach((ca_tensor *)out), CA_F32);
    float *h = t_host(o);
    double s = 0;
    for (int64_t i = 0; i < ca_tensor_numel(out); i++) s += (double)h[i] * w[i];
    free(h);
    return s;
}

/* The loss of one forward without a tape (a finite-difference point). */
static inline double eval_loss(op_fn f, void *ctx, ca_tensor **in, const float *w, const gc_opts *o) {
    double l = NAN;
    CA_SCOPE {
        CA_NO_GRAD {
            if (o->reset_rng) ca_rng_set_state(7, 0);
            ca_tensor *out = f(in, ctx);
            if (!out) fail_msg("forward failed: %s", ca_last_error());
            l = dot_host(out, w);
        }
    }
    return l;
}

/* The ops under test, one wrapper each. */
static inline ca_tensor *f_matmul(ca_tensor **in, void *c) { return ca_matmul(in[0], in[1]); }
static inline ca_tensor *f_matmul_t(ca_tensor **in, void *c) { return ca_matmul(ca_transpose(in[0], 0, 1), in[1]); }
static inline ca_tensor *f_matmul_bt(ca_tensor **in, void *c) { return ca_matmul(in[0], ca_transpose(in[1], 0, 1)); }
static inline ca_tensor *f_linear(ca_tensor **in, void *c) { return ca_linear(in[0], in[1], in[2]); }
static inline ca_tensor *f_linear_nb(ca_tensor **in, void *c) { return ca_linear(in[0], in[1], NULL); }
static inline ca_tensor *f_add(ca_tensor **in, void *c) { return ca_add(in[0], in[1]); }
static inline ca_tensor *f_sub(ca_tensor **in, void *c) { return ca_sub(in[0], in[1]); }
static inline ca_tensor *f_mul(ca_tensor **in, void *c) { return ca_mul(in[0], in[1]); }
static inline ca_tensor *f_div(ca_tensor **in, void *c) { return ca_div(in[0], in[1]); }
static inline ca_tensor *f_unary(ca_tensor **in, void *c) { return ((unary_fn)c)(in[0]); }
static inline ca_tensor *f_add_scalar(ca_tensor **in, void *c) { return ca_add_scalar(in[0], 1.5); }
static inline ca_tensor *f_mul_scalar(ca_tensor **in, void *c) { return ca_mul_scalar(in[0], -0.75); }
static inline ca_tensor *f_pow(ca_tensor **in, void *c) { return ca_pow_scalar(in[0], 2.5); }
static inline ca_tensor *f_sum(ca_tensor **in, void *c) { return ca_sum(in[0]); }
static inline ca_tensor *f_mean(ca_tensor **in, void *c) { return ca_mean(in[0]); }
static inline ca_tensor *f_sum_dim(ca_tensor **in, void *c) { return ca_sum_dim(in[0], *(int *)c, false); }
static inline ca_tensor *f_mean_dim(ca_tensor **in, void *c) { return ca_mean_dim(in[0], *(int *)c, true); }
static inline ca_tensor *f_softmax(ca_tensor **in, void *c) { return ca_softmax(in[0]); }
static inline ca_tensor *f_log_softmax(ca_tensor **in, void *c) { return ca_log_softmax(in[0]); }
static inline ca_tensor *f_ce(ca_tensor **in, void *c) { return ca_cross_entropy_ex(in[0], in[1], c); }
static inline ca_tensor *f_mse(ca_tensor **in, void *c) { return ca_mse_loss(in[0], in[1]); }
static inline ca_tensor *f_dropout(ca_tensor **in, void *c) { return ca_dropout(in[0], 0.3, true); }
static inline ca_tensor *f_layer_norm(ca_tensor **in, void *c) { return ca_layer_norm(in[0], in[1], in[2], 1e-5); }
static inline ca_tensor *f_layer_norm_plain(ca_tensor **in, void *c) { return ca_layer_norm(in[0], NULL, NULL, 1e-5); }
static inline ca_tensor *f_embedding(ca_tensor **in, void *c) { return ca_embedding(in[1], in[0]); }
static inline ca_tensor *f_reshape(ca_tensor **in, void *c) { return ca_mul(ca_reshape(in[0], CA_SHAPE(4, -1)), in[1]); }
static inline ca_tensor *f_transpose(ca_tensor **in, void *c) { return ca_mul(ca_transpose(in[0], 0, 2), in[1]); }
static inline ca_tensor *f_narrow(ca_tensor **in, void *c) { return ca_mul(ca_narrow(in[0], 2, 1, 3), in[1]); }
/* [2, 3, 6] -> a slice of 4 along the last dim -> [2, 3, 2, 2] (a view of the slice) -> heads first */
static inline ca_tensor *f_reshape_slice(ca_tensor **in, void *c) {
    (void)c;
    return ca_mul(ca_transpose(ca_reshape(ca_narrow(in[0], 2, 1, 4), CA_SHAPE(2, 3, 2, 2)), 1, 2), in[1]);
}
static inline ca_tensor *f_contig(ca_tensor **in, void *c) { return ca_contiguous(ca_transpose(in[0], 0, 1)); }
static inline ca_tensor *f_flatten(ca_tensor **in, void *c) { return ca_flatten(in[0]); }
static inline ca_tensor *f_cast(ca_tensor **in, void *c) { return ca_cast(ca_cast(in[0], *(ca_dtype *)c), CA_F32); }
static inline ca_tensor *f_scalar(ca_tensor **in, void *c) { return ca_mul_scalar(ca_add_scalar(in[0], 1.5), -0.75); }

/* The transformer ops. */
typedef struct sdpa_ctx {
    ca_tensor *mask;
    bool causal;
    double p, scale;
} sdpa_ctx;
static inline ca_tensor *f_sdpa(ca_tensor **in, void *c) {
    sdpa_ctx *a = c;
    return ca_scaled_dot_product_attention(in[0], in[1], in[2], a->mask, a->causal, a->p, a->scale);
}
/* The mask as a fourth input (so that it is copied to the device under test). */
static inline ca_tensor *f_sdpa_m(ca_tensor **in, void *c) {
    sdpa_ctx *a = c;
    return ca_scaled_dot_product_attention(in[0], in[1], in[2], in[3], a->causal, a->p, a->scale);
}
static inline ca_tensor *f_concat(ca_tensor **in, void *c) { return ca_concat(*(int *)c, in, 1); }
static inline ca_tensor *f_stack(ca_tensor **in, void *c) { return ca_stack(3, in, *(int *)c); }
static inline ca_tensor *f_split(ca_tensor **in, void *c) {
    ca_tensor *p[3];
    if (ca_split(in[0], 0, 3, (const int64_t[]){2, 1, 3}, p) != CA_OK) return NULL;
    ca_tensor *r[3] = {ca_mul_scalar(p[2], 2.0), p[0], p[1]};
    return ca_concat(3, r, 0);
}
static inline ca_tensor *f_index_select(ca_tensor **in, void *c) { return ca_index_select(in[0], 1, in[1]); }
static inline ca_tensor *f_gather(ca_tensor **in, void *c) { return ca_gather_dim(in[0], 1, in[1]); }
static inline ca_tensor *f_where(ca_tensor **in, void *c) { return ca_where(in[2], in[0], in[1]); }
static inline ca_tensor *f_masked_fill(ca_tensor **in, void *c) { return ca_masked_fill(in[0], in[1], -3.5); }
static inline ca_tensor *f_rms_norm(ca_tensor **in, void *c) { return ca_rms_norm(in[0], in[1], 1e-6); }
static inline ca_tensor *f_rms_norm_plain(ca_tensor **in, void *c) { return ca_rms_norm(in[0], NULL, 1e-6); }
/* A language-model head tied to its embedding: logits = emb(idx) W^T with one W. */
static inline ca_tensor *f_tied(ca_tensor **in, void *c) { return ca_linear(ca_embedding(in[1], in[0]), in[0], NULL); }
static inline ca_tensor *f_expand(ca_tensor **in, void *c) { return ca_expand(in[0], CA_SHAPE(2, 3, 4)); }

#endif
