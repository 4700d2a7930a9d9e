/* Shared-memory collectives for the ranks of one machine: a segment with per-rank slots and futex-backed barriers. */
#include "collectives/shm_impl.h"
#include "base/peer_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x6361636373686d31ULL   /* "caccshm1" */
#define LINE 64
#define SPINS 4000
#define LIVENESS_MS 200           /* a sleeping barrier looks for dead peers this often */
#define SLOT_MB_MAX 1024

/* Each rank's line: its arrival counter, then who it is (for the liveness check). */
enum { L_ARRIVE = 0, L_PID, L_START, L_HOST, L_WORDS = LINE / 8 };

typedef struct shm_header {
    uint64_t magic;
    uint32_t world;
    uint32_t pad;
    uint64_t slot_bytes;
    _Atomic uint32_t aborted;
    _Atomic uint32_t bell;        /* futex word: bumped on every arrival */
    _Atomic uint32_t sleepers;
} shm_header;

struct ca_shm {
    int rank, world;
    size_t slot_bytes;
    size_t map_bytes;
    uint8_t *base;
    shm_header *hdr;
    _Atomic uint64_t *arrive;     /* world counters, one cache line each */
    uint8_t *slots;               /* world * slot_bytes */
    uint8_t *result;              /* slot_bytes */
    uint64_t gen;                 /* barriers passed by this rank */
    uint64_t host;                /* ca_proc_host_key() */
};

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static size_t header_bytes(int world) { return round_up(LINE + (size_t)world * LINE, 4096); }

static void layout(ca_shm *s) {
    s->hdr = (shm_header *)s->base;
    s->arrive = (_Atomic uint64_t *)(s->base + LINE);
    s->slots = s->base + header_bytes(s->world);
    s->result = s->slots + (size_t)s->world * s->slot_bytes;
}

static _Atomic uint64_t *line_of(ca_shm *s, int r) { return &s->arrive[r * L_WORDS]; }

/* Writes who this rank is into its line (before the others are told the segment is usable). */
static void sign_in(ca_shm *s) {
    _Atomic uint64_t *l = line_of(s, s->rank);
    atomic_store(&l[L_PID], (uint64_t)getpid());
    atomic_store(&l[L_START], (uint64_t)ca_proc_self_start());
    atomic_store(&l[L_HOST], s->host);
}

static ca_status store_set_str(ca_store_ref st, const char *key, const char *v) {
    return st.ops->set(st.store, key, v, strlen(v) + 1);
}

static ca_status store_get_str(ca_store_ref st, const char *key, char *v, size_t cap, int64_t timeout_ms) {
    size_t len = cap;
    ca_status s = st.ops->get(st.store, key, v, &len, timeout_ms);
    if (s == CA_OK) v[len < cap ? len : cap - 1] = '\0';
    return s;
}

/* Rank 0: a fresh segment; its name, or "" when it could not be made. */
static ca_status create_segment(ca_shm *s, char *name, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(name, cap, "/caccel-%d-%lx%lx", (int)getpid(), (unsigned long)ts.tv_sec, (unsigned long)ts.tv_nsec);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return ca_error(CA_ERR_UNSUPPORTED, "shm_open(%s): %s", name, strerror(errno));
    /* posix_fallocate, not ftruncate: a /dev/shm too small must fail here, not with SIGBUS later */
    int rc = posix_fallocate(fd, 0, (off_t)s->map_bytes);
    if (rc == 0) {
        s->base = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (s->base == MAP_FAILED) { s->base = NULL; rc = errno; }
    }
    close(fd);
    if (rc != 0) {
        shm_unlink(name);
        return ca_error(CA_ERR_UNSUPPORTED, "a %zu-byte shared-memory segment could not be made: %s",
                        s->map_bytes, strerror(rc));
    }
    layout(s);
    s->hdr->world = (uint32_t)s->world;
    s->hdr->slot_bytes = s->slot_bytes;
    atomic_store(&s->hdr->aborted, 0);
    atomic_thread_fence(memory_order_seq_cst);
    s->hdr->magic = SHM_MAGIC;
    return CA_OK;
}

