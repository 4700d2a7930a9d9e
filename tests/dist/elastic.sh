#!/bin/sh
# Elastic membership (caccel launch --num_machines MIN:MAX): three "machines" (network namespaces, as
# tests/dist/netns.sh) start a job with num_machines: '2:3' in a config file and PET_MAX_RESTARTS=1;
# once machine 2's rank has trained step 6
# (it stops itself there, so no later checkpoint can be written), machine 2 is killed. Machines 0 and 1
# stop, restart at two machines (the one restart of --max_restarts), resume from the newest complete
# checkpoint (step 4) with the accumulation that keeps the global batch (3 x 2 = 2 x 3) and wait at a
# gate after step 6. Machine 2 is started again: it waits to join, the gate opens, and the group stops
# at its next checkpoint (step 8, an asynchronous save, made synchronously for the grow) and restarts
# at three machines (accumulation 2 again) from it: a grow, which --max_restarts does not count
# (torchrun counts failures only).
# The parameters at step 12 equal a run without failures through the same sizes at the same steps:
# 3 processes to step 4, 2 processes (accumulation 3) to step 8, 3 processes to step 12. Then with
# --num_machines 2:2 a dead machine leaves fewer than MIN: the job ends. The refusals (MIN > MAX,
# MIN:MAX under mpirun or with a hostfile of other than MAX hosts, a bad --rdzv_conf, --rdzv_endpoint
# or PET_ variable), a rendezvous that gets
# fewer than MIN within join_timeout, and a machine that waits to join when the job ends (it leaves at
# once) run everywhere; the rest skips where network namespaces cannot be made (not root).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns_lib.sh"
trap 'exit 1' HUP INT TERM
need_caccel

note "refusals"
"$CACCEL" launch --num_machines 3:2 --cpu true >"$WORK/o" 2>&1 && fail "MIN > MAX was accepted"
grep -q "invalid value '3:2' for key 'num_machines': the minimum 3 is larger than the maximum 2" "$WORK/o" ||
    { cat "$WORK/o"; fail "MIN > MAX message"; }
"$CACCEL" launch --num_machines 1:x --cpu true >"$WORK/o" 2>&1 && fail "1:x was accepted"
grep -q "invalid value '1:x' for key 'num_machines' (allowed: an integer from 1 to 1000000, or MIN:MAX" "$WORK/o" ||
    { cat "$WORK/o"; fail "1:x message"; }
PET_MAX_RESTARTS=many "$CACCEL" launch --cpu true >"$WORK/o" 2>&1 && fail "PET_MAX_RESTARTS=many was accepted"
grep -q "env PET_MAX_RESTARTS (--max_restarts) takes a count 0..1000000, not 'many'" "$WORK/o" ||
    { cat "$WORK/o"; fail "PET_MAX_RESTARTS message"; }
PET_RDZV_CONF=read_timeout=3 "$CACCEL" launch --cpu true >"$WORK/o" 2>&1 && fail "PET_RDZV_CONF=read_timeout=3 was accepted"
grep -q "env PET_RDZV_CONF (--rdzv_conf): 'read_timeout=3' is not join_timeout=SECONDS" "$WORK/o" ||
    { cat "$WORK/o"; fail "PET_RDZV_CONF message"; }
"$CACCEL" launch --num_machines 1:2 --backend mpi --num_processes 2 --main_process_ip 127.0.0.1 true >"$WORK/o" 2>&1 &&
    fail "MIN:MAX under mpirun was accepted"
grep -q "num_machines 1:2: mpirun starts a fixed set of processes" "$WORK/o" || { cat "$WORK/o"; fail "mpirun message"; }
printf 'localhost slots=1\n' >"$WORK/hosts"
"$CACCEL" launch --num_machines 1:2 --hostfile "$WORK/hosts" --cpu true >"$WORK/o" 2>&1 &&
    fail "MIN:MAX with a hostfile of fewer than MAX hosts was accepted"
grep -q "num_machines 1:2, but the hostfile $WORK/hosts lists 1 host(s): MAX is the hostfile's hosts" "$WORK/o" ||
    { cat "$WORK/o"; fail "hostfile message"; }
