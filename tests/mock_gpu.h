/* mock_gpu.h: a GPU for tests on machines without one: the CPU's table behind a device that says it is a
 * GPU (kind GPU, not host memory), registered with a score above the built-in devices', so that an
 * accelerator asked for a GPU (use_cpu false) takes it. Its memory is host memory in fact, so the CPU's
 * kernels run on it; what a GPU changes above the kernels (copies to and from the host, collectives staged
 * through host memory, the accelerator's choices for a GPU) runs as on one. */
#ifndef CACCEL_TEST_MOCK_GPU_H
#define CACCEL_TEST_MOCK_GPU_H

#include <caccel/backend.h>
#include <caccel/caccel.h>

/* o: the CPU's table as a GPU named `name` (o must outlive the process: the registry keeps it). */
static inline void mock_gpu_ops(ca_device_ops *o, const char *name) {
    *o = *ca_device_ops_of(ca_cpu_device());
    o->name = name;
    o->host_memory = false;
    o->kind = CA_DEVICE_GPU;
}

/* Registers o as the one device of plugin p (devs: one slot), scored by score. */
static inline ca_status mock_gpu_register(const ca_device_ops *o, const ca_device_ops **devs, ca_plugin *p,
                                          int (*score)(char *reason, size_t len)) {
    devs[0] = o;
    *p = (ca_plugin){.struct_size = sizeof *p, .abi_version = CA_ABI_VERSION, .name = o->name, .version = "test",
                     .num_devices = 1, .devices = devs, .score = score};
    return ca_register_plugin(p, "mock_gpu.h");
}

#endif
