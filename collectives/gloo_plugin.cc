// The Gloo collective plugin: TCP transport, rendezvous through the caccel store, ordered async work queue.
//
// C++ lives only in this file. Every extern "C" entry point catches every
// exception and turns it into a ca_status with a message; no C++ type crosses
// the boundary.
//
// Gloo provides the connections (full mesh over TCP, set up through the
// caccel store) and the unbound-buffer send/recv with timeouts; the
// collectives are written here on top of them (ring all-reduce with pipelined
// segments, or recursive doubling for small buffers over a power-of-two world,
// ring all-gather and reduce-scatter, binomial broadcast, dissemination
// barrier). Owning the buffers is what lets abort() wake an
// operation blocked in Gloo at once: Gloo's own algorithms keep theirs private
// and can only be left through their timeout.

#include <caccel/backend.h>
#include <caccel/log.h>

#include "base/avg_impl.h"
#include "base/thread_impl.h"
#include "collectives/half_reduce_impl.h"
#include "collectives/shm_impl.h"

#include <gloo/common/error.h>
#include <gloo/config.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

// Slot prefixes for the collectives written here (Gloo's own are 0x01..0x08).
constexpr uint8_t kAllReducePrefix = 0x21;
constexpr uint8_t kAllGatherPrefix = 0x22;
constexpr uint8_t kReduceScatterPrefix = 0x23;
constexpr uint8_t kBroadcastPrefix = 0x24;
constexpr uint8_t kBarrierPrefix = 0x25;
// Point-to-point: one slot for every message, matched in order between two ranks as MPI's are.
constexpr uint8_t kP2PPrefix = 0x26;
// Bytes moved per message inside a ring step: one segment is reduced while the next arrives.
constexpr size_t kSegmentBytes = 1 << 20;
// All-reduces up to this size over a power-of-two number of ranks exchange whole buffers by recursive
// doubling: log2(N) messages on the critical path instead of the ring's 2 (N - 1). Over TCP a message
// costs about 100 us of wake-ups whatever its size, which dominates below this.
constexpr size_t kDoublingMaxBytes = 256 << 10;

// A failure with the ca_status it maps to.
struct CaError : std::runtime_error {
    ca_status status;
    CaError(ca_status s, const std::string &m) : std::runtime_error(m), status(s) {}
};

// Records the exception being handled as the calling thread's caccel error.
ca_status record_current(const char *what, int rank) {
    try {
        throw;
    } catch (const CaError &e) {
        return ca_error(e.status, "%s (backend gloo, rank %d): %s", what, rank, e.what());
    } catch (const gloo::IoException &e) {
        return ca_error(CA_ERR_BACKEND, "%s (backend gloo, rank %d): %s", what, rank, e.what());
    } catch (const gloo::Exception &e) {
        return ca_error(CA_ERR_BACKEND, "%s (backend gloo, rank %d): %s", what, rank, e.what());
    } catch (const std::bad_alloc &) {
        return ca_error(CA_ERR_NOMEM, "%s (backend gloo, rank %d): out of memory", what, rank);
    } catch (const std::exception &e) {
        return ca_error(CA_ERR_BACKEND, "%s (backend gloo, rank %d): %s", what, rank, e.what());
    } catch (...) {
        return ca_error(CA_ERR_INTERNAL, "%s (backend gloo, rank %d): unknown exception", what, rank);
    }
}

// Gloo's rendezvous over the caccel store, under the communicator's prefix.
class CaStore : public gloo::rendezvous::Store {
  public:
    CaStore(ca_store_ref ref, std::string prefix, std::chrono::milliseconds timeout)
        : ref_(ref), prefix_(std::move(prefix)), timeout_(timeout) {}

    void set(const std::string &key, const std::vector<char> &data) override {
        std::string k = prefix_ + key;
        check(ref_.ops->set(ref_.store, k.c_str(), data.data(), data.size()));
    }

    std::vector<char> get(const std::string &key) override {
        std::string k = prefix_ + key;
        std::vector<char> buf(64 * 1024);
        size_t len = buf.size();
        ca_status s = ref_.ops->get(ref_.store, k.c_str(), buf.data(), &len, timeout_.count());
        if (s == CA_ERR_INVALID && len > buf.size()) {
            buf.resize(len);
            s = ref_.ops->get(ref_.store, k.c_str(), buf.data(), &len, timeout_.count());
        }
        check(s);
        buf.resize(len);
        return buf;
    }

    void wait(const std::vector<std::string> &keys) override { wait(keys, timeout_); }

    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override {
        std::vector<std::string> full;
        std::vector<const char *> ptrs;
        full.reserve(keys.size());
        for (const auto &k : keys) full.push_back(prefix_ + k);
        for (const auto &k : full) ptrs.push_back(k.c_str());
        int64_t t = timeout.count() > 0 ? timeout.count() : timeout_.count();
        check(ref_.ops->wait(ref_.store, ptrs.data(), (int)ptrs.size(), t));
    }

  private:
    static void check(ca_status s) {
        if (s != CA_OK) throw CaError(s, std::string("rendezvous store: ") + ca_last_error());
    }
    ca_store_ref ref_;
    std::string prefix_;
    std::chrono::milliseconds timeout_;
};

