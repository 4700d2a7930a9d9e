#!/bin/sh
# Drives `caccel config` (Accelerate's questionnaire) through a real terminal with tmux: the files
# written key by key and loaded back by `caccel env`, a refused answer asked again, the refusal
# without a terminal, SageMaker refused, an existing file kept, and `caccel config update`.
set -u

src=${CACCEL_TEST_SRCDIR:-.}
build=${CACCEL_TEST_BUILDDIR:-.}
caccel="$build/tools/caccel"
: "$src"
if [ ! -x "$caccel" ]; then
    echo "SKIP: $caccel not built"
    exit 77
fi
if ! command -v tmux >/dev/null 2>&1; then
    echo "SKIP: tmux is not installed (tools/install-deps.sh installs it); the questionnaire needs a terminal"
    exit 77
fi
case $caccel in /*) ;; *) caccel="$(pwd)/$caccel" ;; esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/caccel-config-XXXXXX") || exit 1
# Each terminal gets its own tmux server (private socket), so one ending cannot race the next starting;
# the sockets live in $tmp.
TMUX_TMPDIR="$tmp"
export TMUX_TMPDIR
unset TMUX
sock="caccel-config-test-$$"
T() { tmux -L "$sock" -f /dev/null "$@"; }
trap 'T kill-server >/dev/null 2>&1; rm -rf "$tmp"' EXIT INT TERM
for v in $(env | sed -n 's/^\(ACCELERATE_[A-Za-z0-9_]*\|FSDP_[A-Za-z0-9_]*\|CACCEL_[A-Za-z0-9_]*\)=.*/\1/p'); do
    case $v in CACCEL_TEST_*|CACCEL_PLUGIN_PATH) ;; *) unset "$v" ;; esac
done
HOME="$tmp/home"
XDG_CONFIG_HOME="$tmp/xdg"
export HOME XDG_CONFIG_HOME
unset XDG_CACHE_HOME HF_HOME
mkdir -p "$HOME"
# Seconds to wait for each prompt: generous, for a loaded machine.
patience=${CACCEL_TEST_PROMPT_TIMEOUT:-90}

failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}

# start NAME ARGS...: runs `caccel config ARGS` in a new terminal; its exit status lands in $tmp/NAME.rc.
start() {
    name=$1
    shift
    seen=0
    rm -f "$tmp/$name.rc"
    {
        echo "#!/bin/sh"
        printf '%s config' "'$caccel'"
        for a in "$@"; do printf " '%s'" "$a"; done
        printf '\necho $? > %s\nsleep 600\n' "'$tmp/$name.rc'"
    } > "$tmp/$name.run"
    chmod +x "$tmp/$name.run"
    T kill-server >/dev/null 2>&1
    sock="caccel-config-test-$$-$name"
    T new-session -d -s cfg -x 400 -y 100 "$tmp/$name.run" || { fail "$name: tmux could not start"; return 1; }
}

screen() { T capture-pane -p -J -S - -t cfg 2>/dev/null; }

# see TEXT: waits for a line holding TEXT after the last one seen (a question, a prompt).
see() {
    end=$(($(date +%s) + patience))
    while :; do
        line=$(screen | awk -v from="$seen" -v pat="$1" 'NR > from && index($0, pat) { print NR; exit }')
        [ -n "$line" ] && break
        if [ "$(date +%s)" -ge "$end" ]; then
            fail "$name: nothing shows '$1' after ${patience}s; the terminal shows:"
            screen | grep -v '^$' | tail -15
            return 1
        fi
        sleep 0.2
    done
    seen=$line
}

# ask PROMPT ANSWER: waits for PROMPT, then types ANSWER (empty: just Enter, the default).
ask() {
    see "$1" || return 1
    [ -n "$2" ] && T send-keys -t cfg -l -- "$2"
    T send-keys -t cfg Enter
}

# shows TEXT: the terminal comes to show TEXT after the last prompt answered (a message about that answer).
shows() {
    see "$1" && echo "ok: $name: shows '$1'"
}

