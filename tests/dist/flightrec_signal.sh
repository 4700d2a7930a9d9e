#!/bin/sh
# The flight recorder on a signal (docs/PROFILING.md, "Flight recorder"): SIGUSR1 asks every rank for a
# dump and the job goes on (each later dump keeps the one before as rank_<r>.<n>.json); a rank that
# takes a fatal signal (SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL) writes its dump before the signal's
# action, also a stack overflow on a thread other than the main one (each runtime thread has its own
# alternate signal stack), and `caccel trace analyze` reads both kinds and names, for a collective
# that failed, the rank it waited on.
. "$(dirname "$0")/lib.sh"
need_caccel
need_backend gloo
unset CACCEL_FLIGHT_RECORDER_ENTRIES
L="timeout 60 $CACCEL launch --main_process_port 0 --num_processes 2"

analyze() {
    "$CACCEL" trace analyze "$1" >"$WORK/report" 2>&1 || { cat "$WORK/out" "$WORK/report"; fail "trace analyze $1 failed"; }
    sed 's/^/    | /' "$WORK/report"
}

note "SIGUSR1 to both ranks once each has completed an all_reduce: each writes a dump and goes on"
$L -q --flight_recorder_dir "$WORK/fr" "$CHECK" --tag "$TAG" --backend gloo --mode ondemand \
    --resume "$WORK/go" >"$WORK/out" 2>&1 &
lpid=$!
wait_lines 2 "comm_check: rank [01] (pid [0-9]*) completed all_reduce #0" "the 2 ranks did not reduce" "$lpid" "$WORK/out"
# (not "pids": wait_lines sets that)
rpids=$(sed -n 's/^comm_check: rank [01] (pid \([0-9]*\)) completed.*/\1/p' "$WORK/out")
for p in $rpids; do kill -USR1 "$p"; done
wait_lines 2 "flight recorder: rank [01] wrote its last 1 collectives" "no dump on SIGUSR1" "$lpid" "$WORK/out"
# a second request: the first dump is kept as rank_<r>.1.json
for p in $rpids; do kill -USR1 "$p"; done
wait_lines 4 "flight recorder: rank [01] wrote its last 1 collectives" "no second dump on SIGUSR1" "$lpid" "$WORK/out"
touch "$WORK/go"
wait "$lpid" || { cat "$WORK/out"; fail "the job did not go on after its dumps (status $?)"; }
# the program's own SIGUSR1 handler (installed before the recorder's) ran after each dump
count 2 "comm_check: OK rank [01] went on after its dump; its own SIGUSR1 handler ran 2 times" "$WORK/out"
for r in 0 1; do
    [ -f "$WORK/fr/rank_$r.json" ] && [ -f "$WORK/fr/rank_$r.1.json" ] || { ls -l "$WORK/fr"; fail "rank $r kept no two dumps"; }
    grep -q '"dump": 2,' "$WORK/fr/rank_$r.json" && grep -q '"dump": 1,' "$WORK/fr/rank_$r.1.json" ||
        fail "rank $r's dumps are not numbered 2 (newest) and 1"
done
analyze "$WORK/fr"
count 1 "^flight recorder: 2 of 2 ranks wrote a record" "$WORK/report"
count 2 "^rank [01] (pid .*): at #1 (not called yet); last completed #0 all_reduce(f32, 16, sum); 1 issued" "$WORK/report"
count 2 "^  dump on demand (SIGUSR1): the process received SIGUSR1 (a dump on demand; the process goes on) on rank [01]$" "$WORK/report"
no_orphans

# fatal FAULT SIGNAL: rank 1 injects FAULT before all_reduce #3 and writes its dump before SIGNAL's
# action; the analyzer names the signal, the rank behind and the rank waited on
fatal() {
    note "a rank that takes $2 ($1) at all_reduce #3 writes its dump; rank 0 waited on it in #3"
    $L -q --flight_recorder_dir "$WORK/fr_$1" "$CHECK" --tag "$TAG" --backend gloo --mode fault \
        --fault "$1" --victim 1 --step 3 --fail-code 3 >"$WORK/out" 2>&1
    [ -f "$WORK/fr_$1/rank_1.json" ] || { cat "$WORK/out"; fail "rank 1 wrote no dump on $2"; }
    count 1 "flight recorder: rank 1 wrote its last 3 collectives" "$WORK/out"
    analyze "$WORK/fr_$1"
    count 1 "^flight recorder: 2 of 2 ranks wrote a record" "$WORK/report"
    count 1 "^verdict: rank 1 is behind: stopped at #3 (not called yet) while rank 0 is at #3 all_reduce(f32, 16, sum)" "$WORK/report"
    count 1 "^  failure ($2): the process received $2 (a fatal signal; its action follows) on rank 1$" "$WORK/report"
    count 1 "^  waited on in #3: rank 1 (not called when it gave up)$" "$WORK/report"
    no_orphans
}
# the test hook CACCEL_TEST_THREAD_OVERFLOW=ROLE recurses on that thread until its stack runs out;
# without an alternate stack there is no room for the handler and the kernel kills the process silently
for role in watchdog gloo_worker; do
    note "a stack overflow on rank 1's $role thread (not the main thread): the thread's own alternate signal stack runs the handler, and rank 1 writes its dump"
    $L -q --flight_recorder_dir "$WORK/fr_$role" sh -c '[ "$RANK" = 1 ] && export CACCEL_TEST_THREAD_OVERFLOW='"$role"'; exec "$0" "$@"' \
        "$CHECK" --tag "$TAG" --backend gloo --mode ondemand --resume "$WORK/never" >"$WORK/out" 2>&1
    [ -f "$WORK/fr_$role/rank_1.json" ] || { cat "$WORK/out"; fail "rank 1 wrote no dump on its $role thread's stack overflow"; }
    count 1 "flight recorder: rank 1 wrote its last [0-9]* collectives" "$WORK/out"
    analyze "$WORK/fr_$role"
    count 1 "^  failure (SIGSEGV): the process received SIGSEGV (a fatal signal; its action follows) on rank 1$" "$WORK/report"
    no_orphans
done

fatal abort SIGABRT
fatal segv SIGSEGV
fatal bus SIGBUS
fatal fpe SIGFPE
fatal ill SIGILL
echo "PASS"
