/* bench_load: ca_load_model of one large safetensors file into a matching model, the caccel side of
 * bench/run_load.sh (whose peers are safetensors.torch.load_file + load_state_dict and cat).
 * usage: bench_load --write DIR [--layers N]   writes DIR/model.safetensors: N Linear(4096, 4096)
 *                                               weights without bias, f32 (64 MiB each; default 16)
 *        bench_load --load DIR [--layers N]    builds the same model (untimed) and prints the
 *                                               seconds ca_load_model takes */
#include "bench/bench_util.h"

#include <string.h>

static ca_module *model_of(int layers) {
    ca_module *seq, *l;
    CA_CHECK(ca_sequential_create(&seq));
    for (int i = 0; i < layers; i++) {
        char name[32];
        snprintf(name, sizeof name, "%d", i);
        CA_CHECK(ca_linear_create(4096, 4096, false, &l));
        CA_CHECK(ca_module_add(seq, name, l));
    }
    return seq;
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    bool write = false;
    int layers = 16;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--write") || !strcmp(argv[i], "--load")) {
            write = !strcmp(argv[i], "--write");
            dir = argv[i + 1];
        } else if (!strcmp(argv[i], "--layers")) {
            layers = atoi(argv[i + 1]);
        }
    }
    if (!dir || layers < 1) {
        fprintf(stderr, "usage: bench_load --write|--load DIR [--layers N]\n");
        return 2;
    }
    ca_module *m = model_of(layers);
    if (write) {
        CA_CHECK(ca_save_model(NULL, m, dir, 0));
    } else {
        double t0 = now_s();
        CA_CHECK(ca_load_model(NULL, m, dir));
        printf("%.3f\n", now_s() - t0);
    }
    ca_module_destroy(m);
    ca_shutdown();
    return 0;
}
