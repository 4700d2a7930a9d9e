#!/bin/sh
# A busy rendezvous port: one machine picks a free one (with a warning), several machines fail naming it;
# a job token file that is a FIFO is refused at once.
. "$(dirname "$0")/lib.sh"
need_caccel
need_backend gloo
# hold a port: a first launcher serving its store while its one process sleeps (long enough for the
# cases below on a busy machine; it is stopped at the end); its process says which port, once the
# launcher serves it
timeout 240 "$CACCEL" launch -q --num_processes 1 --main_process_port 0 sh -c "echo \$MASTER_PORT > $WORK/port.tmp && mv $WORK/port.tmp $WORK/port; sleep 180 # $TAG" &
holder=$!
CLEANUPS="kill_holder"
kill_holder() { kill $holder 2>/dev/null; }
end=$(( $(date +%s) + 120 ))
until [ -s "$WORK/port" ]; do
    running $holder && [ "$(date +%s)" -lt "$end" ] || fail "the first launcher did not start its process within 120 s"
    sleep 0.1
done
port=$(cat "$WORK/port")
[ -n "$port" ] || fail "the first launcher did not start"

note "one machine, port $port busy: a free port is used, with a warning"
timeout 120 "$CACCEL" launch --num_processes 2 --main_process_port "$port" "$CHECK" --tag "$TAG" --backend gloo \
    --mode env >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "the launcher did not fall back to a free port"; }
count 1 "warning: port $port is busy; the rendezvous uses free port" "$WORK/out"
count 2 "comm_check: env rank" "$WORK/out"

note "several machines, port $port busy on machine 0: a clear failure"
CACCEL_JOB_TOKEN=shared-secret-token timeout 60 "$CACCEL" launch --num_machines 2 --machine_rank 0 \
    --main_process_ip 127.0.0.1 --main_process_port "$port" --num_processes 2 "$CHECK" --tag "$TAG" \
    >"$WORK/out" 2>&1
rc=$?
[ "$rc" -ne 0 ] || { cat "$WORK/out"; fail "the launcher started on a busy port"; }
count 1 "error: port $port is already in use" "$WORK/out"
count 0 "comm_check:" "$WORK/out"

note "several machines without a shared token: refused before starting"
env -u CACCEL_JOB_TOKEN timeout 60 "$CACCEL" launch --num_machines 2 --machine_rank 1 --main_process_ip 127.0.0.1 \
    --main_process_port "$port" --num_processes 2 "$CHECK" --tag "$TAG" >"$WORK/out" 2>&1
[ $? -ne 0 ] || fail "a multi-machine job started without a token"
count 1 "needs a shared job token" "$WORK/out"

note "a FIFO as the job token file: refused at once, naming it, on machine 0 and on machine 1"
mkfifo "$WORK/token.fifo"
for mr in 0 1; do
    env -u CACCEL_JOB_TOKEN timeout 20 "$CACCEL" launch --num_machines 2 --machine_rank $mr --main_process_ip 127.0.0.1 \
        --main_process_port "$port" --token_file "$WORK/token.fifo" --num_processes 2 "$CHECK" --tag "$TAG" \
        >"$WORK/out" 2>&1
    rc=$?
    [ $rc -eq 1 ] || { cat "$WORK/out"; fail "machine $mr: exit $rc with a FIFO as the token file (124: it blocked)"; }
    count 1 "error: $WORK/token.fifo: not a regular file (a FIFO); a job token file must be one" "$WORK/out"
done
kill_holder
no_orphans
echo "PASS"
