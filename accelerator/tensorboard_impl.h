/* tensorboard_impl.h: TensorBoard event files for the trackers (tracking.c): TFRecord framing
 * (length, masked CRC32C of the length, data, masked CRC32C of the data) around Event messages
 * encoded by protobuf-c from TensorBoard's field numbers (tensorboard_event.proto). Built when
 * configure finds protobuf-c (CA_HAVE_TENSORBOARD). */
#ifndef CACCEL_TENSORBOARD_IMPL_H
#define CACCEL_TENSORBOARD_IMPL_H

#include <caccel/tracking.h>

#include <stdio.h>

/* Creates dir/events.out.tfevents.<seconds>.<host> and writes the file_version event. */
ca_status ca_tb_open(const char *dir, FILE **out);
/* One event per call: the values as scalar summaries at `step` (negative: 0). Flushes. */
ca_status ca_tb_scalars(FILE *f, const ca_metric *values, size_t n, int64_t step, double wall_time);

#endif
