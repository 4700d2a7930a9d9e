/* nn_impl.h: private module and optimizer layout shared by nn/ and the accelerator. */
#ifndef CACCEL_NN_IMPL_H
#define CACCEL_NN_IMPL_H

#include "tensor/tensor_impl.h"
#include <caccel/collective.h>
#include <caccel/nn.h>
#include <caccel/optim.h>

struct ca_module {
    char *type;
    ca_forward_fn forward;
    void *ctx;
    void (*ctx_free)(void *);
    double p;                        /* dropout probability / layer norm eps */
    bool training;
    int nchildren;
    char **child_names;
    ca_module **children;
    int nparams;
    char **param_names;
    ca_tensor **params;
    ca_module *parent;
    /* the accelerator that prepared it, told when the module goes first */
    void *owner;
    void (*owner_forget)(void *owner, const void *obj);
    ca_dtype autocast;               /* 0 (f32): none; f16/bf16 when prepared for mixed precision */
    bool checkpoint;                 /* activation checkpointing (ca_module_set_checkpointing) */
    /* sharded parameters (ZeRO stage 3): the accelerator gathers a wrap unit's parameters before its
     * forward and releases them after (post_forward may wrap y, e.g. to gather again in backward) */
    ca_status (*pre_forward)(void *hook_ctx, ca_module *m);
    ca_tensor *(*post_forward)(void *hook_ctx, ca_module *m, ca_tensor *y);
    void *hook_ctx;
    /* ca_tp_plan: the tensor-parallel plan the accelerator applies at prepare (accelerator/tp.c) */
    int ntp;
    char **tp_pattern;               /* module names, "*" standing for one dotted component */
    ca_tp_style *tp_style;
    int *tp_parts;                   /* equal blocks of the output features split alike (a fused qkv: 3) */
    /* a model's own plan (a causal LM's base_model_tp_plan): checks that tp_size splits it and adds its
     * entries (after the program's own) when an accelerator at tp_size > 1 prepares it; NULL: none */
    ca_status (*tp_prepare)(ca_module *self, int tp_size);
    int tp_rank, tp_size;            /* a colwise layer while its split forward runs: its tp coordinates
                                      * (accelerator/tp.c; ca_tp_heads reads them); 0 otherwise */
    const struct ca_module_seq *tp_seq; /* a module of a plan with sequence_parallel entries, split: its
                                      * split and gather along the sequence (ca_tp_sequence_split); NULL otherwise */
    /* depth-first list of every parameter with full names, rebuilt on change */
    bool flat_valid;
    int nflat;
    ca_tensor **flat;
    char **flat_names;
};

/* What the owner of a prepared module (the Accelerator) installs, as ca_optimizer_owner: told when
 * the module is destroyed first; the autocast of mixed precision its forward runs under. */
typedef struct ca_module_owner {
    void *owner;
    void (*forget)(void *owner, const void *obj);
    ca_dtype autocast;               /* CA_F32: none */
} ca_module_owner;

/* Installs (or, with NULL, removes: plain use again, no autocast, no gradient hooks on its
 * parameters) the owner of m. Installing one makes low-precision copies of the parameters stale. */
void ca_module_set_owner(ca_module *m, const ca_module_owner *owner);
/* Installs (or, with pre and post NULL, removes) the hooks around m's forward (ZeRO stage 3's
 * gather and release of a wrap unit's parameters). */
void ca_module_set_forward_hooks(ca_module *m, ca_status (*pre)(void *ctx, ca_module *m),
                                 ca_tensor *(*post)(void *ctx, ca_module *m, ca_tensor *y), void *ctx);

/* Sequence parallelism's split and gather of a prepared model's activations along the sequence over its
 * tp ranks, installed on the split modules by the accelerator (accelerator/tp_seq.c), which owns the
 * communicator: nn does not use communicators. Collective over the tp ranks; NULL with the error set. */
typedef struct ca_module_seq {
    void *ctx;                       /* the tp communicator */
    int size;                        /* the tp ranks */
    int rank;                        /* this rank among them: it holds tokens [rank T/size, (rank + 1) T/size) */
    ca_tensor *(*split)(void *ctx, ca_tensor *x);
    ca_tensor *(*gather)(void *ctx, ca_tensor *x);
} ca_module_seq;

typedef enum ca_optim_kind { CA_OPTIM_SGD = 1, CA_OPTIM_ADAMW = 2 } ca_optim_kind;

typedef struct ca_optim_group {
    int n;
    ca_tensor **params;
    ca_tensor **state1;              /* exp_avg / momentum_buffer (persistent, lazily made) */
    ca_tensor **state2;              /* exp_avg_sq */
    int first_index;                 /* index of params[0] in the optimizer's numbering */
    ca_adamw_opts adamw;
    ca_sgd_opts sgd;
    double lr, base_lr;
} ca_optim_group;

/* What the owner of a prepared optimizer (the Accelerator) installs: ca_optimizer_step and
 * ca_optimizer_zero_grad go through it (accumulation, loss scaling, clipping, skip on overflow),
 * and destroying the optimizer first tells it to drop its reference. */
