#!/bin/sh
# The layers (docs/ARCHITECTURE.md): every quoted #include of the library, the plugins and the
# command respects the table of rooms in tools/layers.sh (tools/check-layers.sh).
src=${CACCEL_TEST_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
exec "$src/tools/check-layers.sh"
