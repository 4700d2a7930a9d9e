/* The device-to-host copies of an asynchronous save on a GPU (save_copy_impl.h): each device tensor is
 * copied straight into its place in the host copy of its file, which lies in pinned host memory, on a
 * stream of its own that first waits for an event recorded on the compute stream (every write of the
 * step enqueued so far); after the last copy a second event closes them, the compute stream waits for it
 * on the device (the calling thread does not), and the background writer waits for it on the host before
 * it writes. A device without the slots (the lazy device, a plugin of an older minor) copies
 * synchronously into ordinary host memory. */
#include "accelerator/save_copy_impl.h"

#include "tensor/safetensors_impl.h"
#include "tensor/tensor_impl.h"

#include <caccel/log.h>

#include <stdlib.h>

struct ca_save_copy {
    ca_device *dev;
    const ca_device_ops *ops;
    void *ctx;                 /* the device's context */
    void *stream;              /* the copy stream */
    void *computed, *copied;   /* events: before each copy on the compute stream; after the last copy */
    int pending;               /* copies enqueued since the last ca_save_copy_end */
    bool ended;                /* ca_save_copy_end closed copies that ca_save_copy_wait waits for */
    struct { char *p; size_t n; } *pinned;   /* the live host_alloc blocks (a few: one per file) */
    int npinned, cap;
};

static _Thread_local ca_save_copy *tl_copy;

/* Every slot the copies use, as the table has them (0 beyond an older minor's struct_size). */
static bool has_slots(const ca_device_ops *o) {
    return o->host_alloc && o->host_free && o->stream_create && o->stream_destroy && o->event_create &&
           o->event_destroy && o->event_record && o->stream_wait_event && o->synchronize && o->memcpy_on_stream &&
           o->event_wait_any_thread;
}

ca_status ca_save_copy_create(ca_device *dev, ca_save_copy **out) {
    *out = NULL;
    const ca_device_ops *o = ca_device_ops_of(dev);
    if (ca_device_is_host(dev) || ca_device_is_lazy(dev) || !has_slots(o)) return CA_OK;
    ca_save_copy *sc = calloc(1, sizeof *sc);
    if (!sc) return ca_error(CA_ERR_NOMEM, "save_state: out of memory");
    *sc = (ca_save_copy){.dev = dev, .ops = o, .ctx = ca_device_context(dev)};
    ca_status s = o->stream_create(sc->ctx, &sc->stream);
    if (s == CA_OK) s = o->event_create(sc->ctx, &sc->computed);
    if (s == CA_OK) s = o->event_create(sc->ctx, &sc->copied);
    if (s != CA_OK) {
        ca_save_copy_destroy(sc);
        return ca_error_context("save_state: the copy stream of asynchronous saves on %s:%d", ca_device_name(dev),
                                ca_device_index(dev));
    }
    *out = sc;
    return CA_OK;
}

void ca_save_copy_destroy(ca_save_copy *sc) {
    if (!sc) return;
    if (ca_save_copy_wait(sc) != CA_OK) CA_LOG_E("%s", ca_last_error());
    if (sc->copied) sc->ops->event_destroy(sc->ctx, sc->copied);
    if (sc->computed) sc->ops->event_destroy(sc->ctx, sc->computed);
    if (sc->stream) sc->ops->stream_destroy(sc->ctx, sc->stream);
    free(sc->pinned);
    free(sc);
}

/* The capture's allocator: pinned host memory; NULL (the capture then takes malloc) when it fails. */
static void *pinned_alloc(void *ctx, size_t bytes) {
    ca_save_copy *sc = ctx;
    if (sc->npinned == sc->cap) {
        int cap = sc->cap ? 2 * sc->cap : 16;
        void *grown = realloc(sc->pinned, (size_t)cap * sizeof *sc->pinned);
        if (!grown) return NULL;
        sc->pinned = grown;
        sc->cap = cap;
    }
    void *p = NULL;
    if (sc->ops->host_alloc(sc->ctx, bytes, &p) != CA_OK) {
        CA_LOG_W("save_state: %zu bytes of pinned host memory refused (%s); that file's host copy is ordinary "
                 "memory, copied synchronously", bytes, ca_last_error());
        return NULL;
    }
    sc->pinned[sc->npinned].p = p;
    sc->pinned[sc->npinned++].n = bytes;
    return p;
}

