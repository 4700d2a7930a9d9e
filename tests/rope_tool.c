/* rope_tool: caccel's rotary tables and ca_rope for tests/test_rope_parity.sh.
 *   rope_tool DIR B H T D key=value...
 *     keys: rot, theta, type (a rope_scaling name), factor, max_pos, orig_max, low, high, beta_fast,
 *     beta_slow, attn, mscale, mscale_all_dim, positions (1: read DIR/pos.i64, B*T i64).
 *     Reads DIR/x.f32 (B*H*T*D f32); writes DIR/cos.f32 and DIR/sin.f32 (the tables, [B or 1, T, rot/2])
 *     and DIR/y.f32 (ca_rope of x, [B, H, T, D]). */
#include <caccel/caccel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what) {
    fprintf(stderr, "rope_tool: %s: %s\n", what, ca_last_error());
    exit(1);
}

static void *read_file(const char *dir, const char *name, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    void *p = malloc(bytes ? bytes : 1);
    if (!f || !p || fread(p, 1, bytes, f) != bytes) { fprintf(stderr, "rope_tool: cannot read %s\n", path); exit(1); }
    fclose(f);
    return p;
}

static void write_file(const char *dir, const char *name, ca_tensor *t) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t n = ca_tensor_nbytes(t);
    void *h = malloc(n ? n : 1);
    FILE *f = fopen(path, "wb");
    if (!h || !f || ca_tensor_to_host(t, h, n) != CA_OK || fwrite(h, 1, n, f) != n) die(path);
    fclose(f);
    free(h);
}

/* One key=value into the config; *positions for "positions". */
static void set_key(ca_rope_config *c, const char *kv, bool *positions) {
    const char *eq = strchr(kv, '=');
    if (!eq) { fprintf(stderr, "rope_tool: %s is not key=value\n", kv); exit(2); }
    size_t k = (size_t)(eq - kv);
    const char *v = eq + 1;
    double d = atof(v);
#define KEY(name) (k == strlen(name) && strncmp(kv, name, k) == 0)
    if (KEY("type")) { if (ca_rope_scaling_parse(v, &c->type) != CA_OK) die("type"); }
    else if (KEY("rot")) c->rotary_dim = (int64_t)d;
    else if (KEY("theta")) c->theta = d;
    else if (KEY("factor")) c->factor = d;
    else if (KEY("max_pos")) c->max_position_embeddings = (int64_t)d;
    else if (KEY("orig_max")) c->original_max_position_embeddings = (int64_t)d;
    else if (KEY("low")) c->low_freq_factor = d;
    else if (KEY("high")) c->high_freq_factor = d;
    else if (KEY("beta_fast")) c->beta_fast = d;
    else if (KEY("beta_slow")) c->beta_slow = d;
    else if (KEY("attn")) c->attention_factor = d;
    else if (KEY("mscale")) c->mscale = d;
    else if (KEY("mscale_all_dim")) c->mscale_all_dim = d;
    else if (KEY("positions")) *positions = d != 0;
    else { fprintf(stderr, "rope_tool: unknown key %.*s\n", (int)k, kv); exit(2); }
#undef KEY
}

int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: rope_tool DIR B H T D key=value...\n"); return 2; }
    const char *dir = argv[1];
    int64_t shape[4] = {atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), atoll(argv[5])};
    ca_rope_config c = {.head_dim = shape[3]};
    bool with_pos = false;
    for (int i = 6; i < argc; i++) set_key(&c, argv[i], &with_pos);
    int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
    float *x = read_file(dir, "x.f32", (size_t)n * 4);
    int64_t *pos = with_pos ? read_file(dir, "pos.i64", (size_t)(shape[0] * shape[2]) * 8) : NULL;
    ca_device *dev = ca_cpu_device();
    ca_tensor *cs, *sn;
    if (ca_rope_tables(dev, &c, pos, shape[0], shape[2], &cs, &sn) != CA_OK) die("ca_rope_tables");
    ca_tensor *y = ca_rope(ca_from_host(dev, CA_F32, 4, shape, x), cs, sn);
    if (!y) die("ca_rope");
    write_file(dir, "cos.f32", cs);
    write_file(dir, "sin.f32", sn);
    write_file(dir, "y.f32", y);
    free(x);
    free(pos);
    ca_scope_release_all();
    ca_shutdown();
    return 0;
}
