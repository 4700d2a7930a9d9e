/* sigout_impl.h: text written to a file descriptor through a fixed buffer and write(2), with no
 * malloc, no stdio and no lock, so that a signal handler may use it (the flight recorder's dump on
 * SIGUSR1 or a fatal signal) as well as ordinary code. The caller owns the descriptor; the buffer
 * lives in the struct (on the caller's stack: one per writer, nothing shared between threads). */
#ifndef CACCEL_SIGOUT_IMPL_H
#define CACCEL_SIGOUT_IMPL_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

typedef struct ca_sigout {
    int fd;
    bool failed;      /* a write(2) failed: the rest is dropped, the caller checks this at the end */
    size_t n;
    char buf[4096];
} ca_sigout;

static inline void ca_sigout_flush(ca_sigout *o) {
    for (size_t at = 0; at < o->n && !o->failed;) {
        ssize_t w = write(o->fd, o->buf + at, o->n - at);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) o->failed = true;
        else at += (size_t)w;
    }
    o->n = 0;
}

static inline void ca_sigout_mem(ca_sigout *o, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (o->n == sizeof o->buf) ca_sigout_flush(o);
        o->buf[o->n++] = s[i];
    }
}

static inline void ca_sigout_str(ca_sigout *o, const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    ca_sigout_mem(o, s, n);
}

/* v in decimal into buf (at least 21 bytes); returns buf. */
static inline const char *ca_sigout_fmt_u64(uint64_t v, char *buf) {
    char t[21];
    int n = 0;
    do t[n++] = (char)('0' + v % 10); while ((v /= 10) != 0);
    for (int i = 0; i < n; i++) buf[i] = t[n - 1 - i];
    buf[n] = '\0';
    return buf;
}

static inline void ca_sigout_u64(ca_sigout *o, uint64_t v) {
    char b[21];
    ca_sigout_str(o, ca_sigout_fmt_u64(v, b));
}

static inline void ca_sigout_i64(ca_sigout *o, int64_t v) {
    if (v < 0) ca_sigout_mem(o, "-", 1);
    ca_sigout_u64(o, v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v);
}

/* s as a quoted JSON string, at most max bytes of it (a slot another thread may be rewriting need
 * not hold its terminator in time). */
static inline void ca_sigout_json(ca_sigout *o, const char *s, size_t max) {
    static const char hex[] = "0123456789abcdef";
    ca_sigout_mem(o, "\"", 1);
    for (size_t i = 0; i < max && s[i]; i++) {
        unsigned char ch = (unsigned char)s[i];
        char e[6] = {'\\', (char)ch};
        if (ch == '"' || ch == '\\') ca_sigout_mem(o, e, 2);
        else if (ch >= 0x20) ca_sigout_mem(o, s + i, 1);
        else {
            char u[6] = {'\\', 'u', '0', '0', hex[ch >> 4], hex[ch & 15]};
            ca_sigout_mem(o, u, 6);
        }
    }
    ca_sigout_mem(o, "\"", 1);
}

#endif
