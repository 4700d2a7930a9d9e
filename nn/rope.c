/* Rotary position tables (cos and sin for ca_rope) from a model's rope settings, as Hugging Face's
 * transformers computes them. Every step is the f32 operation torch performs, in its order (a Python
 * scalar meeting an f32 tensor is rounded to f32 first; `s / tensor` is `s * reciprocal(tensor)`), so
 * that the tables match transformers' to a few f32 ulps (tests/test_rope_parity.sh). */
#include "nn/nn_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Python's math.pi. */
#define ROPE_PI 3.141592653589793

static const char *const scaling_names[] = {"default", "linear", "dynamic", "llama3", "yarn"};

ca_status ca_rope_scaling_parse(const char *name, ca_rope_scaling_type *out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_rope_scaling_parse: out is NULL");
    *out = CA_ROPE_SCALING_NONE;
    if (!name || !*name || strcmp(name, "none") == 0) return CA_OK;
    for (int i = 0; i < (int)(sizeof scaling_names / sizeof *scaling_names); i++)
        if (strcmp(name, scaling_names[i]) == 0) {
            *out = (ca_rope_scaling_type)i;
            return CA_OK;
        }
    return ca_error(CA_ERR_INVALID, "rope_scaling type \"%s\" is not supported (linear, dynamic, llama3, yarn)", name);
}

const char *ca_rope_scaling_name(ca_rope_scaling_type t) {
    return (unsigned)t < sizeof scaling_names / sizeof *scaling_names ? scaling_names[t] : "unknown";
}

static int64_t rot_dim(const ca_rope_config *c) { return c->rotary_dim ? c->rotary_dim : c->head_dim; }

/* The settings each type reads, in range: NULL, or the first offending field. */
static const char *bad_field(const ca_rope_config *c) {
    int64_t rot = rot_dim(c);
    if (c->head_dim < 1) return "head_dim";
    if (rot < 2 || rot % 2 || rot > c->head_dim) return "rotary_dim";
    if (c->theta < 0 || !isfinite(c->theta)) return "rope_theta";
    if ((unsigned)c->type > CA_ROPE_SCALING_YARN) return "rope_scaling type";
    if (c->type != CA_ROPE_SCALING_NONE && !(c->factor > 0 && isfinite(c->factor))) return "rope_scaling factor";
    if (c->type == CA_ROPE_SCALING_DYNAMIC && c->max_position_embeddings < 1) return "max_position_embeddings";
    if (c->type == CA_ROPE_SCALING_LLAMA3) {
        if (c->original_max_position_embeddings < 1) return "original_max_position_embeddings";
        if (!(c->low_freq_factor > 0) || !(c->high_freq_factor > c->low_freq_factor))
            return "low_freq_factor/high_freq_factor";
    }
    if (c->type == CA_ROPE_SCALING_YARN && c->original_max_position_embeddings < 1 && c->max_position_embeddings < 1)
        return "original_max_position_embeddings";
    return NULL;
}

/* base ** (f32(2i) / f32(rot)) for i < rot/2, in f32 (the power rounded once from double). */
static void pos_freqs(double base, int64_t rot, float *p) {
    for (int64_t i = 0; i < rot / 2; i++) {
        float e = (float)(2 * i) / (float)rot;
        p[i] = (float)pow((double)(float)base, (double)e);
    }
}

/* 4.39's dynamic NTK base, in f32: base * ((factor seq / max) - (factor - 1)) ** (rot / (rot - 2)). */
static double dynamic_base(const ca_rope_config *c, double base, int64_t seq_len, int64_t rot) {
    if (seq_len <= c->max_position_embeddings) return base;
    float s = (float)c->factor * (float)seq_len;
    s = s / (float)c->max_position_embeddings;
    s = s - (float)(c->factor - 1.0);
    float pw = (float)pow((double)s, (double)rot / (double)(rot - 2));   /* torch keeps a double exponent */
    return (double)((float)base * pw);
}

/* modeling_rope_utils._compute_llama3_parameters on inv (in place). */
static void llama3(const ca_rope_config *c, int64_t half, float *inv) {
    double omax = (double)c->original_max_position_embeddings;
    float low_wl = (float)(omax / c->low_freq_factor), high_wl = (float)(omax / c->high_freq_factor);
    float f = (float)c->factor, lo = (float)c->low_freq_factor, span = (float)(c->high_freq_factor - c->low_freq_factor);
    for (int64_t i = 0; i < half; i++) {
        float wl = (1.0f / inv[i]) * (float)(2 * ROPE_PI);
        float il = wl > low_wl ? inv[i] / f : inv[i];
        float sm = ((1.0f / wl) * (float)omax - lo) / span;
        float smoothed = (1.0f - sm) * il / f + sm * il;
        inv[i] = !(wl < high_wl) && !(wl > low_wl) ? smoothed : il;
    }
}

/* find_correction_dim of YaRN, in double as transformers' math.log. */
static double yarn_dim(double rotations, int64_t rot, double base, double omax) {
    return ((double)rot * log(omax / (rotations * 2 * ROPE_PI))) / (2 * log(base));
}

static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

