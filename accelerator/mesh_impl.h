/* mesh_impl.h: the device mesh's communicators (mesh.c) and tensor-parallel Linear (tp.c). */
#ifndef CACCEL_MESH_IMPL_H
#define CACCEL_MESH_IMPL_H

#include "accelerator/accelerator_impl.h"

typedef struct ca_mesh {
    ca_mesh_shape shape;
    int coord[CA_MESH_NDIMS];          /* this rank's */
    ca_comm *comm[CA_MESH_NDIMS + 1];  /* one per dimension, and [CA_MESH_NDIMS] "dp": the data-parallel
                                        * ranks (same cp and tp coordinates), over which gradients average */
    int ntp;                           /* Linear modules made tensor-parallel at prepare */
    ca_module **tp;
} ca_mesh;

/* Makes acc->mesh when parallelism_config_tp_size is above 1 (collective: after the process group),
 * refusing what does not compose with it yet; nothing otherwise. */
ca_status ca_mesh_setup(ca_accelerator *acc);
void ca_mesh_free(ca_accelerator *acc);
/* Where gradients are averaged: the mesh's dp communicator, or the whole process group. */
ca_comm *ca_mesh_grad_comm(const ca_accelerator *acc);
/* This rank's data shard: its place among the data-parallel ranks (the tp ranks of a group read the
 * same batches). */
void ca_mesh_data_rank(const ca_accelerator *acc, int *rank, int *world);
/* Whether parameter t is one rank's part of a split layer (its gradient's norm is summed over tp). */
bool ca_tp_is_split(const ca_accelerator *acc, const ca_tensor *t);
/* CA_ERR_UNSUPPORTED naming `what` (save_state, load_model, ...) when tensor parallelism is on: what
 * does not handle the split layers yet; CA_OK otherwise. */
ca_status ca_tp_refuse(const ca_accelerator *acc, const char *what);
/* Applies model m's ca_tp_plan over the tp communicator (tp.c): with a mesh, a model without a plan is
 * refused; without one, nothing. */
ca_status ca_tp_apply(ca_accelerator *acc, ca_module *m);
/* The accelerator goes: its tensor-parallel modules can no longer run (their communicator is gone). */
void ca_tp_release(ca_accelerator *acc);

#endif
