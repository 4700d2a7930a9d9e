/* Fuzz target: the IDX reader. The first byte (of the input modulo its length) splits the rest into
 * the images file and the labels file, so both headers and their agreement are fuzzed. */
#include "tests/fuzz/fuzz_util.h"

#include <caccel/data.h>

static size_t spec_bytes(const ca_sample_spec *s) {
    size_t n = ca_dtype_size(s->dtype);
    for (int i = 0; i < s->ndim; i++) n *= (size_t)s->shape[i];
    return n ? n : 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t rest = size - 1, cut = rest ? (size_t)data[0] * 4 % (rest + 1) : 0;
    char images[128], labels[128];
    fz_write("images-idx3-ubyte", data + 1, cut, images, sizeof images);
    fz_write("labels-idx1-ubyte", data + 1 + cut, rest - cut, labels, sizeof labels);
    ca_dataset *d = NULL;
    if (ca_idx_dataset_open(images, labels, &d) != CA_OK) return 0;
    void *x = malloc(spec_bytes(ca_dataset_x_spec(d))), *y = malloc(spec_bytes(ca_dataset_y_spec(d)));
    int64_t n = ca_dataset_length(d);
    if (x && y && n > 0) {   /* the first and the last sample: the ends of the data the header claims */
        ca_dataset_get(d, 0, x, y);
        ca_dataset_get(d, n - 1, x, y);
    }
    free(x);
    free(y);
    ca_dataset_destroy(d);
    return 0;
}
