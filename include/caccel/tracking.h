/* caccel/tracking.h: experiment trackers, as Accelerate's log_with / init_trackers / log /
 * end_training.
 *
 * The configuration key log_with (also ca_options.log_with, CACCEL_LOG_WITH, --log_with) names the
 * trackers, comma-separated: "json" (JSON lines), "csv", "mlflow", "tensorboard" (when configure
 * found protobuf-c), or "all" (every tracker of this build). Accelerate's wandb, comet_ml, aim,
 * clearml, dvclive, swanlab and trackio are accepted as values and refused by ca_init_trackers with
 * one message: they need their Python clients. Files go to <logging_dir>/<project>/, logging_dir
 * defaulting to project_dir, then ".":
 *
 *   hparams.json     {"project": ..., "config": {the program's pairs}, "run": {every configuration
 *                    key with a value: its value and origin}}, written by ca_init_trackers
 *   metrics.jsonl    one line per ca_log_metrics: {"step": N, "time": <unix seconds>, "<name>": value, ...}
 *   metrics.csv      step,time,name,value (one row per value)
 *   events.out.tfevents.<seconds>.<host>   TensorBoard's event file: each value a scalar summary
 *                    (float32) at its step; `tensorboard --logdir <logging_dir>` shows the curves.
 *                    Hyperparameters are in hparams.json only (not TensorBoard's hparams plugin).
 *
 * and mlflow writes MLflow's local file store under <logging_dir>/mlruns/ (what `mlflow ui
 * --backend-store-uri <logging_dir>/mlruns` and MlflowClient read; MLflow 3 wants
 * MLFLOW_ALLOW_FILE_STORE=true for it): the experiment named `project` (found by name, else created
 * with a random id; experiment 0 "Default" when mlruns is new), one run per ca_init_trackers
 * (32-hex id, name caccel-<UTC date-time>) whose params are every configuration value and the
 * program's pairs (these win on a clash), metrics/<name> lines "<unix ms> <value> <step>" (negative
 * step: 0), tags mlflow.runName, mlflow.user, mlflow.source.type, and status RUNNING until
 * ca_end_training sets FINISHED. Names must be MLflow's: letters, digits, '_', '-', '.', ' ', ':',
 * '/' (a folder), not starting with '/'; another is CA_ERR_INVALID naming it, before any tracker
 * writes.
 *
 * Only the main process writes; on the other processes every call returns CA_OK and does nothing.
 * Lines are flushed by every ca_log_metrics, so a run that dies keeps what it logged. */
#ifndef CACCEL_TRACKING_H
#define CACCEL_TRACKING_H

#include <caccel/accelerator.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One logged value. */
typedef struct ca_metric {
    const char *name;
    double value;
} ca_metric;

/* Starts the trackers of log_with for the run `project` (a directory name: no '/'). `config`:
 * the program's hyperparameters as "key=value" strings, NULL-terminated (NULL: none); the
 * accelerator's configuration is recorded with them. With log_with unset it does nothing.
 * CA_ERR_UNSUPPORTED for a tracker this build does not write, CA_ERR_CONFIG for an unknown name,
 * CA_ERR_STATE when already started. */
CA_API ca_status ca_init_trackers(ca_accelerator *acc, const char *project, const char *const *config);

/* Accelerate's accelerator.log (ca_log is the tensor op of caccel/ops.h): logs n values at `step`
 * (negative: no step; JSON null, TensorBoard step 0). Names are unique within a call.
 * CA_ERR_STATE before ca_init_trackers (when log_with is set). */
CA_API ca_status ca_log_metrics(ca_accelerator *acc, const ca_metric *values, size_t n, int64_t step);

/* Closes the trackers' files and marks the MLflow run FINISHED (ca_accelerator_destroy does it too).
 * Accepts an accelerator without trackers. CA_ERR_IO when a file could not be completed. */
CA_API ca_status ca_end_training(ca_accelerator *acc);

#ifdef __cplusplus
}
#endif

#endif