# finish EXPECTED_RC: waits for caccel to exit.
finish() {
    end=$(($(date +%s) + patience))
    while [ ! -s "$tmp/$name.rc" ]; do
        if [ "$(date +%s)" -ge "$end" ]; then
            fail "$name: caccel config did not exit; the terminal shows:"
            screen | grep -v '^$' | tail -15
            return 1
        fi
        sleep 0.2
    done
    rc=$(cat "$tmp/$name.rc")
    if [ "$rc" = "$1" ]; then echo "ok: $name: exit status $rc"; else fail "$name: exit status $rc, expected $1"; fi
    screen > "$tmp/$name.screen"
    T kill-server >/dev/null 2>&1
}

# check WHAT CMD...: CMD succeeds.
check() {
    what=$1
    shift
    if "$@"; then echo "ok: $what"; else fail "$what"; fi
}
quiet() { "$@" >/dev/null 2>&1; }
absent() { [ ! -e "$1" ]; }

# has FILE LINE: FILE holds exactly this line.
has() {
    if grep -Fx -- "$2" "$1" >/dev/null; then echo "ok: $(basename "$1"): $2"; else fail "$1 lacks '$2'"; cat "$1"; fi
}
lacks() {
    if grep -F -- "$2" "$1" >/dev/null; then fail "$1 has '$2'"; else echo "ok: $(basename "$1") has no '$2'"; fi
}

# loads FILE KEY VALUE: `caccel env` reads KEY = VALUE from FILE.
loads() {
    if ! "$caccel" env --config_file "$1" > "$tmp/env.out" 2>&1; then
        fail "caccel env cannot load $1:"
        cat "$tmp/env.out"
        return
    fi
    if grep -E "^[ *] $2 +$3 +.*$(basename "$1" | sed 's/\./\\./g'):[0-9]+" "$tmp/env.out" >/dev/null; then
        echo "ok: caccel env: $2 = $3 from $(basename "$1")"
    else
        fail "caccel env does not read $2 = $3 from $1:"
        grep -E "^[ *] $2 " "$tmp/env.out" || cat "$tmp/env.out"
    fi
}

# 1. Two machines with GPUs: bad answers are refused with the loader's message and asked again.
f="$tmp/multi.yaml"
start multi --config_file "$f"
see "In which compute environment are you running?" &&
ask "Enter a number from 0 to 1 [0]:" "" &&
ask "Enter a number from 0 to 10 [0]:" "12" && shows "Please enter a number from 0 to 10." &&
ask "Enter a number from 0 to 10 [0]:" "4" &&
ask "How many different machines will you use" "two" &&
shows "your answer: invalid value 'two' for key 'num_machines'" &&
ask "How many different machines will you use" "2" &&
ask "What is the rank of this machine? (0 to 1) [0]:" "2" &&
shows "machine_rank 2 (your answer) must be less than num_machines 2" &&
ask "What is the rank of this machine?" "1" &&
ask "What is the IP address of the machine that will host the main process?" "10.1.2.3" &&
ask "What is the port you will use to communicate with the main process?" "70000" &&
shows "invalid value '70000' for key 'main_process_port' (allowed: an integer from 0 to 65535)" &&
ask "What is the port you will use to communicate with the main process?" "29500" &&
ask "Are all the machines on the same local network?" "perhaps" &&
shows "invalid value 'perhaps' for key 'same_network'" &&
ask "Are all the machines on the same local network?" "no" &&
ask "What rendezvous backend will you use?" "c10d" &&
ask "Should distributed operations be checked while running for errors?" "yes" &&
ask "Do you wish to optimize your script with torch dynamo?" "" &&
ask "Do you want to use DeepSpeed? [yes/NO]:" "" &&
ask "Do you want to use FullyShardedDataParallel? [yes/NO]:" "" &&
ask "Do you want to use Megatron-LM ? [yes/NO]:" "" &&
ask "How many GPU(s) should be used for distributed training? [1]:" "1" &&
shows "cannot be less than num_machines 2" &&
ask "How many GPU(s) should be used for distributed training? [1]:" "4" &&
ask "What GPU(s) (by id) should be used for training on this machine" "0,1" &&
ask "Would you like to enable numa efficiency?" "" &&
see "Do you wish to use mixed precision?" &&
ask "Enter a number from 0 to 3 [0]:" "2" &&
finish 0
if [ -f "$f" ]; then
    for l in "compute_environment: LOCAL_MACHINE" "distributed_type: MULTI_GPU" "num_machines: 2" \
        "machine_rank: 1" "main_process_ip: '10.1.2.3'" "main_process_port: 29500" "same_network: false" \
        "rdzv_backend: c10d" "debug: true" "num_processes: 4" "gpu_ids: 0,1" "enable_cpu_affinity: false" \
        "mixed_precision: bf16" "use_cpu: false"; do
        has "$f" "$l"
    done
    lacks "$f" "dynamo_config"
    loads "$f" distributed_type MULTI_GPU
    loads "$f" machine_rank 1
    loads "$f" mixed_precision bf16
    loads "$f" gpu_ids 0,1
