#!/bin/sh
# Real Slurm on this machine. The test configures and starts a private one-node cluster (munged,
# slurmctld and slurmd with their own key, socket, ports, state, spool and logs in the test's folder;
# nothing of /etc/slurm or /etc/munge is used), then:
#  - srun -n 2 of the Fashion-MNIST example trains the same parameters, bit for bit, and prints the
#    same loss and accuracy as caccel launch --num_processes 2 of the same command (same seed, one
#    BLAS thread per process: only the launcher differs, so nothing but a bug can change a bit);
#  - sbatch of examples/slurm/train.sbatch (caccel launch inside the allocation) does too;
#  - under srun each task sizes its BLAS threads by what Slurm gave it (srun sets no LOCAL_WORLD_SIZE);
#  - a rank killed with SIGKILL under srun -n 2 ends the step within BOUND s, the surviving rank naming
#    the dead one, and srun's status is non-zero.
# Needs root (the daemons run as root, SlurmUser=root) and Debian's slurm-wlm and munge; skips without.
. "$(dirname "$0")/lib.sh"
need_caccel
need_backend gloo
[ "$(id -u)" -eq 0 ] || skip "not root: the test runs its own munged, slurmctld and slurmd as root"
PATH=$PATH:/usr/sbin:/sbin
for c in munged munge slurmctld slurmd srun sbatch sinfo squeue scancel scontrol ss; do
    command -v "$c" >/dev/null 2>&1 || skip "no $c (Debian: slurm-wlm munge iproute2; tools/install-deps.sh --test)"
