#!/bin/sh
# caccel launch --hostfile FILE, before any machine starts: the file is read strictly (errors name the
# file and the line), its shape is checked against --num_processes / --num_machines, and every host
# that ssh cannot reach is named, all of them, before anything starts. tests/dist/hostfile_netns.sh
# runs jobs over ssh.
. "$(dirname "$0")/lib.sh"
need_caccel

# bad LINE MESSAGE [FLAGS...]: a hostfile holding LINE is refused with MESSAGE, nothing started
bad() {
    printf '%b' "$1" >"$WORK/hosts"
    want=$2; shift 2
    timeout 30 "$CACCEL" launch --hostfile "$WORK/hosts" "$@" true >"$WORK/out" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] || { cat "$WORK/out"; fail "hostfile '$want' was accepted"; }
    grep -qF -- "$want" "$WORK/out" || { cat "$WORK/out"; fail "no message '$want'"; }
}

note "a bad hostfile is refused, naming the file and its line"
H="$WORK/hosts"
bad '# machines\nnode1 slots=2\nnode2 slots=x\n' "$H:3: slots takes a count 1..4096, not 'x'"
bad 'node1 slots=2\n\nnode2 slots=2 gpus=4\n' "$H:3: unknown word 'gpus=4'"
bad 'node1 slots=2 max_slots=1\n' "$H:1: max_slots=1 is below slots=2"
bad 'node1:0\n' "$H:1: 'node1:0': the count after ':' takes 1..4096"
bad 'node1 slots=2\nnode1 slots=2\n' "$H:2: host node1 is listed twice"
bad 'no;de slots=2\n' "$H:1: 'no;de' is not a host name"
bad '# nothing\n\n' "hostfile $H lists no host"
bad 'node1 slots=2\nnode2 slots=3\n' "host node2 has 3 slot(s) but node1 has 2"
bad 'node1 slots=2\nnode2:2 # mpich form\n' "--num_processes 6, but the hostfile $H has 4 slot(s) in all (2 host(s) x 2)" \
    --num_processes 6
bad 'node1 slots=2 max_slots=4\nnode2 slots=2\n' "--num_machines 3, but the hostfile $H lists 2 host(s)" --num_machines 3
bad 'node1 slots=2\nnode2 slots=2\n' "--main_process_port 0 (any free port) needs one machine; the hostfile $H lists 2: give a port" \
    --main_process_port 0
timeout 30 "$CACCEL" launch --hostfile "$WORK" true >"$WORK/out" 2>&1 && fail "a directory was read as a hostfile"
grep -qF "the hostfile $WORK is not a regular file of at most 1048576 bytes" "$WORK/out" || { cat "$WORK/out"; fail "directory"; }
timeout 30 "$CACCEL" launch --ssh_port 22 true >"$WORK/out" 2>&1 && fail "--ssh_port without --hostfile was accepted"
grep -qF "ssh_port and --ssh_opts need --hostfile" "$WORK/out" || { cat "$WORK/out"; fail "--ssh_port alone"; }

command -v ssh >/dev/null 2>&1 || skip "no ssh client (install openssh-client): unreachable hosts not tested"
note "hosts ssh cannot reach are all named before anything starts"
# a port nothing listens on: ssh fails at once (connection refused) for both hosts
port=$(free_port)
printf '127.0.0.1 slots=1\nlocalhost slots=1\n' >"$H"
start=$(date +%s)
timeout 60 "$CACCEL" launch --hostfile "$H" --ssh_port "$port" --ssh_opts "-F /dev/null" \
    sh -c "echo started; touch $WORK/ran" >"$WORK/out" 2>&1
rc=$?
[ "$rc" -ne 0 ] || { cat "$WORK/out"; fail "a job on unreachable hosts succeeded"; }
count 1 "these hosts of $H cannot be reached over ssh:" "$WORK/out"
count 1 "^  127.0.0.1 (machine 0): .*" "$WORK/out"
count 1 "^  localhost (machine 1): .*" "$WORK/out"
grep -q "nothing was started" "$WORK/out" || { cat "$WORK/out"; fail "no hint"; }
[ ! -e "$WORK/ran" ] || fail "the program ran although hosts were unreachable"
t=$(elapsed_since "$start")
echo "  refused in $t s"
[ "$t" -le 20 ] || fail "naming unreachable hosts took $t s"
echo "PASS"