else
    fail "nothing written at $f"
fi

# 2. FSDP, written as JSON.
f="$tmp/fsdp.json"
start fsdp --config_file "$f"
see "In which compute environment are you running?" &&
ask "Enter a number from 0 to 1 [0]:" "0" &&
ask "Enter a number from 0 to 10 [0]:" "4" &&
ask "How many different machines will you use" "" &&
ask "Should distributed operations be checked while running for errors?" "" &&
ask "Do you wish to optimize your script with torch dynamo?" "yes" &&
see "Which dynamo backend would you like to use?" &&
ask "Enter a number from 0 to 12 [2]:" "" &&
ask "Do you want to customize the defaults sent to torch.compile?" "no" &&
ask "Do you want to use DeepSpeed? [yes/NO]:" "no" &&
ask "Do you want to use FullyShardedDataParallel? [yes/NO]:" "yes" &&
see "What should be your FSDP version? [2]:" &&
ask "Enter a number from 0 to 1 [1]:" "0" &&
see "What should be your sharding strategy?" &&
ask "Enter a number from 0 to 4 [0]:" "1" &&
ask "Do you want to offload parameters and gradients to CPU?" "" &&
see "What should be your auto wrap policy?" &&
ask "Enter a number from 0 to 2 [0]:" "1" &&
ask "minimum number of parameters for Default Auto Wrapping Policy? [1e8]:" "2000" &&
see "What should be your FSDP's backward prefetch policy?" &&
ask "Enter a number from 0 to 2 [0]:" "" &&
see "What should be your FSDP's state dict type?" &&
ask "Enter a number from 0 to 2 [0]:" "2" &&
ask "Do you want to enable FSDP's forward prefetch policy?" "" &&
ask "Do you want to enable FSDP's \`use_orig_params\` feature?" "" &&
ask "Do you want to enable CPU RAM efficient model loading?" "no" &&
ask "Do you want each individually wrapped FSDP unit to broadcast module parameters" "no" &&
ask "Do you want to enable FSDP activation checkpointing?" "yes" &&
ask "How many GPU(s) should be used for distributed training? [1]:" "2" &&
see "Do you wish to use mixed precision?" &&
ask "Enter a number from 0 to 3 [0]:" "1" &&
finish 0
if [ -f "$f" ]; then
    for l in '  "distributed_type": "FSDP",' '  "num_processes": 2,' '  "mixed_precision": "fp16",' \
        '    "dynamo_backend": "INDUCTOR"' '    "fsdp_version": 1' \
        '    "fsdp_reshard_after_forward": "SHARD_GRAD_OP",' '    "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",' \
        '    "fsdp_min_num_params": 2000,' '    "fsdp_backward_prefetch": "BACKWARD_PRE",' \
        '    "fsdp_state_dict_type": "SHARDED_STATE_DICT",' '    "fsdp_cpu_ram_efficient_loading": false,' \
        '    "fsdp_sync_module_states": false,' '    "fsdp_activation_checkpointing": true,' \
        '    "fsdp_use_orig_params": true,' '    "fsdp_offload_params": false,'; do
        has "$f" "$l"
    done
    lacks "$f" "gpu_ids"
    loads "$f" distributed_type FSDP
    loads "$f" fsdp_config.fsdp_state_dict_type SHARDED_STATE_DICT
    loads "$f" fsdp_config.fsdp_activation_checkpointing true
