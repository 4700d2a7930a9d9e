# base/: what every room and plugin may call: status and error records, logging, dtype and
# operator names, the monotonic clock; and, for the library's rooms only, opening the files its
# readers are handed (file.c).
libcaccel_la_SOURCES += \
	base/base_impl.h \
	base/file_impl.h \
	base/half_impl.h \
	base/kernel_check_impl.h \
	base/ptr_map_impl.h \
	base/peer_impl.h \
	base/slurm_impl.h \
	base/sigout_impl.h \
	base/text_impl.h \
	base/thread_impl.h \
	base/trace_impl.h \
	base/unary_math_impl.h \
	base/file.c \
	base/status.c \
	base/log.c \
	base/types.c \
	base/trace.c \
	base/thread.c
