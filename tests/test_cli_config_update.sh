#!/bin/sh
# `caccel config update` without a terminal: a file of any size rewritten with every key and value as it
# read them (checked through `caccel env`), a rewrite that does not read back leaves the file as it was,
# and --to-fsdp2 converts an FSDP1 section keeping every other key and the settings in effect.
set -u

src=${CACCEL_TEST_SRCDIR:-.}
build=${CACCEL_TEST_BUILDDIR:-.}
caccel="$build/tools/caccel"
if [ ! -x "$caccel" ]; then
    echo "SKIP: $caccel not built"
    exit 77
fi

. "$src/tests/cli_lib.sh"
cli_isolate update
ok() { echo "ok: $*"; }
# check DESCRIPTION COMMAND...: the command must succeed
check() {
    d=$1
    shift
    if "$@"; then ok "$d"; else fail "$d"; fi
}
update() {   # update FILE [FLAGS]: runs config update, output in $tmp/update.out
    f=$1
    shift
    "$caccel" config update --config_file "$f" "$@" >"$tmp/update.out" 2>&1
}
# rows FILE: the configuration `caccel env` shows for FILE, one "key value" row per line, without the
# origin column (the lines move when a file is rewritten; a default filled in is the same value), sorted
# (keys outside the schema are listed in the order the file has them).
rows() {
    CACCEL_ALLOW_UNKNOWN_KEYS=1 "$caccel" env --config_file "$1" >"$tmp/env.out" 2>&1 ||
        { fail "caccel env on $1 exited $?"; cat "$tmp/env.out"; }
    sed -n '/^  KEY /,/^$/p' "$tmp/env.out" | sed -e "s#  $1:[0-9][0-9]*.*\$##" -e 's/  default$//' \
        -e 's/ *$//' | LC_ALL=C sort
}
same_rows() {   # same_rows BEFORE AFTER: `caccel env` shows the same keys and values for both
    rows "$1" >"$tmp/rows.before"
    rows "$2" >"$tmp/rows.after"
    if cmp -s "$tmp/rows.before" "$tmp/rows.after"; then
        ok "caccel env shows the same keys and values for $(basename "$2") as for $(basename "$1")"
    else
        fail "caccel env differs between $(basename "$1") and $(basename "$2"):"
        diff "$tmp/rows.before" "$tmp/rows.after" | cut -c1-160 | head -20
    fi
}
has_line() {   # has_line FILE LINE: FILE holds LINE exactly
    if grep -x -F -e "$2" "$1" >/dev/null; then ok "$(basename "$1") has '$(printf '%s' "$2" | cut -c1-60)'"
    else fail "$(basename "$1") lacks the line '$(printf '%s' "$2" | cut -c1-80)'"; fi
}
repeat() { head -c "$2" /dev/zero | tr '\0' "$1"; }

# 1. A file of any size: 300 keys, a 5,000-byte value, 200-byte keys (in a section and at the top),
# values a YAML writer must quote (a line break, a ': ', a leading '['), a key with ': ' in it.
f="$tmp/big.yaml"
long_value=$(repeat v 5000)
long_key=$(repeat k 200)
long_top=$(repeat t 200)
{
    echo "distributed_type: FSDP"
    echo "num_processes: 2"
    echo "allow_unknown_keys: true"
    echo "fsdp_config:"
    echo "  fsdp_sharding_strategy: SHARD_GRAD_OP"
    i=1
    while [ $i -le 300 ]; do
        echo "  key_$i: value $i"
        i=$((i + 1))
    done
    echo "  $long_key: 17"
    echo "main_training_function: $long_value"
    echo "$long_top: 'x'"
    printf '%s\n' 'two_lines: "first\nsecond"'
    echo "'odd: key': '[not a list'"
} >"$f"
cp "$f" "$tmp/big.orig"
chmod 600 "$f"
if update "$f"; then ok "config update of 300 keys"; else fail "config update of 300 keys failed:"; cut -c1-200 "$tmp/update.out"; fi
check "it says so" grep -q "Successfully updated" "$tmp/update.out"
n=$(grep -c '^  key_[0-9]*: value [0-9]*$' "$f")
[ "$n" -eq 300 ] && ok "300 keys of fsdp_config written" || fail "$n of 300 keys of fsdp_config written"
has_line "$f" "main_training_function: $long_value"
has_line "$f" "  $long_key: 17"
has_line "$f" "$long_top: x"
has_line "$f" 'two_lines: "first\u000asecond"'
has_line "$f" "'odd: key': '[not a list'"
same_rows "$tmp/big.orig" "$f"
[ "$(stat -c %a "$f")" = 600 ] && ok "the file keeps its permissions" || fail "permissions $(stat -c %a "$f"), not 600"
cp "$f" "$tmp/big.updated"
update "$f" || fail "a second update failed"
check "a second update changes nothing" cmp -s "$f" "$tmp/big.updated"
[ -z "$(ls "$tmp" | grep '\.tmp')" ] && ok "no temporary file left" || fail "temporary files left: $(ls "$tmp")"

