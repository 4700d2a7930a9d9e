#!/bin/sh
# caccel launch --max_restarts N (torchrun's semantics): after a failure the whole group is stopped and
# started again, with TORCHELASTIC_RESTART_COUNT and CACCEL_RESTART_COUNT counting the restarts, until
# the restarts are used up; the job then ends with the failure's exit status. An interrupted launcher
# does not restart; on several machines the launchers agree on each restart. Restarts under mpirun are
# refused with a message. (A program that resumes from its checkpoint after a restart:
# tests/test_resume.sh.)
. "$(dirname "$0")/lib.sh"
need_caccel

cat > "$WORK/prog.sh" <<'PROG'
#!/bin/sh
# rank 1 fails (exit 3) until restart SUCCEED_AT; rank 0 waits until the launcher stops it
echo "rank $RANK restart $TORCHELASTIC_RESTART_COUNT $CACCEL_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS"
if [ "$TORCHELASTIC_RESTART_COUNT" -lt "$SUCCEED_AT" ]; then
    [ "$RANK" = 1 ] && exit 3
    sleep 60
fi
exit 0
PROG
chmod +x "$WORK/prog.sh"
L="$CACCEL launch --num_processes 2 --cpu -q --monitor_interval 0.2"

note "--max_restarts 2: rank 1 fails twice, the third start succeeds"
start=$(date +%s)
SUCCEED_AT=2 $L --max_restarts 2 "$WORK/prog.sh" "$TAG" > "$WORK/ok.out" 2>&1 || { cat "$WORK/ok.out"; fail "the job failed"; }
took=$(( $(date +%s) - start ))
cat "$WORK/ok.out"
for r in 0 1 2; do
    count 2 "^rank [01] restart $r $r of 2\$" "$WORK/ok.out"   # the whole group, each time
done
count 1 "restarting every process (restart 1 of 2)" "$WORK/ok.out"
count 1 "restarting every process (restart 2 of 2)" "$WORK/ok.out"
count 2 "rank 1 (local rank 1, pid [0-9]*) exited with code 3" "$WORK/ok.out"
[ "$took" -lt 30 ] || fail "3 starts took ${took} s: rank 0 was not stopped at each failure"
no_orphans

note "--max_restarts 1, failing every time: two starts, then the failure's exit status"
SUCCEED_AT=9 $L --max_restarts 1 "$WORK/prog.sh" "$TAG" > "$WORK/fail.out" 2>&1
rc=$?
cat "$WORK/fail.out"
[ $rc -eq 3 ] || fail "exit status $rc, expected 3"
count 2 "^rank 1 restart" "$WORK/fail.out"
count 1 "the job failed after 1 restart(s) (--max_restarts 1)" "$WORK/fail.out"
no_orphans

note "no --max_restarts: no restart"
SUCCEED_AT=1 $L "$WORK/prog.sh" "$TAG" > "$WORK/none.out" 2>&1
rc=$?
[ $rc -eq 3 ] || { cat "$WORK/none.out"; fail "exit status $rc, expected 3"; }
count 1 "^rank 1 restart 0 0 of 0\$" "$WORK/none.out"
count 0 "restarting" "$WORK/none.out"

note "SIGTERM to the launcher: no restart"
SUCCEED_AT=9 $L --max_restarts 3 sh -c 'echo "up $RANK"; sleep 60' "$TAG" > "$WORK/term.out" 2>&1 &
pid=$!
i=0
until [ "$(grep -c '^up' "$WORK/term.out")" -eq 2 ]; do
    i=$((i + 1)); [ $i -lt 400 ] || { cat "$WORK/term.out"; fail "the processes did not start"; }
    sleep 0.05
done
kill -TERM $pid
wait $pid
rc=$?
cat "$WORK/term.out"
[ $rc -eq 143 ] || fail "exit status $rc after SIGTERM, expected 143"
count 0 "restarting" "$WORK/term.out"
no_orphans

# Two launchers on this host act as two machines. The failing rank is on machine 1 (rank 3), then on
# machine 0 (rank 0, whose launcher serves the store): both machines stop, agree on the restart
# (machine 0 replaces the store once machine 1 has stopped) and start again; the restarted group
# rendezvouses through the new store and passes comm_check's collectives at 4 ranks.
cat > "$WORK/prog2.sh" <<'PROG'
#!/bin/sh
echo "rank $RANK restart $TORCHELASTIC_RESTART_COUNT"
if [ "$TORCHELASTIC_RESTART_COUNT" -lt 1 ]; then
    [ "$RANK" = "$FAIL_RANK" ] && exit 3
    sleep 60
fi
exec "$CHECK" "$@"
PROG
chmod +x "$WORK/prog2.sh"
need_backend gloo
# The restarted group's collectives reach their large size (LARGE_MIB: several shared-memory slots
# within a machine, TCP across) once, after rank 3's failure; after rank 0's they stop at 1 MiB (every
# collective, dtype and algorithm still runs): what differs there is the store machine 0 replaces, not
# the collectives, and the large size a second time was nearly half the test's CPU time.
for fr in 3 0; do
    note "--max_restarts 1 on 2 machines: rank $fr fails, both machines restart, the new group rendezvouses"
    mib=1
    [ "$fr" = 3 ] && mib=$LARGE_MIB
    # a launcher gets the default 300 s: 120 s ran out under a parallel `make check` when each case
    # took 75-80 s with both CPUs busy
    CHECK="$CHECK" FAIL_RANK=$fr launch_machines "$WORK/both.out" --cpu --monitor_interval 0.2 \
        --max_restarts 1 "$WORK/prog2.sh" --tag "$TAG" --backend gloo --large-mib "$mib"
    [ "$m0_rc" -eq 0 ] && [ "$m1_rc" -eq 0 ] || { cat "$WORK/both.out"; fail "launcher statuses $m0_rc and $m1_rc after the restart"; }
    count 2 "restarting every process (restart 1 of 1)" "$WORK/both.out"
    count 4 "^rank [0-3] restart 0\$" "$WORK/both.out"
    count 4 "^rank [0-3] restart 1\$" "$WORK/both.out"
    count 1 "rank $fr (local rank $((fr % 2)), pid [0-9]*) exited with code 3" "$WORK/both.out"
    count 4 "comm_check: OK rank .* of 4, backend gloo" "$WORK/both.out"
    no_orphans
done

note "refused: a bad count, restarts under mpirun"
$CACCEL launch --max_restarts -1 true > "$WORK/bad.out" 2>&1 && fail "--max_restarts -1 was accepted"
grep -q "max_restarts takes a count" "$WORK/bad.out" || { cat "$WORK/bad.out"; fail "no message for --max_restarts -1"; }
$CACCEL launch --monitor_interval 0 true > "$WORK/bad.out" 2>&1 && fail "--monitor_interval 0 was accepted"
grep -q "monitor_interval takes seconds" "$WORK/bad.out" || { cat "$WORK/bad.out"; fail "no message for --monitor_interval 0"; }
$CACCEL launch --num_processes 2 --backend mpi --max_restarts 1 true > "$WORK/bad.out" 2>&1 &&
    fail "--max_restarts with mpirun was accepted"
grep -q "max_restarts 1: mpirun starts the processes" "$WORK/bad.out" || { cat "$WORK/bad.out"; fail "no message for mpi"; }
echo "PASS"