enum class Kind { AllReduce, Broadcast, AllGather, ReduceScatter, Barrier, SendRecv };

struct Op {
    Kind kind;
    const void *send = nullptr;
    void *recv = nullptr;
    size_t count = 0;
    ca_dtype dt = CA_F32;
    ca_reduce_op rop = CA_OP_SUM;
    int root = 0;
    int src = -1;              // SendRecv: root is the rank sent to (-1 none), src the one received from
    size_t rcount = 0;         // SendRecv: the elements received
    uint32_t tag = 0;
    int64_t deadline_ms = 0;
    int64_t issued_ms = 0;
    // state, guarded by the communicator's mutex
    bool running = false;
    bool done = false;
    ca_status status = CA_OK;
    std::string error;
};

using ReduceFn = void (*)(void *, const void *, const void *, size_t);

// Blocks of a fixed 16 elements through a local array: the compiler vectorises them at -O2 (its
// cheap cost model does not vectorise a loop of unknown length whose output may alias an input,
// and out is one of the inputs when more than two ranks reduce). About 4x faster at 1 MiB.
constexpr size_t kBlock = 16;

template <typename T, int OP>
inline T reduce_one(T u, T v) {
    if (OP == 0) return static_cast<T>(u + v);
    if (OP == 1) return (u < v || u != u) ? u : v;
    return (u > v || u != u) ? u : v;
}

template <typename T, int OP>
void reduce_plain(void *out, const void *a, const void *b, size_t n) {
    T *o = static_cast<T *>(out);
    const T *x = static_cast<const T *>(a);
    const T *y = static_cast<const T *>(b);
    size_t i = 0;
    for (; i + kBlock <= n; i += kBlock) {
        T t[kBlock];
        for (size_t k = 0; k < kBlock; k++) t[k] = reduce_one<T, OP>(x[i + k], y[i + k]);
        for (size_t k = 0; k < kBlock; k++) o[i + k] = t[k];
    }
    for (; i < n; i++) o[i] = reduce_one<T, OP>(x[i], y[i]);
}

template <int OP>
ReduceFn pick(ca_dtype dt) {
    switch (dt) {
    case CA_F32: return reduce_plain<float, OP>;
    case CA_F16:
    case CA_BF16: return ca_half_reducer(dt, OP);   // collectives/half_reduce.c
    case CA_I32: return reduce_plain<int32_t, OP>;
    case CA_I64: return reduce_plain<int64_t, OP>;
    case CA_U8: return reduce_plain<uint8_t, OP>;
    default: return nullptr;
    }
}

ReduceFn reduce_fn(ca_dtype dt, ca_reduce_op op) {
    switch (op) {
    case CA_OP_SUM:
    case CA_OP_AVG: return pick<0>(dt);
    case CA_OP_MIN: return pick<1>(dt);
    case CA_OP_MAX: return pick<2>(dt);
    }
    return nullptr;
}

// AVG = SUM / world size (integers truncate toward zero).
void divide(void *buf, size_t n, ca_dtype dt, int p) {
    switch (dt) {
    case CA_F32:
        ca_avg_f32(static_cast<float *>(buf), n, p);
        break;
    case CA_F16:
    case CA_BF16:
        ca_half_divide(dt, static_cast<uint16_t *>(buf), n, p);
        break;
    case CA_I32: {
        int32_t *x = static_cast<int32_t *>(buf);
        for (size_t i = 0; i < n; i++) x[i] /= p;
        break;
    }
    case CA_I64: {
        int64_t *x = static_cast<int64_t *>(buf);
        for (size_t i = 0; i < n; i++) x[i] /= p;
        break;
    }
    case CA_U8: {
        uint8_t *x = static_cast<uint8_t *>(buf);
        for (size_t i = 0; i < n; i++) x[i] = static_cast<uint8_t>(x[i] / p);
        break;
    }
    default:
        break;
    }
}

// The shared-memory all-reduce divides each rank's reduced part before it is copied out.
struct Average {
    ca_dtype dt;
    int p;
};

void divide_part(void *buf, size_t n, void *arg) {
    const Average *a = static_cast<const Average *>(arg);
    divide(buf, n, a->dt, a->p);
}

// The local address the routing table would use to reach host:port.
std::string route_to(const char *host, const char *port) {
    struct addrinfo hints = {}, *ai = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai) return "";
    std::string out;
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        char buf[NI_MAXHOST];
        if (getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &sl) == 0 &&
            getnameinfo(reinterpret_cast<sockaddr *>(&ss), sl, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) == 0)
            out = buf;
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return out;
}

using Clock = std::chrono::steady_clock;

class Comm;

// An unbound buffer registered with its communicator while it lives, so that
// abort() can wake whoever waits on it.
class LiveBuffer {
  public:
    LiveBuffer(Comm &c, void *ptr, size_t bytes);
    ~LiveBuffer();
    LiveBuffer(const LiveBuffer &) = delete;
    LiveBuffer &operator=(const LiveBuffer &) = delete;
    gloo::transport::UnboundBuffer *operator->() { return buf_.get(); }
    void wait_recv(int64_t deadline_ms, const char *what);
    void wait_send(int64_t deadline_ms, const char *what);

