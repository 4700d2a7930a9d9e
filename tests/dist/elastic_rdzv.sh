#!/bin/sh
# Elastic membership (caccel launch --num_machines MIN:MAX) when the rendezvous itself fails, on three
# "machines" (network namespaces, as tests/dist/elastic.sh):
# - machine 0, which serves the rendezvous store, is killed while the job trains with a restart left:
#   machines 1 and 2 stop their processes, name machine 0 and its store's address, and end without a
#   restart, leaving no process behind;
# - machine 0's link goes down (cut off, not dead): the same on machines 1 and 2 (its store no longer
#   answers), and machine 0, left alone below MIN, ends too;
# - a member dies while the group restarts to let a machine join (a grow; its launcher is held so that it
#   cannot rejoin first): that is a failure, counted against --max_restarts (0 here), so the job ends
#   instead of going on at the new size.
# Skips where network namespaces cannot be made (not root).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns_lib.sh"
trap 'exit 1' HUP INT TERM
need_caccel
need_backend gloo
ns_setup 3
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# the first two cases end with machine 0, long before step 400
TRAIN="--cpu --backend gloo $DDP --mode plain --batch 8 --save-every 4 --automatic_checkpoint_naming --resume"

# no_processes_left M...: the namespaces of machines M hold no process
no_processes_left() {
    for m in "$@"; do
        [ -z "$(ip netns pids "$(ns_name "$m")")" ] ||
            { ip netns pids "$(ns_name "$m")" | xargs ps -o pid,args -p; fail "processes left on machine $m"; }
    done
}

# gone_ends M PORT: machine M's launcher ended with a failure, naming machine 0 and its store, without
# a restart
gone_ends() {
    eval "wait \$NS_PID_$1; rc=\$?"
    [ "$rc" -ne 0 ] || { cat "$WORK/m$1"; fail "machine $1 ended with status 0 without machine 0"; }
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { cat "$WORK/m$1"; fail "machine $1 ran into its time limit"; }
    count 1 "machine 0 is gone (its rendezvous store at $(ns_addr 0):$2: " "$WORK/m$1"
    grep -q "it holds the rendezvous, and an elastic job cannot go on without it\|machine 0 holds the rendezvous, and an elastic job cannot go on without it" "$WORK/m$1" ||
        { cat "$WORK/m$1"; fail "machine $1 did not say that the job cannot go on without machine 0"; }
    count 0 "membership (round 1)" "$WORK/m$1"
}

note "machine 0 (the rendezvous) is killed while 3 machines train with a restart left: machines 1 and 2 end"
export CACCEL_JOB_TOKEN="netns-test-token-$$" PET_MAX_RESTARTS=1
NS_MACHINES=2:3
for m in 0 1 2; do ns_launch "$m" 3 29581 --monitor_interval 0.2 $TRAIN --steps 400 --project_dir "$WORK/kill"; done
wait_lines 3 "rank=[012] trained step 2 of 3 processes" "the 3 machines did not train" \
    "$NS_PID_0 $NS_PID_1 $NS_PID_2" "$WORK/m0" "$WORK/m1" "$WORK/m2"
ip netns pids "$(ns_name 0)" | xargs kill -9
start=$(date +%s)
gone_ends 1 29581
gone_ends 2 29581
echo "  machines 1 and 2 ended $(elapsed_since "$start") s after machine 0 was killed"
wait "$NS_PID_0"
no_processes_left 1 2

note "machine 0's link goes down: machines 1 and 2 end naming it; machine 0, alone below MIN, ends"
export CACCEL_TIMEOUT=5
for m in 0 1 2; do ns_launch "$m" 3 29582 --monitor_interval 0.2 $TRAIN --steps 400 --project_dir "$WORK/cut"; done
wait_lines 3 "rank=[012] trained step 2 of 3 processes" "the 3 machines did not train" \
    "$NS_PID_0 $NS_PID_1 $NS_PID_2" "$WORK/m0" "$WORK/m1" "$WORK/m2"
