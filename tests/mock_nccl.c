/* A stand-in for libnccl.so.2 (test_cuda_nccl_mock loads it through CACCEL_NCCL_LIBRARY): a communicator of one rank whose ops succeed at once, or, with MOCK_NCCL_STUCK=1, whose enqueue never settles until the communicator is aborted. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define MOCK_API __attribute__((visibility("default")))

/* what the test reads back (dlsym): the stream of the last op, ops entered, aborts */
MOCK_API cudaStream_t mock_nccl_last_stream;
MOCK_API atomic_int mock_nccl_ops_entered;
MOCK_API atomic_int mock_nccl_aborts;
/* point-to-point calls made inside ncclGroupStart / ncclGroupEnd, and groups ended */
MOCK_API atomic_int mock_nccl_p2p_in_group;
MOCK_API atomic_int mock_nccl_groups;

static atomic_int group_depth;

static atomic_int aborted;

static ncclResult_t op(cudaStream_t s) {
    mock_nccl_last_stream = s;
    atomic_fetch_add(&mock_nccl_ops_entered, 1);
    const char *stuck = getenv("MOCK_NCCL_STUCK");
    return stuck && strcmp(stuck, "1") == 0 ? ncclInProgress : ncclSuccess;
}

MOCK_API ncclResult_t ncclGetVersion(int *v) {
    *v = 22809;
    return ncclSuccess;
}
MOCK_API const char *ncclGetErrorString(ncclResult_t r) { return "mock NCCL error"; }
MOCK_API const char *ncclGetLastError(ncclComm_t c) { return ""; }
MOCK_API ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r) {
    const char *stuck = getenv("MOCK_NCCL_STUCK");
    *r = stuck && strcmp(stuck, "1") == 0 && !atomic_load(&aborted) ? ncclInProgress : ncclSuccess;
    return ncclSuccess;
}
MOCK_API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    return ncclSuccess;
}
MOCK_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int n, ncclUniqueId id, int rank, ncclConfig_t *cfg) {
    *comm = calloc(1, 64);
    atomic_store(&aborted, 0);
    return *comm ? ncclSuccess : ncclSystemError;
}
MOCK_API ncclResult_t ncclCommFinalize(ncclComm_t comm) { return ncclSuccess; }
MOCK_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    free(comm);
    return ncclSuccess;
}
MOCK_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
    atomic_store(&aborted, 1);
    atomic_fetch_add(&mock_nccl_aborts, 1);
    free(comm);
    return ncclSuccess;
}
MOCK_API ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c,
                                    cudaStream_t st) {
    return op(st);
}
MOCK_API ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                                    cudaStream_t st) {
    return op(st);
}
MOCK_API ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
    return op(st);
}
MOCK_API ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o,
                                        ncclComm_t c, cudaStream_t st) {
    return op(st);
}
MOCK_API ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    if (atomic_load(&group_depth) > 0) atomic_fetch_add(&mock_nccl_p2p_in_group, 1);
    return op(st);
}
MOCK_API ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    if (atomic_load(&group_depth) > 0) atomic_fetch_add(&mock_nccl_p2p_in_group, 1);
    return op(st);
}
/* nccl.h declares these two without a prototype */
MOCK_API ncclResult_t ncclGroupStart(void);
MOCK_API ncclResult_t ncclGroupEnd(void);
MOCK_API ncclResult_t ncclGroupStart(void) {
    atomic_fetch_add(&group_depth, 1);
    return ncclSuccess;
}
MOCK_API ncclResult_t ncclGroupEnd(void) {
    atomic_fetch_sub(&group_depth, 1);
    atomic_fetch_add(&mock_nccl_groups, 1);
    return ncclSuccess;
}