# The same as JSON.
j="$tmp/big.json"
cp "$tmp/big.orig" "$tmp/big2.yaml"
update "$tmp/big2.yaml" && cp "$tmp/big2.yaml" "$j" && update "$j" || fail "config update to JSON failed: $(cut -c1-200 "$tmp/update.out")"
check "JSON written for a .json file" grep -q '^{' "$j"
same_rows "$tmp/big.orig" "$j"

# The field names alone in parallelism_config become Accelerate's spelling, with their values.
f="$tmp/nd.yaml"
printf 'distributed_type: FSDP\nnum_processes: 4\nparallelism_config:\n  dp_shard_size: 2\n  dp_replicate_size: 2\n' >"$f"
update "$f" || fail "config update of parallelism_config failed: $(cat "$tmp/update.out")"
check "the spelling migration is reported" \
    grep -q "migrated parallelism_config.dp_shard_size to parallelism_config.parallelism_config_dp_shard_size: 2" \
    "$tmp/update.out"
has_line "$f" "  parallelism_config_dp_shard_size: 2"
has_line "$f" "  parallelism_config_dp_replicate_size: 2"
check "the field names are gone" sh -c "! grep -q '^  dp_' '$f'"

# 2. A rewrite that does not read back as written changes nothing: the new text is changed in its
# temporary file while the command is held there (CACCEL_TEST_CONFIG_STALL), as a disk or another
# writer could, and the difference is caught before the file is replaced.
f="$tmp/held.yaml"
cp "$tmp/big.orig" "$f"
CACCEL_TEST_CONFIG_STALL=1 "$caccel" config update --config_file "$f" >"$tmp/held.out" 2>&1 &
pid=$!
waited=0
until grep -q "stalled before reading back" "$tmp/held.out" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null || [ $waited -ge 600 ]; then break; fi
    sleep 0.1
    waited=$((waited + 1))
done
held=$(sed -n 's/.*stalled before reading back \(.*\) (CACCEL_TEST_CONFIG_STALL)$/\1/p' "$tmp/held.out")
if [ -n "$held" ] && [ -f "$held" ]; then
    ok "held with the new text in $(basename "$held")"
    sed 's/^  key_7: value 7$/  key_7: value 8/' "$held" >"$tmp/changed" && cat "$tmp/changed" >"$held"
else
    fail "the command did not stop before reading back:"
    cat "$tmp/held.out"
fi
kill -CONT "$pid" 2>/dev/null
wait "$pid"
rc=$?
[ "$rc" -eq 1 ] && ok "config update fails (1)" || fail "config update exited $rc"
check "the difference is named" grep -q "key 'fsdp_config.key_7' reads back as 'value 8', not 'value 7' as written" "$tmp/held.out"
check "the message says the file was not changed" grep -q "$f was not changed" "$tmp/held.out"
check "the file is as it was" cmp -s "$f" "$tmp/big.orig"
check "no success reported" sh -c "! grep -q 'Successfully' '$tmp/held.out'"
[ -z "$(ls "$tmp" | grep '\.tmp')" ] && ok "no temporary file left" || fail "temporary files left: $(ls "$tmp")"

