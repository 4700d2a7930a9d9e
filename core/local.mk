# core/: the runtime's base above the backends: the registry (built-in backends and dlopen'd
# plugins), opened devices and the caching allocator.
libcaccel_la_SOURCES += \
	core/device_impl.h \
	core/kernel_desc_impl.h \
	core/alloc_impl.h \
	core/registry_impl.h \
	core/registry.c \
	core/device.c \
	core/alloc_caching.c \
	core/kernel_trace.c

# JSON through json-c with its failures said in words, for every reader of JSON above.
libcaccel_la_SOURCES += \
	core/json_impl.h \
	core/json.c
