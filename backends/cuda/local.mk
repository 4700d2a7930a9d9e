# backends/cuda: the CUDA device backend and the NCCL collective backend, one dlopen'd plugin
# (caccel_cuda.so in $(pkglibdir)). libcaccel never links CUDA; the plugin links the CUDA runtime
# (statically where the toolkit has libcudart_static.a), so it loads (and reports why there is no GPU)
# on machines without a driver; it opens cuBLAS only when a GPU opens (cuda_blas.c) and NCCL only
# when a communicator needs it (nccl_coll.c): loading it costs next to nothing and needs neither.
ca_cuda_cu_sources = \
	backends/cuda/cuda_elementwise.cu \
	backends/cuda/cuda_reduce.cu \
	backends/cuda/cuda_nn.cu \
	backends/cuda/cuda_rng.cu \
	backends/cuda/cuda_optim.cu \
	backends/cuda/cuda_attention.cu
ca_cuda_cu_objects = \
	backends/cuda/cuda_elementwise.lo \
	backends/cuda/cuda_reduce.lo \
	backends/cuda/cuda_nn.lo \
	backends/cuda/cuda_rng.lo \
	backends/cuda/cuda_optim.lo \
	backends/cuda/cuda_attention.lo
EXTRA_DIST += $(ca_cuda_cu_sources) backends/cuda/cuda_common.cuh backends/cuda/nvcc-libtool.sh

if HAVE_CUDA
pkglib_LTLIBRARIES += backends/cuda/caccel_cuda.la
backends_cuda_caccel_cuda_la_SOURCES = \
	backends/cuda/cuda_impl.h \
	backends/cuda/cuda_plugin.c \
	backends/cuda/cuda_device.c \
	backends/cuda/cuda_alloc.c \
	backends/cuda/cuda_blas.c \
	backends/cuda/cuda_gemm.c \
	backends/cuda/nccl_coll.c
backends_cuda_caccel_cuda_la_CFLAGS = $(AM_CFLAGS) $(CUDA_CPPFLAGS) -DCA_BUILDING_PLUGIN \
	-DCA_CUDA_ARCHS='"$(CUDA_ARCHS)"'
backends_cuda_caccel_cuda_la_LDFLAGS = -module -avoid-version -no-undefined $(ca_plugin_ldflags)
# The kernels are compiled by nvcc (the rule below) and linked in as libtool objects.
backends_cuda_caccel_cuda_la_LIBADD = $(ca_cuda_cu_objects) libcaccel.la $(CUDA_LIBS)
endif

# .cu -> .lo through libtool; nvcc-libtool.sh hands libtool's -fPIC to the host compiler.
AM_V_NVCC = $(am__v_NVCC_@AM_V@)
am__v_NVCC_ = $(am__v_NVCC_@AM_DEFAULT_V@)
am__v_NVCC_0 = @echo "  NVCC    " $@;
am__v_NVCC_1 =
ca_nvcc_compile = $(LIBTOOL) $(AM_V_lt) --tag=CC --mode=compile \
	$(SHELL) $(top_srcdir)/backends/cuda/nvcc-libtool.sh $(NVCC) $(NVCC_FLAGS) \
	$(DEFS) $(DEFAULT_INCLUDES) $(AM_CPPFLAGS) $(CPPFLAGS) $(CUDA_CPPFLAGS) \
	--compiler-options -fvisibility=hidden -DCA_BUILDING_PLUGIN -DCA_CUDA_ARCHS='"$(CUDA_ARCHS)"'
.cu.lo:
	$(AM_V_NVCC)$(ca_nvcc_compile) -c -o $@ $<
$(ca_cuda_cu_objects): $(srcdir)/backends/cuda/cuda_common.cuh $(srcdir)/backends/cuda/cuda_impl.h \
	$(top_srcdir)/include/caccel/backend.h $(top_srcdir)/include/caccel/types.h \
	$(top_srcdir)/include/caccel/status.h
# the bundle for GPU machines without Debian packages (docs/CUDA.md)
EXTRA_DIST += tools/gpu-bundle.sh
backends/cuda/cuda_attention.lo: $(srcdir)/backends/cuda/cuda_att_plan.h
