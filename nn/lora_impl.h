/* lora_impl.h: what nn/lora.c (the wrapped layers) shares with nn/lora_files.c (PEFT's files). */
#ifndef CACCEL_LORA_IMPL_H
#define CACCEL_LORA_IMPL_H

#include "nn/nn_impl.h"

#include <caccel/lora.h>

/* The state of a wrapped layer: the module's ctx while it carries an adapter. */
typedef struct ca_lora_layer {
    ca_lora_config cfg;                /* a deep copy (ca_lora_config_copy), owned */
    double scaling;
    bool fan_in_fan_out;               /* the layer's weight is [in, out] */
    bool merged;                       /* scaling * B A is in the weight: forward is the base's */
    int64_t in, out;
    ca_module *a, *b;                  /* the children lora_A [r, in] and lora_B [out, r] */
    /* the layer as it was, restored when the adapter is removed */
    ca_forward_fn base_forward;
    void *base_ctx;
    void (*base_ctx_free)(void *);
    char *base_type;
    /* tensor parallelism (accelerator/tp.c): the exchange of the adapter's r-wide product lora_A(x) over the
     * tp ranks (a colwise base: its gradient all-reduced; a rowwise one: the partial products summed), or
     * NULL; tp_ctx is its communicator */
    ca_tensor *(*tp_mix)(ca_tensor *h, void *tp_ctx);
    void *tp_ctx;
    /* under sequence parallelism the adapter's whole matrix that sees only this rank's tokens (lora_A on a
     * colwise base, whose input x is this rank's tokens; lora_B on a rowwise one: tp_whole_b) goes through
     * tp_whole, which sums its gradient over tp; NULL otherwise */
    ca_tensor *(*tp_whole)(ca_tensor *w, void *tp_ctx);
    bool tp_whole_b;
} ca_lora_layer;

/* The adapter state of m, or NULL when m is not a wrapped layer. */
ca_lora_layer *ca_lora_layer_of(const ca_module *m);

/* A module with its full name ("encoder.layer.0.attention.self.query"). */
typedef struct ca_lora_named {
    char *name;
    ca_module *m;
} ca_lora_named;
void ca_lora_named_free(ca_lora_named *list, int n);
/* Every wrapped layer of model, depth first. */
ca_status ca_lora_layers(ca_module *model, ca_lora_named **out, int *n);
/* The modules cfg targets in model, each checked (a Linear or Conv1D without an adapter), or an
 * error naming the module; none found is an error too. */
ca_status ca_lora_targets(ca_module *model, const ca_lora_config *cfg, ca_lora_named **out, int *n);

/* Checks cfg's values; `what` starts the message ("LoraConfig", "adapter 'x/adapter_config.json'"). */
ca_status ca_lora_config_check(const ca_lora_config *cfg, const char *what);
/* A deep copy (strings and the name list owned by dst), freed by ca_lora_config_free. */
ca_status ca_lora_config_copy(ca_lora_config *dst, const ca_lora_config *src);
void ca_lora_config_free(ca_lora_config *c);
/* lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora. */
double ca_lora_scaling(const ca_lora_config *cfg);
/* The [in, out] of a target's weight after its layout (Linear [out, in], Conv1D [in, out]). */
bool ca_lora_layout(const ca_module *m, bool *fan_in_fan_out, int64_t *in, int64_t *out);

#endif
