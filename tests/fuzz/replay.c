/* Replays a fuzz target's corpus and its kept crash inputs as a plain program, so `make check`
 * (and its ASan, UBSan and valgrind builds) runs every input the fuzzer kept through the same
 * entry point. FUZZ_TARGET names the target: its inputs are tests/fuzz/<target>/corpus and
 * tests/fuzz/<target>/regressions under $CACCEL_TEST_SRCDIR. Arguments, when given, replace
 * those folders (files or folders), as libFuzzer takes them. */
#include "tests/fuzz/fuzz_util.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>


static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return 1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0)
        if ((n += k) == cap) buf = realloc(buf, cap *= 2);
    fclose(f);
    if (!buf) return 1;
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

/* The files of a folder in name order, so every run replays them alike. */
static int replay_path(const char *path, int *count) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) return (*count)++, replay_file(path);
    struct dirent **list;
    int n = scandir(path, &list, NULL, alphasort), bad = 0;
    if (n < 0) return 1;
    for (int i = 0; i < n; i++) {
        char p[4096];
        if (list[i]->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", path, list[i]->d_name);
            bad |= replay_path(p, count);
        }
        free(list[i]);
    }
    free(list);
    return bad;
}

int main(int argc, char **argv) {
    int bad = 0, count = 0;
    if (argc > 1) {
        for (int i = 1; i < argc; i++) bad |= replay_path(argv[i], &count);
    } else {
        const char *src = getenv("CACCEL_TEST_SRCDIR");
        static const char *const kinds[] = {"corpus", "regressions"};
        for (int i = 0; i < 2; i++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/tests/fuzz/%s/%s", src ? src : ".", FUZZ_TARGET, kinds[i]);
            struct stat st;
            if (i == 0 || stat(p, &st) == 0) bad |= replay_path(p, &count);   /* regressions may be absent */
        }
    }
    printf("%s: %d input(s) replayed\n", FUZZ_TARGET, count);
    return bad || count == 0;
}
