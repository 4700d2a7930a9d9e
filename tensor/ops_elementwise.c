/* Elementwise ops: unary functions, scalar arithmetic, broadcasting binary arithmetic. */
#include "tensor/ops_impl.h"

#include <string.h>

/* ------------------------------------------------------------------ unary */

static ca_status unary_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *x = n->in[0], *y = n->out;
    float beta;
    ca_tensor *dx = ca_grad_target(x, &beta);
    if (!dx) return x->requires_grad ? ca_last_status() : CA_OK;
    ca_status s = CA_KCALL(ca_tdev(x), unary_backward, .op = (ca_unary_op)n->i[0], .dt = x->dtype,
                           .n = x->numel, .x = ca_tptr(n->saved[0]), .y = ca_tptr(y), .dy = ca_tptr(g),
                           .dx = ca_tptr(dx), .alpha = (float)n->f[0], .beta = beta);
    if (s == CA_OK) ca_grad_written(x);
    return s;
}

/* The node's name is the op's name in caccel/types.h, one list for both. */
static const ca_node_vt unary_vt[] = {
#define VT(e, name) {name, unary_backward},
    CA_UNARY_OP_LIST(VT)
#undef VT
};
CA_TABLE_COVERS(unary_vt, CA_UNARY_OP_COUNT);

static ca_tensor *unary(ca_tensor *x, ca_unary_op op, double alpha) {
    if (op == CA_UNARY_EXP || op == CA_UNARY_LOG || op == CA_UNARY_POW) x = ca_autocast_f32(x);
    CA_OP_NULLCHECK1(x);
    if (!ca_op_check_float(ca_unary_op_name(op), x)) return NULL;
    x = ca_contiguous(x);
    ca_tensor *y = x ? ca_op_new_like(x) : NULL;
    if (!y) return NULL;
    if (x->numel && CA_KCALL(ca_tdev(x), unary, .op = op, .dt = x->dtype, .n = x->numel, .x = ca_tptr(x),
                             .y = ca_tptr(y), .alpha = (float)alpha) != CA_OK)
        return NULL;
    if (ca_needs_grad(1, &x)) {
        ca_node *n = ca_record(&unary_vt[op], y, 1, &x);
        if (!n) return NULL;
        n->saved[0] = x;
        n->i[0] = op;
        n->f[0] = alpha;
    }
    return y;
}

ca_tensor *ca_neg(ca_tensor *x) { return unary(x, CA_UNARY_NEG, 0); }
ca_tensor *ca_relu(ca_tensor *x) { return unary(x, CA_UNARY_RELU, 0); }
ca_tensor *ca_gelu(ca_tensor *x) { return unary(x, CA_UNARY_GELU_TANH, 0); }
ca_tensor *ca_gelu_erf(ca_tensor *x) { return unary(x, CA_UNARY_GELU_ERF, 0); }
ca_tensor *ca_silu(ca_tensor *x) { return unary(x, CA_UNARY_SILU, 0); }
ca_tensor *ca_tanh(ca_tensor *x) { return unary(x, CA_UNARY_TANH, 0); }
ca_tensor *ca_sigmoid(ca_tensor *x) { return unary(x, CA_UNARY_SIGMOID, 0); }
ca_tensor *ca_exp(ca_tensor *x) { return unary(x, CA_UNARY_EXP, 0); }
ca_tensor *ca_log(ca_tensor *x) { return unary(x, CA_UNARY_LOG, 0); }
ca_tensor *ca_sqrt(ca_tensor *x) { return unary(x, CA_UNARY_SQRT, 0); }
ca_tensor *ca_square(ca_tensor *x) { return unary(x, CA_UNARY_SQUARE, 0); }
ca_tensor *ca_pow_scalar(ca_tensor *x, double p) { return unary(x, CA_UNARY_POW, p); }
ca_tensor *ca_mul_scalar(ca_tensor *x, double s) { return unary(x, CA_UNARY_SCALE, s); }
ca_tensor *ca_add_scalar(ca_tensor *x, double s) { return unary(x, CA_UNARY_ADD_SCALAR, s); }

/* ------------------------------------------------------------------ binary */

/* Output shape of broadcasting a and b, and their strides in it (0 = broadcast). */
static bool broadcast(const ca_tensor *a, const ca_tensor *b, const char *op, ca_bcast_args *bc) {
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    if (nd == 0) nd = 1;               /* scalars run as one element */
    memset(bc, 0, sizeof *bc);
    bc->ndim = nd;
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char x[128], y[128];
            ca_error(CA_ERR_INVALID, "%s: shapes %s and %s cannot be broadcast (dimension %d: %lld vs %lld)", op,
                     ca_shape_str(a->ndim, a->shape, x, sizeof x), ca_shape_str(b->ndim, b->shape, y, sizeof y),
                     i, (long long)sa, (long long)sb);
            return false;
        }
        bc->shape[i] = sa > sb ? sa : sb;
        bc->a_stride[i] = ia >= 0 && sa != 1 ? a->stride[ia] : 0;
        bc->b_stride[i] = ib >= 0 && sb != 1 ? b->stride[ib] : 0;
    }
    return true;
}

