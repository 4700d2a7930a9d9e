#!/bin/sh
# The bash completion (tools/completion/caccel) completes subcommands, flags and flag values, and
# lists every flag the configuration and `caccel launch` accept; the manual pages (docs/man) render
# without warnings under groff and man, and caccel(1) names every subcommand and launch flag.
# Parts whose tool is missing (bash, groff, man) are skipped with the reason.
set -u
src=${CACCEL_TEST_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
build=${CACCEL_TEST_BUILDDIR:-.}
comp="$src/tools/completion/caccel"
fail() { echo "FAIL: $*"; exit 1; }
ran=0

# complete WORDS...: the completions of the last word (COMP_CWORD = the last index), one per line
complete_words() {
    bash -c '. "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _caccel; printf "%s\n" "${COMPREPLY[@]}"' \
        sh "$comp" "$@"
}

if command -v bash > /dev/null; then
    [ "$(complete_words caccel la)" = launch ] || fail "'caccel la<TAB>' does not give launch"
    [ "$(complete_words caccel est)" = estimate-memory ] || fail "'caccel est<TAB>' does not give estimate-memory"
    [ "$(complete_words caccel launch --num_p)" = --num_processes ] ||
        fail "'caccel launch --num_p<TAB>' gives '$(complete_words caccel launch --num_p)'"
    [ "$(complete_words caccel test --mixed_precision b)" = bf16 ] || fail "--mixed_precision b<TAB> does not give bf16"
    [ "$(complete_words caccel launch --log_with ml)" = mlflow ] || fail "--log_with ml<TAB> does not give mlflow"
    [ "$(complete_words caccel config "")" = "$(printf 'default\nupdate\n--config_file\n--help')" ] || fail "'caccel config <TAB>'"
    # after the program, the words are the program's: no caccel flags
    [ -z "$(complete_words caccel launch --num_processes 2 ./train --num_p)" ] ||
        fail "flags completed after the program"
    echo "ok: completion of subcommands, flags and values"
    # every configuration flag (config/config_keys.c) and every flag of caccel launch is listed
    flags=$(awk '/^const ca_flag_def ca_config_flags/,/^};/' "$src/config/config_keys.c" | sed -n 's/^ *{"\([a-z0-9_]*\)".*/\1/p')
    flags="$flags $(grep -o 'ca_cli_match_flag(a, "[a-z_]*"' "$src/tools/cmd_launch.c" | sed 's/.*"\(.*\)"/\1/' | sort -u)"
    [ "$(echo $flags | wc -w)" -gt 50 ] || fail "could not read the flag tables"
    missing=
    for f in $flags; do
        [ "$f" = module ] && continue   # refused: caccel launches programs, not Python modules
        grep -q -- "--$f\b" "$comp" || missing="$missing --$f"
    done
    [ -z "$missing" ] || fail "flags missing from tools/completion/caccel:$missing"
    echo "ok: every configuration and launch flag is in the completion"
    ran=$((ran + 1))
else
    echo "skip: no bash, the completion is not checked"
fi

# the subcommands of `caccel --help` in the completion and in caccel(1)
if [ -x "$build/tools/caccel" ]; then
    cmds=$("$build/tools/caccel" --help | sed -n '/^commands:/,/^$/s/^  \([a-z-]*\) .*/\1/p')
    [ -n "$cmds" ] || fail "caccel --help lists no commands"
    for c in $cmds; do
        grep -q "\"[^\"]*\b$c\b" "$comp" || fail "subcommand $c is not completed"
        grep -q "^\.B $(echo "$c" | sed 's/-/\\\\-/g')\b" "$src/docs/man/caccel.1" || fail "caccel.1 does not describe $c"
    done
    for f in log_dir token_file max_restarts monitor_interval tee quiet backend timeout num_processes; do
        grep -q -- "\\\\-\\\\-$f\b" "$src/docs/man/caccel.1" || fail "caccel.1 does not describe --$f"
    done
    echo "ok: caccel(1) and the completion cover the subcommands:" $cmds
fi

for page in "$src/docs/man/caccel.1" "$src/docs/man/caccel.3"; do
    if command -v groff > /dev/null; then
        out=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
        [ -z "$out" ] || fail "groff warns on $(basename "$page"): $out"
        echo "ok: groff renders $(basename "$page") without warnings"
        ran=$((ran + 1))
    else
        echo "skip: no groff, $(basename "$page") is not rendered"
    fi
    if command -v man > /dev/null; then
        err=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 > /dev/null)
        [ -z "$err" ] || fail "man -l warns on $(basename "$page"): $err"
        [ "$(MANWIDTH=80 man -l "$page" 2> /dev/null | wc -l)" -gt 20 ] || fail "man -l renders $(basename "$page") empty"
        echo "ok: man -l renders $(basename "$page") without warnings"
        ran=$((ran + 1))
    fi
done
[ "$ran" -gt 0 ] || { echo "SKIP: neither bash nor groff nor man is installed"; exit 77; }
echo "ok"
