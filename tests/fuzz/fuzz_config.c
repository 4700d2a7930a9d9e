/* Fuzz target: the Accelerate config file loader (YAML, or JSON by content). */
#include "tests/fuzz/fuzz_util.h"

#include <caccel/config.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    fz_write("default_config.yaml", data, size, path, sizeof path);
    ca_config *c = NULL;
    if (ca_config_create(&c) != CA_OK) abort();
    ca_config_load_file(c, path);
    ca_config_destroy(c);
    return 0;
}
