/* The backend registry: built-in backends, dlopen'd plugins with an ABI check, and lookup by name. */
#include "core/device_impl.h"
#include "core/registry_impl.h"
#include "backends/cpu/cpu_plugin.h"
#include "backends/xla_stub/xla_plugin.h"
#include "collectives/single.h"
#include "base/file_impl.h"

#include <pthread.h>
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <limits.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    char *name;
    ca_backend_kind kind;
    char *origin;
    char *version;
    const ca_device_ops *dev;
    const ca_collective_ops *coll;
    bool usable;
    int score;                 /* the plugin's preference (1 without a score slot) */
    bool counted;              /* device_count asked already */
    int device_count;
    char reason[256];
    struct entry *next;
} entry;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static entry *entries, **entries_tail = &entries;
static int nentries;
static bool builtins_done, plugins_done;
static ca_status plugins_status;
static void **handles;
static int nhandles;

void ca_copy_vtable(void *dst, size_t dst_size, const void *src, size_t src_size) {
    memset(dst, 0, dst_size);
    memcpy(dst, src, src_size < dst_size ? src_size : dst_size);
}

static entry *find(const char *name, ca_backend_kind kind) {
    for (entry *e = entries; e; e = e->next)    /* refused entries carry no ops */
        if (e->kind == kind && (e->dev || e->coll) && strcmp(e->name, name) == 0) return e;
    return NULL;
}

static entry *add_entry(const char *name, ca_backend_kind kind, const char *origin, const char *version) {
    entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->name = strdup(name ? name : "?");
    e->origin = strdup(origin ? origin : "built-in");
    e->version = strdup(version ? version : "");
    e->kind = kind;
    e->device_count = -1;
    if (!e->name || !e->origin || !e->version) {
        free(e->name); free(e->origin); free(e->version); free(e);
        return NULL;
    }
    *entries_tail = e;
    entries_tail = &e->next;
    nentries++;
    return e;
}

static bool abi_compatible(uint32_t v) { return (v >> 16) == CA_ABI_MAJOR; }

static void refuse(const char *what, const char *origin, uint32_t abi) {
    ca_log_printf(CA_LOG_WARNING,
                  "%s (%s) was built for caccel plugin ABI %u.%u, this library speaks %u.%u: "
                  "refused, not loaded (rebuild the plugin against this caccel)",
                  what, origin, abi >> 16, abi & 0xffff, CA_ABI_MAJOR, CA_ABI_MINOR);
}

/* Registers every backend of plugin p. Caller holds reg_mu. */
static ca_status register_locked(const ca_plugin *p, const char *origin) {
    if (!p || p->struct_size < offsetof(ca_plugin, score) || !abi_compatible(p->abi_version)) {
        uint32_t abi = p ? p->abi_version : 0;
        const char *name = p && p->struct_size >= offsetof(ca_plugin, version) ? p->name : "plugin";
        refuse(name, origin, abi);
        entry *e = add_entry(name, CA_BACKEND_DEVICE, origin, "");
        if (e) snprintf(e->reason, sizeof e->reason, "refused: built for plugin ABI %u.%u, need %u.x",
                        abi >> 16, abi & 0xffff, CA_ABI_MAJOR);
        return ca_error(CA_ERR_ABI, "plugin %s was built for caccel plugin ABI %u.%u; this library is ABI %u.%u",
                        origin, abi >> 16, abi & 0xffff, CA_ABI_MAJOR, CA_ABI_MINOR);
    }
    char reason[256] = "";
    int score = p->score ? p->score(reason, sizeof reason) : 1;
    bool usable = score > 0;
    for (int i = 0; i < p->num_devices; i++) {
        const ca_device_ops *d = p->devices[i];
        if (!d || !abi_compatible(d->abi_version)) {
            refuse(p->name, origin, d ? d->abi_version : 0);
            continue;
        }
        if (find(d->name, CA_BACKEND_DEVICE)) {
            ca_log_printf(CA_LOG_INFO, "device backend '%s' from %s ignored: already registered", d->name, origin);
            continue;
        }
        entry *e = add_entry(d->name, CA_BACKEND_DEVICE, origin, p->version);
        if (!e) return ca_error(CA_ERR_NOMEM, "out of memory registering %s", origin);
        e->dev = d;
        e->usable = usable;
        e->score = score;
        snprintf(e->reason, sizeof e->reason, "%s", reason);
    }
    for (int i = 0; i < p->num_collectives; i++) {
        const ca_collective_ops *c = p->collectives[i];
        if (!c || !abi_compatible(c->abi_version)) {
            refuse(p->name, origin, c ? c->abi_version : 0);
            continue;
        }
        if (find(c->name, CA_BACKEND_COLLECTIVE)) {
            ca_log_printf(CA_LOG_INFO, "collective backend '%s' from %s ignored: already registered", c->name, origin);
            continue;
        }
        entry *e = add_entry(c->name, CA_BACKEND_COLLECTIVE, origin, p->version);
        if (!e) return ca_error(CA_ERR_NOMEM, "out of memory registering %s", origin);
        e->coll = c;
        e->usable = usable;
        e->score = score;
        snprintf(e->reason, sizeof e->reason, "%s", reason);
    }
    return CA_OK;
}