done
SRC=${CACCEL_TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
FM="$BUILD/examples/fashion_mnist"
BOUND=20   # seconds from the SIGKILL to the end of srun: generous on a busy machine, far below the 1800 s timeout
LIFE=900   # no daemon outlives this even if the cleanup never runs
# What an enclosing shell or Slurm job set would change the runs (srun and sbatch read SLURM_*, SRUN_*,
# SBATCH_* as options).
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS CACCEL_TIMEOUT CACCEL_LAUNCHER CACCEL_JOB_TOKEN RANK WORLD_SIZE \
    LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
for v in $(env | sed -n 's/^\(S[A-Z]*_[A-Z0-9_]*\)=.*/\1/p' | grep -E '^(SLURM|SRUN|SBATCH|SALLOC)_'); do unset "$v"; done
trap 'exit 1' INT TERM HUP   # so that the EXIT trap stops the daemons

C="$WORK/cluster"
mkdir -p "$C/munge" "$C/state" "$C/spool" "$C/log"
chmod 755 "$WORK" "$C" "$C/munge"   # munged wants a socket every user can reach
NODE=$(hostname -s)
DAEMONS=""

# A TCP port nothing listens on, in [$1, $1 + $2).
pick_port() {
    i=0
    while [ $i -lt 50 ]; do
        p=$(( $1 + $(od -An -tu2 -N2 /dev/urandom | tr -d ' ') % $2 ))
        [ -z "$(ss -Htln "sport = :$p")" ] && { echo "$p"; return 0; }
        i=$((i + 1))
    done
    return 1
}

# bounded_wait SECONDS WHAT COMMAND...: until COMMAND succeeds, at most SECONDS
bounded_wait() {
    t=$1 what=$2; shift 2
    end=$(( $(date +%s) + t ))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$end" ] || { show_logs; fail "$what within $t s"; }
        sleep 0.3
    done
}

show_logs() {
    for f in "$C"/log/* "$C"/munge/munged.log; do [ -s "$f" ] && { echo "--- $f (last lines)"; tail -n 20 "$f"; }; done
}

# The cleanup: cancel what still runs, then stop each daemon this test started, by its pid.
stop_cluster() {
    if [ -n "$DAEMONS" ]; then
        timeout 10 scancel --quiet -u root 2>/dev/null
        end=$(( $(date +%s) + 15 ))
        while [ -n "$(timeout 5 squeue -h -o %A 2>/dev/null)" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.5; done
    fi
    for p in $DAEMONS; do kill -TERM "$p" 2>/dev/null; done
    for p in $DAEMONS; do
        i=0
        while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    DAEMONS=""
}
CLEANUPS="$CLEANUPS stop_cluster"

# start NAME COMMAND...: a daemon in the foreground of a bounded background job
start() {
    name=$1; shift
    timeout -k 5 "$LIFE" "$@" >"$C/log/$name.out" 2>&1 &
    DAEMONS="$! $DAEMONS"   # stopped in reverse order: slurmd, slurmctld, munged
}

note "a one-node cluster: munged, slurmctld, slurmd on node $NODE (127.0.0.1)"
dd if=/dev/urandom of="$C/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 600 "$C/munge/munge.key"
SOCK="$C/munge/munge.socket"
start munged munged -F --socket="$SOCK" --key-file="$C/munge/munge.key" --pid-file="$C/munge/munged.pid" \
    --log-file="$C/munge/munged.log" --seed-file="$C/munge/munged.seed" --num-threads=2
munge_ok() { munge -S "$SOCK" -n | unmunge -S "$SOCK"; }
bounded_wait 30 "munged did not answer on $SOCK" munge_ok

ctld_port=$(pick_port 20000 4000) || fail "no free port for slurmctld"
slurmd_port=$(pick_port 24000 4000) || fail "no free port for slurmd"
# srun's ranks serve their store on 29500 + job id mod 1000: the first job ids get ports nothing listens on
first=""
for _ in 1 2 3 4 5 6 7 8 9 10; do
    k=$(( 100 + $(od -An -tu2 -N2 /dev/urandom | tr -d ' ') % 800 ))
    busy=0
    for j in 0 1 2 3 4 5 6 7 8 9; do [ -n "$(ss -Htln "sport = :$((29500 + k + j))")" ] && busy=1; done
    [ "$busy" = 0 ] && { first=$((1000 + k)); break; }
done
[ -n "$first" ] || fail "no run of 10 free ports in 29600-30399 for the jobs' stores"
cpus=$(getconf _NPROCESSORS_ONLN)
# Slurm's CPUs, not the machine's: 4 lets srun -n 2 -c 2 run on a 2-CPU machine (config_overrides).
node_cpus=$(( cpus > 4 ? cpus : 4 ))
: >"$C/plugstack.conf"   # no site SPANK plugins
cat >"$C/slurm.conf" <<EOF
ClusterName=catest
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
StateSaveLocation=$C/state
SlurmdSpoolDir=$C/spool
SlurmctldPidFile=$C/slurmctld.pid
SlurmdPidFile=$C/slurmd.pid
SlurmctldLogFile=$C/log/slurmctld.log
SlurmdLogFile=$C/log/slurmd.log
PlugStackConfig=$C/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
FirstJobId=$first
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$node_cpus State=UNKNOWN
PartitionName=catest Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$C/slurm.conf"
start slurmctld slurmctld -D -f "$SLURM_CONF"
start slurmd slurmd -D -f "$SLURM_CONF" -N "$NODE"
node_idle() { [ "$(timeout 10 sinfo -h -n "$NODE" -o %t)" = idle ]; }
bounded_wait 90 "node $NODE was not idle in sinfo" node_idle
echo "  slurmctld :$ctld_port, slurmd :$slurmd_port, $node_cpus CPUs, first job id $first"
if ! getent hosts "$NODE" >/dev/null; then
    echo "NOTE: $NODE does not resolve here: MASTER_ADDR=127.0.0.1 (the default is the step's first node)"
    export MASTER_ADDR=127.0.0.1
fi

CACCEL_JOB_TOKEN="slurm-$$-$(od -An -tx1 -N8 /dev/urandom | tr -d ' \n')"
export CACCEL_JOB_TOKEN
RUN="--cpu --epochs 1 --max-steps 200 --seed 42"

# the loss, accuracy and size lines the main process prints, without the throughput
results() { grep -E '^(epoch [0-9]+/[0-9]+: train loss|fashion_mnist: [0-9]+ process)' "$1" | sed 's/, [0-9]* samples\/s.*//'; }

note "the reference: caccel launch --num_processes 2, one thread per process, 200 steps"
# shellcheck disable=SC2086
timeout 300 "$CACCEL" launch -q --num_processes 2 --num_cpu_threads_per_process 1 --main_process_port 0 \
    "$FM" $RUN --dump-params "$WORK/launch.bin" >"$WORK/launch.out" 2>"$WORK/launch.err" ||
    { cat "$WORK/launch.out" "$WORK/launch.err"; fail "caccel launch failed"; }
results "$WORK/launch.out" >"$WORK/launch.res"
[ "$(wc -l <"$WORK/launch.res")" -eq 2 ] || { cat "$WORK/launch.out"; fail "no loss line from caccel launch"; }
sed 's/^/  /' "$WORK/launch.res"

note "srun -n 2 -c 1 of the example: the same parameters, bit for bit, and the same printed results"
# shellcheck disable=SC2086
CACCEL_LOG_LEVEL=info timeout 300 srun -n 2 -c 1 --chdir "$WORK" "$FM" $RUN --dump-params "$WORK/srun.bin" \
    >"$WORK/srun.out" 2>"$WORK/srun.err" || { cat "$WORK/srun.out" "$WORK/srun.err"; show_logs; fail "srun -n 2 failed"; }
count 1 'info: 2 processes started by srun, collectives through gloo' "$WORK/srun.err"
cmp "$WORK/launch.bin" "$WORK/srun.bin" || fail "srun's parameters differ from caccel launch's"
results "$WORK/srun.out" | diff "$WORK/launch.res" - || fail "srun printed other results than caccel launch"
echo "  parameters identical ($(wc -c <"$WORK/srun.bin") bytes), results equal"

note "sbatch examples/slurm/train.sbatch: caccel launch inside the allocation, the same result"
# shellcheck disable=SC2086
CACCEL="$CACCEL" NPROC_PER_NODE=2 timeout 300 sbatch --wait --cpus-per-task=2 --chdir "$WORK" \
    --output="$WORK/sbatch.out" --error="$WORK/sbatch.err" "$SRC/examples/slurm/train.sbatch" \
    "$FM" $RUN --dump-params "$WORK/sbatch.bin" >"$WORK/sbatch.submit" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { cat "$WORK/sbatch.submit" "$WORK/sbatch.out" "$WORK/sbatch.err"; show_logs; fail "the batch job failed ($rc)"; }
count 1 "^caccel-train: 1 node(s) x 2 process(es), 1 thread(s) each, rendezvous $NODE:" "$WORK/sbatch.out"
count 1 "caccel launch: 2 process(es) on this machine (ranks 0-1 of 2, machine 0 of 1)" "$WORK/sbatch.err"
cmp "$WORK/launch.bin" "$WORK/sbatch.bin" || fail "the batch job's parameters differ from caccel launch's"
results "$WORK/sbatch.out" | diff "$WORK/launch.res" - || fail "the batch job printed other results than caccel launch"
echo "  parameters identical, results equal"

note "kernel and BLAS threads under srun: the CPUs Slurm gave each task (-c), else the node's CPUs shared among its tasks"
share=$(( cpus / 2 > 0 ? cpus / 2 : 1 ))
timeout 120 srun -n 2 "$CACCEL" env >"$WORK/env.out" 2>&1 || { cat "$WORK/env.out"; fail "srun caccel env"; }
count 2 "^CPU device: .*; $share kernel threads[ ;].*, $share BLAS threads[ ;]" "$WORK/env.out"
c2=$(( cpus < 2 ? cpus : 2 ))   # -c 2, but never more threads than CPUs
timeout 120 srun -n 2 -c 2 "$CACCEL" env >"$WORK/env.out" 2>&1 || { cat "$WORK/env.out"; fail "srun -c 2 caccel env"; }
count 2 "^CPU device: .*; $c2 kernel threads[ ;].*, $c2 BLAS threads[ ;]" "$WORK/env.out"
echo "  srun -n 2: $share each ($cpus CPUs online); srun -n 2 -c 2: $c2 each"

# Without --kill-on-bad-exit (Slurm's default, KillOnBadExit=0) Slurm leaves rank 0 running when rank 1
# dies: the step ends only because rank 0 notices, names rank 1 and exits. With it, Slurm would kill
# rank 0 itself and the test would prove nothing about caccel.
note "srun -n 2: rank 1 killed with SIGKILL while training; the step ends within $BOUND s, rank 0 naming it"
timeout 300 srun -n 2 -c 1 --kill-on-bad-exit=0 --chdir "$WORK" "$FM" --cpu --epochs 100 --seed 42 \
    >"$WORK/kill.out" 2>"$WORK/kill.err" &
sp=$!
# a rank of this cluster's step: its pid, found by SLURM_PROCID and this cluster's SLURM_CONF
rank_pid() {
    for p in $(pgrep -f fashion_mnist); do
        case $(cat "/proc/$p/comm" 2>/dev/null) in fashion_mnist|lt-fashion_mnis) ;; *) continue ;; esac
        e=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null) || continue
        printf '%s\n' "$e" | grep -qx "SLURM_CONF=$SLURM_CONF" && printf '%s\n' "$e" | grep -qx "SLURM_PROCID=$1" &&
            { echo "$p"; return 0; }
    done
    return 1
}
# rank 0 prints its "process(es) on cpu" line after prepare's broadcasts of the parameters, which every
# rank took part in: the job is connected and training, and rank 1 can be killed at once
training() { grep -q 'process(es) on cpu' "$WORK/kill.out" && rank_pid 0 && rank_pid 1; }
bounded_wait 120 "the ranks did not start training" training
r0=$(rank_pid 0) r1=$(rank_pid 1)
job=$(tr '\0' '\n' <"/proc/$r0/environ" | sed -n 's/^SLURM_JOB_ID=//p')
port=$((29500 + job % 1000))
ss -Htlnp "sport = :$port" | grep -q "pid=$r0," ||
    { ss -Htlnp; fail "rank 0 (pid $r0) does not serve the store on $port = 29500 + job id $job mod 1000"; }
echo "  job $job: rank 0 (pid $r0) serves the store on port $port; rank 1 is pid $r1"
t0=$(date +%s.%N)
kill -KILL "$r1"
wait "$sp"
rc=$?
t=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "  srun ended $t s after the SIGKILL, status $rc"
[ "$rc" -ne 0 ] || { cat "$WORK/kill.out" "$WORK/kill.err"; fail "srun succeeded although rank 1 was killed"; }
echo "$t $BOUND" | awk '{ exit !($1 < $2) }' || { cat "$WORK/kill.err"; fail "the step took $t s to end (bound $BOUND s)"; }
grep -q "rank 1 died (pid $r1 ended without exiting: killed or crashed" "$WORK/kill.err" ||
    { cat "$WORK/kill.err"; fail "rank 0 did not name rank 1's death"; }
grep -q "task 0: Exited with exit code 1" "$WORK/kill.err" ||
    { cat "$WORK/kill.err"; fail "rank 0 did not exit with the failed collective's status 1"; }
grep "rank 1 died" "$WORK/kill.err" | head -n 1 | cut -c1-200 | sed 's/^/  /'
[ -z "$(rank_pid 0; rank_pid 1)" ] || fail "a rank outlived srun"

stop_cluster
echo "PASS"