static ca_status open_segment(ca_shm *s, const char *name) {
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return ca_error(CA_ERR_UNSUPPORTED, "shm_open(%s): %s", name, strerror(errno));
    s->base = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        return ca_error(CA_ERR_UNSUPPORTED, "mmap of %s: %s", name, strerror(errno));
    }
    layout(s);
    if (s->hdr->magic != SHM_MAGIC || s->hdr->world != (uint32_t)s->world || s->hdr->slot_bytes != s->slot_bytes)
        return ca_error(CA_ERR_UNSUPPORTED, "shared-memory segment %s does not match this job", name);
    return CA_OK;
}

/* CACCEL_SHM_SLOT_MB, checked like every other variable: a whole number of MiB in 1..SLOT_MB_MAX. */
ca_status ca_shm_slot_from_env(size_t *bytes) {
    const char *v = getenv("CACCEL_SHM_SLOT_MB");
    *bytes = (size_t)4 << 20;
    if (!v || !*v) return CA_OK;
    char *end;
    errno = 0;
    long long mb = strtoll(v, &end, 10);
    if (errno || end == v || *end || mb < 1 || mb > SLOT_MB_MAX) {
        ca_error(CA_ERR_CONFIG, "environment variable CACCEL_SHM_SLOT_MB='%s' is not a whole number of MiB between 1 "
                 "and %d", v, SLOT_MB_MAX);
        ca_error_hint("CACCEL_SHM_SLOT_MB sets the shared-memory slot of each rank (default 4); unset it or give "
                      "e.g. CACCEL_SHM_SLOT_MB=16");
        return CA_ERR_CONFIG;
    }
    *bytes = (size_t)mb << 20;
    return CA_OK;
}

ca_status ca_shm_create(ca_store_ref store, const char *prefix, int rank, int world, size_t slot_bytes,
                        int64_t timeout_ms, ca_shm **out) {
    *out = NULL;
    if (!store.ops || world < 2) return ca_error(CA_ERR_UNSUPPORTED, "shared memory needs a store and 2+ ranks");
    if (!slot_bytes) {
        ca_status vs = ca_shm_slot_from_env(&slot_bytes);
        if (vs != CA_OK) return vs;
    }
    ca_shm *s = calloc(1, sizeof *s);
    if (!s) return ca_error(CA_ERR_NOMEM, "out of host memory");
    s->rank = rank;
    s->world = world;
    s->host = ca_proc_host_key();
    s->slot_bytes = round_up(slot_bytes, LINE);
    s->map_bytes = header_bytes(world) + (size_t)(world + 1) * s->slot_bytes;
    char key[512], name[128] = "", mine[256] = "";
    ca_status st = CA_OK;
    snprintf(key, sizeof key, "%s/shm/name", prefix);
    if (rank == 0) {
        if (create_segment(s, name, sizeof name) != CA_OK) {
            snprintf(mine, sizeof mine, "%s", ca_last_error());
            name[0] = '\0';
        }
        st = store_set_str(store, key, name);
    } else {
        st = store_get_str(store, key, name, sizeof name, timeout_ms);
        if (st == CA_OK && name[0] && open_segment(s, name) != CA_OK) snprintf(mine, sizeof mine, "%s", ca_last_error());
        if (st == CA_OK && !name[0]) snprintf(mine, sizeof mine, "rank 0 could not make the segment");
    }
    if (!mine[0] && name[0] && s->base) sign_in(s);
    /* every rank says whether it mapped the segment; all use it, or none does */
    char okkey[512], v[260];
    snprintf(okkey, sizeof okkey, "%s/shm/ok/%d", prefix, rank);
    if (st == CA_OK) st = store_set_str(store, okkey, mine[0] ? mine : "ok");
    bool all = true;
    for (int r = 0; st == CA_OK && r < world; r++) {
        snprintf(okkey, sizeof okkey, "%s/shm/ok/%d", prefix, r);
        st = store_get_str(store, okkey, v, sizeof v, timeout_ms);
        if (st == CA_OK && strcmp(v, "ok") != 0) {
            if (all) snprintf(mine, sizeof mine, "rank %d: %s", r, v);
            all = false;
        }
    }
    if (rank == 0 && name[0]) shm_unlink(name);    /* everyone has mapped it (or given up) */
    if (st != CA_OK || !all) {
        ca_shm_destroy(s);
        return st != CA_OK ? st : ca_error(CA_ERR_UNSUPPORTED, "no shared-memory transport: %s", mine);
    }
    *out = s;
    return CA_OK;
}

void ca_shm_destroy(ca_shm *s) {
    if (!s) return;
    if (s->base) munmap(s->base, s->map_bytes);
    free(s);
}

