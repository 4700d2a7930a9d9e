#!/bin/sh
# The public headers (tools/check-headers.sh): each includes only standard C headers and other
# <caccel/...> headers, and compiles alone with -Werror as C11 and as C++ (with the build's compilers).
src=${CACCEL_TEST_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
build=${CACCEL_TEST_BUILDDIR:-.}
CC=${CA_TEST_CC:-cc} CXX=${CA_TEST_CXX:-c++} exec "$src/tools/check-headers.sh" "$build"
