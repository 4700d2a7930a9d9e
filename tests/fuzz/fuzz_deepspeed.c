/* Fuzz target: DeepSpeed's JSON (deepspeed_config_file), read by the sharding configuration of an
 * accelerator whose distributed_type is DEEPSPEED. The accelerator is only the state that
 * configuration reads and writes: the configuration, the settings, the rank and the device. */
#include "tests/fuzz/fuzz_util.h"

#include "accelerator/accelerator_impl.h"

#include <caccel/device.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    fz_write("ds_config.json", data, size, path, sizeof path);
    ca_accelerator acc = {0};
    if (ca_config_create(&acc.cfg) != CA_OK) abort();
    if (ca_config_set(acc.cfg, "distributed_type", "DEEPSPEED", CA_SRC_FILE, "fuzz") != CA_OK ||
        ca_config_set(acc.cfg, "mixed_precision", "fp16", CA_SRC_FILE, "fuzz") != CA_OK ||
        ca_config_set(acc.cfg, "deepspeed_config.deepspeed_config_file", path, CA_SRC_FILE, "fuzz") != CA_OK ||
        ca_config_settings(acc.cfg, &acc.st) != CA_OK)
        abort();
    acc.device = ca_cpu_device();
    acc.world = 1;
    ca_zero_configure(&acc);
    ca_config_destroy(acc.cfg);
    return 0;
}
