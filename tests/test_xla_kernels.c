/* Kernel parity on the lazy xla device: every case of the CUDA backend's parity test, recorded into
 * graphs and run at the synchronisation, bit-identical to the eager CPU backend. */
#define TC_XLA 1
#include "test_cuda_kernels.c"
