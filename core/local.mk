# core/: the runtime: configuration, registry, devices, the caching allocator, communicators,
# the process environment and the rendezvous store.
libcaccel_la_SOURCES += \
	core/device_impl.h \
	core/alloc_impl.h \
	core/registry_impl.h \
	core/registry.c \
	core/device.c \
	core/alloc_caching.c

# Configuration: Accelerate's keys, file, env and flags (config*.c).
libcaccel_la_SOURCES += \
	core/config_impl.h \
	core/config.c \
	core/config_keys.c \
	core/config_file.c \
	core/config_effects.c

# Communicators (sequence numbers, deadlines, desync diagnosis), the process environment and the
# rendezvous store (a token-checked TCP key-value server every launcher and rank talks to).
libcaccel_la_SOURCES += \
	core/comm_impl.h \
	core/comm.c \
	core/comm_diag_impl.h \
	core/comm_diag.c \
	core/procenv_impl.h \
	core/procenv.c \
	core/store_impl.h \
	core/store.c

# JSON through json-c with its failures said in words, for every reader of JSON above.
libcaccel_la_SOURCES += \
	core/json_impl.h \
	core/json.c
