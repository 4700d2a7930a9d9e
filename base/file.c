/* base/file.c: opening and reading the files the library is handed (base/file_impl.h). */
#include "base/file_impl.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef __linux__
#include <sys/vfs.h>
#endif
#include <unistd.h>

static const char *file_type(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "of another type";
}

/* A kernel file of /proc or /sys: it says it is regular and reports a size of 0 (or 4096) whatever
 * it holds, and some of them (/proc/self/mem) fail every read, so no size bound can hold. */
static bool kernel_file(int fd) {
#ifdef __linux__
    struct statfs fs;
    return fstatfs(fd, &fs) == 0 && (fs.f_type == 0x9fa0 /* PROC_SUPER_MAGIC */ ||
                                     fs.f_type == 0x62656572 /* SYSFS_MAGIC */);
#else
    (void)fd;
    return false;
#endif
}

/* Why: a FIFO opened for reading blocks until a writer comes, and a device has no end; O_NONBLOCK
 * makes the open return at once so that fstat can tell what the file is. On a regular file the flag
 * changes nothing, and it is cleared before the descriptor is handed on. */
ca_status ca_file_open(const char *path, ca_file_kind kind, int *fd, uint64_t *size) {
    *fd = -1;
    int d;
    do d = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    while (d < 0 && errno == EINTR);
    if (d < 0) {
        int e = errno;
        return ca_error(e == ENOENT ? kind.missing : CA_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    ca_status s = CA_OK;
    int flags;
    if (fstat(d, &st) != 0)
        s = ca_error(CA_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        s = ca_error(CA_ERR_IO, "%s: not a regular file (%s); %s must be one", path, file_type(st.st_mode),
                     kind.what);
    else if (kernel_file(d))
        s = ca_error(CA_ERR_IO, "%s: a file of the kernel's /proc or /sys, not a file on disk (its size is not "
                     "known before it is read); %s must be a regular file", path, kind.what);
    else if ((uint64_t)st.st_size > kind.max_bytes)
        s = ca_error(kind.too_large, "%s: the file is larger than %llu bytes, the limit for %s (it has %llu bytes)",
                     path, (unsigned long long)kind.max_bytes, kind.what, (unsigned long long)st.st_size);
    else if ((flags = fcntl(d, F_GETFL)) < 0 || fcntl(d, F_SETFL, flags & ~O_NONBLOCK) != 0)
        s = ca_error(CA_ERR_IO, "%s: fcntl: %s", path, strerror(errno));
    if (s != CA_OK) {
        close(d);
        return s;
    }
    *fd = d;
    if (size) *size = (uint64_t)st.st_size;
    return CA_OK;
}

ca_status ca_file_fopen(const char *path, ca_file_kind kind, FILE **f, uint64_t *size) {
    *f = NULL;
    int fd;
    ca_status s = ca_file_open(path, kind, &fd, size);
    if (s != CA_OK) return s;
    if (!(*f = fdopen(fd, "rb"))) {
        int e = errno;
        close(fd);
        return ca_error(CA_ERR_NOMEM, "%s: cannot open a stream: %s", path, strerror(e));
    }
    return CA_OK;
}

int64_t ca_file_read_fd(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        size_t ask = n - got < ((size_t)1 << 30) ? n - got : ((size_t)1 << 30);
        ssize_t r = read(fd, (char *)buf + got, ask);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (int64_t)got;
}

ca_status ca_file_read(const char *path, ca_file_kind kind, char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    ca_status s = ca_file_open(path, kind, &fd, &size);
    if (s != CA_OK) return s;
    char *b = size < SIZE_MAX ? malloc((size_t)size + 1) : NULL;
    int64_t got = b ? ca_file_read_fd(fd, b, (size_t)size) : 0;
    int e = errno;
    close(fd);
    if (!b)
        s = ca_error(CA_ERR_NOMEM, "%s: cannot allocate %llu bytes for the file", path, (unsigned long long)size);
    else if (got < 0)
        s = ca_error(CA_ERR_IO, "%s: cannot read: %s", path, strerror(e));
    else if ((uint64_t)got != size)
        s = ca_error(CA_ERR_IO, "%s: read %lld of %llu bytes (the file shrank while it was read)", path,
                     (long long)got, (unsigned long long)size);
    if (s != CA_OK) {
        free(b);
        return s;
    }
    b[size] = '\0';
    *buf = b;
    *len = (size_t)size;
    return CA_OK;
}