else
    fail "nothing written at $f"
fi

# 2b. FSDP2: resharding after forward is a yes/no answer even though the key takes text.
f="$tmp/fsdp2.yaml"
start fsdp2 --config_file "$f"
see "In which compute environment are you running?" &&
ask "Enter a number from 0 to 1 [0]:" "" &&
ask "Enter a number from 0 to 10 [0]:" "4" &&
ask "How many different machines will you use" "" &&
ask "Should distributed operations be checked while running for errors?" "" &&
ask "Do you wish to optimize your script with torch dynamo?" "" &&
ask "Do you want to use DeepSpeed? [yes/NO]:" "" &&
ask "Do you want to use FullyShardedDataParallel? [yes/NO]:" "y" &&
see "What should be your FSDP version? [2]:" &&
ask "Enter a number from 0 to 1 [1]:" "" &&
ask "Do you want to enable resharding after forward? [YES/no]:" "maybe" &&
shows "Please enter yes or no." &&
ask "Do you want to enable resharding after forward? [YES/no]:" "no" &&
ask "Do you want to offload parameters and gradients to CPU?" "" &&
see "What should be your auto wrap policy?" &&
ask "Enter a number from 0 to 2 [0]:" "2" &&
see "What should be your FSDP's state dict type?" &&
ask "Enter a number from 0 to 1 [0]:" "" &&
ask "Do you want to enable CPU RAM efficient model loading?" "" &&
ask "Do you want to enable FSDP activation checkpointing?" "" &&
ask "How many GPU(s) should be used for distributed training? [1]:" "2" &&
see "Do you wish to use mixed precision?" &&
ask "Enter a number from 0 to 3 [0]:" "" &&
finish 0
if [ -f "$f" ]; then
    for l in "distributed_type: FSDP" "fsdp_config:" "  fsdp_version: 2" "  fsdp_reshard_after_forward: false" \
        "  fsdp_auto_wrap_policy: NO_WRAP" "  fsdp_state_dict_type: SHARDED_STATE_DICT" \
        "  fsdp_cpu_ram_efficient_loading: true" "  fsdp_activation_checkpointing: false"; do
        has "$f" "$l"
    done
    lacks "$f" "fsdp_backward_prefetch"
    lacks "$f" "fsdp_sync_module_states"
    loads "$f" fsdp_config.fsdp_reshard_after_forward false
else
    fail "nothing written at $f"
fi

