/* One process: nothing to synchronise. Every gradient is final where backward leaves it, and
 * several models (GANs, teacher/student) are fine. */
#include "accelerator/sync_impl.h"

static bool none_selected(const ca_accelerator *acc) {
    (void)acc;
    return true;   /* the last row of the table */
}

static ca_status none_prepare_extra_model(ca_accelerator *acc, ca_module *m) {
    (void)acc;
    (void)m;
    return CA_OK;
}

const ca_sync_strategy ca_sync_none = {
    .name = "none",
    .key = "distributed_type",
    .selected = none_selected,
    .prepare_extra_model = none_prepare_extra_model,
};