  private:
    Comm &c_;
    std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
};

// Element ranges of `parts` near-equal chunks of n elements.
struct Chunks {
    std::vector<size_t> off, len;
    Chunks(size_t n, int parts) : off(static_cast<size_t>(parts)), len(static_cast<size_t>(parts)) {
        size_t base = n / static_cast<size_t>(parts), extra = n % static_cast<size_t>(parts), o = 0;
        for (int i = 0; i < parts; i++) {
            off[static_cast<size_t>(i)] = o;
            len[static_cast<size_t>(i)] = base + (static_cast<size_t>(i) < extra ? 1 : 0);
            o += len[static_cast<size_t>(i)];
        }
    }
};

class Comm {
  public:
    int rank = 0, size = 1;
    int64_t timeout_ms = 0;
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    std::atomic<bool> aborted{false};

    std::mutex mu;
    std::condition_variable work_cv;   // the worker: something queued, or stop
    std::condition_variable done_cv;   // waiters: an operation finished
    std::deque<std::shared_ptr<Op>> queue;
    bool busy = false;                 // an operation is executing (worker or a waiter)
    bool stop = false;
    uint32_t next_tag = 0;
    std::thread worker;
    std::vector<gloo::transport::UnboundBuffer *> live;   // guarded by mu
    // Ranks all on one machine move data through shared memory; the sockets
    // stay for the rendezvous and for jobs that span machines.
    ca_shm *shm = nullptr;

    ~Comm() {
        {
            std::lock_guard<std::mutex> lock(mu);
            stop = true;
        }
        work_cv.notify_all();
        if (worker.joinable()) worker.join();
        ca_shm_destroy(shm);
    }

    static void shm_check(ca_status s) {
        if (s != CA_OK) throw CaError(s, ca_last_error());
    }

    // The same operations through the shared-memory segment.
    void dispatch_shm(Op &op, size_t es) {
        switch (op.kind) {
        case Kind::SendRecv:   // dispatched before the switch
            return;
        case Kind::Barrier:
            shm_check(ca_shm_barrier(shm, op.deadline_ms));
            return;
        case Kind::Broadcast:
            if (op.count) shm_check(ca_shm_broadcast(shm, op.recv, op.count * es, op.root, op.deadline_ms));
            return;
        case Kind::AllReduce:
            if (op.count == 0) return;
            if (op.send != op.recv) memmove(op.recv, op.send, op.count * es);
            {
                Average avg{op.dt, size};
                shm_check(ca_shm_all_reduce(shm, op.recv, op.count, es, reduce_fn(op.dt, op.rop),
                                            op.rop == CA_OP_AVG ? divide_part : nullptr, &avg, op.deadline_ms));
            }
            return;
        case Kind::AllGather:
            if (op.count)
                shm_check(ca_shm_all_gather(shm, op.send, op.recv, op.count * es, op.deadline_ms));
            return;
        case Kind::ReduceScatter:
            if (op.count == 0) return;
            shm_check(ca_shm_reduce_scatter(shm, op.send, op.recv, op.count, es, reduce_fn(op.dt, op.rop),
                                            op.deadline_ms));
            if (op.rop == CA_OP_AVG) divide(op.recv, op.count, op.dt, size);
            return;
        }
    }

    void run_worker() {
        std::unique_lock<std::mutex> lock(mu);
        for (;;) {
            work_cv.wait(lock, [&] { return stop || (!queue.empty() && !busy); });
            if (stop) break;
            // A blocking call waits on its operation right after issuing it and runs it itself;
            // give it that moment before taking the operation to this thread.
            int64_t age = ca_now_ms() - queue.front()->issued_ms;
            if (age < 1) {
                work_cv.wait_for(lock, std::chrono::microseconds(200));
                continue;
            }
            std::shared_ptr<Op> op = queue.front();
            queue.pop_front();
            busy = true;
            op->running = true;
            lock.unlock();
            execute(*op);
            lock.lock();
            busy = false;
            op->running = false;
            op->done = true;
            done_cv.notify_all();
        }
        // anything still queued will never run
        for (auto &op : queue) {
            op->done = true;
            op->status = CA_ERR_STATE;
            op->error = "communicator destroyed before the operation ran";
        }
        queue.clear();
        done_cv.notify_all();
    }

    // Runs op on the calling thread; records the outcome in op (not yet marked done).
    void execute(Op &op) {
        if (aborted.load()) {
            op.status = CA_ERR_STATE;
            op.error = "communicator aborted";
            return;
        }
        try {
            dispatch(op);
            op.status = CA_OK;
        } catch (const CaError &e) {
            op.status = e.status;
            op.error = e.what();
        } catch (const gloo::IoException &e) {
            op.status = aborted.load() ? CA_ERR_STATE : CA_ERR_BACKEND;
            op.error = e.what();
        } catch (const std::bad_alloc &) {
            op.status = CA_ERR_NOMEM;
            op.error = "out of memory";
        } catch (const std::exception &e) {
            op.status = CA_ERR_BACKEND;
            op.error = e.what();
        } catch (...) {
            op.status = CA_ERR_INTERNAL;
            op.error = "unknown exception";
        }
    }

