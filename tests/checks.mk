# tests/checks.mk: the code rules as tests (docs/CONTRIBUTING.md): the layers of the includes, the
# symbols of the build (layers, names, exports), the public headers alone, no backend name compared
# outside the registry.
TESTS += tests/test_layers.sh tests/test_symbols.sh tests/test_headers.sh tests/test_names.sh
EXTRA_DIST += tests/test_layers.sh tests/test_symbols.sh tests/test_headers.sh tests/test_names.sh
# double quotes: check-valgrind passes this whole list inside single quotes
AM_TESTS_ENVIRONMENT += CA_TEST_CC="$(CC)"; CA_TEST_CXX="$(CXX)"; export CA_TEST_CC CA_TEST_CXX;
