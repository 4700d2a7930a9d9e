/* Fashion-MNIST: where its IDX files are looked for, and opening the train or test split. */
#include "data/data_impl.h"

#include <caccel/log.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Where Debian's dataset-fashion-mnist package installs the files. */
#define FMNIST_DEBIAN_DIR "/usr/share/datasets/fashion-mnist"
#define FMNIST_HINT                                                                       \
    "install the Debian package dataset-fashion-mnist, or pass --data DIR (a directory " \
    "holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "                 \
    "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz)"

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* $CACCEL_DATA_DIR/fashion-mnist into buf, or false when the variable is unset. */
static bool env_dir(char *buf, size_t len) {
    const char *root = getenv("CACCEL_DATA_DIR");
    if (!root || !*root) return false;
    snprintf(buf, len, "%s/fashion-mnist", root);
    return true;
}

const char *ca_fashion_mnist_default_dir(void) {
    /* Per thread, so concurrent callers do not overwrite each other's answer. */
    static _Thread_local char buf[4096];
    if (env_dir(buf, sizeof buf) && is_dir(buf)) return buf;
    if (is_dir(FMNIST_DEBIAN_DIR)) return FMNIST_DEBIAN_DIR;
    return NULL;
}

/* dir/name(.gz): the gzip'd file as distributed, else an unpacked copy. */
static ca_status find_file(const char *dir, const char *name, char *out, size_t len) {
    snprintf(out, len, "%s/%s.gz", dir, name);
    if (access(out, F_OK) == 0) return CA_OK;
    char plain[4096];
    snprintf(plain, sizeof plain, "%s/%s", dir, name);
    if (access(plain, F_OK) == 0) {
        snprintf(out, len, "%s", plain);
        return CA_OK;
    }
    ca_status s = ca_error(CA_ERR_IO, "Fashion-MNIST file '%s' not found", out);
    ca_error_hint(FMNIST_HINT);
    return s;
}

/* The split's image and label files under dir (NULL: the default directory). */
static ca_status split_paths(const char *dir, bool train, char *images, char *labels, size_t len) {
    if (!dir) {
        dir = ca_fashion_mnist_default_dir();
        char env[4096];
        if (dir && env_dir(env, sizeof env) && strcmp(dir, env) != 0)
            CA_LOG_W("Fashion-MNIST: '%s' ($CACCEL_DATA_DIR) does not exist; using '%s'", env, dir);
        if (!dir) {
            ca_status s;
            if (env_dir(env, sizeof env))
                s = ca_error(CA_ERR_IO,
                             "Fashion-MNIST not found: neither '%s' ($CACCEL_DATA_DIR) nor '%s' "
                             "exists",
                             env, FMNIST_DEBIAN_DIR);
            else
                s = ca_error(CA_ERR_IO, "Fashion-MNIST not found: '%s' does not exist",
                             FMNIST_DEBIAN_DIR);
            ca_error_hint(FMNIST_HINT);
            return s;
        }
    }
    const char *split = train ? "train" : "t10k";
    char name[64];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
    ca_status s = find_file(dir, name, images, len);
    if (s != CA_OK) return s;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
    return find_file(dir, name, labels, len);
}

ca_status ca_fashion_mnist_open(const char *dir, bool train, ca_dataset **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_fashion_mnist_open: out is NULL");
    *out = NULL;
    char images[4096 + 64], labels[4096 + 64];
    ca_status s = split_paths(dir, train, images, labels, sizeof images);
    if (s != CA_OK) return s;
    s = ca_idx_dataset_open(images, labels, out);
    if (s != CA_OK) return ca_error_context("Fashion-MNIST (%s)", train ? "train" : "test");
    return CA_OK;
}

ca_status ca_fashion_mnist_load_tensors(const char *dir, bool train, ca_device *dev,
                                        const ca_idx_load_opts *opts, ca_tensor **x, ca_tensor **y) {
    if (!x || !y) return ca_error(CA_ERR_INVALID, "ca_fashion_mnist_load_tensors: x or y is NULL");
    *x = *y = NULL;
    char images[4096 + 64], labels[4096 + 64];
    ca_status s = split_paths(dir, train, images, labels, sizeof images);
    if (s != CA_OK) return s;
    s = ca_idx_load_tensors(dev, images, labels, opts, x, y);
    if (s != CA_OK) return ca_error_context("Fashion-MNIST (%s)", train ? "train" : "test");
    return CA_OK;
}
