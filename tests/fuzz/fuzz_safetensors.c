/* Fuzz target: the safetensors reader (the model and optimizer files of a checkpoint). Every entry
 * it accepts is looked up by name and its bytes read, so a range the validation let through
 * outside the buffer shows up under ASan. */
#include "tests/fuzz/fuzz_util.h"

#include "tensor/safetensors_impl.h"

static volatile uint8_t sink;   /* keeps the reads */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    fz_write("model.safetensors", data, size, path, sizeof path);
    ca_st_file f;
    if (ca_st_open(path, &f) == CA_OK) {
        uint8_t sum = 0;
        for (int i = 0; i < f.n; i++) {
            const ca_st_entry *e = ca_st_find(&f, f.entries[i].name);
            if (!e) abort();   /* every entry of the header must be found by its name */
            for (uint64_t b = e->begin; b < e->end; b++) sum += f.buf[f.data_start + b];
        }
        sink = sum;
    }
    ca_st_close(&f);
    return 0;
}