ca_status ca_register_plugin(const ca_plugin *plugin, const char *origin) {
    pthread_mutex_lock(&reg_mu);
    ca_status s = register_locked(plugin, origin ? origin : "built-in");
    pthread_mutex_unlock(&reg_mu);
    return s;
}

static void builtins_locked(void) {
    if (builtins_done) return;
    builtins_done = true;
    register_locked(ca_cpu_plugin(), "built-in");
    /* the lazy device runs its graphs on the cpu backend's kernels, and its own loops on their threads */
    register_locked(ca_xla_plugin(ca_cpu_plugin()->devices[0], ca_cpu_parallel_for), "built-in");
    register_locked(ca_single_collective_plugin(), "built-in");
}

static void ensure_builtins(void) {
    pthread_mutex_lock(&reg_mu);
    builtins_locked();
    pthread_mutex_unlock(&reg_mu);
}

/* Why: dlopen maps a truncated shared object as if whole and the process dies of SIGBUS when the
 * loader touches a page past the end of the file, and it blocks for ever opening a FIFO. So a
 * plugin must be a regular file, and a 64-bit ELF file must hold every loadable segment and its
 * section headers before it is opened; anything else is left to dlopen's checks. */
static bool unfit_plugin_file(const char *path, char *why, size_t len) {
    FILE *f;
    uint64_t size;
    Elf64_Ehdr eh;
    if (ca_file_fopen(path, CA_FILE_PLUGIN, &f, &size) != CA_OK) {
        bool missing = ca_last_status() == CA_ERR_NOT_FOUND;   /* dlopen says so, as before */
        const char *msg = ca_last_error();
        size_t pl = strlen(path);
        if (strncmp(msg, path, pl) == 0 && strncmp(msg + pl, ": ", 2) == 0) msg += pl + 2;   /* named already */
        snprintf(why, len, "%s", msg);
        ca_clear_error();
        return !missing;
    }
    bool bad = false;
    if (fread(&eh, sizeof eh, 1, f) == 1 &&
        memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64) {
        uint64_t need = eh.e_phoff + (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr);
        if (eh.e_shnum) {
            uint64_t sh = eh.e_shoff + (uint64_t)eh.e_shnum * eh.e_shentsize;
            if (sh > need) need = sh;
        }
        for (int i = 0; i < eh.e_phnum && need <= size; i++) {
            Elf64_Phdr ph;
            if (fseeko(f, (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph), SEEK_SET) != 0 ||
                fread(&ph, sizeof ph, 1, f) != 1)
                break;
            if (ph.p_type == PT_LOAD && ph.p_offset + ph.p_filesz > need) need = ph.p_offset + ph.p_filesz;
        }
        if (need > size) {
            bad = true;
            snprintf(why, len, "the file is truncated: %llu bytes, its ELF headers need %llu",
                     (unsigned long long)size, (unsigned long long)need);
        }
    }
    fclose(f);
    return bad;
}

static ca_status load_file_locked(const char *path) {
    char why[160];
    if (unfit_plugin_file(path, why, sizeof why)) {
        ca_log_printf(CA_LOG_WARNING, "plugin %s skipped: %s", path, why);
        return ca_error(CA_ERR_BACKEND, "plugin %s could not be loaded: %s", path, why);
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *err = dlerror();
        ca_log_printf(CA_LOG_WARNING, "plugin %s could not be loaded: %s", path, err ? err : "?");
        return ca_error(CA_ERR_BACKEND, "plugin %s could not be loaded: %s", path, err ? err : "?");
    }
    ca_plugin_init_fn init = (ca_plugin_init_fn)(uintptr_t)dlsym(h, CA_PLUGIN_INIT_SYMBOL);
    if (!init) {
        dlclose(h);
        return ca_error(CA_ERR_BACKEND, "%s is not a caccel plugin (no %s symbol)", path,
                        CA_PLUGIN_INIT_SYMBOL);
    }
    ca_status s = register_locked(init(), path);
    if (s != CA_OK) {
        dlclose(h);
        return s;
    }
    void **nh = realloc(handles, (size_t)(nhandles + 1) * sizeof *nh);
    if (!nh) return ca_error(CA_ERR_NOMEM, "out of memory");
    handles = nh;
    handles[nhandles++] = h;
    return CA_OK;
}