# 3. DeepSpeed ZeRO-3 at the default location; a refused number of accumulation steps.
f="$XDG_CONFIG_HOME/caccel/default_config.yaml"
start deepspeed
see "In which compute environment are you running?" &&
ask "Enter a number from 0 to 1 [0]:" "" &&
ask "Enter a number from 0 to 10 [0]:" "" &&
ask "Do you want to run your training on CPU only" "" &&
ask "Do you wish to optimize your script with torch dynamo?" "" &&
ask "Do you want to use DeepSpeed? [yes/NO]:" "yes" &&
ask "Do you want to specify a json file to a DeepSpeed config?" "" &&
see "What should be your DeepSpeed's ZeRO optimization stage?" &&
ask "Enter a number from 0 to 3 [2]:" "3" &&
see "Where to offload optimizer states?" &&
ask "Enter a number from 0 to 2 [0]:" "1" &&
see "Where to offload parameters?" &&
ask "Enter a number from 0 to 2 [0]:" "" &&
ask "How many gradient accumulation steps you're passing in your script? [1]:" "0" &&
shows "invalid value '0' for key 'deepspeed_config.gradient_accumulation_steps'" &&
ask "How many gradient accumulation steps you're passing in your script? [1]:" "4" &&
ask "Do you want to use gradient clipping?" "yes" &&
ask "What is the gradient clipping value? [1.0]:" "0.5" &&
ask "Do you want to save 16-bit model weights when using ZeRO Stage-3?" "yes" &&
ask "Do you want to enable \`deepspeed.zero.Init\`" "" &&
ask "Do you want to enable Mixture-of-Experts training (MoE)?" "" &&
ask "How many GPU(s) should be used for distributed training? [1]:" "" &&
see "Do you wish to use mixed precision?" &&
ask "Enter a number from 0 to 3 [0]:" "" &&
finish 0
if [ -f "$f" ]; then
    for l in "distributed_type: DEEPSPEED" "deepspeed_config:" "  zero_stage: 3" \
        "  offload_optimizer_device: cpu" "  offload_param_device: none" "  gradient_accumulation_steps: 4" \
        "  gradient_clipping: 0.5" "  zero3_save_16bit_model: true" "  zero3_init_flag: false" \
        "mixed_precision: 'no'" "num_processes: 1"; do
        has "$f" "$l"
    done
    loads "$f" deepspeed_config.zero_stage 3
    loads "$f" deepspeed_config.gradient_clipping 0.5
else
    fail "nothing written at $f"
fi

# 4. Megatron-LM, with Transformer Engine's fp8 recipe.
f="$tmp/megatron.yaml"
start megatron --config_file "$f"
see "In which compute environment are you running?" &&
ask "Enter a number from 0 to 1 [0]:" "" &&
ask "Enter a number from 0 to 10 [0]:" "4" &&
ask "How many different machines will you use" "" &&
ask "Should distributed operations be checked while running for errors?" "" &&
ask "Do you wish to optimize your script with torch dynamo?" "" &&
ask "Do you want to use DeepSpeed? [yes/NO]:" "" &&
ask "Do you want to use FullyShardedDataParallel? [yes/NO]:" "" &&
ask "Do you want to use Megatron-LM ? [yes/NO]:" "yes" &&
ask "What is the Tensor Parallelism degree/size? [1]:" "2" &&
ask "Do you want to enable Sequence Parallelism? [YES/no]:" "" &&
ask "What is the Pipeline Parallelism degree/size? [1]:" "2" &&
ask "What is the number of micro-batches? [1]:" "4" &&
ask "Do you want to enable selective activation recomputation? [YES/no]:" "" &&
ask "Do you want to use distributed optimizer" "no" &&
ask "What is the gradient clipping value based on global L2 Norm (0 to disable)? [1.0]:" "" &&
ask "How many GPU(s) should be used for distributed training? [1]:" "4" &&
see "Do you wish to use mixed precision?" &&
ask "Enter a number from 0 to 3 [0]:" "3" &&
see "Which FP8 backend do you want to use?" &&
ask "Enter a number from 0 to 2 [0]:" "1" &&
ask "Do you want to use FP8 autocast during eval mode?" "" &&
ask "What margin should be used for gradient scaling? [0]:" "" &&
ask "What interval should be used for how often the scaling factor is recomputed? [1]:" "often" &&
shows "invalid value 'often' for key 'fp8_config.interval'" &&
ask "What interval should be used for how often the scaling factor is recomputed? [1]:" "2" &&
see "Which weight format should be used?" &&
ask "Enter a number from 0 to 2 [0]:" "1" &&
ask "What length of history should be used for the amax scaling factor computation? [1024]:" "" &&
see "Which algorithm should be used for the amax scaling factor computation?" &&
ask "Enter a number from 0 to 1 [0]:" "" &&
ask "GEMMS in higher precision? [yes/NO]:" "yes" &&
ask "Should \`fprop\` be executed in higher precision? [yes/NO]:" "yes" &&
ask "Should \`dgrad\` be executed in higher precision? [yes/NO]:" "" &&
ask "Should \`wgrad\` be executed in higher precision? [yes/NO]:" "" &&
finish 0
if [ -f "$f" ]; then
    for l in "distributed_type: MEGATRON_LM" "num_processes: 4" "mixed_precision: fp8" "megatron_lm_config:" \
        "  megatron_lm_tp_degree: 2" "  megatron_lm_sequence_parallelism: true" "  megatron_lm_pp_degree: 2" \
        "  megatron_lm_num_micro_batches: 4" "  megatron_lm_recompute_activations: true" \
        "  megatron_lm_use_distributed_optimizer: false" "  megatron_lm_gradient_clipping: 1.0" "fp8_config:" \
        "  backend: TE" "  use_autocast_during_eval: false" "  margin: 0" "  interval: 2" "  fp8_format: E4M3" \
        "  amax_history_length: 1024" "  amax_compute_algorithm: max" \
        "  override_linear_precision: (true, false, false)"; do
        has "$f" "$l"
    done
    lacks "$f" "gpu_ids"
    loads "$f" distributed_type MEGATRON_LM
    loads "$f" fp8_config.interval 2
