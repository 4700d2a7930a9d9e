#!/bin/sh
# Checks the public headers (include/caccel/*.h), which are installed alone: each includes only
# standard C headers and other public <caccel/...> headers (never a private *_impl.h or a folder of
# the source tree, which an installed header cannot reach), and each compiles on its own with
# -Werror, as C11 and, where a C++ compiler runs, as C++ (the headers promise extern "C").
# usage: tools/check-headers.sh BUILDDIR [--report]   (BUILDDIR holds the generated caccel/version.h)
# CC and CXX name the compilers (default cc, c++; CXX=none skips C++).
# Prints one line per violation and "headers: ok" or "headers: N violation(s)".
b=${1:?usage: tools/check-headers.sh BUILDDIR [--report]}
report=0
[ "${2:-}" = --report ] && report=1
src=$(cd "$(dirname "$0")/.." && pwd)
b=$(cd "$b" && pwd) || exit 2
cc=${CC:-cc}
cxx=${CXX:-c++}
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
nbad=0
bad() { printf '%s\n' "$1"; nbad=$((nbad + 1)); }

std=' assert.h complex.h ctype.h errno.h fenv.h float.h inttypes.h iso646.h limits.h locale.h math.h
      setjmp.h signal.h stdalign.h stdarg.h stdbool.h stddef.h stdint.h stdio.h stdlib.h stdnoreturn.h
      string.h tgmath.h time.h uchar.h wchar.h wctype.h'
std=" $(printf '%s' "$std" | tr -s ' \n' '  ') "
public=$(cd "$src/include/caccel" && find . -maxdepth 1 \( -name '*.h' -o -name '*.h.in' \) | sed 's#^\./##; s/\.in$//' | sort -u)
headers=$(cd "$src/include/caccel" && find . -maxdepth 1 -name '*.h' | sed 's#^\./##' | sort)
[ -n "$headers" ] || { echo "headers: none under $src/include/caccel"; exit 2; }

# 1. What each header includes.
for h in $headers; do
    grep -n -E '^[[:space:]]*#[[:space:]]*include' "$src/include/caccel/$h" | while IFS= read -r l; do
        num=${l%%:*}; inc=${l#*:}
        name=$(printf '%s\n' "$inc" | sed -n 's/.*[<"]\([^>"]*\)[>"].*/\1/p')
        case $inc in
        *'"'*) echo "include/caccel/$h:$num: includes \"$name\" (a public header includes <...> headers only)" ;;
        *"<caccel/"*)
            base=${name#caccel/}
            case " $(echo "$public" | tr '\n' ' ') " in
            *" $base "*) ;;
            *) echo "include/caccel/$h:$num: includes <$name>, which is not a public header" ;;
            esac ;;
        *)
            case "$std" in
            *" $name "*) ;;
            *) echo "include/caccel/$h:$num: includes <$name> (standard C headers and <caccel/...> only)" ;;
            esac ;;
        esac
    done
done >"$tmp/inc"
while IFS= read -r l; do bad "$l"; done <"$tmp/inc"

# 2. Each header alone, as the first line of a file.
cxx_ok=0
if [ "$cxx" != none ] && echo 'int main() { return 0; }' >"$tmp/t.cc" &&
   $cxx -fsyntax-only "$tmp/t.cc" 2>/dev/null; then cxx_ok=1; fi
for h in $headers; do
    printf '#include <caccel/%s>\n' "$h" >"$tmp/alone.c"
    # shellcheck disable=SC2086
    $cc -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$src/include" -I"$b/include" \
        "$tmp/alone.c" >"$tmp/out" 2>&1 || { bad "include/caccel/$h: does not compile alone as C11:"; sed 's/^/    /' "$tmp/out"; }
    [ "$cxx_ok" -eq 1 ] || continue
    cp "$tmp/alone.c" "$tmp/alone.cc"
    # shellcheck disable=SC2086
    $cxx -std=c++17 -Wall -Wextra -Werror -fsyntax-only -I"$src/include" -I"$b/include" \
        "$tmp/alone.cc" >"$tmp/out" 2>&1 || { bad "include/caccel/$h: does not compile alone as C++:"; sed 's/^/    /' "$tmp/out"; }
done
[ "$cxx_ok" -eq 1 ] || echo "headers: no C++ compiler ($cxx), C++ not checked"

if [ "$nbad" -gt 0 ]; then
    echo "headers: $nbad violation(s)"
    [ "$report" -eq 1 ]; exit
fi
echo "headers: ok"
