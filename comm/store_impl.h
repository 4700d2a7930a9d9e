/* store_impl.h: the rendezvous store: a token-checked TCP key-value server (store_server.c) and its
 * client (store_client.c) (private). */
#ifndef CACCEL_STORE_IMPL_H
#define CACCEL_STORE_IMPL_H

#include <caccel/backend.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * One server per job, served by `caccel launch` (machine 0) or by rank 0 when
 * there is no launcher. Every connection must first present the job token
 * (CACCEL_JOB_TOKEN); anything else is dropped. Keys are at most
 * CA_STORE_MAX_KEY bytes, values at most CA_STORE_MAX_VALUE. `add` keeps the
 * counter as decimal text, so `get` of a counter returns e.g. "3".
 *
 * Wire format (little endian): request = magic, op, key_len, val_len (u32
 * each), arg (i64), then key and value bytes; reply = magic (u32), status
 * (i32, a ca_status), val_len (u32), arg (i64), then the value.
 */
#define CA_STORE_MAX_KEY 4096u
#define CA_STORE_MAX_TOKEN 256u
/* Environment variable carrying the job token to every process of a job. */
#define CA_STORE_TOKEN_ENV "CACCEL_JOB_TOKEN"

typedef struct ca_store_server ca_store_server;
typedef struct ca_store_client ca_store_client;

/* Starts serving on host:port in a background thread. host NULL or "" binds
 * every address; port 0 lets the kernel choose (see ca_store_server_port).
 * On failure *sys_errno (when non-NULL) receives the socket error, so callers
 * can tell a busy port (EADDRINUSE) from other failures. */
ca_status ca_store_server_start(const char *host, int port, const char *token,
                                ca_store_server **out, int *sys_errno);
int ca_store_server_port(const ca_store_server *s);
/* Stops the thread, closes every connection and frees the data. Accepts NULL. */
void ca_store_server_stop(ca_store_server *s);

/* Connects to the store at host:port presenting `token`, retrying refused
 * connections until timeout_ms passes (the server may start after us).
 * The client is thread-safe: concurrent calls use separate connections. */
ca_status ca_store_client_connect(const char *host, int port, const char *token,
                                  int64_t timeout_ms, ca_store_client **out);
void ca_store_client_close(ca_store_client *c);   /* accepts NULL */
/* The client as a ca_store_ref (valid until ca_store_client_close). */
ca_store_ref ca_store_client_ref(ca_store_client *c);
/* "host:port" of the server, for messages. */
const char *ca_store_client_address(const ca_store_client *c);
/* Who serves the store ("rank 0", "caccel launch"), added to the address in
 * messages: "127.0.0.1:29500 (rank 0)". */
void ca_store_client_set_server_name(ca_store_client *c, const char *who);
/* Deadline for the non-waiting calls (set/add/check), default 30 s. */
void ca_store_client_set_io_timeout(ca_store_client *c, int64_t timeout_ms);
/* Every exchange on c under way or begun in the next `within_ms` gives up by then (later ones keep
 * their own deadlines): a failing communicator's diagnosis and teardown must not wait out a store
 * that no longer answers (its process stopped, the network to it down). Returns the time they give
 * up by (CLOCK_MONOTONIC milliseconds), for ca_store_client_uncut. Thread-safe. */
int64_t ca_store_client_cut(ca_store_client *c, int64_t within_ms);
/* Ends the cut that ca_store_client_cut returned `at` for, unless a later cut replaced it: a cut
 * meant for one step (a diagnosis) does not shorten the requests after it. Thread-safe. */
void ca_store_client_uncut(ca_store_client *c, int64_t at);
/* The last exchange on c timed out unanswered (the store's process stopped or hung). */
bool ca_store_client_silent(ca_store_client *c);
/* The store closed a connection of c or refused a new one after c had reached it: its process has
 * ended (a stopped or unreachable store is silent instead). *why (len bytes, may be NULL) says how. */
bool ca_store_client_gone(ca_store_client *c, char *why, size_t len);
/* Requests are under way on c and none was answered for `ms` (or the last one timed out). */
bool ca_store_client_stalled(ca_store_client *c, int64_t ms);

/* A new random job token (32 hex digits) in buf (at least 33 bytes). */
ca_status ca_store_make_token(char *buf, size_t len);

#endif
