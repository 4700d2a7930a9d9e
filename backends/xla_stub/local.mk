# backends/xla_stub: the built-in lazy device "xla" (records a graph, compiles and caches it, runs it
# on the cpu backend's kernels at synchronisation points).
ca_xla_sources = \
	backends/xla_stub/xla_impl.h \
	backends/xla_stub/xla_plugin.h \
	backends/xla_stub/xla_device.c \
	backends/xla_stub/xla_kernels.c \
	backends/xla_stub/xla_fusion.c
libcaccel_la_SOURCES += $(ca_xla_sources)
EXTRA_DIST += backends/xla_stub/README.md

# The fused loops are the cpu kernels' loops: the same flags (backends/cpu/local.mk), so that they
# vectorise and round as those do.
backends/xla_stub/%xla_fusion.lo backends/xla_stub/%xla_fusion.o: CFLAGS += $(CA_CPU_KERNEL_CFLAGS)