/* modeling_rope_utils._compute_yarn_parameters from the frequencies p (base ** (2i / rot)). */
static void yarn(const ca_rope_config *c, double base, int64_t rot, const float *p, float *inv, float *scale) {
    double omax = (double)(c->original_max_position_embeddings ? c->original_max_position_embeddings
                                                               : c->max_position_embeddings);
    double bf = c->beta_fast ? c->beta_fast : 32, bs = c->beta_slow ? c->beta_slow : 1;
    double lo = floor(yarn_dim(bf, rot, base, omax)), hi = ceil(yarn_dim(bs, rot, base, omax));
    lo = lo > 0 ? lo : 0;
    hi = hi < (double)(rot - 1) ? hi : (double)(rot - 1);
    if (lo == hi) hi += 0.001;
    for (int64_t i = 0; i < rot / 2; i++) {
        float ramp = ((float)i - (float)lo) / (float)(hi - lo);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float ef = 1.0f - ramp, interp = 1.0f / ((float)c->factor * p[i]), extrap = 1.0f / p[i];
        inv[i] = interp * (1.0f - ef) + extrap * ef;
    }
    double af = c->attention_factor;
    if (!af)
        af = c->mscale && c->mscale_all_dim
                 ? yarn_mscale(c->factor, c->mscale) / yarn_mscale(c->factor, c->mscale_all_dim)
                 : yarn_mscale(c->factor, 1.0);
    if (scale) *scale = (float)af;
}

ca_status ca_rope_inv_freq(const ca_rope_config *c, int64_t seq_len, float *inv_freq, float *scale) {
    if (!c || !inv_freq) return ca_error(CA_ERR_INVALID, "ca_rope_inv_freq: %s is NULL", c ? "inv_freq" : "config");
    const char *bad = bad_field(c);
    if (bad) return ca_error(CA_ERR_INVALID, "rope: %s is out of range for rope_scaling type %s", bad,
                             ca_rope_scaling_name(c->type));
    int64_t rot = rot_dim(c), half = rot / 2;
    double base = c->theta ? c->theta : 10000.0;
    if (c->type == CA_ROPE_SCALING_DYNAMIC) base = dynamic_base(c, base, seq_len, rot);
    if (scale) *scale = 1.0f;
    float *p = malloc((size_t)half * sizeof *p);
    if (!p) return ca_error(CA_ERR_NOMEM, "rope: out of host memory for %lld frequencies", (long long)half);
    pos_freqs(base, rot, p);
    for (int64_t i = 0; i < half; i++) inv_freq[i] = 1.0f / p[i];
    if (c->type == CA_ROPE_SCALING_LLAMA3) llama3(c, half, inv_freq);
    if (c->type == CA_ROPE_SCALING_YARN) yarn(c, base, rot, p, inv_freq, scale);
    free(p);
    return CA_OK;
}

/* cos/sin rows for n positions: angle = f32(inv[i] * f32(pos)) (linear: f32(pos) / f32(factor) first). */
static void fill_tables(const ca_rope_config *c, const float *inv, int64_t half, float scale, const int64_t *pos,
                        int64_t n, float *cs, float *sn) {
    for (int64_t r = 0; r < n; r++) {
        float p = (float)(pos ? pos[r] : r);
        if (c->type == CA_ROPE_SCALING_LINEAR) p = p / (float)c->factor;
        for (int64_t i = 0; i < half; i++) {
            float a = inv[i] * p;
            cs[r * half + i] = (float)cos((double)a) * scale;
            sn[r * half + i] = (float)sin((double)a) * scale;
        }
    }
}

/* The largest position + 1 (dynamic NTK's seq_len), t without positions. */
static int64_t seq_len_of(const int64_t *pos, int64_t n) {
    if (!pos) return n;
    int64_t m = n ? pos[0] : 0;
    for (int64_t i = 1; i < n; i++) m = pos[i] > m ? pos[i] : m;
    return m + 1;
}

ca_status ca_rope_tables(ca_device *dev, const ca_rope_config *c, const int64_t *positions, int64_t batch,
                         int64_t t, ca_tensor **cos, ca_tensor **sin) {
    if (cos) *cos = NULL;
    if (sin) *sin = NULL;
    if (!dev || !c || !cos || !sin)
        return ca_error(CA_ERR_INVALID, "ca_rope_tables: %s is NULL", !dev ? "dev" : !c ? "config" : "cos or sin");
    if (t < 0 || (positions && batch < 1))
        return ca_error(CA_ERR_INVALID, "ca_rope_tables: bad sizes (batch %lld, t %lld)", (long long)batch,
                        (long long)t);
    int64_t half = rot_dim(c) / 2, rows = (positions ? batch : 1) * t;
    float *inv = malloc((size_t)(half > 0 ? half : 1) * sizeof *inv), scale = 1.0f;
    float *buf = malloc((size_t)(rows * half > 0 ? 2 * rows * half : 1) * sizeof *buf);
    ca_status s = inv && buf ? CA_OK : ca_error(CA_ERR_NOMEM, "rope: out of host memory for %lld table rows",
                                               (long long)rows);
    if (s == CA_OK) s = ca_rope_inv_freq(c, seq_len_of(positions, rows), inv, &scale);
    if (s == CA_OK) {
        fill_tables(c, inv, half, scale, positions, rows, buf, buf + rows * half);
        int64_t shape[3] = {batch, t, half};
        int nd = positions ? 3 : 2;
        const int64_t *sh = positions ? shape : shape + 1;
        ca_tensor *tc = ca_from_host(dev, CA_F32, nd, sh, buf), *ts = tc ? ca_from_host(dev, CA_F32, nd, sh,
                                                                                         buf + rows * half) : NULL;
        if (ts) { *cos = tc; *sin = ts; }
        else s = ca_last_status();
    }
    free(inv);
    free(buf);
    return s;
}