    void dispatch(Op &op) {
        size_t es = ca_dtype_size(op.dt);
        if (op.kind == Kind::SendRecv) {   // over the pairs also where the collectives use shared memory
            sendrecv(op, es);
            return;
        }
        if (shm) {
            dispatch_shm(op, es);
            return;
        }
        switch (op.kind) {
        case Kind::SendRecv:   // dispatched before the switch
            return;
        case Kind::Barrier:
            barrier(op);
            return;
        case Kind::Broadcast:
            if (op.count && size > 1) broadcast(op, es);
            return;
        case Kind::AllReduce:
            if (op.count == 0) return;
            if (op.send != op.recv) memmove(op.recv, op.send, op.count * es);
            if (size > 1) all_reduce(op, es);
            if (op.rop == CA_OP_AVG) divide(op.recv, op.count, op.dt, size);
            return;
        case Kind::AllGather:
            if (op.count) all_gather(op, es);
            return;
        case Kind::ReduceScatter:
            if (op.count == 0) return;
            reduce_scatter(op, es);
            if (op.rop == CA_OP_AVG) divide(op.recv, op.count, op.dt, size);
            return;
        }
    }

    int right() const { return (rank + 1) % size; }
    int left() const { return (rank + size - 1) % size; }
    static size_t mod(long long a, int n) { return static_cast<size_t>(((a % n) + n) % n); }

    // One reduce-scatter pass of the ring over buf split in `ch`: at step k
    // this rank sends its partial sum of chunk (rank-k+shift) to the right and
    // adds chunk (rank-k-1+shift) from the left, one segment while the next
    // arrives. Afterwards it holds the total of chunk (rank+1+shift).
    void ring_reduce_scatter(uint8_t *buf, const Chunks &ch, size_t es, ReduceFn fn, uint64_t slot, int shift,
                             const Op &op) {
        size_t seg_elems = std::max<size_t>(1, kSegmentBytes / es);
        size_t longest = *std::max_element(ch.len.begin(), ch.len.end());
        seg_elems = std::min(seg_elems, std::max<size_t>(1, longest));
        // two segments in flight; left uninitialised: a small reduction must not pay for a large memset
        size_t tmp_bytes = 2 * seg_elems * es;
        std::unique_ptr<uint8_t[]> tmp_mem(new uint8_t[tmp_bytes]);
        uint8_t *tmp = tmp_mem.get();
        LiveBuffer bufb(*this, buf, ch.off.back() * es + ch.len.back() * es);
        LiveBuffer tmpb(*this, tmp, tmp_bytes);
        for (int k = 0; k < size - 1; k++) {
            size_t sc = mod(rank - k + shift, size), rc = mod(rank - k - 1 + shift, size);
            size_t nsend = (ch.len[sc] + seg_elems - 1) / seg_elems;
            size_t nrecv = (ch.len[rc] + seg_elems - 1) / seg_elems;
            // receives first: a send that finds its receive posted goes out at once, without
            // a ready-to-receive round trip through Gloo's event loop
            for (size_t s = 0; s < nrecv && s < 2; s++) {
                size_t e0 = s * seg_elems, n = std::min(seg_elems, ch.len[rc] - e0);
                tmpb->recv(left(), slot, (s & 1) * seg_elems * es, n * es);
            }
            for (size_t s = 0; s < nsend; s++) {
                size_t e0 = s * seg_elems, n = std::min(seg_elems, ch.len[sc] - e0);
                bufb->send(right(), slot, (ch.off[sc] + e0) * es, n * es);
            }
            for (size_t s = 0; s < nrecv; s++) {
                tmpb.wait_recv(op.deadline_ms, "reduce-scatter receive");
                size_t e0 = s * seg_elems, n = std::min(seg_elems, ch.len[rc] - e0);
                uint8_t *dst = buf + (ch.off[rc] + e0) * es;
                fn(dst, dst, tmp + (s & 1) * seg_elems * es, n);
                if (s + 2 < nrecv) {
                    size_t e2 = (s + 2) * seg_elems, n2 = std::min(seg_elems, ch.len[rc] - e2);
                    tmpb->recv(left(), slot, (s & 1) * seg_elems * es, n2 * es);
                }
            }
            for (size_t s = 0; s < nsend; s++) bufb.wait_send(op.deadline_ms, "reduce-scatter send");
        }
    }

    // Ring all-gather of the chunks of buf: this rank starts owning chunk
    // (rank+shift) and passes along what it last received.
    void ring_all_gather(uint8_t *buf, const Chunks &ch, size_t es, uint64_t slot, int shift, const Op &op) {
        LiveBuffer bufb(*this, buf, ch.off.back() * es + ch.len.back() * es);
        for (int k = 0; k < size - 1; k++) {
            size_t sc = mod(rank - k + shift, size), rc = mod(rank - k - 1 + shift, size);
            if (ch.len[rc]) bufb->recv(left(), slot, ch.off[rc] * es, ch.len[rc] * es);
            if (ch.len[sc]) bufb->send(right(), slot, ch.off[sc] * es, ch.len[sc] * es);
            if (ch.len[rc]) bufb.wait_recv(op.deadline_ms, "all-gather receive");
            if (ch.len[sc]) bufb.wait_send(op.deadline_ms, "all-gather send");
        }
    }

