/* Fuzz target: the rendezvous store's server. Each input starts a store server on the loopback
 * interface and is sent to it over one connection, then the write side is shut and the replies
 * are read until the server closes the connection: it must drop or answer anything it is sent.
 * An odd first byte puts the job token's HELLO request first, so requests after it reach the
 * authenticated handlers (set, add, check, get, wait). */
#include "tests/fuzz/fuzz_util.h"

#include "comm/store_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#define TOKEN "0123456789abcdef0123456789abcdef"

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static bool send_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return false;   /* the server dropped the connection */
        p += k;
        n -= (size_t)k;
    }
    return true;
}

/* -1 when the loopback has no port left: hundreds of connections a second leave tens of thousands
 * in TIME_WAIT, more than the ephemeral range; that input is skipped, it is not a finding. */
static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0) abort();
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
    if (errno == EINTR) {   /* libFuzzer's SIGALRM: the connection goes on; wait for its result */
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int e = 0;
        socklen_t len = sizeof e;
        while (poll(&p, 1, -1) < 0 && errno == EINTR) {
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0 && e == 0) return fd;
        errno = e;
    }
    if (errno != EADDRNOTAVAIL && errno != EADDRINUSE) {
        perror("fuzz_store: connect");
        abort();
    }
    close(fd);
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fz_tmpdir();   /* quiet logs */
    ca_store_server *s = NULL;
    if (ca_store_server_start("127.0.0.1", 0, TOKEN, &s, NULL) != CA_OK) abort();
    int fd = connect_to(ca_store_server_port(s));
    if (fd < 0) {
        ca_store_server_stop(s);
        return 0;
    }
    bool ok = true;
    if (data[0] & 1) {   /* HELLO: magic "CAS1", op 0, no key, the token as the value, arg 0 */
        uint8_t hello[24 + sizeof TOKEN - 1] = {0};
        put32(hello, 0x31534143u);
        put32(hello + 4, 1);
        put32(hello + 12, sizeof TOKEN - 1);
        memcpy(hello + 24, TOKEN, sizeof TOKEN - 1);
        ok = send_all(fd, hello, sizeof hello);
    }
    if (ok) send_all(fd, data + 1, size - 1);
    shutdown(fd, SHUT_WR);
    uint8_t buf[4096];
    while (recv(fd, buf, sizeof buf, 0) > 0) {
    }
    close(fd);
    ca_store_server_stop(s);
    return 0;
}
