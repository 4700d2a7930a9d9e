/* The device mesh (Accelerate's ParallelismConfig): the process group split into dp_replicate x dp_shard x
 * cp x tp communicators, made when tensor or context parallelism asks for it, and the combinations they
 * refuse. */
#include "accelerator/accelerator_impl.h"
#include "accelerator/mesh_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the mesh's tensor and context parallelism do not compose with yet, each naming its key; `dim`
 * names the dimension asking (its size key), `tp` whether it is tensor parallelism. */
static const char *mesh_why(const ca_accelerator *acc, const ca_mesh_shape *m, bool tp, const char **key) {
    const ca_settings *st = &acc->st;
    *key = "distributed_type";
    if (m->size[CA_MESH_DP_SHARD] > 1 && st->distributed_type == CA_DIST_XLA) {   /* ZeRO runs on eager devices */
        *key = "parallelism_config.parallelism_config_dp_shard_size";
        return "sharded data parallelism (ZeRO / FSDP) does not run on the lazy device yet; "
               "parallelism_config_dp_replicate_size does";
    }
    /* zero.c shards over the dp ranks of a tp coordinate, under cp over dp_shard x cp ("dp_shard_cp") */
    if (m->size[CA_MESH_DP_SHARD] > 1 && acc->zero.stage == 0) {
        *key = "parallelism_config.parallelism_config_dp_shard_size";
        return "sharded data parallelism needs distributed_type FSDP (fsdp_sharding_strategy FULL_SHARD or "
               "SHARD_GRAD_OP) or DEEPSPEED (zero_stage 1 to 3); under plain data parallelism set "
               "parallelism_config_dp_replicate_size instead";
    }
    if (st->deterministic) {
        *key = "deterministic";
        return tp ? "deterministic mode's virtual shards assume every rank holds whole parameters (not yet)"
                  : "deterministic mode's virtual shards assume the data-parallel ranks are all the ranks (not yet)";
    }
    if (st->comm_hook == CA_COMM_HOOK_POWER_SGD || st->comm_hook == CA_COMM_HOOK_BATCHED_POWER_SGD) {
        *key = "comm_hook";
        return "PowerSGD's compression runs over the whole process group (not yet over the data-parallel one)";
    }
    return NULL;
}

static ca_status mesh_refuse(const ca_accelerator *acc, const ca_mesh_shape *m) {
    const ca_config *c = acc->cfg;
    for (int d = CA_MESH_TP; d >= CA_MESH_CP; d--) {
        if (m->size[d] <= 1) continue;
        const char *dkey = d == CA_MESH_TP ? "parallelism_config.parallelism_config_tp_size"
                                           : "parallelism_config.parallelism_config_cp_size";
        const char *key, *why = mesh_why(acc, m, d == CA_MESH_TP, &key);
        if (why)
            return ca_error(CA_ERR_UNSUPPORTED, "%s %d (from %s) with %s (from %s): %s", dkey + 19, m->size[d],
                            ca_config_origin(c, dkey), key, ca_config_origin(c, key), why);
    }
    return CA_OK;
}

/* The color of this rank's group along dimension d: its rank with the d coordinate zeroed (the
 * combined "dp" dimension: its cp and tp coordinates; "dp_cp": its tp coordinate). */
static int mesh_color(const ca_mesh *m, int rank, int d) {
    if (d == CA_MESH_NDIMS) return rank % (m->shape.size[CA_MESH_CP] * m->shape.size[CA_MESH_TP]);
    if (d == CA_MESH_DP_CP) return rank % m->shape.size[CA_MESH_TP];
    int stride = 1;
    for (int k = CA_MESH_NDIMS - 1; k > d; k--) stride *= m->shape.size[k];
    return rank - m->coord[d] * stride;
}

static const char *comm_name(int d) { return d == CA_MESH_DP_CP ? "dp_cp" : ca_mesh_dim_name(d); }

/* Every rank makes every dimension's communicator, in the same order (each split is collective); "dp_cp"
 * only under context parallelism. */
static ca_status mesh_split(ca_accelerator *acc, ca_mesh *m) {
    int last = m->shape.size[CA_MESH_CP] > 1 ? CA_MESH_DP_CP : CA_MESH_NDIMS;
    for (int d = 0; d <= last; d++) {
        int key = d < CA_MESH_NDIMS ? m->coord[d] : acc->rank;
        ca_status s = ca_comm_split(acc->comm, mesh_color(m, acc->rank, d), key, &m->comm[d]);
        if (s == CA_OK) s = ca_comm_set_name(m->comm[d], comm_name(d));
        if (s != CA_OK)
            return ca_error_context("making the device mesh's %s communicator (rank %d)", comm_name(d), acc->rank);
    }
    return CA_OK;
}