PET_RDZV_ENDPOINT=127.0.0.1:port "$CACCEL" launch --cpu true >"$WORK/o" 2>&1 && fail "PET_RDZV_ENDPOINT=127.0.0.1:port was accepted"
grep -q "env PET_RDZV_ENDPOINT: invalid value 'port' for key 'main_process_port'" "$WORK/o" ||
    { cat "$WORK/o"; fail "PET_RDZV_ENDPOINT message"; }
"$CACCEL" launch --rdzv_endpoint 10.0.0.1:29500 --main_process_ip 10.0.0.2 --cpu true >"$WORK/o" 2>&1 &&
    fail "two rendezvous addresses were accepted"
grep -q "rdzv_endpoint sets main_process_ip to '10.0.0.1', but --main_process_ip set it to '10.0.0.2'" "$WORK/o" ||
    { cat "$WORK/o"; fail "--rdzv_endpoint message"; }
"$CACCEL" launch --num_machines 1:2 --rdzv_conf join_timeout=5,read_timeout=3 --cpu true >"$WORK/o" 2>&1 &&
    fail "an unknown --rdzv_conf key was accepted"
grep -q "rdzv_conf: 'read_timeout=3' is not join_timeout=SECONDS or last_call_timeout=SECONDS" "$WORK/o" ||
    { cat "$WORK/o"; fail "--rdzv_conf message"; }

note "fewer than MIN machines join within join_timeout: the job ends naming the ones that came"
CACCEL_JOB_TOKEN="elastic-test-$$" "$CACCEL" launch --num_machines 2:3 --machine_rank 0 --main_process_ip 127.0.0.1 \
    --main_process_port 0 --num_processes 3 --rdzv_conf join_timeout=1 --cpu true >"$WORK/o" 2>&1 &&
    fail "a rendezvous of 1 machine for --num_machines 2:3 started"
grep -q "the rendezvous has 1 machine(s) (0) after [0-9]* s: --num_machines 2:3 needs at least 2" "$WORK/o" ||
    { cat "$WORK/o"; fail "join_timeout message"; }

note "num_machines: '1:2' in a config file; machine 1 (PET_NNODES=1:2) waits to join, the job ends: it leaves at once"
# machine 0 finds the rendezvous in --rdzv_endpoint, machine 1 in PET_RDZV_ENDPOINT (torchrun's names)
printf "distributed_type: MULTI_CPU\nnum_machines: '1:2'\nnum_processes: 2\nuse_cpu: true\n" >"$WORK/el12.yaml"
port=$(free_port)
export CACCEL_JOB_TOKEN="elastic-test-$$"
mkfifo "$WORK/gate12"   # the rank blocks reading it until the test writes (no poll)
PET_RDZV_CONF=last_call_timeout=0 timeout 60 "$CACCEL" launch --config_file "$WORK/el12.yaml" --machine_rank 0 \
    --rdzv_endpoint "127.0.0.1:$port" sh -c 'echo "rank $RANK of $WORLD_SIZE started"
        read -r go < "$0"' "$WORK/gate12" >"$WORK/e0" 2>&1 &
e0=$!
wait_lines 1 "rank 0 of 1 started" "machine 0 did not start" "$e0" "$WORK/e0"
PET_NNODES=1:2 PET_RDZV_ENDPOINT="127.0.0.1:$port" timeout 60 "$CACCEL" launch --machine_rank 1 --num_processes 2 \
    --rdzv_conf join_timeout=20 --cpu true >"$WORK/e1" 2>&1 &
e1=$!
wait_lines 1 "machine 1 waits to join: the running group takes it in at its next checkpoint" "machine 1 did not wait" \
    "$e0 $e1" "$WORK/e1"
wait_lines 1 "machine 1 waits to join: the job grows at its next checkpoint" "machine 0 did not see machine 1" \
    "$e0 $e1" "$WORK/e0"
