/* peer_impl.h: is a process of this job, on this machine, still running? (the communicators' and shared memory's liveness checks) */
#ifndef CACCEL_PEER_IMPL_H
#define CACCEL_PEER_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * A rank killed by SIGKILL announces nothing. Its peers on the same machine
 * see it through /proc: a process that no longer exists, a zombie (its parent
 * has not reaped it yet), or a pid that now belongs to another process (a
 * different start time). A pid means something only within its pid namespace
 * on its kernel, so a peer is judged this way only when its host key (boot id
 * and pid namespace) equals ours.
 */

/* State letter and start time (clock ticks after boot) of process pid; false when there is none. */
static inline bool ca_proc_stat(long pid, char *state, unsigned long long *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');   /* the command name may hold spaces and parentheses */
    if (!p || !p[1]) return false;
    /* field 3 is the state, field 22 the start time */
    return sscanf(p + 2, "%c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu", state,
                  start) == 2;
}

static inline unsigned long long ca_proc_self_start(void) {
    char st;
    unsigned long long start = 0;
    return ca_proc_stat((long)getpid(), &st, &start) ? start : 0;
}

/* This kernel's boot and this pid namespace, as one number (0 when unknown). */
static inline uint64_t ca_proc_host_key(void) {
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
    }
    struct stat ns;
    if (!boot[0] || stat("/proc/self/ns/pid", &ns) != 0) return 0;
    uint64_t h = 1469598103934665603ull;
    for (const char *p = boot; *p && *p != '\n'; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    h = (h ^ (uint64_t)ns.st_ino) * 1099511628211ull;
    h = (h ^ (uint64_t)ns.st_dev) * 1099511628211ull;
    return h ? h : 1;
}

/* True when the process (pid, start) is known to have ended. */
static inline bool ca_proc_ended(long pid, unsigned long long start) {
    if (pid <= 0) return false;
    char st = '?';
    unsigned long long now = 0;
    if (!ca_proc_stat(pid, &st, &now)) return true;
    return st == 'Z' || st == 'X' || (start && now != start);
}

/* True when the process (pid, start) exists and is stopped (SIGSTOP, SIGTSTP, a debugger): it keeps
 * its place in the job but answers nothing, and does not publish its state. */
static inline bool ca_proc_stopped(long pid, unsigned long long start) {
    char st = '?';
    unsigned long long now = 0;
    if (pid <= 0 || !ca_proc_stat(pid, &st, &now) || (start && now != start)) return false;
    return st == 'T' || st == 't';
}

#endif
