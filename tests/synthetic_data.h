/* synthetic_data.h: the classification data the multi-process check programs (ddp_check, tp_check)
 * train on: n samples of `in` features in [-1, 1) and a label below `classes`, from a fixed xorshift
 * stream, so every rank and every run builds the same dataset without a file. */
#ifndef CACCEL_SYNTHETIC_DATA_H
#define CACCEL_SYNTHETIC_DATA_H

#include <caccel/caccel.h>

#include <stdlib.h>

static inline ca_dataset *synthetic_classes(int64_t n, int in, int classes) {
    float *x = malloc(sizeof(float) * (size_t)(n * in));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)n);
    uint64_t s = 77;
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < in; j++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            x[i * in + j] = (float)((s >> 40) * (2.0 / 16777216.0) - 1.0);
        }
        y[i] = (int64_t)(s % (uint64_t)classes);
    }
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {in}}, ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds;
    CA_CHECK(ca_dataset_from_memory(&xs, x, &ys, y, n, &ds));
    free(x);
    free(y);
    return ds;
}

#endif