ca_status ca_registry_load_plugin_file(const char *path) {
    pthread_mutex_lock(&reg_mu);
    builtins_locked();
    ca_status s = load_file_locked(path);
    pthread_mutex_unlock(&reg_mu);
    return s;
}

static int is_plugin_name(const char *n) {
    size_t len = strlen(n);
    return strncmp(n, "caccel_", 7) == 0 && len > 10 && strcmp(n + len - 3, ".so") == 0;
}

/* True when DIR was scanned before: the folder near the library is often the
 * configured plugin folder too, and a second scan would only log clashes. */
static bool scanned_before_locked(const char *dir) {
    static char seen[16][PATH_MAX];
    static int nseen;
    char real[PATH_MAX];
    if (!realpath(dir, real)) return false;
    for (int i = 0; i < nseen; i++)
        if (strcmp(seen[i], real) == 0) return true;
    if (nseen < (int)CA_ARRAY_LEN(seen)) memcpy(seen[nseen++], real, strlen(real) + 1);
    return false;
}

static void scan_dir_locked(const char *dir) {
    if (scanned_before_locked(dir)) return;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char **names = NULL;
    int n = 0;
    while ((de = readdir(d))) {
        if (!is_plugin_name(de->d_name)) continue;
        char **nn = realloc(names, (size_t)(n + 1) * sizeof *nn);
        if (!nn) break;
        names = nn;
        names[n] = strdup(de->d_name);
        if (names[n]) n++;
    }
    closedir(d);
    /* sorted, so the load order (and thus who wins a name clash) is stable */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *t = names[j]; names[j] = names[j - 1]; names[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (load_file_locked(path) != CA_OK) ca_clear_error();
        free(names[i]);
    }
    free(names);
}

/* Plugins next to this library: <libdir>/caccel of a relocated install, and,
 * when the library runs from its build tree (<build>/.libs), the plugins built
 * beside it, so programs run from a build work without installing. */
static void scan_near_library_locked(void) {
    Dl_info info;
    if (!dladdr((void *)(uintptr_t)ca_registry_load_plugins, &info) || !info.dli_fname) return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (!slash) return;
    *slash = '\0';
    static const char *const rel[] = {"caccel", "../collectives/.libs", "../backends/cuda/.libs"};
    bool build_tree = strlen(dir) >= 6 && strcmp(dir + strlen(dir) - 6, "/.libs") == 0;
    for (size_t i = 0; i < CA_ARRAY_LEN(rel); i++) {
        if (i > 0 && !build_tree) break;
        char path[4200], real[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, rel[i]);
        if (realpath(path, real)) scan_dir_locked(real);
    }
}

ca_status ca_registry_load_plugins(void) {
    pthread_mutex_lock(&reg_mu);
    builtins_locked();
    if (!plugins_done) {
        plugins_done = true;
        const char *env = getenv("CACCEL_PLUGIN_PATH");
        if (env && *env) {
            char *copy = strdup(env), *save = NULL;
            for (char *dir = copy ? strtok_r(copy, ":", &save) : NULL; dir; dir = strtok_r(NULL, ":", &save))
                scan_dir_locked(dir);
            free(copy);
        }
        scan_near_library_locked();
        scan_dir_locked(CA_PLUGIN_DIR);
        plugins_status = CA_OK;
    }
    ca_status s = plugins_status;
    pthread_mutex_unlock(&reg_mu);
    return s;
}

static void count_devices(entry *e) {
    if (e->counted || !e->dev) return;
    e->counted = true;
    int n = 0;
    char reason[256] = "";
    if (e->dev->device_count && e->dev->device_count(&n, reason, sizeof reason) == CA_OK) {
        e->device_count = n;
        if (n == 0 && reason[0]) snprintf(e->reason, sizeof e->reason, "%s", reason);
    } else {
        e->device_count = 0;
        snprintf(e->reason, sizeof e->reason, "%s", reason[0] ? reason : ca_last_error());
        ca_clear_error();
    }
}

