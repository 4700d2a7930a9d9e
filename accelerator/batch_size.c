/* batch_size.c: find_executable_batch_size, Accelerate's retry-on-out-of-memory loop. */
#include "accelerator/accelerator_impl.h"

#include <stdio.h>
#include <string.h>

/* What one try did on this rank: flags[0] ran out of memory, flags[1] failed otherwise. */
enum { TRY_OK = 0, TRY_OOM = 1, TRY_FAILED = 2 };

/* Sums the two flags over the ranks, so every rank takes the same decision: one rank out of
 * memory makes all retry at the same smaller size (else the ranks would train at different
 * batch sizes and their collectives would no longer pair). */
static ca_status agree(ca_accelerator *acc, int outcome, int64_t counts[2]) {
    counts[0] = outcome == TRY_OOM;
    counts[1] = outcome == TRY_FAILED;
    if (!acc || ca_num_processes(acc) <= 1) return CA_OK;
    int64_t two = 2;
    ca_scope *sc = ca_scope_begin();
    ca_tensor *t = ca_from_host(acc->device, CA_I64, 1, &two, counts);
    ca_status s = t ? ca_reduce(acc, t, CA_OP_SUM) : ca_last_status();
    if (s == CA_OK) s = ca_tensor_to_host(t, counts, 2 * sizeof *counts);
    ca_scope_end(sc);
    return s == CA_OK ? CA_OK : ca_error_context("find_executable_batch_size: agreeing over ranks on rank %d",
                                                 acc->rank);
}

/* Accelerate's release_memory: the allocator's cached blocks go back to the device (and the
 * host's, where offloaded state lives), so the next try starts from what tensors really hold. */
static void release_cached(ca_accelerator *acc) {
    ca_device *d = acc ? acc->device : ca_cpu_device();
    ca_device_empty_cache(d);
    if (d != ca_cpu_device()) ca_device_empty_cache(ca_cpu_device());
}

/* One call of fn in a scope of its own, so the tensors the try left scoped (activations of a
 * step that ran out half-way) are released before the next, as Accelerate's gc.collect() does.
 * Keeps the message of an out-of-memory failure in oom. */
static ca_status try_once(ca_batch_size_fn fn, void *ctx, int64_t bs, char *oom, size_t n) {
    ca_clear_error();
    ca_scope *sc = ca_scope_begin();
    ca_status s = fn(ctx, bs);
    if (s == CA_ERR_NOMEM) snprintf(oom, n, "%s", ca_last_error());
    ca_scope_end(sc);
    return s;
}

/* The error of a try that failed: this rank's own (fn's status and message stand), or, when only
 * other ranks failed, CA_ERR_PEER naming how many. */
static ca_status try_failed(const ca_accelerator *acc, ca_status own, int64_t failed, int64_t bs) {
    if (own != CA_OK && own != CA_ERR_NOMEM)
        return ca_error_context("find_executable_batch_size: batch size %lld", (long long)bs);
    return ca_error(CA_ERR_PEER,
                    "find_executable_batch_size: %lld rank(s) failed at batch size %lld with an error "
                    "other than out of memory (see their messages); rank %d stops too",
                    (long long)failed, (long long)bs, acc ? acc->rank : 0);
}

ca_status ca_find_executable_batch_size(ca_accelerator *acc, int64_t starting_batch_size,
                                        ca_batch_size_fn fn, void *ctx, int64_t *found) {
    if (found) *found = 0;
    if (!fn || !found)
        return ca_error(CA_ERR_INVALID, "ca_find_executable_batch_size: fn and found are required");
    if (starting_batch_size < 1)
        return ca_error(CA_ERR_INVALID, "find_executable_batch_size: starting batch size must be >= 1 (got %lld)",
                        (long long)starting_batch_size);
    char last_oom[512] = "";
    for (int64_t bs = starting_batch_size; bs > 0; bs = (int64_t)((double)bs * 0.9)) {
        ca_status s = try_once(fn, ctx, bs, last_oom, sizeof last_oom);
        int outcome = s == CA_OK ? TRY_OK : s == CA_ERR_NOMEM ? TRY_OOM : TRY_FAILED;
        if (outcome != TRY_FAILED) release_cached(acc);
        int64_t counts[2];
        ca_status a = agree(acc, outcome, counts);
        if (a != CA_OK) return a;
        if (counts[1] > 0) return try_failed(acc, s, counts[1], bs);
        if (counts[0] == 0) {
            *found = bs;
            return CA_OK;
        }
        CA_LOG_I("find_executable_batch_size: batch size %lld ran out of memory on %lld rank(s); retrying at %lld",
                 (long long)bs, (long long)counts[0], (long long)(int64_t)((double)bs * 0.9));
    }
    return ca_error(CA_ERR_NOMEM,
                    "find_executable_batch_size: no batch size down to 1 fit in memory (started at %lld; "
                    "last out-of-memory error: %s)",
                    (long long)starting_batch_size, last_oom[0] ? last_oom : "on another rank");
}
