# accelerator/: the Accelerator, the top layer: prepare, backward with gradient synchronisation,
# accumulation, clipping, mixed precision, and the collective helpers for training loops.
libcaccel_la_SOURCES += \
	accelerator/accelerator_impl.h \
	accelerator/process_state.c \
	accelerator/accumulate.c \
	accelerator/grad_scaler.c \
	accelerator/accelerator.c \
	accelerator/profile.c \
	accelerator/throughput.c \
	accelerator/sync_impl.h \
	accelerator/strategy.c \
	accelerator/sync_none.c \
	accelerator/sync_ddp.c \
	accelerator/sync_zero.c \
	accelerator/sync_deterministic.c \
	accelerator/powersgd.c \
	accelerator/local_sgd.c \
	accelerator/frozen.c \
	accelerator/zero_buffers.c \
	accelerator/zero.c \
	accelerator/zero3.c \
	accelerator/zero_config.c \
	accelerator/zero_offload.c \
	accelerator/zero_state.c \
	accelerator/checkpoint_impl.h \
	accelerator/checkpoint.c \
	accelerator/state.c \
	accelerator/state_keep.c \
	accelerator/save_copy_impl.h \
	accelerator/save_copy.c \
	accelerator/objects.c \
	accelerator/join.c \
	accelerator/mesh_impl.h \
	accelerator/mesh.c \
	accelerator/tp.c \
	accelerator/cp.c \
	accelerator/cp_ring.c \
	accelerator/cp_ring_dev.c \
	accelerator/tp_state.c \
	accelerator/tp_load.c \
	accelerator/tp_seq.c \
	accelerator/autocast.c \
	accelerator/batch_size.c \
	accelerator/memory_report.c \
	accelerator/tracking.c \
	accelerator/mlflow_impl.h \
	accelerator/mlflow.c \
	accelerator/progress.c

# log_with tensorboard: the event messages' C, generated from tensorboard_event.proto by protoc-c.
EXTRA_DIST += accelerator/tensorboard_event.proto
if HAVE_TENSORBOARD
libcaccel_la_SOURCES += accelerator/tensorboard_impl.h accelerator/tensorboard.c
nodist_libcaccel_la_SOURCES = accelerator/tensorboard_event.pb-c.c accelerator/tensorboard_event.pb-c.h
BUILT_SOURCES = accelerator/tensorboard_event.pb-c.c accelerator/tensorboard_event.pb-c.h
CLEANFILES += accelerator/tensorboard_event.pb-c.c accelerator/tensorboard_event.pb-c.h
libcaccel_la_CFLAGS += $(PROTOBUFC_CFLAGS) -DCA_HAVE_TENSORBOARD
libcaccel_la_LIBADD += $(PROTOBUFC_LIBS)
accelerator/tensorboard_event.pb-c.c accelerator/tensorboard_event.pb-c.h: $(srcdir)/accelerator/tensorboard_event.proto
	$(AM_V_GEN)$(MKDIR_P) accelerator && $(PROTOC_C) --proto_path=$(srcdir) --c_out=. accelerator/tensorboard_event.proto
else
EXTRA_DIST += accelerator/tensorboard_impl.h accelerator/tensorboard.c
endif