static void pinned_free(void *ctx, void *p) {
    ca_save_copy *sc = ctx;
    for (int i = 0; i < sc->npinned; i++)
        if (sc->pinned[i].p == p) {
            sc->pinned[i] = sc->pinned[--sc->npinned];
            break;
        }
    sc->ops->host_free(sc->ctx, p);
}

/* Whether [p, p + n) lies in one of the pinned blocks (memcpy_on_stream's host side must). */
static bool is_pinned(const ca_save_copy *sc, const void *p, size_t n) {
    for (int i = 0; i < sc->npinned; i++)
        if ((const char *)p >= sc->pinned[i].p && (const char *)p + n <= sc->pinned[i].p + sc->pinned[i].n)
            return true;
    return false;
}

void ca_save_copy_hook(ca_save_copy *sc, ca_st_capture *c) {
    if (!sc) return;
    c->alloc = pinned_alloc;
    c->free = pinned_free;
    c->alloc_ctx = sc;
}

ca_save_copy *ca_save_copy_set(ca_save_copy *sc) {
    ca_save_copy *prev = tl_copy;
    tl_copy = sc;
    return prev;
}

static ca_status enqueue(ca_save_copy *sc, ca_tensor *t, void *dst, size_t len) {
    ca_status s = ca_tensor_check_present(t, "save_state");
    if (s != CA_OK) return s;
    /* the copy stream goes on only once the compute stream has done every write enqueued before now */
    s = sc->ops->event_record(sc->ctx, sc->computed, NULL);
    if (s == CA_OK) s = sc->ops->stream_wait_event(sc->ctx, sc->stream, sc->computed);
    if (s == CA_OK) s = sc->ops->memcpy_on_stream(sc->ctx, dst, ca_tptr(t), len, CA_COPY_D2H, sc->stream);
    if (s != CA_OK) return ca_error_context("enqueuing its copy to pinned host memory");
    sc->pending++;
    return CA_OK;
}

ca_status ca_save_copy_fill(ca_tensor *t, void *dst, size_t len) {
    ca_save_copy *sc = tl_copy;
    if (!sc) return ca_tensor_to_host(t, dst, len);
    ca_status s = ca_tdev(t) != sc->dev || !ca_tensor_is_contiguous(t) || ca_tensor_nbytes(t) != len ||
                          !is_pinned(sc, dst, len)
                      ? ca_tensor_to_host(t, dst, len)   /* a view is gathered on the device first: synchronous */
                      : len ? enqueue(sc, t, dst, len) : CA_OK;
    /* the capture frees the buffer of a file that failed: the copies already enqueued into it land first */
    if (s != CA_OK && sc->pending > 0 && sc->ops->synchronize(sc->ctx) != CA_OK)
        CA_LOG_E("save_state: waiting for the copies to pinned host memory after a failure: %s", ca_last_error());
    return s;
}

ca_status ca_save_copy_end(ca_save_copy *sc) {
    if (!sc || sc->pending == 0) return CA_OK;
    sc->pending = 0;
    ca_status s = sc->ops->event_record(sc->ctx, sc->copied, sc->stream);
    sc->ended = s == CA_OK;
    /* the parameters and optimizer state are not written, nor their blocks reused, before they are copied */
    if (s == CA_OK) s = sc->ops->stream_wait_event(sc->ctx, NULL, sc->copied);
    if (s != CA_OK) {   /* ordering not ensured: wait here, as a synchronous copy would */
        ca_status w = sc->ops->synchronize(sc->ctx);
        sc->ended = false;
        if (w != CA_OK) s = w;
        return ca_error_context("save_state: closing the copies to pinned host memory on %s:%d",
                                ca_device_name(sc->dev), ca_device_index(sc->dev));
    }
    return CA_OK;
}

ca_status ca_save_copy_wait(ca_save_copy *sc) {
    if (!sc || !sc->ended) return CA_OK;
    sc->ended = false;
    ca_status s = sc->ops->event_wait_any_thread(sc->ctx, sc->copied);
    if (s != CA_OK)
        return ca_error_context("the copy of the state from %s:%d to pinned host memory", ca_device_name(sc->dev),
                                ca_device_index(sc->dev));
    return CA_OK;
}
