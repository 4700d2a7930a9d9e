#!/bin/sh
# Checks that every quoted #include of the library and the CLI respects the layers
# (docs/ARCHITECTURE.md): a file includes private headers of its own room or of a room below it.
# Prints one line per violation and "layers: ok" or "layers: N violation(s)"; exits 1 on violations
# unless --report is given.
cd "$(dirname "$0")/.." || exit 2
. tools/layers.sh
report=0
[ "${1:-}" = --report ] && report=1
rooms='base config core comm tensor nn data accelerator backends collectives tools'
# The tracked files of a clone; every file of an unpacked tarball, which has no git.
files() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        for r in $rooms; do git ls-files "$r/*"; done
    else
        # shellcheck disable=SC2086
        find $rooms -type f
    fi
}
files | grep -E '\.(c|h|cc|cu|cuh)$' | xargs grep -n -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]' /dev/null |
    awk -v report="$report" "$LAYERS_AWK"'
    BEGIN {   # what core may see of the rooms under it: the built-in faces only
        face["backends/cpu/cpu_plugin.h"] = face["backends/xla_stub/xla_plugin.h"] = face["collectives/single.h"] = 1
    }
    {
        file = $0; sub(/:.*/, "", file)
        line = $0; sub(/^[^:]*:/, "", line); num = line; sub(/:.*/, "", num); sub(/^[^:]*:/, "", line)
        from = room(file)
        if (line ~ /<caccel\/caccel\.h>/ && from != "tools") { bad(file, num, "includes <caccel/caccel.h> (library code includes the headers it uses)"); next }
        if (line !~ /"/) next
        inc = line; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
        to = room(inc)
        if (to == "" || to == from || !(to in below)) next
        ok = may_use(from, to)
        if (ok && from == "core" && (to == "backends/cpu" || to == "backends/xla_stub" || to == "collectives") && !(inc in face)) ok = 0
        if (!ok) bad(file, num, "(" from ") includes \"" inc "\" (" to "), which is not below it")
    }
    function bad(f, n, msg) { printf "%s:%s: %s\n", f, n, msg; nbad++ }
    END {
        if (nbad) { printf "layers: %d violation(s)\n", nbad; exit report ? 0 : 1 }
        print "layers: ok"
    }'