# 3. --to-fsdp2: an FSDP1 section in FSDP2's keys (Accelerate's to-fsdp2 table), every other key kept, and
# the same settings in effect: `caccel env` resolves the same strategy and state dict type, and a run
# prints the same losses.
f="$tmp/fsdp1.yaml"
cat >"$f" <<'YAML'
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: bf16
num_processes: 2
gradient_clipping: 1.0
fsdp_config:
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_reshard_after_forward: SHARD_GRAD_OP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_forward_prefetch: false
  fsdp_use_orig_params: true
  fsdp_sync_module_states: true
  fsdp_offload_params: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: [Block, Layer]
  fsdp_cpu_ram_efficient_loading: true
  fsdp_activation_checkpointing: true
  fsdp_min_num_params: 5000
  fsdp_version: 1
  fsdp_backward_prefetch_policy: kept
parallelism_config:
  parallelism_config_dp_shard_size: 2
YAML
cp "$f" "$tmp/fsdp1.orig"
if update "$f" --to-fsdp2; then ok "config update --to-fsdp2"; else fail "config update --to-fsdp2 failed:"; cat "$tmp/update.out"; fi
for l in "  converted fsdp_config.fsdp_sharding_strategy: SHARD_GRAD_OP to fsdp_config.fsdp_reshard_after_forward: false" \
    "  removed fsdp_config.fsdp_backward_prefetch: BACKWARD_PRE" "  removed fsdp_config.fsdp_use_orig_params: true" \
    "  removed fsdp_config.fsdp_sync_module_states: true" "  removed fsdp_config.fsdp_forward_prefetch: false" \
    "  set fsdp_config.fsdp_state_dict_type: FULL_STATE_DICT" "  set fsdp_config.fsdp_version: 2"; do
    check "it says '$l'" grep -q -F -e "$l" "$tmp/update.out"
done
for l in "  fsdp_version: 2" "  fsdp_reshard_after_forward: false" "  fsdp_state_dict_type: FULL_STATE_DICT" \
    "  fsdp_offload_params: false" "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP" \
    "  fsdp_transformer_layer_cls_to_wrap: [\"Block\", \"Layer\"]" "  fsdp_cpu_ram_efficient_loading: true" \
    "  fsdp_activation_checkpointing: true" "  fsdp_min_num_params: 5000" "  fsdp_backward_prefetch_policy: kept" \
    "  parallelism_config_dp_shard_size: 2"; do
    has_line "$f" "$l"
done
for k in fsdp_sharding_strategy fsdp_backward_prefetch: fsdp_forward_prefetch fsdp_use_orig_params fsdp_sync_module_states; do
    check "$k is gone" sh -c "! grep -q '^  $k' '$f'"
done
# every key outside fsdp_config as it was
rows "$tmp/fsdp1.orig" | grep -v '^[ *] fsdp_config\.' >"$tmp/rows.before"
rows "$f" | grep -v '^[ *] fsdp_config\.' >"$tmp/rows.after"
check "every key outside fsdp_config as it was" cmp -s "$tmp/rows.before" "$tmp/rows.after"
# what runs: caccel env's resolution (without the origins, which name other keys and lines)
resolved() {
    "$caccel" env --config_file "$1" 2>&1 | sed -n 's/ ([^)]*)//g; s/^Resolved/&/p'
}
resolved "$tmp/fsdp1.orig" >"$tmp/res.before"
resolved "$f" >"$tmp/res.after"
check "caccel env resolves the FSDP1 file as SHARD_GRAD_OP" grep -q "sharding strategy SHARD_GRAD_OP, state dict type FULL_STATE_DICT" "$tmp/res.before"
if cmp -s "$tmp/res.before" "$tmp/res.after"; then ok "caccel env resolves the same settings after the conversion"
else fail "caccel env resolves other settings:"; diff "$tmp/res.before" "$tmp/res.after"; fi
prog="$build/examples/linear_regression"
if [ -x "$prog" ]; then
    "$caccel" launch --config_file "$tmp/fsdp1.orig" "$prog" 2>&1 | grep "mse" >"$tmp/run.before"
    "$caccel" launch --config_file "$f" "$prog" 2>&1 | grep "mse" >"$tmp/run.after"
    check "the run prints losses" grep -q "epoch 20: mse" "$tmp/run.before"
    check "the same run after the conversion" cmp -s "$tmp/run.before" "$tmp/run.after"