    // Recursive doubling: at step k each rank swaps its whole partial result with rank ^ 2^k and
    // combines the two, the lower rank's operand first, so that every rank computes the same bits.
    void all_reduce_doubling(Op &op, size_t es, ReduceFn fn) {
        size_t bytes = op.count * es;
        uint8_t *buf = static_cast<uint8_t *>(op.recv);
        std::unique_ptr<uint8_t[]> tmp_mem(new uint8_t[bytes]);
        uint8_t *tmp = tmp_mem.get();
        LiveBuffer bufb(*this, buf, bytes);
        LiveBuffer tmpb(*this, tmp, bytes);
        uint64_t slot = gloo::Slot::build(kAllReducePrefix, op.tag);
        for (int mask = 1; mask < size; mask <<= 1) {
            int peer = rank ^ mask;
            tmpb->recv(peer, slot, 0, bytes);
            bufb->send(peer, slot, 0, bytes);
            tmpb.wait_recv(op.deadline_ms, "all-reduce receive");
            bufb.wait_send(op.deadline_ms, "all-reduce send");
            if (rank < peer) fn(buf, buf, tmp, op.count);
            else fn(buf, tmp, buf, op.count);
        }
    }

    void all_reduce(Op &op, size_t es) {
        ReduceFn fn = reduce_fn(op.dt, op.rop);
        if ((size & (size - 1)) == 0 && op.count * es <= kDoublingMaxBytes) {
            all_reduce_doubling(op, es, fn);
            return;
        }
        Chunks ch(op.count, size);
        uint8_t *buf = static_cast<uint8_t *>(op.recv);
        uint64_t slot = gloo::Slot::build(kAllReducePrefix, op.tag);
        ring_reduce_scatter(buf, ch, es, fn, slot, 0, op);
        ring_all_gather(buf, ch, es, slot + 1, 1, op);   // this rank now owns chunk rank+1
    }

    void all_gather(Op &op, size_t es) {
        size_t bytes = op.count * es;
        uint8_t *out = static_cast<uint8_t *>(op.recv);
        const uint8_t *in = static_cast<const uint8_t *>(op.send);
        if (in != out + static_cast<size_t>(rank) * bytes) memmove(out + static_cast<size_t>(rank) * bytes, in, bytes);
        if (size == 1) return;
        Chunks ch(op.count * static_cast<size_t>(size), size);
        ring_all_gather(out, ch, es, gloo::Slot::build(kAllGatherPrefix, op.tag), 0, op);
    }

    void reduce_scatter(Op &op, size_t es) {
        size_t seg = op.count * es;
        const uint8_t *in = static_cast<const uint8_t *>(op.send);
        if (size == 1) {
            memmove(op.recv, in, seg);
            return;
        }
        std::vector<uint8_t> acc(in, in + seg * static_cast<size_t>(size));
        Chunks ch(op.count * static_cast<size_t>(size), size);
        // shift -1: the pass ends holding chunk `rank`
        ring_reduce_scatter(acc.data(), ch, es, reduce_fn(op.dt, op.rop),
                            gloo::Slot::build(kReduceScatterPrefix, op.tag), -1, op);
        memcpy(op.recv, acc.data() + static_cast<size_t>(rank) * seg, seg);
    }

    // Binomial tree from the root: relative rank v receives from v - 2^j
    // (2^j its highest bit) and sends to v + 2^i for every larger power.
    void broadcast(Op &op, size_t es) {
        size_t bytes = op.count * es;
        LiveBuffer b(*this, op.recv, bytes);
        uint64_t slot = gloo::Slot::build(kBroadcastPrefix, op.tag);
        int v = (rank - op.root + size) % size, m = 1;
        if (v) {
            while (m * 2 <= v) m *= 2;
            b->recv((v - m + op.root) % size, slot, 0, bytes);
            b.wait_recv(op.deadline_ms, "broadcast receive");
            m *= 2;
        }
        int sent = 0;
        for (; v + m < size; m *= 2) {
            b->send((v + m + op.root) % size, slot, 0, bytes);
            sent++;
        }
        for (int i = 0; i < sent; i++) b.wait_send(op.deadline_ms, "broadcast send");
    }

    // Both directions in flight before either is waited for: a ring of ranks calling it at once
    // cannot deadlock. An exchange with itself (a ring of one) copies.
    void sendrecv(Op &op, size_t es) {
        size_t sb = op.root >= 0 ? op.count * es : 0, rb = op.src >= 0 ? op.rcount * es : 0;
        if (op.root == rank && op.src == rank) {
            if (sb) std::memmove(op.recv, op.send, sb);
            return;
        }
        uint64_t slot = gloo::Slot::build(kP2PPrefix, 0);
        uint8_t none = 0;
        LiveBuffer ib(*this, rb ? op.recv : &none, rb ? rb : 1);
        LiveBuffer ob(*this, sb ? const_cast<void *>(op.send) : &none, sb ? sb : 1);
        if (op.src >= 0) ib->recv(op.src, slot, 0, rb);
        if (op.root >= 0) ob->send(op.root, slot, 0, sb);
        if (op.src >= 0) ib.wait_recv(op.deadline_ms, "point-to-point receive");
        if (op.root >= 0) ob.wait_send(op.deadline_ms, "point-to-point send");
    }

