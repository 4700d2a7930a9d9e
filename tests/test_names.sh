#!/bin/sh
# No backend or collective name is compared outside the registry and the backends' own folders
# (tools/check-names.sh): the core, the accelerator and the command choose by kind and by slot.
src=${CACCEL_TEST_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
exec "$src/tools/check-names.sh"