ip -n "$(ns_name 0)" link set eth0 down
start=$(date +%s)
gone_ends 1 29582
gone_ends 2 29582
echo "  machines 1 and 2 ended $(elapsed_since "$start") s after machine 0 was cut off"
wait "$NS_PID_0" && { cat "$WORK/m0"; fail "machine 0 alone ended with status 0 under --num_machines 2:3"; }
count 1 "the rendezvous has 1 machine(s) (0) after [0-9]* s: --num_machines 2:3 needs at least 2" "$WORK/m0"
echo "  machine 0 ended $(elapsed_since "$start") s after it was cut off"
no_processes_left 0 1 2
ip -n "$(ns_name 0)" link set eth0 up
unset CACCEL_TIMEOUT PET_MAX_RESTARTS NS_MACHINES

note "a member dies while the group restarts to let machine 2 join: a failure, and --max_restarts 0 ends the job"
# the round closes once MIN (machines 0 and 1) have joined; the ranks wait at a gate after step 2
printf "distributed_type: MULTI_CPU\nnum_machines: '2:3'\n" >"$WORK/grow.yaml"
NS_MACHINES=
export PET_RDZV_CONF=last_call_timeout=0
GROW="--config_file $WORK/grow.yaml --monitor_interval 0.2 $TRAIN --steps 12 --gate-step 2 --gate-restart 0 --gate $WORK/gate
    --project_dir $WORK/grow"
for m in 0 1; do ns_launch "$m" 3 29583 $GROW; done
wait_lines 2 "rank=[01] at the gate" "machines 0 and 1 did not reach step 2" "$NS_PID_0 $NS_PID_1" "$WORK/m0" "$WORK/m1"
ns_launch 2 3 29583 $GROW
wait_lines 1 "machine 2 waits to join: the job grows at its next checkpoint" "machine 0 did not see machine 2" \
    "$NS_PID_0 $NS_PID_1 $NS_PID_2" "$WORK/m0"
# machine 1's launcher (the child of its `timeout`) is held, so that it cannot stop its rank for the grow
# or rejoin: machine 1 dies in the grow's restart whenever the test gets to kill it
launcher1=$(ps -o pid= --ppid "$NS_PID_1")
[ -n "$launcher1" ] || fail "no launcher under machine 1's timeout ($NS_PID_1)"
kill -STOP $launcher1
touch "$WORK/gate"
wait_lines 1 "elastic: a machine waits to join: the group stops at this checkpoint (optimizer step 4) to grow" \
    "the group did not stop at step 4 to grow" "$NS_PID_0 $NS_PID_1 $NS_PID_2" "$WORK/m0"
ip netns pids "$(ns_name 1)" | xargs kill -9
unset NS_MACHINES PET_RDZV_CONF
ns_wait
unset CACCEL_JOB_TOKEN
[ "$NS_RC_0" -ne 0 ] && [ "$NS_RC_2" -ne 0 ] ||
    { cat "$WORK/all"; fail "machines 0 and 2 exited $NS_RC_0 and $NS_RC_2: the job went on after a failure"; }
count 1 "restarting every process to let a machine join (not a failure: --max_restarts 0 used of 0)" "$WORK/m0"
count 1 "machine 1 has not answered for [0-9]* s: it leaves the job" "$WORK/m0"
count 1 "machine(s) 1 left while the group restarted to let a machine join: a failure, and --max_restarts 0 allows no more restarts (0 used): the job ends" "$WORK/m0"
count 1 "machine 2 waited to join: it has learnt that the job has ended" "$WORK/m0"
count 1 "the job ended (machine 0's exit status 1) before machine 2 could join: it leaves without starting its processes" "$WORK/m2"
count 0 "trained step 5 of" "$WORK/all"
no_processes_left 0 1 2
echo "PASS"
