#!/bin/sh
# Runs `caccel env` and `caccel config default` and checks what they print: values and the origin of each.
set -u

src=${CACCEL_TEST_SRCDIR:-.}
build=${CACCEL_TEST_BUILDDIR:-.}
caccel="$build/tools/caccel"
data="$src/tests/data/accelerate-configs"
if [ ! -x "$caccel" ]; then
    echo "SKIP: $caccel not built"
    exit 77
fi

. "$src/tests/cli_lib.sh"
cli_isolate cli

# expect_row FILE KEY VALUE ORIGIN: a row of the configuration table
expect_row() {
    if grep -E "^[ *] $2 +$3 +$4\$" "$1" >/dev/null; then
        echo "ok: $2 = $3 ($4)"
    else
        fail "no row '$2 $3 $4' in:"
        grep -E "^[ *] $2 " "$1" || cat "$1"
    fi
}
expect_text() {
    if grep -F -- "$2" "$1" >/dev/null; then
        echo "ok: output has '$2'"
    else
        fail "output lacks '$2':"
        cat "$1"
    fi
}

# --- version and help
"$caccel" --version >"$tmp/out" 2>&1 || fail "--version exited $?"
expect_text "$tmp/out" "caccel "
expect_text "$tmp/out" "plugin ABI "
"$caccel" --help >"$tmp/out" 2>&1 || fail "--help exited $?"
expect_text "$tmp/out" "env "
expect_text "$tmp/out" "config "
"$caccel" evn >"$tmp/out" 2>&1 && fail "an unknown command succeeded"
expect_text "$tmp/out" "did you mean 'env'"

# --- env: file < environment < flags, each value with its origin
cfg="$data/tests_0_28_0_mpi.yaml"
ACCELERATE_NUM_PROCESSES=8 CACCEL_TIMEOUT=90 \
    "$caccel" env --config_file "$cfg" --mixed_precision bf16 --bucket_cap_mb=10 >"$tmp/env" 2>&1 ||
    { fail "caccel env exited $?"; cat "$tmp/env"; }
expect_text "$tmp/env" "Configuration file: $cfg"
expect_text "$tmp/env" "CPU device: "
expect_row "$tmp/env" distributed_type MULTI_CPU "$cfg:3"
expect_row "$tmp/env" use_cpu true "$cfg:22"
expect_row "$tmp/env" num_machines 4 "$cfg:15"
expect_row "$tmp/env" mixed_precision bf16 "--mixed_precision"
expect_row "$tmp/env" bucket_cap_mb 10 "--bucket_cap_mb"
expect_row "$tmp/env" num_processes 8 "env ACCELERATE_NUM_PROCESSES"
expect_row "$tmp/env" timeout 90 "env CACCEL_TIMEOUT"
expect_row "$tmp/env" even_batches true default
expect_row "$tmp/env" 'mpirun_config\.mpirun_hostfile' /home/user/hostfile "$cfg:14"
# keys caccel only reports are marked
if grep -E '^\* ipex_config\.ipex ' "$tmp/env" >/dev/null; then echo "ok: ipex_config.ipex marked"; else fail "ipex_config.ipex not marked *"; fi
if grep -E '^  mixed_precision ' "$tmp/env" >/dev/null; then echo "ok: mixed_precision unmarked"; else fail "mixed_precision marked"; fi
expect_text "$tmp/env" "cpu "

# every key `caccel env` lists is documented
doc="$src/docs/CONFIGURATION.md"
if [ -f "$doc" ]; then
    undocumented=$(sed -n '/^  KEY /,/^$/p' "$tmp/env" | sed -n 's/^[ *] \([a-z0-9_.]*\) .*/\1/p' | while read -r k; do
        grep -F "\`$k\`" "$doc" >/dev/null || echo "$k"
    done)
    if [ -n "$undocumented" ]; then fail "keys missing from docs/CONFIGURATION.md: $undocumented"; else echo "ok: every listed key is documented"; fi
fi

# --- Accelerate 1.10's parallelism_config: its spelling in the file, the field name alone, the variables
# and the launcher's flags, each with its origin; a size caccel cannot run yet is shown and warned about
printf '%s\n' 'distributed_type: FSDP' 'num_processes: 4' 'fsdp_config:' '  fsdp_version: 2' 'parallelism_config:' \
    '  parallelism_config_dp_replicate_size: 2' '  dp_shard_size: 2' '  parallelism_config_cp_size: 1' >"$tmp/nd.yaml"
PARALLELISM_CONFIG_SP_BACKEND=deepspeed PARALLELISM_CONFIG_TP_SIZE=2 "$caccel" env --config_file "$tmp/nd.yaml" \
    --use_parallelism_config --parallelism_config_sp_seq_length_is_variable false >"$tmp/env" 2>&1 ||
    { fail "caccel env on a parallelism_config file exited $?"; cat "$tmp/env"; }
