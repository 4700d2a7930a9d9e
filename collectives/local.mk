# collectives: collective backends (single built in; MPI and Gloo as plugins).
libcaccel_la_SOURCES += \
	collectives/single.h \
	collectives/single.c

# The fp16/bf16 reductions vectorise only with -O3's cost model and without trapping math (the
# conversions are selects over float arithmetic): appended to that file's objects in both plugins.
collectives/%half_reduce.lo collectives/%half_reduce.o: CFLAGS += -O3 -fno-math-errno -fno-trapping-math

# Plugins export ca_plugin_init and nothing else (not even C++ template instances).
EXTRA_DIST += collectives/plugin.map
ca_plugin_ldflags = -Wl,--version-script=$(top_srcdir)/collectives/plugin.map

# The MPI plugin (dlopen'd): built when configure found mpi.h and libmpi.
if HAVE_MPI
pkglib_LTLIBRARIES += collectives/caccel_mpi.la
collectives_caccel_mpi_la_SOURCES = collectives/mpi_plugin.c base/half_impl.h base/avg_impl.h \
	collectives/half_reduce.c collectives/half_reduce_impl.h
collectives_caccel_mpi_la_CFLAGS = $(AM_CFLAGS) $(MPI_CFLAGS) -DCA_BUILDING_PLUGIN
collectives_caccel_mpi_la_LDFLAGS = -module -avoid-version -no-undefined $(ca_plugin_ldflags)
collectives_caccel_mpi_la_LIBADD = libcaccel.la $(MPI_LIBS)
endif

# The Gloo plugin (C++17 shim, dlopen'd): built when configure found libgloo-dev.
if HAVE_GLOO
pkglib_LTLIBRARIES += collectives/caccel_gloo.la
collectives_caccel_gloo_la_SOURCES = collectives/gloo_plugin.cc base/half_impl.h base/avg_impl.h \
	collectives/shm.c collectives/shm_impl.h base/peer_impl.h collectives/half_reduce.c collectives/half_reduce_impl.h
collectives_caccel_gloo_la_CXXFLAGS = $(AM_CXXFLAGS) $(GLOO_CFLAGS) -DCA_BUILDING_PLUGIN
collectives_caccel_gloo_la_CFLAGS = $(AM_CFLAGS) -DCA_BUILDING_PLUGIN
collectives_caccel_gloo_la_LDFLAGS = -module -avoid-version -no-undefined $(ca_plugin_ldflags)
collectives_caccel_gloo_la_LIBADD = libcaccel.la $(GLOO_LIBS)
endif
