#!/bin/sh
# log_with tensorboard: the event file caccel writes, read back by TensorBoard's own reader
# (tensorboard.backend.event_processing.event_accumulator): every scalar at its step, exactly.
# SKIP when this build has no TensorBoard writer (configure found no protobuf-c) or Python lacks
# the tensorboard package (tools/install-deps.sh --test installs it).
set -u
build=${CACCEL_TEST_BUILDDIR:-.}
prog="$build/tests/test_trackers"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/caccel-tb-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
fail() { echo "FAIL: $*"; exit 1; }

"$prog" --log "$tmp" tensorboard > "$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
if [ $rc -eq 77 ]; then
    grep -q "log_with tensorboard (from .*): tensorboard is not available in caccel: this build does not write its files" \
        "$tmp/out" || fail "the refusal does not say why"
    echo "SKIP: this build writes no TensorBoard files (configure found no protobuf-c)"
    exit 77
fi
[ $rc -eq 0 ] || fail "logging to tensorboard exited $rc"
ls "$tmp/run"/events.out.tfevents.* > /dev/null 2>&1 || fail "no events.out.tfevents.* file in $tmp/run"
if ! python3 -c 'import tensorboard' 2>/dev/null; then
    echo "SKIP: Python's tensorboard package is not installed (tools/install-deps.sh --test)"
    exit 77
fi
python3 - "$tmp/run" <<'PY' || fail "TensorBoard's reader disagrees"
import sys
from tensorboard.backend.event_processing import event_accumulator
acc = event_accumulator.EventAccumulator(sys.argv[1])
acc.Reload()
tags = sorted(acc.Tags()["scalars"])
assert tags == ["accuracy", "loss"], tags
for tag, want in (("loss", lambda s: 1.0 / (s + 1)), ("accuracy", lambda s: s / 8.0)):
    events = acc.Scalars(tag)
    assert [e.step for e in events] == [0, 1, 2, 3, 4], (tag, [e.step for e in events])
    for e in events:
        # simple_value is a float32: 1/3 arrives rounded to float32
        assert abs(e.value - want(e.step)) <= 1e-7 * max(1.0, abs(want(e.step))), (tag, e.step, e.value)
        assert e.wall_time > 1.5e9, e.wall_time
print("ok: TensorBoard reads", {t: len(acc.Scalars(t)) for t in tags}, "scalars")
PY
echo "ok"