start=$(date +%s)
timeout 30 sh -c 'echo go > "$1"' _ "$WORK/gate12" || { cat "$WORK/e0"; fail "machine 0's rank did not read its gate"; }
wait "$e0" || { cat "$WORK/e0"; fail "machine 0 failed"; }
wait "$e1" || { cat "$WORK/e1"; fail "machine 1 did not leave with status 0"; }
unset CACCEL_JOB_TOKEN
echo "  machine 1 left $(elapsed_since "$start") s after the job's end"
count 1 "the job ended (machine 0's exit status 0) before machine 1 could join: it leaves without starting" "$WORK/e1"
count 1 "machine 1 waited to join: it has learnt that the job has ended" "$WORK/e0"

need_backend gloo
ns_setup 3
# ELASTIC_LINK (for the measurements in bench/RESULTS.md, unset in make check): a tc queueing
# discipline put on every machine's link, e.g. "tbf rate 100mbit burst 64kb latency 50ms".
if [ -n "${ELASTIC_LINK:-}" ]; then
    for m in 0 1 2; do
        ip netns exec "$(ns_name "$m")" tc qdisc add dev eth0 root $ELASTIC_LINK || fail "tc qdisc add $ELASTIC_LINK"
    done
    note "every machine's link shaped: $ELASTIC_LINK"
fi
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
TRAIN="--cpu --backend gloo $DDP --mode plain --batch 8 --steps 12 --save-every 4 --automatic_checkpoint_naming"

note "the run without failures: 3 processes to step 4, 2 processes (accumulation 3) to step 8, 3 processes to step 12"
L="timeout 120 $CACCEL launch -q --main_process_port 0"
$L --num_processes 3 $TRAIN --k 2 --steps 4 --project_dir "$WORK/ref" >"$WORK/ref1" 2>&1 || { cat "$WORK/ref1"; fail "3 processes"; }
$L --num_processes 2 $TRAIN --k 3 --steps 8 --resume --project_dir "$WORK/ref" >"$WORK/ref2" 2>&1 ||
    { cat "$WORK/ref2"; fail "2 processes"; }
count 4 "rank=0 trained step \(5\|6\|7\|8\) of 2 processes" "$WORK/ref2"
$L --num_processes 3 $TRAIN --k 2 --resume --project_dir "$WORK/ref" --dump "$WORK/ref.bin" >"$WORK/ref3" 2>&1 ||
    { cat "$WORK/ref3"; fail "3 processes from step 8"; }
count 4 "rank=0 trained step \(9\|10\|11\|12\) of 3 processes" "$WORK/ref3"

note "num_machines: '2:3' (config file), 3 machines join; machine 2 dies after step 6: machines 0 and 1 go on from step 4"
export CACCEL_JOB_TOKEN="netns-test-token-$$"
printf "distributed_type: MULTI_CPU\nnum_machines: '2:3'\n" >"$WORK/el.yaml"
NS_MACHINES= PET_MAX_RESTARTS=1
export PET_MAX_RESTARTS
el_launch() {
    ns_launch "$1" 3 29571 --config_file "$WORK/el.yaml" --monitor_interval 0.2 $TRAIN --k 2 --halt-step 6 --resume \
        --gate-step 6 --gate "$WORK/gate" --async-save-from 8 --project_dir "$WORK/el" --dump "$WORK/el.bin"
}
for m in 0 1 2; do el_launch "$m"; done
wait_lines 1 "rank=2 trained step 6 of 3 processes" "machine 2 did not train" "$NS_PID_0 $NS_PID_1 $NS_PID_2" "$WORK/m2"
ip netns pids "$(ns_name 2)" | xargs kill -9
start=$(date +%s)
wait_lines 1 "rank=0 trained step 5 of 2 processes" "the group did not train again at 2 machines" "$NS_PID_0 $NS_PID_1" "$WORK/m0"
echo "  training again at 2 machines $(elapsed_since "$start") s after machine 2 died"
wait_lines 2 "rank=[01] at the gate" "the 2 machines did not reach step 6" "$NS_PID_0 $NS_PID_1" "$WORK/m0" "$WORK/m1"

note "machine 2 comes back: the job grows to 3 machines at its checkpoint of step 8"
el_launch 2
wait_lines 1 "machine 2 waits to join: the job grows at its next checkpoint" "machine 0 did not see machine 2" \
    "$NS_PID_0 $NS_PID_1 $NS_PID_2" "$WORK/m0"
