#!/bin/sh
# A full disk never goes unnoticed: caccel launch warns once, naming the file and the reason, when a
# --log_dir log cannot be written (the log is a link to /dev/full), and the rank's output still
# reaches the terminal; save_state on a full file system (a 256 KiB tmpfs; root only, where mount
# is allowed) fails with an error and leaves the previous checkpoint loadable; then saves over a
# checkpoint (named, and automatically named with total_limit) with a page more free space each
# time, so that the disk fills at every step of a save in turn: after each, the new checkpoint loads
# if the save succeeded, else the previous one. The trackers' case is in tests/test_trackers
# (test_full_disk).
. "$(dirname "$0")/dist/lib.sh"
need_caccel
[ -w /dev/full ] || skip "no /dev/full"

note "caccel launch --log_dir, stdout.log on a full disk"
mkdir -p "$WORK/logs/0"
ln -s /dev/full "$WORK/logs/0/stdout.log"
"$CACCEL" launch --num_processes 1 --log_dir "$WORK/logs" \
    sh -c 'for i in 1 2 3; do echo "line $i"; done; echo "to stderr" >&2' >"$WORK/out" 2>"$WORK/err" ||
    { cat "$WORK/err"; fail "launch failed"; }
cat "$WORK/err"
n=$(grep -c "warning: cannot write $WORK/logs/0/stdout.log: No space left on device" "$WORK/err")
[ "$n" -eq 1 ] || fail "expected one warning naming stdout.log and ENOSPC, got $n"
[ "$(grep -c '^line ' "$WORK/out")" -eq 3 ] || fail "the output did not reach the terminal: $(cat "$WORK/out")"
grep -q "to stderr" "$WORK/logs/0/stderr.log" || fail "stderr.log, on a working disk, lost its line"

note "save_state on a full file system"
STATE="$BUILD/tests/test_state"
[ -x "$STATE" ] || skip "no $STATE"
[ "$(id -u)" -eq 0 ] || { echo "SKIP (part): mounting a small tmpfs needs root"; exit 0; }
mkdir "$WORK/small"
mount -t tmpfs -o size=256k tmpfs "$WORK/small" 2>"$WORK/mount.err" ||
    { echo "SKIP (part): cannot mount a tmpfs here: $(cat "$WORK/mount.err")"; exit 0; }
unmount() { umount "$WORK/small" 2>/dev/null; }
CLEANUPS="unmount"
"$STATE" --full-disk "$WORK/small" || fail "save_state on a full disk (above)"
echo "PASS"
