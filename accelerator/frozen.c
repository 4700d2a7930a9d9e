/* Frozen parameters (requires_grad false) and prepared models: DDP's buckets, deterministic mode's
 * gradient rows and ZeRO's shards are laid out over the parameters that are trainable when the model
 * is prepared. A parameter frozen or unfrozen after that would silently miss its reduction or have a
 * stale one stepped, so, as torch's DDP, the next ca_backward refuses the change. */
#include "accelerator/sync_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct ca_trainable_snap {
    const ca_module *m;
    int n;
    bool *on;                    /* [n] requires_grad of each parameter at ca_prepare */
} ca_trainable_snap;

ca_status ca_trainable_snapshot(ca_accelerator *acc, ca_module *m) {
    if (acc->sync_ops == &ca_sync_none) return CA_OK;   /* one process, nothing laid out: any change is fine */
    ca_trainable_snap *ns = realloc(acc->snaps, (size_t)(acc->nsnaps + 1) * sizeof *ns);
    if (!ns) return ca_error(CA_ERR_NOMEM, "out of host memory");
    acc->snaps = ns;
    int n = ca_module_num_params(m);
    bool *on = calloc((size_t)n + 1, sizeof *on);
    if (!on) return ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < n; i++) on[i] = m->flat[i]->requires_grad;
    acc->snaps[acc->nsnaps++] = (ca_trainable_snap){.m = m, .n = n, .on = on};
    return CA_OK;
}

ca_status ca_trainable_check(const ca_accelerator *acc) {
    for (int k = 0; k < acc->nsnaps; k++) {
        const ca_trainable_snap *sn = &acc->snaps[k];
        ca_module *m = (ca_module *)sn->m;
        for (int i = 0; i < sn->n && i < ca_module_num_params(m); i++) {
            if (m->flat[i]->requires_grad == sn->on[i]) continue;
            return ca_error(CA_ERR_STATE, "ca_backward: parameter %s was %s after ca_prepare (rank %d); %s lays out "
                            "its gradient reduction over the parameters trainable when the model is prepared: set "
                            "requires_grad (ca_module_requires_grad) before ca_prepare", m->flat_names[i],
                            sn->on[i] ? "frozen" : "unfrozen", acc->rank, acc->sync_ops->name);
        }
    }
    return CA_OK;
}

void ca_trainable_forget(ca_accelerator *acc, const void *m) {
    for (int k = 0; k < acc->nsnaps; k++)
        if (acc->snaps[k].m == m) {
            free(acc->snaps[k].on);
            acc->snaps[k--] = acc->snaps[--acc->nsnaps];
        }
}

void ca_trainable_free(ca_accelerator *acc) {
    for (int k = 0; k < acc->nsnaps; k++) free(acc->snaps[k].on);
    free(acc->snaps);
    acc->snaps = NULL;
    acc->nsnaps = 0;
}