touch "$WORK/gate"
start=$(date +%s)
wait_lines 1 "rank=0 trained step 9 of 3 processes" "the group did not train at 3 machines" "$NS_PID_0 $NS_PID_1 $NS_PID_2" "$WORK/m0"
echo "  training at 3 machines $(elapsed_since "$start") s after the gate opened (2 steps and a checkpoint before it)"
unset NS_MACHINES PET_MAX_RESTARTS
ns_wait
unset CACCEL_JOB_TOKEN
[ "$NS_RC_0" -eq 0 ] && [ "$NS_RC_1" -eq 0 ] && [ "$NS_RC_2" -eq 0 ] ||
    { cat "$WORK/all"; fail "machines 0, 1, 2 exited $NS_RC_0, $NS_RC_1, $NS_RC_2"; }
for m in 0 1; do
    count 1 "membership (round 0): machines 0,1,2 joined (3 of --num_machines 2:3)" "$WORK/m$m"
    count 1 "membership (round 1): machine(s) 2 left; the job goes on with machines 0,1 (2 of --num_machines 2:3)" "$WORK/m$m"
    count 1 "restarting every process (restart 1 of 1)" "$WORK/m$m"
    count 1 "the processes stopped at a checkpoint to let a machine join: starting the group again" "$WORK/m$m"
    count 1 "restarting every process to let a machine join (not a failure: --max_restarts 1 used of 1)" "$WORK/m$m"
done
for m in 0 1 2; do
    count 1 "membership (round 2): machine(s) 2 joined; the job goes on with machines 0,1,2 (3 of --num_machines 2:3)" "$WORK/m$m"
done
count 1 "machine 2 waits to join: the running group takes it in at its next checkpoint" "$WORK/m2"
count 1 "save_state: a machine waits to join the elastic job: this save runs synchronously" "$WORK/m0"
count 1 "elastic: a machine waits to join: the group stops at this checkpoint (optimizer step 8) to grow" "$WORK/m0"
count 1 "elastic: the group of 3 processes resumes at optimizer step 8" "$WORK/m0"
count 1 "rank=2 trained step 12 of 3 processes" "$WORK/m2"
count 1 "machine 2 has not answered for [0-9]* s: it leaves the job" "$WORK/m0"
count 1 "elastic: 2 processes instead of 3: gradient_accumulation_steps 2 -> 3 keeps the global batch" "$WORK/m0"
count 1 "elastic: the group of 2 processes resumes at optimizer step 4" "$WORK/m0"
count 0 "rank=0 trained step 9 of 2 processes" "$WORK/m0"
count 1 "rank=0 trained step 12 of 3 processes" "$WORK/m0"
same "$WORK/ref.bin" "$WORK/el.bin"
for m in 0 1 2; do
    [ -z "$(ip netns pids "$(ns_name "$m")")" ] || { ip netns pids "$(ns_name "$m")" | xargs ps -o pid,args -p; fail "processes left on machine $m"; }
done

note "--num_machines 2:2, machine 1 dies: fewer than MIN remain, the job ends"
export CACCEL_JOB_TOKEN="netns-test-token-$$"
NS_MACHINES=2:2
for m in 0 1; do
    ns_launch "$m" 2 29572 --max_restarts 1 --monitor_interval 0.2 $TRAIN --k 2 --halt-step 2 --resume --project_dir "$WORK/min"
done
unset NS_MACHINES
wait_lines 1 "rank=1 trained step 2 of 2 processes" "machine 1 did not train" "$NS_PID_0 $NS_PID_1" "$WORK/m1"
ip netns pids "$(ns_name 1)" | xargs kill -9
wait "$NS_PID_0"
rc=$?
unset CACCEL_JOB_TOKEN
[ "$rc" -ne 0 ] || { cat "$WORK/m0"; fail "machine 0 alone ended with status 0 under --num_machines 2:2"; }
count 1 "the rendezvous has 1 machine(s) (0) after [0-9]* s: --num_machines 2:2 needs at least 2" "$WORK/m0"
echo "PASS"
