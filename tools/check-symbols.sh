#!/bin/sh
# Checks the layers (docs/ARCHITECTURE.md) on a build: every ca_ symbol an object of a room uses is
# defined in that room or in a room below it. usage: tools/check-symbols.sh BUILDDIR [--report]
# Prints one line per violation and "symbols: ok" or "symbols: N violation(s)".
b=${1:?usage: tools/check-symbols.sh BUILDDIR [--report]}
report=0
[ "${2:-}" = --report ] && report=1
. "$(cd "$(dirname "$0")" && pwd)/layers.sh"
cd "$b" || exit 2
objs=$(find base config core comm tensor nn data accelerator backends collectives tools -name '*.o' \
           \( -path '*/.libs/*' -o -path 'tools/*' \) ! -name 'tests_*' 2>/dev/null | sort)
[ -n "$objs" ] || { echo "symbols: no objects under $b (build first)"; exit 2; }
# shellcheck disable=SC2086
out=$(nm -A $objs | awk "$LAYERS_AWK"'
    {
        obj = $1; sub(/:.*/, "", obj); sym = $NF; type = $(NF - 1)
        if (sym !~ /^ca_/) next
        if (type == "U") { uses[obj, sym] = 1; users[obj] = 1 }
        else if (type ~ /^[TDBRCV]$/) def[sym] = room(obj)
    }
    END {
        for (k in uses) {
            split(k, p, SUBSEP); obj = p[1]; sym = p[2]
            if (!(sym in def)) continue
            from = room(obj); to = def[sym]
            if (to == from) continue
            if (!may_use(from, to)) { printf "%s (%s) uses %s, defined in %s\n", obj, from, sym, to; nbad++ }
        }
        if (nbad) { printf "~symbols: %d violation(s)\n", nbad; exit 1 }
        print "~symbols: ok"
    }')
rc=$?
printf '%s\n' "$out" | sort | sed 's/^~//'
[ "$rc" -eq 0 ] || [ "$report" -eq 1 ]
