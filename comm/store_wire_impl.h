/* store_wire_impl.h: what the rendezvous store's server (store_server.c) and client (store_client.c)
 * share: the wire format of store_impl.h, its byte order, the clock and address resolution (private). */
#ifndef CACCEL_STORE_WIRE_IMPL_H
#define CACCEL_STORE_WIRE_IMPL_H

#include "comm/store_impl.h"

#include <caccel/status.h>

#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>

#define MAGIC_REQ 0x31534143u   /* "CAS1" */
#define MAGIC_REP 0x52534143u   /* "CASR" */
#define REQ_HDR 24
#define REP_HDR 20
#define MAX_WAIT_LIST (1u << 20)
/* Forever, for practical purposes, when a caller passes a negative timeout. */
#define DEFAULT_WAIT_MS (30LL * 60 * 1000)

enum { OP_HELLO = 1, OP_SET, OP_GET, OP_ADD, OP_CHECK, OP_WAIT };

static inline int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* host:port as addresses to bind (passive) or to connect to; `what` starts the error message. */
static inline ca_status resolve(const char *host, int port, bool passive, struct addrinfo **out, const char *what) {
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = passive ? AI_PASSIVE : 0 };
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host && *host ? host : NULL, ps, &hints, out);
    if (rc != 0)
        return ca_error(CA_ERR_IO, "%s: cannot resolve '%s': %s", what, host && *host ? host : "*",
                        gai_strerror(rc));
    return CA_OK;
}

#endif