else
    fail "nothing written at $f"
fi

# 5. A TPU pod with startup commands: the lists as Accelerate writes them.
f="$tmp/tpu.yaml"
start tpu --config_file "$f"
see "In which compute environment are you running?" &&
ask "Enter a number from 0 to 1 [0]:" "" &&
ask "Enter a number from 0 to 10 [0]:" "10" &&
ask "Do you wish to optimize your script with torch dynamo?" "" &&
ask "How many XLA(s) should be used for distributed training? [1]:" "8" &&
ask "What is the name of the function in your script that should be launched" "" &&
ask "Are you using a TPU cluster? [yes/NO]:" "yes" &&
ask "What is the name of your TPU cluster?" "pod-1" &&
ask "What is the zone of your TPU cluster?" "us-central1-a" &&
ask "should \`sudo\` be used? [yes/NO]:" "" &&
ask "Do you have code you wish to run on startup in each pod? [yes/NO]:" "yes" &&
ask "Is this code located in a bash script? [yes/NO]:" "" &&
ask "Please enter a single command to be ran" "pip install \"x<2\"" &&
ask "Do you wish to add another command? [yes/NO]:" "yes" &&
ask "Please enter a single command to be ran" "echo a, b" &&
ask "Do you wish to add another command? [yes/NO]:" "" &&
ask "what are the names of the Compute VM instances to be used, separated by a comma:" "vm-a,vm-b" &&
ask "What environment variables do you wish to set in each pod, separated by a comma:" "" &&
finish 0
if [ -f "$f" ]; then
    for l in "distributed_type: XLA" "num_processes: 8" "mixed_precision: 'no'" "main_training_function: main" \
        "tpu_use_cluster: true" "tpu_name: pod-1" "tpu_zone: us-central1-a" "tpu_use_sudo: false" \
        'commands: ["pip install \"x<2\"", "echo a, b"]' 'tpu_vm: ["vm-a", "vm-b"]'; do
        has "$f" "$l"
    done
    lacks "$f" "tpu_env"
    loads "$f" distributed_type XLA
    loads "$f" tpu_zone us-central1-a
else
    fail "nothing written at $f"
fi

# 6. An existing file is kept unless replacing it is confirmed.
f="$XDG_CONFIG_HOME/caccel/default_config.yaml"
cp "$f" "$tmp/before.yaml"
start keep
ask "A configuration already exists at $f. Replace it? [yes/NO]:" "" &&
finish 1
check "the existing file is unchanged" cmp -s "$f" "$tmp/before.yaml"
check "says it kept the file" quiet grep -F "kept the existing" "$tmp/keep.screen"