    // Dissemination barrier: round i talks to the ranks 2^i away.
    void barrier(Op &op) {
        if (size == 1) return;
        uint8_t out = 1, in[64] = {};
        LiveBuffer ob(*this, &out, 1);
        LiveBuffer ib(*this, in, sizeof in);
        uint64_t slot = gloo::Slot::build(kBarrierPrefix, op.tag);
        int round = 0;
        for (int d = 1; d < size; d *= 2, round++) {
            ib->recv((rank - d + size) % size, slot + static_cast<uint8_t>(round), static_cast<size_t>(round), 1);
            ob->send((rank + d) % size, slot + static_cast<uint8_t>(round), 0, 1);
            ib.wait_recv(op.deadline_ms, "barrier receive");
            ob.wait_send(op.deadline_ms, "barrier send");
        }
    }

    void abort_all() {
        std::lock_guard<std::mutex> lock(mu);
        aborted.store(true);
        ca_shm_abort(shm);
        for (auto *b : live) {
            b->abortWaitRecv();
            b->abortWaitSend();
        }
    }
};

LiveBuffer::LiveBuffer(Comm &c, void *ptr, size_t bytes) : c_(c), buf_(c.ctx->createUnboundBuffer(ptr, bytes)) {
    std::lock_guard<std::mutex> lock(c_.mu);
    c_.live.push_back(buf_.get());
    if (c_.aborted.load()) {
        buf_->abortWaitRecv();
        buf_->abortWaitSend();
    }
}

LiveBuffer::~LiveBuffer() {
    std::lock_guard<std::mutex> lock(c_.mu);
    auto &v = c_.live;
    for (size_t i = 0; i < v.size(); i++)
        if (v[i] == buf_.get()) {
            v[i] = v.back();
            v.pop_back();
            break;
        }
}

static std::chrono::milliseconds left_until(int64_t deadline_ms) {
    int64_t left = deadline_ms - ca_now_ms();
    return std::chrono::milliseconds(left > 1 ? left : 1);
}

void LiveBuffer::wait_recv(int64_t deadline_ms, const char *what) {
    if (!buf_->waitRecv(left_until(deadline_ms))) throw CaError(CA_ERR_STATE, std::string(what) + " aborted");
}

void LiveBuffer::wait_send(int64_t deadline_ms, const char *what) {
    if (!buf_->waitSend(left_until(deadline_ms))) throw CaError(CA_ERR_STATE, std::string(what) + " aborted");
}

}  // namespace

struct ca_work_impl {
    Comm *comm;
    std::shared_ptr<Op> op;
};