expect_row "$tmp/env" 'parallelism_config\.parallelism_config_dp_replicate_size' 2 "$tmp/nd.yaml:6"
expect_row "$tmp/env" 'parallelism_config\.parallelism_config_dp_shard_size' 2 \
    "$tmp/nd.yaml:7 \(parallelism_config\.dp_shard_size\)"
expect_row "$tmp/env" 'parallelism_config\.parallelism_config_cp_size' 1 "$tmp/nd.yaml:8"
expect_row "$tmp/env" 'parallelism_config\.parallelism_config_tp_size' 2 "env PARALLELISM_CONFIG_TP_SIZE"
expect_row "$tmp/env" 'parallelism_config\.parallelism_config_sp_backend' deepspeed "env PARALLELISM_CONFIG_SP_BACKEND"
expect_row "$tmp/env" 'parallelism_config\.parallelism_config_sp_seq_length_is_variable' false \
    "--parallelism_config_sp_seq_length_is_variable"
# tensor parallelism runs: no warning, but the mesh of 2 x 2 x 1 x 2 is not 4 processes, which a run refuses
expect_text "$tmp/env" "Device mesh: parallelism_config: parallelism_config_dp_replicate_size 2 ($tmp/nd.yaml:6) x parallelism_config_dp_shard_size 2 ($tmp/nd.yaml:7 (parallelism_config.dp_shard_size)) x parallelism_config_cp_size 1 ($tmp/nd.yaml:8) x parallelism_config_tp_size 2 (env PARALLELISM_CONFIG_TP_SIZE) = 8 processes, but the job has 4"
if grep -F "parallelism_config_tp_size = 2 is not supported yet" "$tmp/env" >/dev/null; then fail "tp_size warned about"; else echo "ok: tp_size not warned about"; fi
# the device mesh, tp innermost, and each rank's coordinates
"$caccel" env --num_processes 4 --parallelism_config_tp_size 2 --parallelism_config_dp_replicate_size 2 >"$tmp/env" 2>&1 ||
    fail "caccel env with a mesh exited $?"
expect_text "$tmp/env" "Device mesh: dp_replicate 2 x dp_shard 1 x cp 1 x tp 2 (tp innermost), 4 processes"
expect_text "$tmp/env" "  rank 1: dp_replicate 0, dp_shard 0, cp 0, tp 1"
expect_text "$tmp/env" "  rank 2: dp_replicate 1, dp_shard 0, cp 0, tp 0"
if grep -F "has no effect" "$tmp/env" >/dev/null; then cat "$tmp/env"; fail "a mesh key warned about"; else echo "ok: the mesh's keys act"; fi
if grep -F "not a key caccel knows" "$tmp/env" >/dev/null; then fail "a parallelism_config key is unknown"; else echo "ok: every parallelism_config key known"; fi

# --- under FSDP, the strategy in effect from FSDP1's or FSDP2's keys (any spelling of a boolean)
"$caccel" env --use_fsdp --fsdp_version 2 --fsdp_reshard_after_forward False >"$tmp/env" 2>&1 || fail "env FSDP2 exited $?"
expect_text "$tmp/env" "Resolved FSDP: sharding strategy SHARD_GRAD_OP (fsdp_config.fsdp_reshard_after_forward = False, --fsdp_reshard_after_forward), state dict type FULL_STATE_DICT (not set: full)"
"$caccel" env --use_fsdp --fsdp_sharding_strategy 4 --fsdp_state_dict_type SHARDED_STATE_DICT >"$tmp/env" 2>&1 || fail "env FSDP1 exited $?"
expect_text "$tmp/env" "Resolved FSDP: sharding strategy HYBRID_SHARD (fsdp_config.fsdp_sharding_strategy = 4, --fsdp_sharding_strategy), state dict type SHARDED_STATE_DICT (--fsdp_state_dict_type)"

# --- env refuses Accelerate's invalid file, naming both keys and the file
"$caccel" env --config_file "$data/tests_invalid_keys.yaml" >"$tmp/bad" 2>&1 && fail "invalid keys accepted"
expect_text "$tmp/bad" "tests_invalid_keys.yaml"
expect_text "$tmp/bad" "'invalid_key'"
expect_text "$tmp/bad" "'another_invalid_key'"
expect_text "$tmp/bad" "hint: "
# ... unless unknown keys are allowed
CACCEL_ALLOW_UNKNOWN_KEYS=1 "$caccel" env --config_file "$data/tests_invalid_keys.yaml" >"$tmp/allowed" 2>&1 ||
    fail "CACCEL_ALLOW_UNKNOWN_KEYS=1 did not allow the file"
