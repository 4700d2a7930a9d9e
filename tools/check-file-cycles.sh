#!/bin/sh
# Checks that the files of one folder of the library do not call each other in a circle: file A
# calls a function defined in file B, which (directly or through others of the folder) calls one in
# A. Such a circle means no file of it can be read, changed or replaced alone. The calls are read
# from the object files with nm: the symbols each object defines against those it leaves undefined.
# Usage: tools/check-file-cycles.sh BUILDDIR [FOLDER] (FOLDER: accelerator by default)
# Prints each circle (its files, and for each call inside it one symbol that makes it) and
# "file cycles (FOLDER): ok" or "file cycles (FOLDER): N circle(s)"; exits 1 on a circle,
# 77 when the objects are not built. --report: the same, exit 0.
report=0
[ "${1:-}" = --report ] && { report=1; shift; }
build=${1:-_build}
folder=${2:-accelerator}
NM=${NM:-nm}
dir=$build/$folder
# libtool builds the library's objects in .libs (PIC); a static-only build leaves them beside the .lo
objs=$(ls "$dir"/.libs/*.o 2>/dev/null)
[ -n "$objs" ] || objs=$(ls "$dir"/*.o 2>/dev/null)
[ -n "$objs" ] || { echo "SKIP: no object files in $dir"; exit 77; }
src=$(cd "$(dirname "$0")/.." && pwd)
for o in $objs; do
    f=$(basename "$o" .o); f=${f#libcaccel_la-}
    [ -f "$src/$folder/$f.c" ] || [ -f "$folder/$f.c" ] || continue   # an object left from a removed file
    # D: a global symbol the object defines; U: one it uses from elsewhere
    "$NM" -g --defined-only "$o" | awk -v f="$f" 'NF >= 3 { print "D", f, $3 }'
    "$NM" -u "$o" | awk -v f="$f" '{ print "U", f, $NF }'
done | awk -v folder="$folder" -v report="$report" '
    $1 == "D" { def[$3] = $2; files[$2] = 1; next }
    { use[++nu] = $2; sym[nu] = $3; files[$2] = 1 }
    END {
        for (i = 1; i <= nu; i++) {
            a = use[i]; b = def[sym[i]]
            if (b == "" || a == b) continue
            if (!((a, b) in edge)) edge[a, b] = sym[i]
            reach[a, b] = 1
        }
        n = 0
        for (f in files) name[++n] = f
        for (k = 1; k <= n; k++) for (i = 1; i <= n; i++) if ((name[i], name[k]) in reach)
            for (j = 1; j <= n; j++) if ((name[k], name[j]) in reach) reach[name[i], name[j]] = 1
        circles = 0
        for (i = 1; i <= n; i++) {
            a = name[i]
            if ((a in seen) || !((a, a) in reach)) continue
            members = ""
            for (j = 1; j <= n; j++) {
                b = name[j]
                if (b == a || ((a, b) in reach && (b, a) in reach)) { seen[b] = 1; members = members " " b; in_c[b] = circles + 1 }
            }
            circles++
            printf "%s: circle %d of files:%s\n", folder, circles, members
            for (x = 1; x <= n; x++) for (y = 1; y <= n; y++)
                if (in_c[name[x]] == circles && in_c[name[y]] == circles && (name[x], name[y]) in edge)
                    printf "  %s.c -> %s.c (%s)\n", name[x], name[y], edge[name[x], name[y]]
        }
        if (circles) { printf "file cycles (%s): %d circle(s)\n", folder, circles; exit report ? 0 : 1 }
        printf "file cycles (%s): ok\n", folder
    }'
