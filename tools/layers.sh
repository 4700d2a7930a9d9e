# layers.sh: the table of rooms (docs/ARCHITECTURE.md), sourced by check-layers.sh and
# check-symbols.sh. LAYERS_AWK defines room(path), below[room]: the rooms under a room whose
# private headers and ca_ symbols it may use, and prefix[room]: the other prefix its global symbols
# may have.
# shellcheck disable=SC2034
LAYERS_AWK='
    function room(p) {
        if (p ~ /^backends\/[^\/]+\//) { split(p, a, "/"); return a[1] "/" a[2] }
        if (p !~ /\//) return ""
        sub(/\/.*/, "", p); return p
    }
    function may_use(from, to,   n, i, allowed) {
        n = split(below[from], allowed, " ")
        for (i = 1; i <= n; i++) if (allowed[i] == to) return 1
        return 0
    }
    BEGIN {
        below["base"] = ""
        below["backends/cpu"] = below["backends/cuda"] = below["backends/xla_stub"] = "base"
        below["collectives"] = "base"
        below["config"] = "base"
        below["core"] = "base backends/cpu backends/xla_stub collectives"
        below["tensor"] = below["comm"] = "core base"     # side by side: neither uses the other
        below["nn"] = below["data"] = "tensor core base"
        below["accelerator"] = "nn data tensor comm config core base"
        below["tools"] = "accelerator nn data tensor comm config core base"   # merge-weights calls the accelerator; caccel test trains a model
        # Besides ca_, the prefix the non-static symbols of a room may carry: the internals of a backend, hidden
        # in libcaccel or in its plugin (tools/check-symbols.sh checks that nothing but ca_ is exported).
        prefix["backends/cpu"] = "cpu_"; prefix["backends/xla_stub"] = "xla_"; prefix["backends/cuda"] = "cu_"
    }
'
