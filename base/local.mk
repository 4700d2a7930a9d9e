# base/: what every room and plugin may call: status and error records, logging, dtype and
# operator names, the monotonic clock.
libcaccel_la_SOURCES += \
	base/base_impl.h \
	base/half_impl.h \
	base/kernel_check_impl.h \
	base/ptr_map_impl.h \
	base/peer_impl.h \
	base/slurm_impl.h \
	base/text_impl.h \
	base/unary_math_impl.h \
	base/status.c \
	base/log.c \
	base/types.c
