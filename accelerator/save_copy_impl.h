/* save_copy_impl.h: the device-to-host copies of an asynchronous save on a device with memory of its own
 * (a GPU): into pinned host buffers, on a copy stream of their own, so that the calling thread never waits
 * for the transfer (docs/CHECKPOINTS.md, "On a device"). */
#ifndef CACCEL_SAVE_COPY_IMPL_H
#define CACCEL_SAVE_COPY_IMPL_H

#include <caccel/device.h>
#include <caccel/tensor.h>

struct ca_st_capture;

/* One per accelerator, made at its first asynchronous save, kept across saves: the copy stream, two
 * events (`computed`, recorded on the compute stream before each copy; `copied`, after the last), and the
 * device's pinned host memory under the save's host copy. Used by the calling thread, but for
 * ca_save_copy_wait (the background writer). */
typedef struct ca_save_copy ca_save_copy;

/* *out NULL (CA_OK) where the device is host memory, or its table lacks a slot the copies need
 * (host_alloc, host_free, stream_create/destroy, event_create/record/destroy, stream_wait_event,
 * synchronize, and ABI 3.8's memcpy_on_stream and event_wait_any_thread): the save then copies
 * synchronously, as before. */
ca_status ca_save_copy_create(ca_device *dev, ca_save_copy **out);
void ca_save_copy_destroy(ca_save_copy *sc);   /* accepts NULL; waits for copies in flight first */

/* The capture's file buffers come from the device's pinned host memory (kept by the capture between
 * saves, freed by ca_st_capture_free; sc must outlive them). sc NULL: nothing changes. */
void ca_save_copy_hook(ca_save_copy *sc, struct ca_st_capture *c);

/* The calling thread's copy context, as ca_st_capture_set: while set, ca_save_copy_fill enqueues. */
ca_save_copy *ca_save_copy_set(ca_save_copy *sc);

/* t's bytes to dst (len of them): with a context set and t contiguous on its device, an asynchronous copy
 * on the copy stream after everything the compute stream has been given so far; else ca_tensor_to_host
 * (synchronous). */
ca_status ca_save_copy_fill(ca_tensor *t, void *dst, size_t len);

/* After the last fill of a save: `copied` recorded on the copy stream, and the compute stream waits for
 * it, so that no later kernel writes or reuses what is still being copied. No copy enqueued: nothing. */
ca_status ca_save_copy_end(ca_save_copy *sc);

/* Waits until the copies ca_save_copy_end closed have completed (the background writer, before it
 * writes; also before a failed save frees the buffers). A failure names the device and the copy. NULL sc,
 * or nothing enqueued: CA_OK. Thread-safe against the calling thread's enqueuing of the next save only
 * through the save protocol (one save in flight: the next save joins the writer first). */
ca_status ca_save_copy_wait(ca_save_copy *sc);

#endif
