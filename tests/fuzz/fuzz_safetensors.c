/* Fuzz target: the safetensors reader (the model and optimizer files of a checkpoint). Every entry
 * it accepts is looked up by name and its bytes read, so a range the validation let through
 * outside the buffer shows up under ASan (the file is mapped, and a mapping's last page reads as
 * zeros past the end: an entry ending beyond the file's size aborts explicitly). The file is also
 * opened as a checkpoint's load opens it, with chunk sums (chunks of 64 bytes, sums of the input's
 * bytes, so that they match): the header's chunks verified before it is parsed, then each entry's
 * range verified as a rank's slice is. */
#include "tests/fuzz/fuzz_util.h"

#include "tensor/safetensors_impl.h"

static volatile uint8_t sink;   /* keeps the reads */

static uint32_t crc_of(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c >> 1 ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

static void read_entries(ca_st_file *f, bool verify) {
    uint8_t sum = 0;
    for (int i = 0; i < f->n; i++) {
        const ca_st_entry *e = ca_st_find(f, f->entries[i].name);
        if (!e) abort();   /* every entry of the header must be found by its name */
        if (f->data_start + e->end > f->size) abort();
        if (verify && ca_st_verify_range(f, f->data_start + e->begin, e->end - e->begin) != CA_OK) abort();
        for (uint64_t b = e->begin; b < e->end; b++) sum += f->buf[f->data_start + b];
    }
    sink = sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    fz_write("model.safetensors", data, size, path, sizeof path);
    ca_st_file f;
    if (ca_st_open(path, &f) == CA_OK) read_entries(&f, false);
    ca_st_close(&f);
    enum { CS = 64 };
    size_t n = (size + CS - 1) / CS;
    uint32_t *ch = malloc((n ? n : 1) * sizeof *ch);
    if (!ch) return 0;
    for (size_t c = 0; c < n; c++) ch[c] = crc_of(data + c * CS, c + 1 < n ? CS : size - c * CS);
    ca_st_sums sums = {.size = size, .crc32 = crc_of(data, size), .chunk_size = CS, .nchunks = n, .chunk_crc = ch};
    if (ca_st_open_checked(path, &sums, false, &f) == CA_OK) read_entries(&f, true);
    ca_st_close(&f);
    free(ch);
    return 0;
}
