/* caccel/device.h: opening devices, memory statistics, and the backend registry. */
#ifndef CACCEL_DEVICE_H
#define CACCEL_DEVICE_H

#include <caccel/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An opened device: its backend's vtable, context, kernel table and allocator.
 * Devices are owned by the registry and live until ca_shutdown(); a device
 * may be used from several threads (calls are serialised internally). */
typedef struct ca_device ca_device;

/* The process-wide CPU device. Never NULL once the library is initialised
 * (first call of any ca_ function); thread-safe. */
CA_API ca_device *ca_cpu_device(void);

/* The OPENBLAS_CORETYPE ("Haswell", "SkylakeX") that would give the CPU backend's OpenBLAS the kernels this
 * CPU runs, where OpenBLAS chose kernels without AVX2 on a CPU with AVX2 and FMA (its detection falls back so
 * on CPU models it does not know); *out NULL when it runs the CPU's own kernels. OpenBLAS reads the variable
 * only when it loads: a launcher sets it for the processes it starts. *out is a static string; thread-safe;
 * no error (CA_OK). */
CA_API ca_status ca_cpu_openblas_coretype_hint(const char **out);

/* Opens device `index` of backend `name` ("cpu", "cuda", ...), loading
 * plugins first if needed. Opening the same (name, index) twice returns the
 * same device. Errors: CA_ERR_NOT_FOUND (no such backend: the message lists
 * those available), CA_ERR_UNSUPPORTED (backend present but 0 devices: the
 * message carries the backend's reason), CA_ERR_BACKEND. */
CA_API ca_status ca_device_open(const char *name, int index,
                                const ca_device_open_args *args, ca_device **out);

CA_API const char *ca_device_name(const ca_device *d);   /* backend name, "cpu" */
CA_API int ca_device_index(const ca_device *d);
/* One line describing the hardware (static buffer per device). */
CA_API const char *ca_device_description(const ca_device *d);
/* True when the device's memory is host memory. */
CA_API bool ca_device_is_host(const ca_device *d);

/* Waits for all work queued on the device. */
CA_API ca_status ca_device_synchronize(ca_device *d);

/* Memory statistics of the device's allocator. */
CA_API ca_status ca_device_memory_stats(ca_device *d, ca_allocator_stats *out);
/* Returns cached blocks to the device. */
CA_API ca_status ca_device_empty_cache(ca_device *d);
/* Resets the peak counters to the current values. */
CA_API ca_status ca_device_reset_peak_stats(ca_device *d);

/* Caps the bytes tensors may hold on d at `bytes` (0: no cap, the default), as
 * torch.cuda.set_per_process_memory_fraction does: past it an allocation fails with CA_ERR_NOMEM
 * ("cpu:0: out of memory allocating N bytes: the device's memory limit is L bytes and tensors
 * would hold H"), the same status a device that runs out reports, so code that handles out-of-memory
 * (ca_find_executable_batch_size) can be tested on any machine, and a small device simulated on a
 * big one. The cap counts the allocator's in-use bytes (its size classes), not its cache.
 * An allocation is made and undone when it went past the cap, so the allocator's peak statistics
 * count a refused one too. Thread-safe; allocations racing on the same device are checked against
 * what they hold together (one may be refused that alone would fit). ca_device_memory_limit
 * returns the cap (0 when none or d is NULL). */
CA_API ca_status ca_device_set_memory_limit(ca_device *d, size_t bytes);
CA_API size_t ca_device_memory_limit(const ca_device *d);

/* Raw memory through the device's allocator (tensors use this). Thread-safe. */
CA_API ca_status ca_device_alloc(ca_device *d, size_t bytes, void **ptr);
CA_API void ca_device_free(ca_device *d, void *ptr);
/* Synchronous copies between host memory and device memory. */
CA_API ca_status ca_device_copy_from_host(ca_device *d, void *dst, const void *src, size_t bytes);
CA_API ca_status ca_device_copy_to_host(ca_device *d, void *dst, const void *src, size_t bytes);
CA_API ca_status ca_device_copy(ca_device *d, void *dst, const void *src, size_t bytes);

