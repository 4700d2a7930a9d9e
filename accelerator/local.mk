# accelerator/: the Accelerator, the top layer: prepare, backward with gradient synchronisation,
# accumulation, clipping, mixed precision, and the collective helpers for training loops.
libcaccel_la_SOURCES += \
	accelerator/accelerator_impl.h \
	accelerator/accelerator.c \
	accelerator/ddp.c \
	accelerator/zero.c \
	accelerator/zero_config.c \
	accelerator/zero_state.c \
	accelerator/determinism.c \
	accelerator/checkpoint_impl.h \
	accelerator/checkpoint.c \
	accelerator/state.c \
	accelerator/tracking.c
