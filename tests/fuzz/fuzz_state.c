/* Fuzz target: the checkpoint state JSON (caccel_state.json) read by ca_load_state. Each input
 * becomes the state file of a checkpoint whose complete.json lists it with its true size and
 * CRC-32, so the reader gets past the integrity check to the JSON itself. */
#include "tests/fuzz/fuzz_util.h"

#include <caccel/accelerator.h>
#include <caccel/checkpoint.h>

#include <zlib.h>

static ca_accelerator *acc;

static void drop_acc(void) { ca_accelerator_destroy(acc); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!acc) {
        ca_options o = {0};
        fz_tmpdir();   /* quiet logs before the accelerator starts */
        if (ca_accelerator_create(&o, &acc) != CA_OK) abort();
        atexit(drop_acc);
    }
    char path[128], marker[256];
    static const char rng[] = "{\"seed\": 42, \"offset\": 0}";
    fz_write("caccel_state.json", data, size, path, sizeof path);
    fz_write("random_states_0.json", rng, sizeof rng - 1, path, sizeof path);
    uLong crc = crc32(crc32(0L, Z_NULL, 0), data, (uInt)size), rcrc = crc32(0L, (const Bytef *)rng, sizeof rng - 1);
    int n = snprintf(marker, sizeof marker, "{\"files\": {\"caccel_state.json\": {\"size\": %zu, \"crc32\": %lu}, "
                     "\"random_states_0.json\": {\"size\": %zu, \"crc32\": %lu}}}", size, crc, sizeof rng - 1, rcrc);
    fz_write("complete.json", marker, (size_t)n, path, sizeof path);
    ca_load_state(acc, fz_tmpdir());
    return 0;
}
