/* Gradient checks through the public ops API on the lazy xla device: finite differences, and the
 * same forward and backward on the CPU, bit for bit. */
#define TC_XLA 1
#include "test_cuda_autograd.c"