ca_status ca_mesh_setup(ca_accelerator *acc) {
    ca_mesh_shape shape;
    ca_status s = ca_config_mesh(acc->cfg, acc->world, &shape);
    if (s != CA_OK || (shape.size[CA_MESH_TP] <= 1 && shape.size[CA_MESH_CP] <= 1)) return s;
    if ((s = mesh_refuse(acc, &shape)) != CA_OK) return s;
    ca_mesh *m = calloc(1, sizeof *m);
    if (!m) return ca_error(CA_ERR_NOMEM, "out of host memory");
    m->shape = shape;
    ca_mesh_coords(&shape, acc->rank, m->coord);
    acc->mesh = m;
    s = mesh_split(acc, m);
    if (s == CA_OK && acc->rank == 0)
        ca_log_printf(CA_LOG_INFO, "device mesh: dp_replicate %d x dp_shard %d x cp %d x tp %d",
                      shape.size[0], shape.size[1], shape.size[2], shape.size[3]);
    return s;
}

void ca_mesh_free(ca_accelerator *acc) {
    ca_mesh *m = acc->mesh;
    if (!m) return;
    ca_context_parallel_end(acc);   /* a split left open: its communicator goes */
    for (int d = CA_MESH_DP_CP; d >= 0; d--) ca_comm_destroy(m->comm[d]);
    free(m);
    acc->mesh = NULL;
}

ca_comm *ca_mesh_grad_comm(const ca_accelerator *acc) {
    if (!acc->mesh) return acc->comm;
    return acc->mesh->comm[CA_MESH_DP_CP] ? acc->mesh->comm[CA_MESH_DP_CP] : acc->mesh->comm[CA_MESH_NDIMS];
}

ca_comm *ca_mesh_data_comm(const ca_accelerator *acc) {
    return acc->mesh ? acc->mesh->comm[CA_MESH_NDIMS] : acc->comm;
}

void ca_mesh_data_rank(const ca_accelerator *acc, int *rank, int *world) {
    *rank = acc->rank;
    *world = acc->world;
    if (!acc->mesh) return;
    *rank = ca_comm_rank(acc->mesh->comm[CA_MESH_NDIMS]);
    *world = ca_comm_size(acc->mesh->comm[CA_MESH_NDIMS]);
}

ca_status ca_accelerator_mesh(const ca_accelerator *acc, ca_mesh_shape *shape, int coord[CA_MESH_NDIMS]) {
    if (!acc || !shape) return ca_error(CA_ERR_INVALID, "ca_accelerator_mesh: accelerator and shape are required");
    if (acc->mesh) {
        *shape = acc->mesh->shape;
        if (coord) memcpy(coord, acc->mesh->coord, sizeof acc->mesh->coord);
        return CA_OK;
    }
    ca_status s = ca_config_mesh(acc->cfg, acc->world, shape);
    if (s == CA_OK && coord) ca_mesh_coords(shape, acc->rank, coord);
    return s;
}

ca_comm *ca_mesh_comm(ca_accelerator *acc, const char *dim) {
    if (!acc || !dim) {
        ca_error(CA_ERR_INVALID, "ca_mesh_comm: accelerator and dimension are required");
        return NULL;
    }
    for (int d = 0; d <= CA_MESH_DP_CP; d++) {
        if (strcmp(dim, comm_name(d)) != 0) continue;
        if (acc->mesh && acc->mesh->comm[d]) return acc->mesh->comm[d];
        ca_error(CA_ERR_NOT_FOUND, "ca_mesh_comm(\"%s\"): no %s (parallelism_config_tp_size is %s, from %s; "
                 "parallelism_config_cp_size is %s, from %s)", dim, acc->mesh ? "dp_cp communicator" : "device mesh",
                 ca_config_get(acc->cfg, "parallelism_config.parallelism_config_tp_size"),
                 ca_config_origin(acc->cfg, "parallelism_config.parallelism_config_tp_size"),
                 ca_config_get(acc->cfg, "parallelism_config.parallelism_config_cp_size"),
                 ca_config_origin(acc->cfg, "parallelism_config.parallelism_config_cp_size"));
        return NULL;
    }
    ca_error(CA_ERR_INVALID, "ca_mesh_comm: unknown dimension \"%s\" (tp, cp, dp_shard, dp_replicate, dp, dp_cp)",
             dim);
    return NULL;
}
