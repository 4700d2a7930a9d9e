#!/bin/sh
# log_with mlflow: the file store caccel writes (<logging_dir>/mlruns), read back by MLflow's own
# client (mlflow.tracking.MlflowClient on a file: tracking URI): the experiment by name, the run
# FINISHED, every metric value at its step, the program's and the run's parameters.
# The read-back part SKIPs when Python lacks the mlflow package (tools/install-deps.sh --test
# installs mlflow-skinny); the layout itself is checked by tests/test_trackers.
set -u
build=${CACCEL_TEST_BUILDDIR:-.}
prog="$build/tests/test_trackers"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/caccel-mlflow-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
fail() { echo "FAIL: $*"; exit 1; }

"$prog" --log "$tmp" mlflow > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "logging to mlflow failed"; }
ls "$tmp"/mlruns/*/meta.yaml > /dev/null 2>&1 || fail "no experiment under $tmp/mlruns"
if ! python3 -c 'import mlflow' 2>/dev/null; then
    echo "SKIP: Python's mlflow package is not installed (tools/install-deps.sh --test installs mlflow-skinny)"
    exit 77
fi
# MLflow 3 reads the file store only when asked to (it recommends a database for new work)
MLFLOW_ALLOW_FILE_STORE=true MLFLOW_ENABLE_ASYNC_LOGGING=false python3 - "$tmp/mlruns" <<'PY' 2>"$tmp/py.err" || { cat "$tmp/py.err"; fail "MLflow's reader disagrees"; }
import pathlib, sys, warnings
warnings.simplefilter("ignore")
from mlflow.tracking import MlflowClient
client = MlflowClient(tracking_uri=pathlib.Path(sys.argv[1]).resolve().as_uri())
exp = client.get_experiment_by_name("run")
assert exp is not None and exp.lifecycle_stage == "active", exp
runs = client.search_runs([exp.experiment_id])
assert len(runs) == 1, runs
run = runs[0]
assert run.info.status == "FINISHED", run.info.status
assert run.info.end_time >= run.info.start_time > 1.5e12, (run.info.start_time, run.info.end_time)
assert run.data.params["lr"] == "0.01", run.data.params
assert run.data.params["log_with"] == "mlflow", run.data.params
assert run.data.tags["mlflow.runName"] == run.info.run_name, (run.data.tags, run.info.run_name)
for key, want in (("loss", lambda s: 1.0 / (s + 1)), ("accuracy", lambda s: s / 8.0)):
    hist = client.get_metric_history(run.info.run_id, key)
    assert [m.step for m in hist] == [0, 1, 2, 3, 4], (key, [m.step for m in hist])
    for m in hist:
        assert m.value == want(m.step), (key, m.step, m.value)   # %.17g round-trips a double
print("ok: MLflow reads run", run.info.run_id, "with", len(run.data.params), "params")
PY
cat "$tmp/py.err" >&2
echo "ok"