# 7. SageMaker is refused, nothing written.
start sagemaker --config_file "$tmp/sm.yaml"
see "In which compute environment are you running?" &&
ask "Enter a number from 0 to 1 [0]:" "1" &&
finish 1
check "SageMaker refused with a message" quiet grep -F "Amazon SageMaker is not supported" "$tmp/sagemaker.screen"
check "nothing written for SageMaker" absent "$tmp/sm.yaml"

# 7b. The input ends (Ctrl-D) before the last question: nothing written.
start eof --config_file "$tmp/eof.yaml"
see "In which compute environment are you running?" &&
ask "Enter a number from 0 to 1 [0]:" "" &&
see "Enter a number from 0 to 10 [0]:" &&
T send-keys -t cfg C-d &&
finish 1
check "says the questionnaire did not finish" quiet grep -F "did not finish; nothing was written" "$tmp/eof.screen"
check "nothing written when the input ends" absent "$tmp/eof.yaml"

# 8. Without a terminal: a refusal pointing to `caccel config default`.
if "$caccel" config --config_file "$tmp/notty.yaml" < /dev/null > "$tmp/notty.out" 2>&1; then
    fail "caccel config without a terminal succeeded"
else
    echo "ok: caccel config without a terminal fails"
fi
check "the refusal points to caccel config default" quiet grep -F "caccel config default" "$tmp/notty.out"
check "nothing written without a terminal" absent "$tmp/notty.yaml"

# 9. `caccel config update`: old keys migrated, missing keys filled, values kept.
f="$tmp/old.yaml"
cat > "$f" << 'EOF'
distributed_type: MULTI_CPU
fp16: true
dynamo_backend: INDUCTOR
num_processes: 3
gpu_ids: "0"
main_process_port: 29501
fsdp_config:
  fsdp_activation_checkpointing: true
EOF
if "$caccel" config update --config_file "$f" > "$tmp/update.out" 2>&1; then
    echo "ok: config update succeeded"
else
    fail "config update failed:"
    cat "$tmp/update.out"
fi
for l in "compute_environment: LOCAL_MACHINE" "distributed_type: MULTI_CPU" "mixed_precision: fp16" \
    "dynamo_config:" "num_processes: 3" "gpu_ids: '0'" "main_process_port: 29501" "fsdp_config:" \
    "  fsdp_activation_checkpointing: true" "use_cpu: false" "debug: false" "num_machines: 1" \
    "machine_rank: 0" "rdzv_backend: static"; do
    has "$f" "$l"
done
check "dynamo_backend moved into dynamo_config" quiet grep -E "^  dynamo_backend: (inductor|INDUCTOR)\$" "$f"
lacks "$f" "fp16:"
check "config update reports the migration of fp16" quiet grep -F "migrated fp16 to mixed_precision: fp16" "$tmp/update.out"
loads "$f" mixed_precision fp16
loads "$f" num_processes 3
cp "$f" "$tmp/updated.yaml"
"$caccel" config update --config_file "$f" > /dev/null 2>&1 || fail "a second config update failed"
check "a second update changes nothing" cmp -s "$f" "$tmp/updated.yaml"
printf 'distributed_type: NO\nmixed_precison: fp16\n' > "$tmp/typo.yaml"
cp "$tmp/typo.yaml" "$tmp/typo.before"
if "$caccel" config update --config_file "$tmp/typo.yaml" > "$tmp/update.out" 2>&1; then
    fail "config update accepted an unknown key"
else
    check "config update names the unknown key" quiet grep -F "mixed_precison" "$tmp/update.out"
fi
check "a refused file is left as it was" cmp -s "$tmp/typo.yaml" "$tmp/typo.before"
if "$caccel" config update --config_file "$tmp/missing.yaml" > "$tmp/update.out" 2>&1; then
    fail "config update of a missing file succeeded"
else
    check "the error names the missing file" quiet grep -F "$tmp/missing.yaml" "$tmp/update.out"
fi

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)"
    exit 1
fi
echo "all passed"
