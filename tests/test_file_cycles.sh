#!/bin/sh
# The files of accelerator/ call each other without a circle (tools/check-file-cycles.sh reads the
# built objects): the gradient-synchronisation strategies are reached through their table
# (accelerator/sync_impl.h), never called back by name, and process state, accumulation and the zero
# buffers sit below the files that use them.
b=${CACCEL_TEST_BUILDDIR:-.}
src=${CACCEL_TEST_SRCDIR:-$(dirname "$0")/..}
command -v "${NM:-nm}" >/dev/null 2>&1 || { echo "SKIP: nm is not installed"; exit 77; }
exec "$src/tools/check-file-cycles.sh" "$b" accelerator
