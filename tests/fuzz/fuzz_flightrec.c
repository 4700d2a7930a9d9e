/* Fuzz target: the flight recorder's dumps read by `caccel trace analyze` (tools/cmd_trace_analyze.c).
 * Each input becomes DIR/rank_1.json beside a fixed, valid rank_0.json of a world of 2, so an input
 * that parses goes on through the analysis against rank 0's records (the mismatch search, the
 * positions, the late arrival). The report goes to /dev/null. */
#include "tests/fuzz/fuzz_util.h"

#include "tools/cli_impl.h"

#include <fcntl.h>

static const char rank0[] =
    "{\"format\":\"caccel-flight-recorder\",\"version\":1,\"rank\":0,\"world\":2,\"comm\":\"caccel/c0\",\"host\":\"h\","
    "\"pid\":1,\"dump_ns\":5000,\"issued\":3,\"status\":\"CA_ERR_TIMEOUT\",\"reason\":\"r\",\"collectives\":["
    "{\"seq\":0,\"sig\":\"all_reduce(f32, 16, sum)\",\"state\":\"completed\",\"t_issue_ns\":10,\"t_end_ns\":20},"
    "{\"seq\":1,\"sig\":\"barrier\",\"state\":\"completed\",\"t_issue_ns\":30,\"t_end_ns\":40},"
    "{\"seq\":2,\"sig\":\"all_reduce(f32, 16, sum)\",\"state\":\"unfinished\",\"t_issue_ns\":50,\"t_end_ns\":0}],"
    "\"kernels\":[{\"op\":\"gemm\",\"device\":\"cpu:0\",\"dtype\":\"f32\",\"shapes\":[[1,4,8]],\"t_start_ns\":1,"
    "\"t_end_ns\":2}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool once;
    char path[128];
    if (!once) {
        fz_write("rank_0.json", rank0, sizeof rank0 - 1, path, sizeof path);
        once = true;
    }
    fz_write("rank_1.json", data, size, path, sizeof path);
    /* the report and the errors to /dev/null for this call only (the replay prints its count) */
    fflush(stdout);
    fflush(stderr);
    int out = dup(1), err = dup(2), null = open("/dev/null", O_WRONLY);
    if (out < 0 || err < 0 || null < 0) abort();
    dup2(null, 1);
    dup2(null, 2);
    ca_cmd_trace_analyze(fz_tmpdir());
    fflush(stdout);
    fflush(stderr);
    dup2(out, 1);
    dup2(err, 2);
    close(out);
    close(err);
    close(null);
    return 0;
}
