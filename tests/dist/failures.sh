#!/bin/sh
# What users meet: mismatched collectives, a late rank, a rank that dies, Ctrl-C, a killed launcher, a wrong token.
. "$(dirname "$0")/lib.sh"
need_caccel
need_backend gloo
L="timeout 120 $CACCEL launch --main_process_port 0 --num_processes 3"

note "desync: a barrier only rank 0 reaches fails fast on every rank"
start=$(date +%s)
$L -q "$CHECK" --tag "$TAG" --backend gloo --mode desync --timeout-ms 60000 >"$WORK/out" 2>&1
count 3 "comm_check: EXPECTED rank .* failed after [0-9.]* s (CA_ERR_PEER).*mismatch" "$WORK/out"
[ "$(elapsed_since "$start")" -lt 30 ] || fail "the desync took the whole timeout to surface"

note "timeout: the waiting ranks name the collective and the late rank"
$L -q "$CHECK" --tag "$TAG" --backend gloo --mode timeout --timeout-ms 3000 --sleep-ms 6000 >"$WORK/out" 2>&1
count 2 "comm_check: EXPECTED rank [01] failed .*CA_ERR_TIMEOUT.*all_reduce #2 (f32, 16 elements, sum) timed out after 3 s.*rank 2 has finished #1" "$WORK/out"

note "a rank exits with an error: the launcher stops the job and names it"
start=$(date +%s)
$L "$CHECK" --tag "$TAG" --backend gloo --mode exit >"$WORK/out" 2>&1
rc=$?
[ "$rc" -eq 7 ] || { cat "$WORK/out"; fail "launcher exit status $rc, expected the rank's 7"; }
count 1 "caccel launch: rank 2 (local rank 2, pid [0-9]*) exited with code 7" "$WORK/out"
[ "$(elapsed_since "$start")" -lt 30 ] || fail "stopping the job took too long"
no_orphans

# the launcher itself (no `timeout` in between) gets the signals below; a guard stops a hung one (after
# the 120 s that wait_lines gives a busy machine to start the job)
guard() { ( sleep 180; kill -KILL "$1" 2>/dev/null ) >/dev/null 2>&1 & }
N="$CACCEL launch --main_process_port 0 --num_processes 3"

# the signals come once every rank has completed an all-reduce ("spinning"); the output file is emptied
# first, so that the previous case's lines cannot stand in for them
note "SIGINT to the launcher reaches every rank"
: >"$WORK/out"
$N -q "$CHECK" --tag "$TAG" --backend gloo --mode spin >>"$WORK/out" 2>&1 &
lpid=$!
guard $lpid
wait_lines 3 "comm_check: rank [0-2] spinning" "the 3 ranks did not start reducing" "$lpid" "$WORK/out"
kill -INT $lpid
wait $lpid
rc=$?
[ "$rc" -eq 130 ] || { cat "$WORK/out"; fail "launcher exit status $rc after SIGINT, expected 130"; }
no_orphans

note "SIGKILL to the launcher: the ranks die with it"
: >"$WORK/out"
$N -q "$CHECK" --tag "$TAG" --backend gloo --mode spin >>"$WORK/out" 2>&1 &
lpid=$!
wait_lines 3 "comm_check: rank [0-2] spinning" "the 3 ranks did not start reducing" "$lpid" "$WORK/out"
kill -KILL $lpid
wait $lpid 2>/dev/null
no_orphans

note "a process with the wrong job token is refused"
$L -q "$CHECK" --tag "$TAG" --backend gloo --mode badtoken --timeout-ms 20000 >"$WORK/out" 2>&1
rc=$?
[ "$rc" -eq 3 ] || { cat "$WORK/out"; fail "launcher exit status $rc, expected 3 (rank 1 refused)"; }
count 1 "comm_check: EXPECTED rank 1 was refused: .*wrong job token" "$WORK/out"
count 1 "caccel launch: rank 1 .* exited with code 3" "$WORK/out"
no_orphans
echo "PASS"