// Gloo writes to its TCP sockets with writev, which cannot be asked not to raise SIGPIPE: a peer
// that dies while this rank sends would kill this rank silently (SIGPIPE's default action) before
// it could name the dead peer. Python programs, PyTorch's Gloo included, run with SIGPIPE ignored;
// so does a caccel program once it creates a Gloo communicator, unless it installed a handler of
// its own (kept). The write then fails with EPIPE, which Gloo reports as an I/O error.
static void ignore_default_sigpipe() {
    struct sigaction old;
    if (sigaction(SIGPIPE, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return;
    struct sigaction ign;
    std::memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    if (sigaction(SIGPIPE, &ign, nullptr) == 0)
        ca_log_printf(CA_LOG_DEBUG, "gloo: SIGPIPE ignored (it was at its default action)");
}

extern "C" {

static ca_status gloo_init(const ca_comm_init_args *args, void **out) {
    *out = nullptr;
    Comm *c = nullptr;
    ignore_default_sigpipe();
    try {
        if (!args->store.ops)
            return ca_error(CA_ERR_INVALID, "backend gloo needs a rendezvous store (rank %d of %d)", args->rank,
                            args->world_size);
        std::unique_ptr<Comm> cp(new Comm());
        c = cp.get();
        c->rank = args->rank;
        c->size = args->world_size;
        c->timeout_ms = args->timeout_ms > 0 ? args->timeout_ms : 1800 * 1000;
        std::chrono::milliseconds to(c->timeout_ms);
        // shared memory on one machine: a bad slot size fails every rank here, before any rank connects
        const char *use_shm = std::getenv("CACCEL_SHM");
        bool want_shm = c->size > 1 && args->local_world_size == args->world_size &&
                        !(use_shm && !std::strcmp(use_shm, "0"));
        size_t slot_bytes = 0;
        if (want_shm && ca_shm_slot_from_env(&slot_bytes) != CA_OK) return ca_last_status();

        gloo::transport::tcp::attr attr;
        const char *ifname = std::getenv("CACCEL_SOCKET_IFNAME");
        if (!ifname || !*ifname) ifname = std::getenv("GLOO_SOCKET_IFNAME");
        if (ifname && *ifname) {
            attr.iface = ifname;
        } else if (args->local_world_size == args->world_size) {
            attr.hostname = "127.0.0.1";
        } else {
            const char *ma = std::getenv("MASTER_ADDR"), *mp = std::getenv("MASTER_PORT");
            std::string local = ma ? route_to(ma, mp ? mp : "29500") : "";
            if (local.empty()) {
                char h[256] = "";
                gethostname(h, sizeof h - 1);
                local = h;
            }
            attr.hostname = local;
        }
        c->dev = gloo::transport::tcp::CreateDevice(attr);
        c->ctx = std::make_shared<gloo::rendezvous::Context>(c->rank, c->size);
        c->ctx->setTimeout(to);
        std::string prefix = std::string(args->prefix ? args->prefix : "caccel/gloo") + "/";
        CaStore store(args->store, prefix, to);
        c->ctx->connectFullMesh(store, c->dev);
        if (want_shm) {
            ca_status s = ca_shm_create(args->store, (prefix + "shm").c_str(), c->rank, c->size, slot_bytes,
                                        c->timeout_ms, &c->shm);
            if (s == CA_ERR_UNSUPPORTED) {
                if (c->rank == 0) ca_log_printf(CA_LOG_INFO, "gloo: %s; using TCP", ca_last_error());
                ca_clear_error();
            } else if (s != CA_OK) {
                throw CaError(s, ca_last_error());
            }
        }
        c->worker = std::thread([c] {
            ca_thread_begin("gloo_worker");   /* its own alternate signal stack: a crash here is dumped too */
            c->run_worker();
        });
        *out = cp.release();
        return CA_OK;
    } catch (...) {
        return record_current("connecting the ranks", args->rank);
    }
}

static void gloo_destroy(void *comm) {
    Comm *c = static_cast<Comm *>(comm);
    if (!c) return;
    try {
        delete c;
    } catch (...) {
        ca_clear_error();
    }
}

static ca_status enqueue(Comm *c, std::shared_ptr<Op> op, const char *what, ca_work_impl **work) {
    *work = nullptr;
    if (c->aborted.load())
        return ca_error(CA_ERR_STATE, "%s on an aborted communicator (backend gloo, rank %d)", what, c->rank);
    try {
        std::unique_ptr<ca_work_impl> w(new ca_work_impl{ c, op });
        op->issued_ms = ca_now_ms();
        op->deadline_ms = op->issued_ms + c->timeout_ms;
        {
            std::lock_guard<std::mutex> lock(c->mu);
            op->tag = c->next_tag++;
            c->queue.push_back(op);
        }
        c->work_cv.notify_one();
        *work = w.release();
        return CA_OK;
    } catch (...) {
        return record_current(what, c->rank);
    }
}

static ca_status check_dtype(Comm *c, ca_dtype dt, const char *what) {
    if (!ca_dtype_size(dt))
        return ca_error(CA_ERR_INVALID, "%s: invalid dtype %d (backend gloo, rank %d)", what, (int)dt, c->rank);
    return CA_OK;
}

// An operation's arguments; the fields a kind does not use keep their defaults.
static Op op_of(Kind kind, const void *send, void *recv, size_t count, ca_dtype dt) {
    Op o;
    o.kind = kind;
    o.send = send;
    o.recv = recv;
    o.count = count;
    o.dt = dt;
    return o;
}

// Every operation enters the queue here, its arguments checked by the caller: the copy on the heap is
// shared with the worker thread, and a failed allocation is reported like any other error.
static ca_status submit(Comm *c, const Op &req, const char *what, ca_work_impl **work) {
    try {
        return enqueue(c, std::make_shared<Op>(req), what, work);
    } catch (...) {
        return record_current(what, c->rank);
    }
}

static ca_status gloo_all_reduce(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                 ca_reduce_op op, ca_work_impl **work) {
    Comm *c = static_cast<Comm *>(comm);
    *work = nullptr;
    ca_status s = check_dtype(c, dt, "all_reduce");
    if (s != CA_OK) return s;
    if (!reduce_fn(dt, op))
        return ca_error(CA_ERR_INVALID, "all_reduce: reduce op %d on %s (backend gloo)", (int)op, ca_dtype_name(dt));
    Op o = op_of(Kind::AllReduce, send, recv, count, dt);
    o.rop = op;
    return submit(c, o, "all_reduce", work);
}

static ca_status gloo_broadcast(void *comm, void *buf, size_t count, ca_dtype dt, int root, ca_work_impl **work) {
    Comm *c = static_cast<Comm *>(comm);
    *work = nullptr;
    ca_status s = check_dtype(c, dt, "broadcast");
    if (s != CA_OK) return s;
    if (root < 0 || root >= c->size)
        return ca_error(CA_ERR_INVALID, "broadcast: root %d outside 0..%d (backend gloo)", root, c->size - 1);
    Op o = op_of(Kind::Broadcast, buf, buf, count, dt);
    o.root = root;
    return submit(c, o, "broadcast", work);
}

static ca_status gloo_all_gather(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                 ca_work_impl **work) {
    Comm *c = static_cast<Comm *>(comm);
    *work = nullptr;
    ca_status s = check_dtype(c, dt, "all_gather");
    if (s != CA_OK) return s;
    return submit(c, op_of(Kind::AllGather, send, recv, count, dt), "all_gather", work);
}

static ca_status gloo_reduce_scatter(void *comm, const void *send, void *recv, size_t count, ca_dtype dt,
                                     ca_reduce_op op, ca_work_impl **work) {
    Comm *c = static_cast<Comm *>(comm);
    *work = nullptr;
    ca_status s = check_dtype(c, dt, "reduce_scatter");
    if (s != CA_OK) return s;
    if (!reduce_fn(dt, op))
        return ca_error(CA_ERR_INVALID, "reduce_scatter: reduce op %d on %s (backend gloo)", (int)op,
                        ca_dtype_name(dt));
    Op o = op_of(Kind::ReduceScatter, send, recv, count, dt);
    o.rop = op;
    return submit(c, o, "reduce_scatter", work);
}

static ca_status gloo_barrier(void *comm, ca_work_impl **work) {
    Comm *c = static_cast<Comm *>(comm);
    *work = nullptr;
    return submit(c, op_of(Kind::Barrier, nullptr, nullptr, 0, CA_F32), "barrier", work);
}

static ca_status gloo_sendrecv(void *comm, const void *send, size_t send_count, int dst, void *recv,
                               size_t recv_count, int src, ca_dtype dt, ca_work_impl **work) {
    Comm *c = static_cast<Comm *>(comm);
    *work = nullptr;
    ca_status s = check_dtype(c, dt, "sendrecv");
    if (s != CA_OK) return s;
    Op o = op_of(Kind::SendRecv, send, recv, send_count, dt);
    o.rcount = recv_count;
    o.root = dst;
    o.src = src;
    return submit(c, o, "sendrecv", work);
}

static ca_status finished(ca_work_impl *w) {
    const Op &op = *w->op;
    if (op.status == CA_OK) return CA_OK;
    return ca_error(op.status, "%s (backend gloo, rank %d)", op.error.c_str(), w->comm->rank);
}

static ca_status gloo_work_test(ca_work_impl *w) {
    try {
        std::lock_guard<std::mutex> lock(w->comm->mu);
        if (!w->op->done) return CA_IN_PROGRESS;
    } catch (...) {
        return record_current("testing an operation", w->comm->rank);
    }
    return finished(w);
}

// A waiter whose operation is next in line and nothing runs executes it
// itself: a blocking collective then costs no thread handoff.
static ca_status gloo_work_wait(ca_work_impl *w, int64_t timeout_ms) {
    Comm *c = w->comm;
    try {
        std::unique_lock<std::mutex> lock(c->mu);
        if (!w->op->done && !c->busy && !c->queue.empty() && c->queue.front() == w->op) {
            c->queue.pop_front();
            c->busy = true;
            w->op->running = true;
            lock.unlock();
            c->execute(*w->op);
            lock.lock();
            c->busy = false;
            w->op->running = false;
            w->op->done = true;
            c->done_cv.notify_all();
            if (!c->queue.empty()) c->work_cv.notify_one();
        }
        auto pred = [&] { return w->op->done || c->aborted.load(); };
        if (timeout_ms < 0) c->done_cv.wait(lock, pred);
        else if (!c->done_cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), pred))
            return ca_error(CA_ERR_TIMEOUT, "operation not complete after %lld ms (backend gloo, rank %d)",
                            (long long)timeout_ms, c->rank);
        if (!w->op->done)
            return ca_error(CA_ERR_STATE, "operation abandoned: the communicator was aborted (backend gloo, rank %d)",
                            c->rank);
    } catch (...) {
        return record_current("waiting for an operation", c->rank);
    }
    return finished(w);
}

static void gloo_work_free(ca_work_impl *w) {
    try {
        delete w;
    } catch (...) {
        ca_clear_error();
    }
}

static ca_status gloo_abort(void *comm) {
    Comm *c = static_cast<Comm *>(comm);
    try {
        c->abort_all();
        c->done_cv.notify_all();
        return CA_OK;
    } catch (...) {
        return record_current("aborting", c->rank);
    }
}

// Each communicator has its own pairs, buffers and threads: two never share state.
static bool gloo_threads_concurrent(void *) { return true; }

static const ca_collective_ops gloo_ops = {
    sizeof(ca_collective_ops),
    CA_ABI_VERSION,
    "gloo",
    "cpu",
    gloo_init,
    gloo_destroy,
    gloo_all_reduce,
    gloo_broadcast,
    gloo_all_gather,
    gloo_reduce_scatter,
    gloo_barrier,
    gloo_work_test,
    gloo_work_wait,
    gloo_work_free,
    gloo_abort,
    nullptr,   // split: the core builds a group's communicator over the store
    false,     // needs_mpi_launcher: ranks and rendezvous come from the store
    gloo_threads_concurrent,
    gloo_sendrecv,
};

static const ca_collective_ops *const gloo_list[] = { &gloo_ops };

static char gloo_version[64];

static const ca_plugin gloo_plugin = {
    sizeof(ca_plugin),
    CA_ABI_VERSION,
    "gloo",
    gloo_version,
    0,
    nullptr,
    1,
    gloo_list,
    nullptr,
};

CA_PLUGIN_EXPORT const ca_plugin *ca_plugin_init(void);
CA_PLUGIN_EXPORT const ca_plugin *ca_plugin_init(void) {
    std::snprintf(gloo_version, sizeof gloo_version, "Gloo %d.%d.%d", GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR,
                  GLOO_VERSION_PATCH);
    return &gloo_plugin;
}

}  // extern "C"
