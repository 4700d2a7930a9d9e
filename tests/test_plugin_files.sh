#!/bin/sh
# Broken files in the plugin path are skipped with a warning that names them; they never take the
# process down. A truncated copy of a real plugin used to kill every caccel program with SIGBUS
# inside dlopen (the loader maps the file as if whole and touches pages past its end); a text file
# named like a plugin, and an ELF file that is not a caccel plugin, are refused by dlopen's and
# the registry's own checks. A FIFO named like a plugin blocked dlopen for ever; it is skipped too.
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$b/tools/caccel" ] || { echo "SKIP: $b/tools/caccel not built"; exit 77; }
real=""
for d in $(echo "${CACCEL_PLUGIN_PATH:-}" | tr ':' ' ') "$b/collectives/.libs"; do
    for n in gloo mpi; do [ -z "$real" ] && [ -f "$d/caccel_$n.so" ] && real="$d/caccel_$n.so"; done
done
[ -n "$real" ] || { echo "SKIP: no built plugin (caccel_gloo.so or caccel_mpi.so) to truncate"; exit 77; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-plugins.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
size=$(wc -c < "$real")
for n in 2000 20000 $((size / 2)) $((size - 1)); do
    head -c "$n" "$real" > "$WORK/caccel_cut$n.so"
done
echo "not a shared object" > "$WORK/caccel_text.so"
mkfifo "$WORK/caccel_fifo.so"
cp "$b/tools/.libs/caccel" "$WORK/caccel_notplugin.so" 2>/dev/null || cp "$b/tools/caccel" "$WORK/caccel_notplugin.so"

out=$(CACCEL_PLUGIN_PATH="$WORK" timeout 60 "$b/tools/caccel" env 2>&1); rc=$?
echo "$out" | grep -E "warning|error" | sed 's/^/    /'
[ $rc -eq 0 ] || fail "caccel env exited with $rc with broken files in the plugin path (138/135 = SIGBUS, 124 = blocked)"
for n in 2000 20000 $((size / 2)) $((size - 1)); do
    echo "$out" | grep -q "plugin $WORK/caccel_cut$n.so skipped: the file is truncated: $n bytes" ||
        fail "no warning naming the truncated $WORK/caccel_cut$n.so"
done
echo "$out" | grep -q "plugin $WORK/caccel_text.so could not be loaded" || fail "no warning naming the text file"
echo "$out" | grep -q "plugin $WORK/caccel_fifo.so skipped: not a regular file (a FIFO)" ||
    fail "no warning naming the FIFO"
out=$(CACCEL_PLUGIN_PATH="$WORK" timeout 120 "$b/examples/linear_regression" --cpu --epochs 2 2>&1) ||
    { echo "$out"; fail "a program did not run with broken files in the plugin path"; }
echo "PASS: truncated, text, FIFO and non-plugin files in the plugin path are skipped, each named"
