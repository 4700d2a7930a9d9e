/* gradcheck_util.h: the loss sum(w * f(x)) that test_autograd's tape-rule checks compare backward
 * with by central differences (every op's own checks are rows of tests/test_ops.c). */
#ifndef CACCEL_GRADCHECK_UTIL_H
#define CACCEL_GRADCHECK_UTIL_H

/* An op under test: builds its output from the inputs. */
typedef ca_tensor *(*op_fn)(ca_tensor **in, void *ctx);

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

/* A language-model head tied to its embedding: logits = emb(idx) W^T with one W. */
static inline ca_tensor *f_tied(ca_tensor **in, void *c) { return ca_linear(ca_embedding(in[1], in[0]), in[0], NULL); }

#endif
