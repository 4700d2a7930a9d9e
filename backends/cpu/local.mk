# backends/cpu: the built-in CPU device backend (host memory, OpenBLAS GEMM, vectorised kernels).
ca_cpu_sources = \
	backends/cpu/cpu_impl.h \
	backends/cpu/cpu_plugin.h \
	backends/cpu/cpu_plugin.c \
	backends/cpu/cpu_device.c \
	backends/cpu/cpu_parallel.h \
	backends/cpu/cpu_parallel.c \
	backends/cpu/cpu_threads.c \
	backends/cpu/cpu_gemm.c \
	backends/cpu/cpu_gemm_split.c \
	backends/cpu/cpu_onednn.c \
	backends/cpu/cpu_cast.c \
	backends/cpu/cpu_elementwise.c \
	backends/cpu/cpu_reduce.c \
	backends/cpu/cpu_nn.c \
	backends/cpu/cpu_rng.c \
	backends/cpu/cpu_attention.c \
	backends/cpu/cpu_optim.c
libcaccel_la_SOURCES += $(ca_cpu_sources)

# The kernels are plain loops written for the vectoriser: they need -O3's
# cost model, and -fno-math-errno so that sqrtf etc. vectorise. Appended
# (GNU make pattern-specific) to every object built from this folder, in the
# library and in the tests and benchmarks that compile these sources.
CA_CPU_KERNEL_CFLAGS = -O3 -fno-math-errno -fno-trapping-math
backends/cpu/%.lo backends/cpu/%.o: CFLAGS += $(CA_CPU_KERNEL_CFLAGS)

# The one file built with OpenMP (cpu_parallel.h says why); the library links its runtime.
# (Objects are named per program: libcaccel_la-cpu_parallel.lo, tests_test_cpu_gemm-cpu_parallel.o, ...;
# every program that compiles $(ca_cpu_sources) links with $(OPENMP_CFLAGS) too.)
backends/cpu/%-cpu_parallel.lo backends/cpu/%-cpu_parallel.o: CFLAGS += $(OPENMP_CFLAGS)
libcaccel_la_LIBADD += $(OPENMP_CFLAGS)
