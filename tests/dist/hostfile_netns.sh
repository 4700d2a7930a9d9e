#!/bin/sh
# One command starts every machine: three "machines" (network namespaces on a bridge, as
# tests/dist/netns.sh), each running its own sshd on its own address with keys generated here.
# `caccel launch --hostfile` on machine 0 trains Fashion-MNIST on 3 x 2 processes to the parameters
# of one machine with 6; a host that cannot be reached is named before anything starts; a failed
# rank, Ctrl-C and a host that dies each stop every machine and leave no process behind; with
# --num_machines 2:3 a host that dies leaves the job, and the others finish it from the newest
# checkpoint. Skips without root (network namespaces) or without OpenSSH's server.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns_lib.sh"
trap 'exit 1' HUP INT TERM
need_caccel
need_backend gloo
SSHD=/usr/sbin/sshd
if ! [ -x "$SSHD" ] || ! command -v ssh >/dev/null 2>&1 || ! command -v ssh-keygen >/dev/null 2>&1; then
    skip "no OpenSSH server or client (install openssh-server openssh-client)"
fi
ns_setup 3
export OPENBLAS_NUM_THREADS=1
FM="$BUILD/examples/fashion_mnist"
SSH_PORT=2222

# keys made here: the server's host key and the client's key, authorized for this user
K="$WORK/ssh"
mkdir -p "$K" && chmod 700 "$K"
ssh-keygen -q -t ed25519 -N '' -f "$K/host_key" && ssh-keygen -q -t ed25519 -N '' -f "$K/id" || fail "ssh-keygen"
cp "$K/id.pub" "$K/authorized_keys" && chmod 600 "$K/authorized_keys"
cat >"$K/sshd_config" <<CONF
Port $SSH_PORT
HostKey $K/host_key
AuthorizedKeysFile $K/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
PidFile none
CONF
[ -d /run/sshd ] || mkdir -p /run/sshd   # sshd's privilege separation directory
i=0
while [ "$i" -lt 3 ]; do
    : >"$WORK/sshd$i"
    ip netns exec "$(ns_name "$i")" "$SSHD" -D -e -f "$K/sshd_config" -o "ListenAddress=$(ns_addr "$i")" \
        >>"$WORK/sshd$i" 2>&1 &
    eval "SSHD_$i=\$!"
    i=$((i + 1))
done
stop_sshd() { for p in "$SSHD_0" "$SSHD_1" "$SSHD_2"; do kill "$p" 2>/dev/null; done; }
CLEANUPS="stop_sshd $CLEANUPS"
wait_lines 3 "Server listening on 10.231.7.[1-3] port $SSH_PORT" "the sshd of each machine" \
    "$SSHD_0 $SSHD_1 $SSHD_2" "$WORK/sshd0" "$WORK/sshd1" "$WORK/sshd2"

OPTS="-F /dev/null -i $K/id -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
H="$WORK/hosts"
printf '# three machines, two processes each\n%s slots=2\n%s slots=2\n%s:2\n' "$(ns_addr 0)" "$(ns_addr 1)" \
    "$(ns_addr 2)" >"$H"
# hostfile_launch OUT ARGS...: caccel launch --hostfile on machine 0, in the background ($HL_PID)
hostfile_launch() {
    out=$1; shift
    : >"$out"
    ip netns exec "$(ns_name 0)" timeout -k 5 120 "$CACCEL" launch --hostfile "$H" --ssh_port "$SSH_PORT" \
        --ssh_opts "$OPTS" --cpu --backend gloo --num_cpu_threads_per_process 1 "$@" >>"$out" 2>&1 &
    HL_PID=$!
}

note "a host that cannot be reached is named before anything starts"
printf '%s slots=2\n10.231.7.99 slots=2\n' "$(ns_addr 1)" >"$WORK/hosts_bad"
start=$(date +%s)
ip netns exec "$(ns_name 0)" "$CACCEL" launch --hostfile "$WORK/hosts_bad" --ssh_port "$SSH_PORT" --ssh_opts "$OPTS" \
    sh -c "touch $WORK/ran" >"$WORK/out" 2>&1 && { cat "$WORK/out"; fail "a job with an unreachable host succeeded"; }
count 1 "^  10.231.7.99 (machine 1): " "$WORK/out"
grep -q "$(ns_addr 1) (machine 0)" "$WORK/out" && { cat "$WORK/out"; fail "a reachable host was named"; }
[ ! -e "$WORK/ran" ] || fail "the program ran on the reachable host"
echo "  refused in $(elapsed_since "$start") s"

note "Fashion-MNIST: 3 machines x 2 processes from one command == 1 machine with 6 processes"
timeout 300 "$CACCEL" launch --main_process_port 0 --num_processes 6 --cpu --backend gloo \
    --num_cpu_threads_per_process 1 "$FM" --batch-size 32 --epochs 1 --max-steps 5 --dump-params "$WORK/local6.bin" \
    >"$WORK/o" 2>&1 || { cat "$WORK/o"; fail "1 machine with 6 processes"; }
hostfile_launch "$WORK/o" "$FM" --batch-size 32 --epochs 1 --max-steps 5 --dump-params "$WORK/net6.bin"
wait "$HL_PID" || { cat "$WORK/o"; fail "the --hostfile job exited $?"; }
same "$WORK/local6.bin" "$WORK/net6.bin"
for m in 0 1 2; do   # every line reaches this terminal with its host's name
    grep -q "^\[$(ns_addr "$m")\] " "$WORK/o" || { cat "$WORK/o"; fail "no output prefixed with machine $m's host"; }
