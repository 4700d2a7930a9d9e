#!/bin/sh
# Checks that no backend or collective name is compared outside the registry (docs/CONTRIBUTING.md,
# "Adding a backend"): a strcmp, strncmp or strcasecmp with the name of a built-in backend or of a
# known plugin's, in the library or the command, outside core/registry.c and the backends' own
# folders (backends/*, collectives/). The rest asks by a device's kind and a collective's slots.
# A line where such a word is a value the user types that names no backend is listed in `allowed`
# (file:word of the line). Prints one line per violation and "names: ok" or "names: N violation(s)";
# exits 1 on violations unless --report is given.
cd "$(dirname "$0")/.." || exit 2
report=0
[ "${1:-}" = --report ] && report=1
names='xla|cuda|cpu|nccl|mpi|gloo|single'
allowed='accelerator/zero_config.c:offload'   # offload_*_device: cpu is host memory, not a backend
rooms='base config core comm tensor nn data accelerator tools'
files() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        for r in $rooms; do git ls-files "$r/*"; done
    else
        # shellcheck disable=SC2086
        find $rooms -type f
    fi
}
files | grep -E '\.(c|h|cc|cu|cuh)$' | grep -v -x 'core/registry.c' |
    xargs grep -n -E "str(n)?(case)?cmp[[:space:]]*\([^;]*\"($names)\"" /dev/null |
    awk -v allowed="$allowed" -v report="$report" '
    BEGIN { n = split(allowed, a, " "); for (i = 1; i <= n; i++) { split(a[i], p, ":"); ok[p[1]] = p[2] } }
    {
        file = $0; sub(/:.*/, "", file)
        if ((file in ok) && index($0, ok[file])) next
        printf "%s: compares a backend name (ask the registry, or the device kind and the collective slots)\n", $0
        nbad++
    }
    END {
        if (nbad) { printf "names: %d violation(s)\n", nbad; exit report ? 0 : 1 }
        print "names: ok"
    }'