static void wake_all(ca_shm *s) {
    atomic_fetch_add(&s->hdr->bell, 1);
    if (atomic_load(&s->hdr->sleepers))
        syscall(SYS_futex, (uint32_t *)&s->hdr->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void ca_shm_abort(ca_shm *s) {
    if (!s || !s->hdr) return;
    atomic_store(&s->hdr->aborted, 1);
    wake_all(s);
}

static bool all_arrived(ca_shm *s, uint64_t gen) {
    for (int r = 0; r < s->world; r++)
        if (atomic_load_explicit(&line_of(s, r)[L_ARRIVE], memory_order_acquire) < gen) return false;
    return true;
}

/* A peer that has not arrived and whose process has ended: the barrier can never complete. */
static ca_status dead_peer(ca_shm *s, uint64_t gen) {
    for (int r = 0; r < s->world; r++) {
        _Atomic uint64_t *l = line_of(s, r);
        if (r == s->rank || atomic_load(&l[L_ARRIVE]) >= gen) continue;
        uint64_t pid = atomic_load(&l[L_PID]), host = atomic_load(&l[L_HOST]);
        if (!pid || !s->host || host != s->host) continue;
        if (ca_proc_ended((long)pid, (unsigned long long)atomic_load(&l[L_START])))
            return ca_error(CA_ERR_PEER, "shared-memory barrier #%llu on rank %d: rank %d (pid %llu) has ended "
                            "(exited, killed or crashed) without arriving", (unsigned long long)gen, s->rank, r,
                            (unsigned long long)pid);
    }
    return CA_OK;
}

static ca_status late_error(ca_shm *s, uint64_t gen) {
    char late[256] = "";
    size_t used = 0;
    for (int r = 0; r < s->world && used < sizeof late - 12; r++)
        if (atomic_load(&line_of(s, r)[L_ARRIVE]) < gen)
            used += (size_t)snprintf(late + used, sizeof late - used, "%s%d", used ? ", " : "", r);
    return ca_error(CA_ERR_TIMEOUT, "shared-memory barrier #%llu timed out on rank %d; ranks not arrived: %s",
                    (unsigned long long)gen, s->rank, late);
}

/* Spin briefly (the peers are usually about to arrive), then sleep on the bell. */
ca_status ca_shm_barrier(ca_shm *s, int64_t deadline_ms) {
    uint64_t gen = ++s->gen;
    atomic_store_explicit(&line_of(s, s->rank)[L_ARRIVE], gen, memory_order_release);
    wake_all(s);
    for (int i = 0; i < SPINS; i++) {
        if (all_arrived(s, gen)) return CA_OK;
        if (atomic_load(&s->hdr->aborted)) break;
        if ((i & 63) == 63) sched_yield();
    }
    int64_t next_check = ca_now_ms() + LIVENESS_MS;
    for (;;) {
        if (atomic_load(&s->hdr->aborted))
            return ca_error(CA_ERR_STATE, "shared-memory collective aborted");
        uint32_t bell = atomic_load(&s->hdr->bell);
        if (all_arrived(s, gen)) return CA_OK;
        int64_t now = ca_now_ms(), left = deadline_ms - now;
        if (left <= 0) return late_error(s, gen);
        if (now >= next_check) {
            if (dead_peer(s, gen) != CA_OK) return CA_ERR_PEER;
            next_check = now + LIVENESS_MS;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (left < 50 ? left : 50) * 1000000L};
        atomic_fetch_add(&s->hdr->sleepers, 1);
        if (!all_arrived(s, gen))
            syscall(SYS_futex, (uint32_t *)&s->hdr->bell, FUTEX_WAIT, bell, &ts, NULL, 0);
        atomic_fetch_sub(&s->hdr->sleepers, 1);
    }
}

static uint8_t *slot(ca_shm *s, int r) { return s->slots + (size_t)r * s->slot_bytes; }

/* Portion p of n items split over `world` near-equal parts. */
static void portion(size_t n, int world, int p, size_t *off, size_t *len) {
    size_t base = n / (size_t)world, extra = n % (size_t)world;
    *off = (size_t)p * base + ((size_t)p < extra ? (size_t)p : extra);
    *len = base + ((size_t)p < extra ? 1 : 0);
}

/* Chunk by chunk: every rank copies in, barrier, rank r reduces part r of the
 * chunk into the result area, barrier, every rank copies the result out. The
 * next chunk's barrier keeps the result area from being reused too early. */
ca_status ca_shm_all_reduce(ca_shm *s, void *buf, size_t count, size_t es, ca_shm_reduce_fn fn,
                            ca_shm_finish_fn finish, void *arg, int64_t deadline_ms) {
    size_t per = s->slot_bytes / es;
    uint8_t *b = buf;
    for (size_t c0 = 0; c0 < count; c0 += per) {
        size_t n = count - c0 < per ? count - c0 : per;
        memcpy(slot(s, s->rank), b + c0 * es, n * es);
        ca_status st = ca_shm_barrier(s, deadline_ms);
        if (st != CA_OK) return st;
        size_t off, len;
        portion(n, s->world, s->rank, &off, &len);
        if (len) {
            uint8_t *dst = s->result + off * es;
            fn(dst, slot(s, 0) + off * es, slot(s, 1) + off * es, len);
            for (int r = 2; r < s->world; r++) fn(dst, dst, slot(s, r) + off * es, len);
            if (finish) finish(dst, len, arg);
        }
        st = ca_shm_barrier(s, deadline_ms);
        if (st != CA_OK) return st;
        memcpy(b + c0 * es, s->result, n * es);
    }
    /* the result area is read until every rank is done with the last chunk */
    return ca_shm_barrier(s, deadline_ms);
}

ca_status ca_shm_broadcast(ca_shm *s, void *buf, size_t bytes, int root, int64_t deadline_ms) {
    uint8_t *b = buf;
    for (size_t c0 = 0; c0 < bytes; c0 += s->slot_bytes) {
        size_t n = bytes - c0 < s->slot_bytes ? bytes - c0 : s->slot_bytes;
        if (s->rank == root) memcpy(s->result, b + c0, n);
        ca_status st = ca_shm_barrier(s, deadline_ms);
        if (st != CA_OK) return st;
        if (s->rank != root) memcpy(b + c0, s->result, n);
        st = ca_shm_barrier(s, deadline_ms);
        if (st != CA_OK) return st;
    }
    return CA_OK;
}

ca_status ca_shm_all_gather(ca_shm *s, const void *in, void *out, size_t bytes, int64_t deadline_ms) {
    const uint8_t *src = in;
    uint8_t *dst = out;
    for (size_t c0 = 0; c0 < bytes; c0 += s->slot_bytes) {
        size_t n = bytes - c0 < s->slot_bytes ? bytes - c0 : s->slot_bytes;
        memcpy(slot(s, s->rank), src + c0, n);
        ca_status st = ca_shm_barrier(s, deadline_ms);
        if (st != CA_OK) return st;
        for (int r = 0; r < s->world; r++) memcpy(dst + (size_t)r * bytes + c0, slot(s, r), n);
        st = ca_shm_barrier(s, deadline_ms);
        if (st != CA_OK) return st;
    }
    return CA_OK;
}

ca_status ca_shm_reduce_scatter(ca_shm *s, const void *in, void *out, size_t count, size_t es,
                                ca_shm_reduce_fn fn, int64_t deadline_ms) {
    /* a chunk covers elements [j0, j0 + m) of every rank's part: slot r holds them part by part */
    size_t per = s->slot_bytes / ((size_t)s->world * es);
    if (per == 0) return ca_error(CA_ERR_INVALID, "shared-memory slot too small for %d ranks", s->world);
    const uint8_t *src = in;
    uint8_t *dst = out;
    for (size_t j0 = 0; j0 < count; j0 += per) {
        size_t m = count - j0 < per ? count - j0 : per;
        for (int p = 0; p < s->world; p++)
            memcpy(slot(s, s->rank) + (size_t)p * m * es, src + ((size_t)p * count + j0) * es, m * es);
        ca_status st = ca_shm_barrier(s, deadline_ms);
        if (st != CA_OK) return st;
        size_t mine = (size_t)s->rank * m * es;
        fn(dst + j0 * es, slot(s, 0) + mine, slot(s, 1) + mine, m);
        for (int r = 2; r < s->world; r++) fn(dst + j0 * es, dst + j0 * es, slot(s, r) + mine, m);
        st = ca_shm_barrier(s, deadline_ms);
        if (st != CA_OK) return st;
    }
    return CA_OK;
}
