# comm/: communicators (sequence numbers, deadlines, desync diagnosis), the process environment and
# enable_cpu_affinity's binding of each local rank to its cores (hwloc), the rendezvous store (a token-checked TCP key-value server every launcher and rank talks to).
libcaccel_la_SOURCES += \
	comm/comm_impl.h \
	comm/comm.c \
	comm/comm_diag_impl.h \
	comm/comm_diag.c \
	comm/flightrec.c \
	comm/procenv_impl.h \
	comm/procenv.c \
	comm/affinity_impl.h \
	comm/affinity.c \
	comm/store_impl.h \
	comm/store_wire_impl.h \
	comm/store_server.c \
	comm/store_client.c
