/* Each runtime thread's alternate signal stack (thread_impl.h). Linux gives a fatal signal to the
 * thread that caused it, and a handler runs on the thread's stack unless the thread has an alternate
 * one and the handler was installed with SA_ONSTACK: a thread whose stack overflowed has no room left
 * for the handler, the kernel kills the process, and the flight recorder writes nothing. */
#include "base/thread_impl.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define ALT_STACK_BYTES (128 * 1024)   /* the flight recorder's dump needs about 30 KB */

static pthread_key_t alt_key;
static pthread_once_t alt_once = PTHREAD_ONCE_INIT;

/* At the thread's exit: the stack is the thread's no more, then it goes. */
static void alt_free(void *stack) {
    stack_t off = {.ss_flags = SS_DISABLE}, cur;
    if (sigaltstack(NULL, &cur) == 0 && cur.ss_sp == stack) (void)sigaltstack(&off, NULL);
    munmap(stack, ALT_STACK_BYTES);
}

static void alt_key_make(void) {
    if (pthread_key_create(&alt_key, alt_free) != 0) alt_key = (pthread_key_t)-1;
}

static void alt_stack(void) {
    stack_t cur;
    if (sigaltstack(NULL, &cur) != 0 || !(cur.ss_flags & SS_DISABLE)) return;   /* it has one (a sanitizer's) */
    pthread_once(&alt_once, alt_key_make);
    if (alt_key == (pthread_key_t)-1) return;
    void *p = mmap(NULL, ALT_STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    stack_t ss = {.ss_sp = p, .ss_size = ALT_STACK_BYTES};
    if (sigaltstack(&ss, NULL) != 0 || pthread_setspecific(alt_key, p) != 0) {
        stack_t off = {.ss_flags = SS_DISABLE};
        (void)sigaltstack(&off, NULL);
        munmap(p, ALT_STACK_BYTES);
    }
}

/* Recurses until the stack runs out (each frame's page written, so the guard page is hit). */
static int overflow(long n) {
    volatile char frame[4096];
    frame[0] = (char)n;
    frame[sizeof frame - 1] = (char)(n >> 8);
    if (n <= 0) return frame[0];
    return overflow(n - 1) + frame[sizeof frame - 1];
}

void ca_thread_begin(const char *role) {
    alt_stack();
    const char *t = getenv("CACCEL_TEST_THREAD_OVERFLOW");
    if (t && role && !strcmp(t, role)) (void)overflow(1L << 40);
}