done

note "rank 5 (machine 2) exits 7: every machine stops, the host whose launcher failed first is named"
hostfile_launch "$WORK/exit" "$CHECK" --tag "$TAG" --backend gloo --mode exit
wait "$HL_PID"
rc=$?
[ "$rc" -ne 0 ] || { cat "$WORK/exit"; fail "the job exited 0 although rank 5 failed"; }
count 1 "^\[$(ns_addr 2)\] caccel launch: rank 5 (local rank 1, pid [0-9]*) exited with code 7" "$WORK/exit"
# machine 2's launcher ends first unless another's ranks saw rank 5 gone sooner: either is named
count 1 "^caccel launch: host 10.231.7.[1-3] (machine [0-2]) exited with code [0-9]*: stopping every machine" "$WORK/exit"
no_orphans

note "the configuration file travels: every machine reads a copy, removed when its launcher ends"
printf 'distributed_type: MULTI_CPU\nmixed_precision: bf16\n' >"$WORK/cfg.yaml"
hostfile_launch "$WORK/cfg" --config_file "$WORK/cfg.yaml" sh -c 'echo "cfg=$ACCELERATE_CONFIG_FILE $(cat "$ACCELERATE_CONFIG_FILE" | tr "\n" " ")"'
wait "$HL_PID" || { cat "$WORK/cfg"; fail "the job with a configuration file exited $?"; }
count 6 "cfg=/.*/caccel-config\.[A-Za-z0-9]*/cfg.yaml distributed_type: MULTI_CPU mixed_precision: bf16 $" "$WORK/cfg"
for d in $(sed -n 's|.*cfg=\(/.*/caccel-config\.[A-Za-z0-9]*\)/cfg.yaml .*|\1|p' "$WORK/cfg" | sort -u); do
    [ ! -e "$d" ] || fail "the configuration's copy $d outlived the job"
done

# spin_job OUT: 6 ranks all-reducing in a loop over the 3 machines, once every one of them has
spin_job() {
    hostfile_launch "$1" "$CHECK" --tag "$TAG" --backend gloo --mode spin
    wait_lines 6 "comm_check: rank [0-5] spinning" "the 6 ranks did not start" "$HL_PID" "$1"
}

note "Ctrl-C stops every machine and leaves no process on any of them"
spin_job "$WORK/int"
kill -INT "$HL_PID"
wait "$HL_PID"
rc=$?
[ "$rc" -ne 0 ] || { cat "$WORK/int"; fail "an interrupted job exited 0"; }
count 1 "caccel launch: Interrupt received: stopping every machine" "$WORK/int"
no_orphans

note "--num_machines 2:3: machine 2 dies after step 6; machines 0 and 1 go on from step 4 and finish"
hostfile_launch "$WORK/el" --num_machines 2:3 --max_restarts 1 --monitor_interval 0.2 "$BUILD/tests/ddp_check" \
    --mode plain --batch 8 --k 2 --steps 8 --save-every 4 --automatic_checkpoint_naming --resume --halt-step 6 \
    --project_dir "$WORK/elastic"
wait_lines 1 "rank=5 trained step 6 of 6 processes" "machine 2 did not train" "$HL_PID" "$WORK/el"
# every process of machine 2 but its sshd (the next case needs it): its launcher, ranks and ssh session
# shellcheck disable=SC2046  # one word per process
kill -KILL $(ip netns pids "$(ns_name 2)" | grep -vx "$SSHD_2")
wait "$HL_PID" || { cat "$WORK/el"; fail "the elastic --hostfile job exited $? after machine 2 died"; }
count 1 "^caccel launch: the connection to host $(ns_addr 2) (machine 2) was lost (ssh exited 255): the elastic job goes on without it" "$WORK/el"
count 1 "^\[$(ns_addr 1)\] caccel launch: membership (round 1): machine(s) 2 left; the job goes on with machines 0,1 (2 of --num_machines 2:3)" "$WORK/el"
count 1 "^\[$(ns_addr 0)\] .*elastic: the group of 4 processes resumes at optimizer step 4" "$WORK/el"
count 1 "^\[$(ns_addr 0)\] rank=0 trained step 8 of 4 processes" "$WORK/el"
count 1 "1 of the 3 machines left the elastic job while it ran; it ended with machine 0's status 0" "$WORK/el"
for m in 0 1 2; do
    [ -z "$(ip netns pids "$(ns_name "$m")" | grep -vx "$(eval echo "\$SSHD_$m")")" ] ||
        { ip netns pids "$(ns_name "$m")" | xargs ps -o pid,args -p; fail "processes left on machine $m"; }
done

note "a host that dies (every process of machine 2 killed) stops the others, naming it"
spin_job "$WORK/dead"
# shellcheck disable=SC2046  # one word per process
kill -KILL $(ip netns pids "$(ns_name 2)")
wait "$HL_PID"
rc=$?
[ "$rc" -ne 0 ] || { cat "$WORK/dead"; fail "the job exited 0 although machine 2 died"; }
grep -q "caccel launch: the connection to host $(ns_addr 2) (machine 2) was lost (ssh exited 255): stopping every machine" \
    "$WORK/dead" || { cat "$WORK/dead"; fail "machine 2 was not named"; }
no_orphans
echo "PASS"