static void fill_info(entry *e, ca_backend_info *out) {
    count_devices(e);
    *out = (ca_backend_info){
        .name = e->name, .kind = e->kind, .origin = e->origin, .version = e->version,
        .usable = e->usable && (e->kind == CA_BACKEND_COLLECTIVE || e->device_count > 0),
        .device_count = e->kind == CA_BACKEND_DEVICE ? e->device_count : -1,
        .reason = e->reason,
    };
}

int ca_registry_count(void) {
    ensure_builtins();
    pthread_mutex_lock(&reg_mu);
    int n = nentries;
    pthread_mutex_unlock(&reg_mu);
    return n;
}

ca_status ca_registry_get(int i, ca_backend_info *out) {
    ensure_builtins();
    pthread_mutex_lock(&reg_mu);
    entry *e = entries;
    for (int k = 0; e && k < i; k++) e = e->next;
    if (!e || i < 0) {
        pthread_mutex_unlock(&reg_mu);
        return ca_error(CA_ERR_NOT_FOUND, "no backend #%d (registry has %d)", i, nentries);
    }
    fill_info(e, out);
    pthread_mutex_unlock(&reg_mu);
    return CA_OK;
}

static ca_device_kind entry_kind(const entry *e) {
    ca_device_ops o;
    ca_copy_vtable(&o, sizeof o, e->dev, e->dev->struct_size);
    if (o.kind != CA_DEVICE_KIND_UNSET) return o.kind;
    return o.host_memory ? CA_DEVICE_HOST : CA_DEVICE_GPU;   /* a table of an older minor ABI */
}

ca_status ca_registry_best_device(ca_device_kind kind, ca_backend_info *out) {
    ca_registry_load_plugins();
    pthread_mutex_lock(&reg_mu);
    entry *best = NULL, *first = NULL;
    for (entry *e = entries; e; e = e->next) {
        if (!e->dev || entry_kind(e) != kind) continue;
        if (!first) first = e;
        count_devices(e);
        if (e->usable && e->device_count > 0 && (!best || e->score > best->score)) best = e;
    }
    if (best || first) fill_info(best ? best : first, out);
    else *out = (ca_backend_info){.kind = CA_BACKEND_DEVICE, .device_count = -1, .reason = ""};
    pthread_mutex_unlock(&reg_mu);
    return best ? CA_OK : CA_ERR_NOT_FOUND;
}

/* True when the comma-separated list `names` names `dev` ("*" names none: it serves any device
 * only because it moves nothing). */
static bool names_device(const char *names, const char *dev) {
    size_t dl = strlen(dev);
    for (const char *p = names ? names : ""; *p;) {
        const char *c = strchr(p, ',');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        while (l && *p == ' ') { p++; l--; }
        if (l == dl && strncmp(p, dev, dl) == 0) return true;
        if (!c) break;
        p = c + 1;
    }
    return false;
}

bool ca_registry_names_device(const char *names, const char *device_name) {
    return names_device(names, device_name);
}

bool ca_registry_names_host(const char *names) {
    ca_registry_load_plugins();
    pthread_mutex_lock(&reg_mu);
    bool found = false;
    for (entry *e = entries; e && !found; e = e->next)
        found = e->dev && entry_kind(e) == CA_DEVICE_HOST && names_device(names, e->name);
    pthread_mutex_unlock(&reg_mu);
    return found;
}

const char *ca_registry_collective_serving(const char *device_name) {
    ca_registry_load_plugins();
    pthread_mutex_lock(&reg_mu);
    const char *name = NULL;
    for (entry *e = entries; e && !name; e = e->next)
        if (e->coll && e->usable && names_device(e->coll->device_names, device_name)) name = e->name;
    pthread_mutex_unlock(&reg_mu);
    return name;
}

/* What to install when a backend is missing: one row a plugin. */
static const ca_plugin_hint hints[] = {
    {CA_BACKEND_COLLECTIVE, "gloo", CA_DEVICE_KIND_UNSET, "caccel_gloo.so", "libgloo-dev",
     "; or start the program with mpirun and backend mpi", false},
    {CA_BACKEND_COLLECTIVE, "mpi", CA_DEVICE_KIND_UNSET, "caccel_mpi.so", "libopenmpi-dev (and openmpi-bin for mpirun)",
     "; the MPI backend runs only under mpirun/mpiexec/srun --mpi", true},
    {CA_BACKEND_COLLECTIVE, "nccl", CA_DEVICE_KIND_UNSET, "caccel_cuda.so", "libnccl-dev and the CUDA toolkit", "",
     false},
    {CA_BACKEND_DEVICE, "cuda", CA_DEVICE_GPU, "caccel_cuda.so", "the CUDA toolkit (nvcc)", "", false},
};

