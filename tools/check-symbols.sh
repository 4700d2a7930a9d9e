#!/bin/sh
# Checks a build's symbols (docs/ARCHITECTURE.md, docs/CONTRIBUTING.md):
#  1. layers: every ca_ symbol an object of a room uses is defined in that room or in a room below it;
#  2. names: every global symbol an object of the library or of a plugin defines starts with ca_ (a
#     backend's hidden internals may carry its room's prefix instead: prefix[] in tools/layers.sh;
#     C++ names, mangled into their namespaces, are left to 3);
#  3. exports: libcaccel.so exports ca_ symbols only, and a plugin ca_plugin_init only.
# usage: tools/check-symbols.sh BUILDDIR [--report]
# Prints one line per violation and "symbols: ok" or "symbols: N violation(s)".
b=${1:?usage: tools/check-symbols.sh BUILDDIR [--report]}
report=0
[ "${2:-}" = --report ] && report=1
. "$(cd "$(dirname "$0")" && pwd)/layers.sh"
src=$(cd "$(dirname "$0")/.." && pwd)   # before the cd: $0 may be relative
cd "$b" || exit 2
rooms="base config core comm tensor nn data accelerator backends collectives"
# shellcheck disable=SC2086
objs=$(find $rooms tools -name '*.o' \( -path '*/.libs/*' -o -path 'tools/*' \) ! -name 'tests_*' 2>/dev/null | sort)
[ -n "$objs" ] || { echo "symbols: no objects under $b (build first)"; exit 2; }
# Only objects whose source still exists (in the tree, or generated in the build): a build directory
# keeps the objects of files that moved or went, which would define symbols in their old rooms.
objs=$(for o in $objs; do
    f=$(printf '%s\n' "$o" | sed 's#/\.libs/#/#; s#/[^/-]*-\([^/]*\)\.o$#/\1#; s#\.o$##')
    for e in c cc cu; do
        if [ -e "$src/$f.$e" ] || [ -e "$f.$e" ]; then echo "$o"; break; fi
    done
done)
lib=.libs/libcaccel.so
[ -f "$lib" ] || { echo "symbols: no $lib under $b (a static build?): exports not checked"; lib=; }
# shellcheck disable=SC2086
libs=$(find $rooms -name 'caccel_*.so' -path '*/.libs/*' 2>/dev/null | sort)
# shellcheck disable=SC2086
out=$({
    nm -A $objs | sed 's/^/o /'
    nm -A -g --defined-only $objs | sed 's/^/g /'   # global only ("i" is an ifunc, local or not)
    [ -z "$lib" ] || nm -D --defined-only "$lib" | sed "s|^|d $lib: |"
    for l in $libs; do nm -D --defined-only "$l" | sed "s|^|d $l: |"; done
} | awk "$LAYERS_AWK"'
    {
        what = $1; obj = $2; sub(/:.*/, "", obj); sym = $NF; type = $(NF - 1)
        if (what == "d") {   # an exported symbol of the library or a plugin
            if (obj ~ /libcaccel\.so$/ ? sym !~ /^ca_/ : sym != "ca_plugin_init")
                bad(obj " exports " sym (obj ~ /libcaccel\.so$/ ? " (only ca_ symbols may be exported)" : " (a plugin exports ca_plugin_init only)"))
            next
        }
        if (what == "g") {   # a global an object defines
            r = room(obj)
            # _Z: C++ (the Gloo shim); DW.ref.: unwinding; __odr_asan., __asan_, __sancov...: added by
            # sanitizer instrumentation beside each global of an instrumented object
            if (obj ~ /\/\.libs\// && sym !~ /^ca_/ && sym !~ /^(_Z|DW\.ref\.|__odr_asan|__asan_|__ubsan_|__sancov|__sanitizer_)/ &&
                (!(r in prefix) || index(sym, prefix[r]) != 1))
                bad(obj " (" r ") defines the global " sym ": not ca_" ((r in prefix) ? " or " prefix[r] : "") " (make it static, or name it ca_...)")
            next
        }
        if (sym !~ /^ca_/) next
        if (type == "U") { uses[obj, sym] = 1; users[obj] = 1 }
        else if (type ~ /^[TDBRCV]$/) def[sym] = room(obj)
    }
    function bad(msg) { printf "%s\n", msg; nbad++ }
    END {
        for (k in uses) {
            split(k, p, SUBSEP); obj = p[1]; sym = p[2]
            if (!(sym in def)) continue
            from = room(obj); to = def[sym]
            if (to == from) continue
            if (!may_use(from, to)) bad(obj " (" from ") uses " sym ", defined in " to)
        }
        if (nbad) { printf "~symbols: %d violation(s)\n", nbad; exit 1 }
        print "~symbols: ok"
    }')
rc=$?
printf '%s\n' "$out" | sort | sed 's/^~//'
[ "$rc" -eq 0 ] || [ "$report" -eq 1 ]
