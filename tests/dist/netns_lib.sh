# netns_lib.sh: "machines" made of network namespaces, for tests/dist/netns*.sh (after lib.sh).
# NS_COUNT namespaces each hold one end of a veth pair whose other end is on a bridge in a hub
# namespace: a switch between machines. Machine i has address 10.231.7.(i+1)/24 on device eth0.
# Everything is deleted on exit (the test's CLEANUPS), failed or not.

NS_PREFIX="ca$$"
NS_HUB="${NS_PREFIX}hub"

ns_name() { echo "${NS_PREFIX}m$1"; }
ns_addr() { echo "10.231.7.$(($1 + 1))"; }

ns_drop() {
    i=0
    while [ "$i" -lt "${NS_COUNT:-0}" ]; do ip netns del "$(ns_name "$i")" 2>/dev/null; i=$((i + 1)); done
    ip netns del "$NS_HUB" 2>/dev/null
}

# ns_setup N: N machines on one switch; skips the test when this host cannot make them.
ns_setup() {
    command -v ip >/dev/null 2>&1 || skip "no ip command (install iproute2)"
    ip netns add "$NS_HUB" 2>"$WORK/err" ||
        skip "cannot create network namespaces ($(cat "$WORK/err")): needs root or CAP_NET_ADMIN"
    NS_COUNT=$1
    CLEANUPS="$CLEANUPS ns_drop"
    ip -n "$NS_HUB" link add br0 type bridge 2>"$WORK/err" || skip "cannot create a bridge ($(cat "$WORK/err"))"
    ip -n "$NS_HUB" link set br0 up && ip -n "$NS_HUB" link set lo up || fail "bridge up"
    i=0
    while [ "$i" -lt "$1" ]; do
        ns=$(ns_name "$i")
        ip netns add "$ns" || fail "namespace $ns"
        ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$NS_HUB" 2>"$WORK/err" ||
            skip "cannot create a veth pair ($(cat "$WORK/err"))"
        ip -n "$NS_HUB" link set "p$i" master br0 && ip -n "$NS_HUB" link set "p$i" up || fail "port p$i on the bridge"
        ip -n "$ns" addr add "$(ns_addr "$i")/24" dev eth0 || fail "address of machine $i"
        ip -n "$ns" link set lo up && ip -n "$ns" link set eth0 up || fail "links of machine $i up"
        i=$((i + 1))
    done
    # no spanning tree: a port forwards as soon as it is up (the launchers retry their first connection)
}

# ns_launch M N PORT PROG ARGS...: caccel launch on machine M of NS_COUNT (--num_machines NS_MACHINES
# when set: MIN:MAX; none when set empty: a config file or PET_NNODES says it), N processes in all,
# in the background; output in $WORK/mM, pid in $NS_PID_M. Machine 0 serves the store.
ns_launch() {
    m=$1 np=$2 port=$3; shift 3
    # emptied now, not by the background job's own redirection, which a busy machine may run late:
    # a test that waits for a line must not find the previous job's
    : >"$WORK/m$m"
    nm=${NS_MACHINES-$NS_COUNT}
    ip netns exec "$(ns_name "$m")" timeout -k 5 "${NS_LIMIT:-300}" "$CACCEL" launch ${nm:+--num_machines "$nm"} \
        --machine_rank "$m" --main_process_ip "$(ns_addr 0)" --main_process_port "$port" --num_processes "$np" \
        "$@" >>"$WORK/m$m" 2>&1 &
    eval "NS_PID_$m=\$!"
}

# ns_job N PORT PROG ARGS...: the same program on every machine; waits for every launcher.
# Statuses in NS_RC_0.., every output in $WORK/all.
ns_job() {
    export CACCEL_JOB_TOKEN="netns-test-token-$$"
    i=0
    while [ "$i" -lt "$NS_COUNT" ]; do ns_launch "$i" "$@"; i=$((i + 1)); done
    ns_wait
    unset CACCEL_JOB_TOKEN
}

ns_wait() {
    i=0
    : >"$WORK/all"
    while [ "$i" -lt "$NS_COUNT" ]; do
        eval "wait \$NS_PID_$i; NS_RC_$i=\$?"
        cat "$WORK/m$i" >>"$WORK/all"
        i=$((i + 1))
    done
}

# ns_all_ok: every launcher exited 0, else show their output and fail
ns_all_ok() {
    i=0
    while [ "$i" -lt "$NS_COUNT" ]; do
        eval "rc=\$NS_RC_$i"
        [ "$rc" -eq 0 ] || { cat "$WORK/all"; fail "machine $i's launcher exited $rc"; }
        i=$((i + 1))
    done
}

# netem_ok: the netem queueing discipline can be attached here (kernel module sch_netem)
netem_ok() {
    ns=$(ns_name 0)
    ip netns exec "$ns" tc qdisc add dev eth0 root netem delay 1ms 2>"$WORK/err" || return 1
    ip netns exec "$ns" tc qdisc del dev eth0 root
}
