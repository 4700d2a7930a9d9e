#!/bin/sh
# The built objects and libraries (tools/check-symbols.sh): the ca_ symbols each room uses come from
# its room or from below; every global symbol of the library and of the plugins is ca_ (or a
# backend's hidden prefix); libcaccel.so exports ca_ symbols only, a plugin ca_plugin_init only.
src=${CACCEL_TEST_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
build=${CACCEL_TEST_BUILDDIR:-.}
command -v nm >/dev/null || { echo "SKIP: no nm"; exit 77; }
exec "$src/tools/check-symbols.sh" "$build"
