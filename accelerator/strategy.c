/* The table of gradient-synchronisation strategies (sync_impl.h) and the one choice among them.
 * Adding a strategy: its own sync_<name>.c defining a ca_sync_strategy, and one row here. */
#include "accelerator/mesh_impl.h"
#include "accelerator/sync_impl.h"

/* In order of precedence: the first row whose `selected` says yes is the run's strategy.
 * (Combinations are refused where they are read: deterministic with ZeRO in zero_config.c.) */
static const ca_sync_strategy *const strategies[] = {
    &ca_sync_deterministic,   /* deterministic: true */
    &ca_sync_zero,            /* distributed_type FSDP / DEEPSPEED (a ZeRO stage) */
    &ca_sync_ddp,             /* several processes */
    &ca_sync_none,            /* one process */
};

ca_status ca_sync_select(ca_accelerator *acc) {
    ca_status s = ca_zero_configure(acc);   /* the stage, from FSDP's keys or DeepSpeed's JSON */
    if (s != CA_OK) return s;
    for (size_t i = 0; !acc->sync_ops && i < sizeof strategies / sizeof *strategies; i++)
        if (strategies[i]->selected(acc)) acc->sync_ops = strategies[i];
    return acc->sync_ops->configure ? acc->sync_ops->configure(acc) : CA_OK;
}

ca_status ca_summon_full_params(ca_accelerator *acc, bool on) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_summon_full_params: accelerator is NULL");
    if (!on) {   /* the tp slices first, while stage 3's parameters still hold their values */
        ca_status t = ca_tp_full_params(acc, false);
        ca_status s = acc->sync_ops->summon ? acc->sync_ops->summon(acc, false) : CA_OK;
        return t != CA_OK ? t : s;
    }
    ca_status s = acc->sync_ops->summon ? acc->sync_ops->summon(acc, true) : CA_OK;
    return s == CA_OK ? ca_tp_full_params(acc, true) : s;   /* then tensor parallelism's slices whole */
}