/* The collective's needs_mpi_launcher (false in a table of an older minor ABI). */
static bool coll_needs_mpi_launcher(const ca_collective_ops *ops) {
    ca_collective_ops o;
    ca_copy_vtable(&o, sizeof o, ops, ops->struct_size);
    return o.needs_mpi_launcher;
}

bool ca_registry_collective_needs_mpi_launcher(const char *name) {
    if (!name) return false;
    /* A launcher asks before it starts the ranks: a backend already registered, else the row of a
     * known plugin, answers without loading plugins (the CUDA one pulls in its libraries). */
    pthread_mutex_lock(&reg_mu);
    entry *e = find(name, CA_BACKEND_COLLECTIVE);
    bool loaded = plugins_done;
    pthread_mutex_unlock(&reg_mu);
    if (e) return coll_needs_mpi_launcher(e->coll);
    const ca_plugin_hint *h = ca_registry_hint(CA_BACKEND_COLLECTIVE, name, CA_DEVICE_KIND_UNSET);
    if (h || loaded) return h && h->needs_mpi_launcher;
    const ca_collective_ops *ops = ca_registry_collective(name);
    return ops && coll_needs_mpi_launcher(ops);
}

const ca_plugin_hint *ca_registry_hint(ca_backend_kind kind, const char *name, ca_device_kind dev_kind) {
    for (size_t i = 0; i < CA_ARRAY_LEN(hints); i++)
        if (hints[i].kind == kind &&
            (name ? strcmp(hints[i].name, name) == 0 : hints[i].device_kind == dev_kind))
            return &hints[i];
    return NULL;
}

/* "cpu, cuda" — the names of one kind, for error messages. */
static void list_names(ca_backend_kind kind, char *buf, size_t len) {
    buf[0] = '\0';
    for (entry *e = entries; e; e = e->next) {
        if (e->kind != kind || (!e->dev && !e->coll)) continue;
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "%s%s", used ? ", " : "", e->name);
    }
}

static const void *lookup(const char *name, ca_backend_kind kind, char *reason, size_t rlen) {
    ca_registry_load_plugins();
    pthread_mutex_lock(&reg_mu);
    entry *e = find(name, kind);
    const void *ops = NULL;
    if (e && (e->dev || e->coll)) {
        if (e->usable) ops = kind == CA_BACKEND_DEVICE ? (const void *)e->dev : (const void *)e->coll;
        else snprintf(reason, rlen, "%s", e->reason);
    } else {
        char names[512];
        list_names(kind, names, sizeof names);
        snprintf(reason, rlen, "not built or plugin not found (available: %s)", names[0] ? names : "none");
    }
    pthread_mutex_unlock(&reg_mu);
    return ops;
}

const ca_collective_ops *ca_registry_collective(const char *name) {
    char reason[600];
    const ca_collective_ops *c = lookup(name, CA_BACKEND_COLLECTIVE, reason, sizeof reason);
    if (!c) {
        ca_error(CA_ERR_NOT_FOUND, "collective backend '%s' is not available: %s", name, reason);
        ca_error_hint("plugins are searched in %s and in CACCEL_PLUGIN_PATH; `caccel env` lists what was found",
                      CA_PLUGIN_DIR);
    }
    return c;
}

const ca_device_ops *ca_registry_device(const char *name) {
    char reason[600];
    const ca_device_ops *d = lookup(name, CA_BACKEND_DEVICE, reason, sizeof reason);
    if (!d) {
        ca_error(CA_ERR_NOT_FOUND, "device backend '%s' is not available: %s", name, reason);
        ca_error_hint("plugins are searched in %s and in CACCEL_PLUGIN_PATH; `caccel env` lists what was found",
                      CA_PLUGIN_DIR);
    }
    return d;
}

void ca_registry_shutdown(void) {
    pthread_mutex_lock(&reg_mu);
    for (entry *e = entries; e;) {
        entry *n = e->next;
        free(e->name); free(e->origin); free(e->version); free(e);
        e = n;
    }
    entries = NULL;
    entries_tail = &entries;
    nentries = 0;
    /* Plugins stay mapped: their threads or atexit handlers may still run. */
    free(handles);
    handles = NULL;
    nhandles = 0;
    builtins_done = plugins_done = false;
    pthread_mutex_unlock(&reg_mu);
}

ca_status ca_cpu_openblas_coretype_hint(const char **out) {
    *out = ca_cpu_coretype_hint();
    return CA_OK;
}