fi
cp "$f" "$tmp/fsdp2.yaml"
update "$f" --to-fsdp2 || fail "a second --to-fsdp2 failed"
check "FSDP2 already: nothing to convert" grep -q "fsdp_config is FSDP2 already" "$tmp/update.out"
check "a second conversion changes nothing" cmp -s "$f" "$tmp/fsdp2.yaml"

# values: one machine's HYBRID_SHARD is FULL_SHARD, LOCAL_STATE_DICT is saved sharded
f="$tmp/hybrid1.yaml"
printf 'distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n  fsdp_state_dict_type: LOCAL_STATE_DICT\n' >"$f"
update "$f" --to-fsdp2 || fail "--to-fsdp2 of HYBRID_SHARD on one machine failed: $(cat "$tmp/update.out")"
has_line "$f" "  fsdp_reshard_after_forward: true"
has_line "$f" "  fsdp_state_dict_type: SHARDED_STATE_DICT"
# the same with parallelism_config's sizes over 2 machines (FSDP2's HSDP)
f="$tmp/hsdp.yaml"
printf 'distributed_type: FSDP\nnum_processes: 4\nnum_machines: 2\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD_ZERO2\nparallelism_config:\n  dp_replicate_size: 2\n  dp_shard_size: 2\n' >"$f"
update "$f" --to-fsdp2 || fail "--to-fsdp2 of HSDP failed: $(cat "$tmp/update.out")"
has_line "$f" "  fsdp_reshard_after_forward: false"
has_line "$f" "  parallelism_config_dp_replicate_size: 2"

# refused where FSDP2 would run something else; the file is left as it was
refused() {   # refused NAME TEXT EXPECTED...
    f="$tmp/$1.yaml"
    printf "$2" >"$f"
    cp "$f" "$tmp/$1.orig"
    shift 2
    if update "$f" --to-fsdp2; then fail "--to-fsdp2 of $(basename "$f") succeeded"; else ok "--to-fsdp2 of $(basename "$f") refused"; fi
    for want in "$@"; do check "it says '$want'" grep -q -F -e "$want" "$tmp/update.out"; done
    check "$(basename "$f") is as it was" cmp -s "$f" "${f%.yaml}.orig"
}
refused noshard 'distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n' \
    "cannot convert fsdp_config to FSDP2: fsdp_config.fsdp_sharding_strategy = NO_SHARD (" "FSDP2 always shards"
refused hybrid2 'distributed_type: FSDP\nnum_processes: 8\nnum_machines: 2\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n' \
    "shards within each machine" \
    "add parallelism_config: {parallelism_config_dp_replicate_size: 2, parallelism_config_dp_shard_size: 4}"
refused disagree 'distributed_type: FSDP\nfsdp_config:\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n' \
    "fsdp_config.fsdp_reshard_after_forward = SHARD_GRAD_OP (" \
    "and fsdp_config.fsdp_sharding_strategy = FULL_SHARD (not set: the default) disagree"
# no fsdp_config: an ordinary update
f="$tmp/plain.yaml"
printf 'distributed_type: MULTI_CPU\nnum_processes: 2\n' >"$f"
update "$f" --to-fsdp2 || fail "--to-fsdp2 without fsdp_config failed"
check "no fsdp_config: nothing to convert" grep -q "no fsdp_config in $f: nothing to convert" "$tmp/update.out"

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)"
    exit 1
fi
echo "all passed"
