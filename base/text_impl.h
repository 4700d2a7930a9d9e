/* text_impl.h: a value from the environment, a file or the command line quoted inside one message line. */
#ifndef CACCEL_TEXT_IMPL_H
#define CACCEL_TEXT_IMPL_H

#include <stddef.h>
#include <stdio.h>

/* s with its control characters written as C escapes (\n, \r, \t, else \xHH, DEL included), into
 * buf (len > 4), cut with "..." where it does not fit; returns buf. A value echoed into an error
 * must not break the line, nor carry terminal escapes: ACCELERATE_MIXED_PRECISION=$'fp16\n' shows
 * as 'fp16\n'. */
static inline const char *ca_escape(const char *s, char *buf, size_t len) {
    size_t n = 0;
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e[5] = {(char)c, 0};
        if (c == '\n' || c == '\r' || c == '\t')
            snprintf(e, sizeof e, "\\%c", c == '\n' ? 'n' : c == '\r' ? 'r' : 't');
        else if (c < 0x20 || c == 0x7f) snprintf(e, sizeof e, "\\x%02x", c);
        size_t k = 0;
        while (e[k]) k++;
        if (n + k + 4 > len) {   /* room for "..." and the terminator */
            snprintf(buf + n, len - n, "...");
            return buf;
        }
        for (size_t i = 0; i < k; i++) buf[n++] = e[i];
    }
    buf[n] = '\0';
    return buf;
}

#endif
