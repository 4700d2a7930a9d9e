/* caccel/xla.h: the lazy "xla" device's own calls: its metrics and bf16 storage. */
#ifndef CACCEL_XLA_H
#define CACCEL_XLA_H

#include <caccel/device.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The lazy "xla" device (backends/xla_stub): kernels record a graph that is compiled (cached by
 * structure) and run at a synchronisation point. Its counters since open or the last reset: */
typedef struct ca_xla_metrics {
    uint64_t graphs;           /* graphs run (one per synchronisation point with pending work) */
    uint64_t compiles;         /* graphs compiled: cache misses */
    uint64_t cache_hits;       /* graphs whose compiled program was found in the cache */
    uint64_t cached_programs;  /* programs held in the cache now */
    uint64_t nodes_recorded;
    uint64_t nodes_executed;
    uint64_t nodes_eliminated; /* dead code removed by the compiler */
    uint64_t last_graph_nodes, max_graph_nodes;
    uint64_t h2d_transfers, h2d_bytes;   /* copies host -> device */
    uint64_t d2h_transfers, d2h_bytes;   /* copies device -> host */
    uint64_t mark_steps;       /* explicit step boundaries (ca_mark_step, the prepared dataloader) */
    double compile_ms, execute_ms;       /* wall time in the compiler and in execution */
    uint64_t kernels_launched; /* kernels run: a fused loop counts once */
    uint64_t fused_kernels;    /* of them, fused loops of two or more nodes */
    uint64_t fused_nodes;      /* nodes run inside fused loops */
    uint64_t planned_peak_bytes;         /* last graph: its intermediates' peak, planned by liveness */
    uint64_t intermediate_bytes;         /* last graph: the sum of its intermediates (no reuse) */
    uint64_t collectives_in_graph;       /* collectives run as nodes of a graph (in graph order) */
    uint64_t arena_bytes;                /* last graph: the memory its intermediates were placed in
                                          * (planned_peak_bytes, or more where the live ranges
                                          * do not pack perfectly) */
} ca_xla_metrics;

/* Metrics of an xla device; CA_ERR_INVALID for another device. */
CA_API ca_status ca_xla_metrics_get(const ca_device *d, ca_xla_metrics *out);
CA_API ca_status ca_xla_metrics_reset(ca_device *d);
/* The metrics as text (one "name: value" a line), as CACCEL_XLA_METRICS=1 prints them at exit. */
CA_API ca_status ca_xla_metrics_report(const ca_device *d, char *buf, size_t len);

/* bf16 storage on an xla device: every f32 value the device holds is rounded to bf16 (to nearest
 * even), as torch_xla's XLA_USE_BF16 / XLA_DOWNCAST_BF16 make a TPU do (Accelerate sets one of them
 * for mixed_precision bf16 on a TPU; the accelerator here calls this for mixed_precision bf16 on
 * xla). Kernels still compute in f32 and the program still sees f32 tensors; values keep their
 * 4-byte slots (the numbers are a TPU's, the memory is not halved). The pending graph runs first,
 * in the mode it was recorded in; values already on the device are rounded when next read. The
 * device also turns it on at open when XLA_USE_BF16 or XLA_DOWNCAST_BF16 is 1. Errors:
 * CA_ERR_INVALID for a device that is not xla, or the pending graph's error. Not thread-safe
 * against kernels recorded on the device at the same time. */
CA_API ca_status ca_xla_set_bf16_storage(ca_device *d, bool on);
/* Whether bf16 storage is on; false for a NULL or non-xla device. */
CA_API bool ca_xla_bf16_storage(const ca_device *d);
/* For backends: the extras a lazy device hands out by name through its table's get_proc (the
 * calls above resolve through them, so the core names no backend). `dev` is the device's context. */
#define CA_XLA_PROC_METRICS "xla_metrics"              /* ca_xla_metrics_fn */
#define CA_XLA_PROC_METRICS_RESET "xla_metrics_reset"  /* ca_xla_metrics_reset_fn */
#define CA_XLA_PROC_FORMAT_METRICS "xla_format_metrics" /* ca_xla_format_metrics_fn */
typedef void (*ca_xla_metrics_fn)(void *dev, ca_xla_metrics *out);
typedef void (*ca_xla_metrics_reset_fn)(void *dev);
/* "name: value" lines of m. */
typedef void (*ca_xla_format_metrics_fn)(const ca_xla_metrics *m, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