expect_row "$tmp/allowed" invalid_key invalid_value "$data/tests_invalid_keys.yaml:14"
# a bad flag value names the flag; an unknown argument is refused
"$caccel" env --num_processes many >"$tmp/bad" 2>&1 && fail "a bad flag value was accepted"
expect_text "$tmp/bad" "--num_processes: invalid value 'many'"
"$caccel" env --frobnicate >"$tmp/bad" 2>&1 && fail "an unknown argument was accepted"
expect_text "$tmp/bad" "unknown argument '--frobnicate'"
"$caccel" env --config_file "$tmp/missing.yaml" >"$tmp/bad" 2>&1 && fail "a missing --config_file was accepted"
expect_text "$tmp/bad" "$tmp/missing.yaml"

# --- log levels: Python's names are accepted, another warns once and keeps WARNING; never a hang
# (an unknown level used to deadlock every program inside the log's pthread_once)
printf 'distributed_type: MULTI_GPU\nnum_processes: 1\nuse_cpu: false\n' >"$tmp/warn.yaml"
level_run() {   # level_run VAR VALUE: caccel env under a 10 s bound, output in $tmp/lvl
    env "$1=$2" timeout 10 "$caccel" env --config_file "$tmp/warn.yaml" >"$tmp/lvl" 2>&1
    rc=$?
    if [ "$rc" -eq 124 ]; then fail "$1=$2: caccel env hung (killed after 10 s)"; elif [ "$rc" -ne 0 ]; then
        fail "$1=$2: caccel env exited $rc"; cat "$tmp/lvl"; fi
}
count_in() { grep -c -F -- "$2" "$1"; }
level_run ACCELERATE_LOG_LEVEL FATAL
[ "$(count_in "$tmp/lvl" "warning:")" -eq 0 ] && echo "ok: FATAL hides warnings" || fail "FATAL shows warnings"
level_run ACCELERATE_LOG_LEVEL NOTSET
expect_text "$tmp/lvl" "info: not set in a file"
level_run CACCEL_LOG_LEVEL critical
[ "$(count_in "$tmp/lvl" "warning:")" -eq 0 ] && echo "ok: critical hides warnings" || fail "critical shows warnings"
level_run ACCELERATE_LOG_LEVEL WARNIGN
[ "$(count_in "$tmp/lvl" "ACCELERATE_LOG_LEVEL=WARNIGN is not a log level")" -eq 1 ] &&
    echo "ok: one warning for the typo" || { fail "not one warning for ACCELERATE_LOG_LEVEL=WARNIGN"; cat "$tmp/lvl"; }
expect_text "$tmp/lvl" "using WARNING"
expect_text "$tmp/lvl" "runs a single process"   # warnings still shown
[ "$(count_in "$tmp/lvl" "info:")" -eq 0 ] && echo "ok: the typo falls back to WARNING" || fail "INFO shown after a typo"

# --- config default writes a file that env then finds by itself
"$caccel" config default --mixed_precision=BF16 >"$tmp/cd" 2>&1 || { fail "config default exited $?"; cat "$tmp/cd"; }
written="$HOME/.config/caccel/default_config.yaml"
expect_text "$tmp/cd" "$written"
[ -f "$written" ] || fail "$written not written"
ls "$HOME/.config/caccel" | grep -F '.tmp' >/dev/null && fail "a temporary file was left behind"
"$caccel" env >"$tmp/env2" 2>&1 || { fail "env with the written default exited $?"; cat "$tmp/env2"; }
expect_text "$tmp/env2" "Configuration file: $written"
expect_row "$tmp/env2" mixed_precision bf16 "$written:9"
expect_row "$tmp/env2" compute_environment LOCAL_MACHINE "$written:2"
"$caccel" config default >"$tmp/cd" 2>&1 && fail "config default overwrote an existing file"
expect_text "$tmp/cd" "already exists"
"$caccel" config default --config_file "$tmp/x/y.yaml" --mixed_precision fp17 >"$tmp/cd" 2>&1 &&
    fail "config default accepted --mixed_precision fp17"
expect_text "$tmp/cd" "--mixed_precision: invalid value 'fp17'"
[ -f "$tmp/x/y.yaml" ] && fail "a file was written despite the bad value"
"$caccel" config default --config_file "$tmp/x/y.yaml" >"$tmp/cd" 2>&1 || fail "config default --config_file failed"
"$caccel" env --config_file "$tmp/x/y.yaml" >"$tmp/env3" 2>&1 || fail "env could not read $tmp/x/y.yaml"
expect_row "$tmp/env3" mixed_precision no "$tmp/x/y.yaml:9"

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
echo "all checks passed"
exit 0
