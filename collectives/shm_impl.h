/* shm_impl.h: collectives over a shared-memory segment for ranks on one machine (the Gloo plugin's intra-node path). */
#ifndef CACCEL_SHM_IMPL_H
#define CACCEL_SHM_IMPL_H

#include <caccel/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Why: TCP over loopback needs several thread wake-ups per message; with every
 * core busy training, an 0.9 MB gradient all-reduce took ~3 ms through Gloo's
 * sockets against ~0.3 ms through Open MPI's shared memory. Ranks on one
 * machine therefore exchange data through one segment: a slot per rank plus a
 * result area, and per-rank arrival counters that a barrier spins on briefly
 * and then sleeps on with a futex. The segment is unlinked as soon as every
 * rank has mapped it, so a crash leaves nothing behind in /dev/shm.
 */
typedef struct ca_shm ca_shm;
typedef void (*ca_shm_reduce_fn)(void *dst, const void *a, const void *b, size_t n);
/* Applied to each reduced part before the ranks copy it out (the average's division): every rank
 * finishes its own part, so the work is spread over the ranks instead of repeated by each. */
typedef void (*ca_shm_finish_fn)(void *buf, size_t n, void *arg);

/* Joins the segment of the `world` ranks (rank 0 creates it; the name goes
 * through the store under `prefix`). All ranks agree: if any rank cannot map
 * it, every rank gets CA_ERR_UNSUPPORTED (and uses another transport).
 * slot_bytes 0: CACCEL_SHM_SLOT_MB or 4 MiB. */
ca_status ca_shm_create(ca_store_ref store, const char *prefix, int rank, int world, size_t slot_bytes,
                        int64_t timeout_ms, ca_shm **out);
void ca_shm_destroy(ca_shm *s);
/* The slot size CACCEL_SHM_SLOT_MB asks for (4 MiB when unset); CA_ERR_CONFIG naming the variable and its
 * value when it is not a whole number of MiB in 1..1024. */
ca_status ca_shm_slot_from_env(size_t *bytes);
/* Wakes every rank waiting in the segment; their calls fail with CA_ERR_STATE. */
void ca_shm_abort(ca_shm *s);

/* The collectives; every rank calls them in the same order. deadline_ms is a
 * ca_now_ms() time; passing it fails with CA_ERR_TIMEOUT naming the late ranks. */
ca_status ca_shm_barrier(ca_shm *s, int64_t deadline_ms);
/* buf (count elements of es bytes) becomes the reduction over ranks, then finish(part, n, arg) of
 * it when finish is not NULL. */
ca_status ca_shm_all_reduce(ca_shm *s, void *buf, size_t count, size_t es, ca_shm_reduce_fn fn,
                            ca_shm_finish_fn finish, void *arg, int64_t deadline_ms);
ca_status ca_shm_broadcast(ca_shm *s, void *buf, size_t bytes, int root, int64_t deadline_ms);
/* out[r * bytes ..] = rank r's in (in may equal out + rank * bytes). */
ca_status ca_shm_all_gather(ca_shm *s, const void *in, void *out, size_t bytes, int64_t deadline_ms);
/* out (count elements) = reduction over ranks of in[rank * count ..] (in holds world * count). */
ca_status ca_shm_reduce_scatter(ca_shm *s, const void *in, void *out, size_t count, size_t es,
                                ca_shm_reduce_fn fn, int64_t deadline_ms);

#ifdef __cplusplus
}
#endif
#endif