/* What the device is (host, GPU, lazy), from its backend's table. */
CA_API ca_device_kind ca_device_kind_of(const ca_device *d);
/* Deterministic mode on d: results must not depend on the thread count (the CPU runs its GEMMs
 * on one thread), through the backend's set_deterministic slot; nested on/off calls balanced. A
 * device without the slot is left as it is. */
CA_API void ca_device_set_deterministic(ca_device *d, bool on);
/* True for devices that record work and run it at synchronisation points (xla). */
CA_API bool ca_device_is_lazy(const ca_device *d);
/* A step boundary: a lazy device runs the graph recorded so far (torch_xla's mark_step); other
 * devices do nothing. */
CA_API ca_status ca_device_mark_step(ca_device *d);

/* The device's kernel table (for ops and backends; never NULL). */
CA_API const ca_kernels *ca_device_kernels(const ca_device *d);
/* The backend context to pass to kernels as `dev`. */
CA_API void *ca_device_context(const ca_device *d);
CA_API const ca_device_ops *ca_device_ops_of(const ca_device *d);

/* ------------------------------------------------------------- registry */

typedef enum ca_backend_kind { CA_BACKEND_DEVICE = 1, CA_BACKEND_COLLECTIVE = 2 } ca_backend_kind;

/* One registered or refused backend, for `caccel env` and error messages. */
typedef struct ca_backend_info {
    const char *name;          /* "cpu", "mpi", ... */
    ca_backend_kind kind;
    const char *origin;        /* "built-in" or the plugin's path */
    const char *version;       /* what it wraps, may be "" */
    bool usable;               /* false: refused (ABI) or cannot run here */
    int device_count;          /* device backends: usable devices, else -1 */
    const char *reason;        /* why not usable / why 0 devices, else "" */
} ca_backend_info;

/* Scans every directory of CACCEL_PLUGIN_PATH (':'-separated), then caccel/ next
 * to the loaded libcaccel (and, from a build tree, the build's plugin folders),
 * then $libdir/caccel for plugins (caccel_*.so exporting ca_plugin_init) and
 * registers them; the first plugin of a name wins. Runs once;
 * later calls return the first result. A plugin built for another ABI is
 * refused with a logged warning and listed as unusable. Thread-safe. */
CA_API ca_status ca_registry_load_plugins(void);

/* Loads one plugin file (tests, embedders). CA_ERR_ABI when refused. */
CA_API ca_status ca_registry_load_plugin_file(const char *path);

/* Number of known backends and the i-th one (valid until ca_shutdown). */
CA_API int ca_registry_count(void);
CA_API ca_status ca_registry_get(int i, ca_backend_info *out);
/* The best usable device backend of `kind`: the highest plugin score with devices, the first
 * registered on a tie. CA_ERR_NOT_FOUND when none is usable; then *out describes the first
 * registered backend of that kind (its reason says why not), or has a NULL name when there is none. */
CA_API ca_status ca_registry_best_device(ca_device_kind kind, ca_backend_info *out);

/* The collective backend called `name`, or NULL (with the error recorded). */
CA_API const ca_collective_ops *ca_registry_collective(const char *name);
/* True when the collective backend `name` runs only in processes an MPI launcher started (its
 * table's needs_mpi_launcher), as a launcher must know before it starts the ranks. A backend already
 * registered answers from its table, one of a known plugin from the registry's row for it, so the
 * plugins are loaded only for a name neither knows; false for NULL or a name no backend has. */
CA_API bool ca_registry_collective_needs_mpi_launcher(const char *name);
/* The device backend called `name`, or NULL. */
CA_API const ca_device_ops *ca_registry_device(const char *name);

/* Closes devices and unloads plugins. Optional (at exit), not thread-safe. */
CA_API void ca_shutdown(void);

#ifdef __cplusplus
}
#endif
#endif
