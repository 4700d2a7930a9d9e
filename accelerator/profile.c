/* The profiler as the accelerator runs it: the configuration's profile keys (Accelerate's
 * ProfileKwargs) begin a trace at ca_accelerator_create, each optimizer step is a step of the
 * schedule, and ca_accelerator_destroy ends it (docs/PROFILING.md). */
#include "accelerator/accelerator_impl.h"
#include "base/trace_impl.h"

#include <caccel/profile.h>

static int cfg_int(const ca_accelerator *acc, const char *key) {
    int64_t v = 0;
    if (ca_config_get_int(acc->cfg, key, &v) != CA_OK) {
        ca_clear_error();
        v = 0;
    }
    return (int)v;
}

static bool cfg_bool(const ca_accelerator *acc, const char *key) {
    bool v = false;
    if (ca_config_get_bool(acc->cfg, key, &v) != CA_OK) {
        ca_clear_error();
        v = false;
    }
    return v;
}

ca_status ca_accelerator_profile_begin(ca_accelerator *acc) {
    if (!cfg_bool(acc, "profiling")) return CA_OK;
    if (ca_profile_running()) {   /* the program profiles itself: its begin and end stand */
        ca_log_printf(CA_LOG_WARNING, "profiling (from %s): a profile is already running; the accelerator leaves it as it is",
                      ca_config_origin(acc->cfg, "profiling"));
        return CA_OK;
    }
    ca_profile_config pc = {
        .activities = ca_config_get(acc->cfg, "profile_activities"),
        .wait = cfg_int(acc, "profile_wait"),
        .warmup = cfg_int(acc, "profile_warmup"),
        .active = cfg_int(acc, "profile_active"),
        .repeat = cfg_int(acc, "profile_repeat"),
        .record_shapes = cfg_bool(acc, "profile_record_shapes"),
        .profile_memory = cfg_bool(acc, "profile_memory"),
        .with_flops = cfg_bool(acc, "profile_with_flops"),
        .output_trace_dir = ca_config_get(acc->cfg, "output_trace_dir"),
        .rank = acc->rank < 0 ? 0 : acc->rank,
    };
    ca_status s = ca_profile_begin(&pc);
    if (s != CA_OK) return ca_error_context("profiling (from %s)", ca_config_origin(acc->cfg, "profiling"));
    acc->profiling = true;
    return CA_OK;
}

void ca_accelerator_profile_step(ca_accelerator *acc, const ca_optimizer *o) {
    /* one step per optimizer step of the first prepared optimizer, as prof.step() once per loop */
    if (acc->profiling && acc->nopts > 0 && acc->opts[0] == o && ca_profile_step() != CA_OK) ca_clear_error();
}

void ca_accelerator_profile_end(ca_accelerator *acc) {
    if (!acc->profiling) return;
    acc->profiling = false;
    if (ca_profile_end() != CA_OK) {
        ca_log_printf(CA_LOG_ERROR, "profiler: %s", ca_last_error());
        ca_clear_error();
    } else if (acc->rank <= 0) {
        ca_log_printf(CA_LOG_INFO, "profiler: trace written to %s", ca_profile_last_path());
    }
}