/* g op v into a scoped tensor shaped like g (for the chain rule of mul/div). */
static ca_tensor *binary_raw(ca_binary_op op, ca_tensor *g, ca_tensor *v) {
    ca_bcast_args bc;
    if (!broadcast(g, v, ca_binary_op_name(op), &bc)) return NULL;
    ca_tensor *r = ca_tensor_new(ca_tdev(g), g->dtype, g->ndim, g->shape);
    if (!r) return NULL;
    if (CA_KCALL(ca_tdev(g), binary, .op = op, .dt = g->dtype, .shape = bc, .a = ca_tptr(g), .b = ca_tptr(v),
                 .y = ca_tptr(r)) != CA_OK) return NULL;
    return r;
}

static ca_status binary_backward(ca_node *n, ca_tensor *g) {
    ca_tensor *a = n->in[0], *b = n->in[1];
    ca_binary_op op = (ca_binary_op)n->i[0];
    ca_status s = CA_OK;
    /* Only ca_add, ca_sub, ca_mul and ca_div record binary nodes; max and min have a row in
     * binary_vt for their name but no chain rule here. */
    if (op != CA_BINARY_ADD && op != CA_BINARY_SUB && op != CA_BINARY_MUL && op != CA_BINARY_DIV)
        return ca_error(CA_ERR_INTERNAL, "backward of binary %s is not implemented", ca_binary_op_name(op));
    /* A gradient that nothing reads afterwards (a fresh product, or g at its last reader) is
     * handed over rather than copied (ca_grad_adopt). */
    if (a->requires_grad) {
        ca_tensor *ga = g;
        if (op == CA_BINARY_MUL) ga = binary_raw(CA_BINARY_MUL, g, b);
        else if (op == CA_BINARY_DIV) ga = binary_raw(CA_BINARY_DIV, g, b);
        if (!ga) return ca_last_status();
        bool give = ga != g || !b->requires_grad;   /* b reads g below */
        s = give ? ca_op_accumulate_owned(a, ga, 1.0f) : ca_op_accumulate_reduced(a, ga, 1.0f);
    }
    if (s == CA_OK && b->requires_grad) {
        ca_tensor *gb = g;
        float alpha = 1.0f;
        if (op == CA_BINARY_SUB) alpha = -1.0f;
        else if (op == CA_BINARY_MUL) gb = binary_raw(CA_BINARY_MUL, g, a);
        else if (op == CA_BINARY_DIV) {     /* d(a/b)/db = -y/b */
            ca_tensor *t = binary_raw(CA_BINARY_MUL, g, n->out);
            gb = t ? binary_raw(CA_BINARY_DIV, t, b) : NULL;
            alpha = -1.0f;
        }
        s = gb ? ca_op_accumulate_owned(b, gb, alpha) : ca_last_status();
    }
    return s;
}

static const ca_node_vt binary_vt[] = {
#define VT(e, name) {name, binary_backward},
    CA_BINARY_OP_LIST(VT)
#undef VT
};
CA_TABLE_COVERS(binary_vt, CA_BINARY_OP_COUNT);

static ca_tensor *binary(ca_tensor *a, ca_tensor *b, ca_binary_op op) {
    CA_OP_NULLCHECK2(a, b);
    const char *name = ca_binary_op_name(op);
    if (!ca_op_check_float(name, a) || !ca_op_check_float(name, b) || !ca_op_check_same_device(name, a, b))
        return NULL;
    if (a->dtype != b->dtype) {   /* mixed float dtypes promote to f32, as in PyTorch */
        a = ca_cast(a, CA_F32);
        b = ca_cast(b, CA_F32);
        CA_OP_NULLCHECK2(a, b);
    }
    ca_bcast_args bc;
    if (!broadcast(a, b, name, &bc)) return NULL;
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    ca_tensor *y = ca_tensor_new(ca_tdev(a), a->dtype, nd, bc.shape);
    if (!y) return NULL;
    if (y->numel && CA_KCALL(ca_tdev(a), binary, .op = op, .dt = a->dtype, .shape = bc, .a = ca_tptr(a),
                             .b = ca_tptr(b), .y = ca_tptr(y)) != CA_OK)
        return NULL;
    ca_tensor *in[2] = {a, b};
    if (ca_needs_grad(2, in)) {
        ca_node *n = ca_record(&binary_vt[op], y, 2, in);
        if (!n) return NULL;
        n->i[0] = op;
    }
    return y;
}

ca_tensor *ca_add(ca_tensor *a, ca_tensor *b) { return binary(a, b, CA_BINARY_ADD); }
ca_tensor *ca_sub(ca_tensor *a, ca_tensor *b) { return binary(a, b, CA_BINARY_SUB); }
ca_tensor *ca_mul(ca_tensor *a, ca_tensor *b) { return binary(a, b, CA_BINARY_MUL); }
ca_tensor *ca_div(ca_tensor *a, ca_tensor *b) { return binary(a, b, CA_BINARY_DIV); }
