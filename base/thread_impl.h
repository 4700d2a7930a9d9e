/* thread_impl.h: what every thread the runtime creates does first (the dataloader's worker, the
 * asynchronous save's writer, a communicator's watchdog, the store server, Gloo's work thread). */
#ifndef CACCEL_THREAD_IMPL_H
#define CACCEL_THREAD_IMPL_H

#include <caccel/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Called at the top of a runtime thread's function, on that thread. Gives the thread an alternate
 * signal stack of its own (sigaltstack, 128 KiB, freed when the thread exits) where it has none, so
 * that a fatal signal on it, a stack overflow included, runs the flight recorder's handler (installed
 * with SA_ONSTACK) and its dump is written. `role` names the thread for the test hook
 * CACCEL_TEST_THREAD_OVERFLOW=<role>, which overflows this thread's stack right away (the crash a
 * test needs on a thread that is not the main one). Never fails: without memory for a stack the
 * thread runs without one, as before. */
CA_API void ca_thread_begin(const char *role);

#ifdef __cplusplus
}
#endif

#endif
