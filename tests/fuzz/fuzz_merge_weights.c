/* Fuzz target: the index of a sharded checkpoint (zero_index.json) read by ca_merge_weights
 * (`caccel merge-weights`). Each input becomes the index of a checkpoint with two parameter shards
 * of 42 floats, as a 2-process run of an 83-parameter model saves them, and a complete.json that
 * lists all three files with their true sizes and CRC-32s, so the merge gets past the integrity
 * check to the index itself. A merge that succeeds must have written a file the safetensors reader
 * accepts. */
#include "tests/fuzz/fuzz_util.h"

#include "tensor/safetensors_impl.h"

#include <caccel/checkpoint.h>

#include <zlib.h>

enum { SHARD = 42, WORLD = 2 };

typedef struct fz_file {
    const char *name;
    size_t size;
    unsigned long crc;
} fz_file;

static fz_file shards[WORLD];

static unsigned long file_crc(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    static unsigned char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (!f || n == sizeof buf) abort();
    fclose(f);
    *size = n;
    return crc32(crc32(0L, Z_NULL, 0), buf, (uInt)n);
}

/* The shards, once: "params" f32 [42] holding 0, 1, 2, ... across both. */
static void write_shards(void) {
    static const char *const names[WORLD] = {"zero_shard_0.safetensors", "zero_shard_1.safetensors"};
    for (int r = 0; r < WORLD; r++) {
        float v[SHARD];
        int64_t n = SHARD;
        char path[128];
        for (int i = 0; i < SHARD; i++) v[i] = (float)(r * SHARD + i);
        snprintf(path, sizeof path, "%s/%s", fz_tmpdir(), names[r]);
        ca_st_tensor t = {.name = "params", .dtype = CA_F32, .ndim = 1, .shape = &n, .data = v};
        if (ca_st_write(path, &t, 1) != CA_OK) abort();
        size_t len = 0;
        unsigned long crc = file_crc(path, &len);
        shards[r] = (fz_file){names[r], len, crc};
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128], out[128], marker[512];
    if (!shards[0].name) write_shards();
    fz_write("zero_index.json", data, size, path, sizeof path);
    unsigned long crc = crc32(crc32(0L, Z_NULL, 0), data, (uInt)size);
    int n = snprintf(marker, sizeof marker, "{\"files\": {\"zero_index.json\": {\"size\": %zu, \"crc32\": %lu}", size, crc);
    for (int r = 0; r < WORLD; r++)
        n += snprintf(marker + n, sizeof marker - (size_t)n, ", \"%s\": {\"size\": %zu, \"crc32\": %lu}",
                      shards[r].name, shards[r].size, shards[r].crc);
    n += snprintf(marker + n, sizeof marker - (size_t)n, "}}");
    fz_write("complete.json", marker, (size_t)n, path, sizeof path);
    snprintf(out, sizeof out, "%s/merged", fz_tmpdir());
    if (ca_merge_weights(fz_tmpdir(), out) == CA_OK) {
        ca_st_file f;
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        if (ca_st_open(path, &f) != CA_OK) {
            fprintf(stderr, "merge_weights wrote a file the reader refuses: %s\n", ca_last_error());
            abort();
        }
        ca_st_close(&f);
    }
    return 0;
}
