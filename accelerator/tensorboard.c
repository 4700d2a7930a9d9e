/* TensorBoard event files (tensorboard_impl.h). */
#include "accelerator/tensorboard_impl.h"
#include "accelerator/tensorboard_event.pb-c.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses. */
static uint32_t tb_crc32c(const uint8_t *p, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    uint32_t c = 0xFFFFFFFFu;
    while (n--) c = table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static uint32_t tb_masked_crc(const uint8_t *p, size_t n) {
    uint32_t c = tb_crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

static void tb_le(uint8_t *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

/* One TFRecord holding the encoded event. */
static ca_status tb_write_event(FILE *f, const CaTb__Event *ev) {
    size_t n = ca_tb__event__get_packed_size(ev);
    uint8_t *buf = malloc(n ? n : 1), head[12], tail[4];
    if (!buf) return ca_error(CA_ERR_NOMEM, "tensorboard: out of host memory");
    ca_tb__event__pack(ev, buf);
    tb_le(head, n, 8);
    tb_le(head + 8, tb_masked_crc(head, 8), 4);
    tb_le(tail, tb_masked_crc(buf, n), 4);
    int ok = fwrite(head, 1, 12, f) == 12 && fwrite(buf, 1, n, f) == n && fwrite(tail, 1, 4, f) == 4 && fflush(f) == 0;
    free(buf);
    return ok ? CA_OK : ca_error(CA_ERR_IO, "tensorboard: writing an event failed: %s", strerror(errno));
}

ca_status ca_tb_open(const char *dir, FILE **out) {
    *out = NULL;
    char host[256] = "localhost", path[PATH_MAX];
    gethostname(host, sizeof host - 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (snprintf(path, sizeof path, "%s/events.out.tfevents.%lld.%s", dir, (long long)ts.tv_sec, host) >=
        (int)sizeof path)
        return ca_error(CA_ERR_INVALID, "tensorboard: path too long under %s", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return ca_error(CA_ERR_IO, "tensorboard: cannot create %s: %s", path, strerror(errno));
    CaTb__Event ev = CA_TB__EVENT__INIT;
    ev.wall_time = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    ev.what_case = CA_TB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    ca_status s = tb_write_event(f, &ev);
    if (s != CA_OK) return fclose(f), s;
    *out = f;
    return CA_OK;
}

ca_status ca_tb_scalars(FILE *f, const ca_metric *values, size_t n, int64_t step, double wall_time) {
    CaTb__SummaryValue *v = calloc(n ? n : 1, sizeof *v);
    CaTb__SummaryValue **pv = calloc(n ? n : 1, sizeof *pv);
    if (!v || !pv) return free(v), free(pv), ca_error(CA_ERR_NOMEM, "tensorboard: out of host memory");
    for (size_t i = 0; i < n; i++) {
        ca_tb__summary_value__init(&v[i]);
        v[i].tag = (char *)values[i].name;
        v[i].value_case = CA_TB__SUMMARY_VALUE__VALUE_SIMPLE_VALUE;
        v[i].simple_value = (float)values[i].value;
        pv[i] = &v[i];
    }
    CaTb__Summary sum = CA_TB__SUMMARY__INIT;
    sum.n_value = n;
    sum.value = pv;
    CaTb__Event ev = CA_TB__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.step = step < 0 ? 0 : step;
    ev.what_case = CA_TB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    ca_status s = tb_write_event(f, &ev);
    free(v), free(pv);
    return s;
}
