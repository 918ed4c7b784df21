/* One decode step of a Llama stack in one call: for each layer, the C kernels the eager model
   calls one by one from Python (04b's GEMM on float rows or GGUF blocks, 05a's glue, 04c's
   decode attention), called here in the same order on buffers laid out as its tensors are, so
   the hidden states come out bit for bit the same. The kernels come in as function pointers,
   each built (and shape-specialised) on its own for the model's dtype; this file only moves
   bytes (`es`: bytes of one element). */
#include <stdint.h>
#include <string.h>

typedef void v;
typedef int (*gemm_fn)(const v *, int64_t, int64_t, const v *, int64_t, const v *, v *);
typedef void (*norm_fn)(const v *, int64_t, const v *, int64_t, float, v *, int64_t);
typedef void (*rotate_fn)(const v *, int64_t, const v *, const v *, int64_t, int64_t, v *,
                          int64_t);
typedef void (*silu_fn)(const v *, int64_t, v *, int64_t);
typedef void (*add_fn)(v *, const v *, int64_t);
typedef void (*decode_fn)(const v *, int64_t, const v *, int64_t, int64_t, const int64_t *,
                          int64_t, const int64_t *, int64_t, float, v *, int64_t);

typedef struct {   /* the kernels, for the model's dtype (each projection brings its GEMM) */
    norm_fn rms_norm;
    rotate_fn rotate;
    silu_fn silu_and_mul;
    add_fn add_into;
    decode_fn decode;
} kernels_t;

typedef struct {   /* a projection's part: its GEMM, its weight as that GEMM reads it, its bias */
    gemm_fn gemm;
    const v *weight, *bias;   /* bias: null for none */
    int64_t cols;    /* its output columns */
} part_t;

typedef struct {   /* a projection: one part, or up to three side by side (columns in order) */
    int64_t num_parts;
    part_t parts[3];
} proj_t;

typedef struct {   /* one layer's norms, projections and cache */
    const v *input_norm, *post_norm;
    proj_t qkv, o, gate_up, down;
    char *cache;   /* [2, num_blocks, block_size, kv_heads, head_dim] */
} layer_t;

/* y [n, N] = x [n, k] @ W.T by the projection's parts: one part writes y itself; with several,
   each part's columns go through `tmp` (one row: straight to their place in y). */
static int project(const proj_t *p, const char *x, int64_t n, int64_t k, char *y, int64_t N,
                   int64_t es, char *tmp) {
    const part_t *q = p->parts;
    if (p->num_parts == 1) return q->gemm(x, n, k, q->weight, N, q->bias, y);
    int64_t c0 = 0;
    for (int64_t i = 0; i < p->num_parts; i++, q++) {
        char *out = n == 1 ? y + c0 * es : tmp;
        if (q->gemm(x, n, k, q->weight, q->cols, q->bias, out)) return 1;
        for (int64_t r = 0; n > 1 && r < n; r++)
            memcpy(y + (r * N + c0) * es, tmp + r * q->cols * es, q->cols * es);
        c0 += q->cols;
    }
    return 0;
}

/* The layers over x [n, hidden] (the residual stream, updated in place): n requests, one new
   token each, at cache slots `slots`, attending over `seq_lens` tokens through `block_tables`.
   cos, sin: [n, head_dim]. scratch: n * (2 * hidden + 3 * (heads + kv_heads) * head_dim
   + 3 * inter + max(qkv columns, 2 * inter)) elements. Returns 1 when a GEMM could not
   allocate, else 0. */
int decode_layers(const kernels_t *k, const layer_t *layers, int64_t num_layers, int64_t es,
                  char *x, int64_t n, int64_t hidden, int64_t heads, int64_t kv_heads,
                  int64_t head_dim, int64_t inter, const v *cos, const v *sin,
                  const int64_t *slots, const int64_t *block_tables, int64_t bt_stride,
                  const int64_t *seq_lens, int64_t num_blocks, int64_t block_size, float eps,
                  float scale, char *scratch) {
    const int64_t D = head_dim, q_size = heads * D, kv_size = kv_heads * D;
    const int64_t qkv_n = q_size + 2 * kv_size, qk_heads = heads + kv_heads;
    char *h = scratch, *qkv = h + n * hidden * es, *qk = qkv + n * qkv_n * es,
         *attn = qk + n * qk_heads * D * es, *y = attn + n * q_size * es,
         *gu = y + n * hidden * es, *act = gu + n * 2 * inter * es, *tmp = act + n * inter * es;
    const int64_t plane = num_blocks * block_size * kv_size * es;   /* keys, then values */
    for (int64_t l = 0; l < num_layers; l++) {
        const layer_t *L = layers + l;
        k->rms_norm(x, hidden, L->input_norm, hidden, eps, h, n);
        if (project(&L->qkv, h, n, hidden, qkv, qkv_n, es, tmp)) return 1;
        k->rotate(qkv, qkv_n, cos, sin, qk_heads, D, qk, n);   /* q and k side by side */
        for (int64_t i = 0; i < n; i++) {                        /* this step's keys and values */
            memcpy(L->cache + slots[i] * kv_size * es, qk + (i * qk_heads + heads) * D * es,
                   kv_size * es);
            memcpy(L->cache + plane + slots[i] * kv_size * es,
                   qkv + (i * qkv_n + q_size + kv_size) * es, kv_size * es);
        }
        k->decode(qk, qk_heads * D, L->cache, num_blocks, kv_heads, block_tables, bt_stride,
                  seq_lens, n, scale, attn, q_size);
        if (project(&L->o, attn, n, q_size, y, hidden, es, tmp)) return 1;
        k->add_into(x, y, n * hidden);
        k->rms_norm(x, hidden, L->post_norm, hidden, eps, h, n);
        if (project(&L->gate_up, h, n, hidden, gu, 2 * inter, es, tmp)) return 1;
        k->silu_and_mul(gu, inter, act, n);
        if (project(&L->down, act, n, inter, y, hidden, es, tmp)) return 1;
        k->add_into(x, y, n * hidden);
    }
    return 0;
}