typedef struct ca_optimizer_owner {
    void *owner;
    ca_status (*step)(void *owner, ca_optimizer *o);     /* replaces the plain update */
    bool (*should_zero_grad)(const void *owner);         /* false on accumulation micro-steps */
    void (*forget)(void *owner, const void *obj);
} ca_optimizer_owner;

/* Installs (or, with NULL, removes) the owner of o. Not thread-safe against a concurrent step. */
void ca_optimizer_set_owner(ca_optimizer *o, const ca_optimizer_owner *owner);

struct ca_optimizer {
    ca_optim_kind kind;
    int ngroups;
    ca_optim_group *groups;
    int64_t steps;
    bool has_schedule;
    ca_lr_schedule schedule;
    int64_t schedule_stride;         /* schedule steps per optimizer step (0 means 1) */
    bool skipped;
    bool amp_unscaled;               /* fp16: gradients already unscaled this step */
    ca_optimizer_owner owner;        /* set by ca_prepare (owner.owner NULL: plain use) */
    /* state listing for checkpoints */
    char **state_names;
    int nstate_names;
};

/* Makes each optimizer step advance the schedule by `stride` steps. A prepared
 * optimizer uses the number of processes, as Accelerate steps a prepared
 * scheduler once per process when batches are not split, so a schedule written
 * for one process ends at the same point on N. */
void ca_optimizer_set_schedule_stride(ca_optimizer *o, int64_t stride);

/* Applies one update of every group with gradients multiplied by grad_scale
 * (1: none), then advances the step count and the schedule. */
ca_status ca_optimizer_apply(ca_optimizer *o, float grad_scale);
/* Every parameter of the optimizer, in its numbering. */
int ca_optimizer_num_params(const ca_optimizer *o);
ca_tensor *ca_optimizer_param_at(const ca_optimizer *o, int i);
/* Creates missing state tensors on the parameters' devices (prepare does this
 * after moving parameters, so state lives on the training device). */
ca_status ca_optimizer_init_state(ca_optimizer *o);
/* The parameter of the i-th state tensor as ca_optimizer_state_at lists them once
 * ca_optimizer_init_state has made them, with its name and slot (0: exp_avg or momentum_buffer,
 * 1: exp_avg_sq), without making any (its shape is the parameter's, its dtype f32): a sharded load
 * reads only its slices. NULL past the last one. */
ca_tensor *ca_optimizer_state_param(ca_optimizer *o, int i, const char **name, int *slot);

/* Initialisation as transformers' _init_weights does it for the pretrained models (nn/layers.c):
 * ca_nn_init_normal fills t with N(0, std) from the process generator; ca_nn_add_linear adds a
 * Linear (weight N(0, std), bias 0) and ca_nn_add_embedding an Embedding (N(0, std), the
 * padding_idx row pad zeroed when pad >= 0) to parent as `name`, setting *out. On failure nothing
 * is left allocated. */
ca_status ca_nn_init_normal(ca_tensor *t, float std);
ca_status ca_nn_add_linear(ca_module *parent, const char *name, int64_t in, int64_t out_f, bool bias, float std,
                           ca_module **out);
ca_status ca_nn_add_embedding(ca_module *parent, const char *name, int64_t n, int64_t dim, int64_t pad, float std,
                              ca_module **out);

/* The sizes of a BERT config (nn/bert_config.c), checked before config.json is accepted and
 * before ca_bert_model_create allocates anything: positive, at most 1000 layers,
 * num_attention_heads dividing hidden_size, and each weight and the whole model (with a
 * classifier of num_labels, 0: none) within the memory there is (physical memory, or ulimit -v
 * / -d when lower). The message starts with `what` ("config 'x/config.json'", "BertModel") and
 * names the key. */
struct ca_bert_config;
ca_status ca_bert_check_sizes(const struct ca_bert_config *c, int64_t num_labels, const char *what);

/* The same checks for a decoder config (nn/causal_lm_config.c): sizes in [1, 2^40], at most 1000
 * layers, heads of an even size dividing hidden_size, num_key_value_heads dividing the heads,
 * pad_token_id below vocab_size, the model within the memory there is. Messages start with
 * `what` and name the key. */
struct ca_causal_lm_config;
ca_status ca_causal_lm_check_sizes(const struct ca_causal_lm_config *c, const char *what);

/* GPT2LMHeadModel (nn/gpt2_lm.c), reached through ca_causal_lm_create / ca_causal_lm_forward:
 * create for a checked config; the config of a GPT-2 module (NULL for another module); the forward
 * on arguments ca_causal_lm_forward checked. */
ca_status ca_gpt2_lm_create(const struct ca_causal_lm_config *c, ca_module **out);
const struct ca_causal_lm_config *ca_gpt2_lm_config(const ca_module *m);
ca_status ca_gpt2_lm_run(ca_module *m, ca_tensor *ids, ca_tensor *mask, ca_tensor *pos, ca_tensor **logits);

#endif
