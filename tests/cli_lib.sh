# Sourced by the caccel command tests: a temporary folder $tmp, removed at exit, and a process
# environment of its own, so that nothing of the machine running the tests leaks in: no default
# config files (HOME is inside $tmp), no ACCELERATE_*, FSDP_*, MEGATRON_LM_*, PARALLELISM_CONFIG_* or
# CACCEL_* variables but the test harness's own (CACCEL_TEST_*, CACCEL_PLUGIN_PATH), no MASTER_*.
# Also fail() and $failures, which the test ends with.
cli_isolate() {   # cli_isolate NAME: the folder is ${TMPDIR:-/tmp}/caccel-NAME-XXXXXX
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/caccel-$1-XXXXXX") || exit 1
    trap 'rm -rf "$tmp"' EXIT INT TERM
    for v in $(env | sed -n 's/^\(ACCELERATE_[A-Za-z0-9_]*\|FSDP_[A-Za-z0-9_]*\|MEGATRON_LM_[A-Za-z0-9_]*\|PARALLELISM_CONFIG_[A-Za-z0-9_]*\|CACCEL_[A-Za-z0-9_]*\|MASTER_ADDR\|MASTER_PORT\)=.*/\1/p'); do
        case $v in CACCEL_TEST_*|CACCEL_PLUGIN_PATH) ;; *) unset "$v" ;; esac
    done
    HOME="$tmp/home"
    export HOME
    unset XDG_CONFIG_HOME XDG_CACHE_HOME HF_HOME
    mkdir -p "$HOME"
}

failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
