/* mlflow_impl.h: log_with mlflow (tracking.c): MLflow's local file store, as `mlflow ui` and
 * mlflow.get_run read it:
 *
 *   <root>/0/meta.yaml                 the Default experiment (created with <root>, as MLflow does)
 *   <root>/<exp>/meta.yaml             the experiment named after the project (reused by name)
 *   <root>/<exp>/<run>/meta.yaml       the run: status RUNNING, FINISHED at close; times in ms
 *   <root>/<exp>/<run>/params/<key>    one value per file, no newline
 *   <root>/<exp>/<run>/metrics/<key>   one line per logged value: "<unix ms> <value> <step>"
 *   <root>/<exp>/<run>/tags/<key>      mlflow.runName, mlflow.user, mlflow.source.type
 *   <root>/<exp>/<run>/artifacts/      empty
 *
 * <exp> is a random 63-bit decimal id, <run> 32 hex digits (uuid4's hex form), both as MLflow. */
#ifndef CACCEL_MLFLOW_IMPL_H
#define CACCEL_MLFLOW_IMPL_H

#include <caccel/tracking.h>

#include <stdbool.h>

typedef struct ca_mlflow ca_mlflow;

/* One parameter of the run. */
typedef struct ca_mlflow_param {
    const char *key, *value;
} ca_mlflow_param;

/* Creates <root> if needed, finds or creates the experiment `experiment`, starts a run with the
 * params (a later duplicate key overrides an earlier one). */
ca_status ca_mlflow_open(const char *root, const char *experiment, const ca_mlflow_param *params, size_t nparams,
                         ca_mlflow **out);
/* Appends each value to metrics/<name> (step < 0: 0). CA_ERR_INVALID for a name MLflow refuses. */
ca_status ca_mlflow_log(ca_mlflow *m, const ca_metric *values, size_t n, int64_t step, double unix_seconds);
/* Rewrites the run's meta.yaml with status FINISHED and its end time; frees m (NULL accepted). */
ca_status ca_mlflow_close(ca_mlflow *m);

#endif
