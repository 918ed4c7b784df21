/* One decode step of a Llama stack in one call: for each layer, the same C kernels the eager
   model calls one by one from Python (04a's GEMM, 05a's glue, 04c's decode attention), called here
   in the same order on the same buffers, so the hidden states come out bit for bit the same.
   The kernels come in as function pointers (each is built, and shape-specialised, on its own).
   Compile-time constant: BF16 (1: bfloat16, 0: float32), for the residual adds. */
#include <stdint.h>
#include <string.h>

#if BF16
typedef uint16_t scalar_t;
static inline float load(const scalar_t *p) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)*p << 16;
    return v.f;
}
static inline void store(scalar_t *p, float x) {   /* round to nearest even, as torch does */
    union { uint32_t u; float f; } v;
    v.f = x;
    *p = (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}
#else
typedef float scalar_t;
static inline float load(const scalar_t *p) { return *p; }
static inline void store(scalar_t *p, float x) { *p = x; }
#endif

typedef int (*gemm_fn)(const scalar_t *, int64_t, int64_t, const scalar_t *, int64_t,
                       const scalar_t *, scalar_t *);
typedef void (*norm_fn)(const scalar_t *, int64_t, const scalar_t *, int64_t, float, scalar_t *,
                        int64_t);
typedef void (*rotate_fn)(const scalar_t *, int64_t, const scalar_t *, const scalar_t *, int64_t,
                          int64_t, scalar_t *, int64_t);
typedef void (*silu_fn)(const scalar_t *, int64_t, scalar_t *, int64_t);
typedef void (*decode_fn)(const scalar_t *, int64_t, const scalar_t *, int64_t, int64_t,
                          const int64_t *, int64_t, const int64_t *, int64_t, float, scalar_t *,
                          int64_t);

typedef struct {   /* one layer's weights (packed for the GEMM) and its KV cache */
    const scalar_t *input_norm, *qkv, *qkv_bias, *o, *o_bias, *post_norm, *gate_up, *gu_bias,
        *down, *down_bias;
    scalar_t *cache;   /* [2, num_blocks, block_size, kv_heads, head_dim] */
} layer_t;

typedef struct {
    gemm_fn gemm;
    norm_fn rms_norm;
    rotate_fn rotate;
    silu_fn silu_and_mul;
    decode_fn decode;
} kernels_t;

/* x[i] += y[i], rounded as torch's add */
static void add_into(scalar_t *x, const scalar_t *y, int64_t len) {
    for (int64_t i = 0; i < len; i++) store(x + i, load(x + i) + load(y + i));
}

/* The layers over x [n, hidden] (the residual stream, updated in place): n requests, one new
   token each, at cache slots `slots`, attending over `seq_lens` tokens through `block_tables`.
   cos, sin: [n, head_dim]. scratch: n * (2 * hidden + 3 * (heads + kv_heads) * head_dim
   + 3 * inter) elements. Returns 1 when a GEMM could not allocate, else 0. */
int decode_layers(const kernels_t *k, const layer_t *layers, int64_t num_layers, scalar_t *x,
                  int64_t n, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                  int64_t inter, const scalar_t *cos, const scalar_t *sin, const int64_t *slots,
                  const int64_t *block_tables, int64_t bt_stride, const int64_t *seq_lens,
                  int64_t num_blocks, int64_t block_size, float eps, float scale,
                  scalar_t *scratch) {
    const int64_t D = head_dim, q_size = heads * D, kv_size = kv_heads * D;
    const int64_t qkv_n = q_size + 2 * kv_size, qk_heads = heads + kv_heads;
    scalar_t *h = scratch, *qkv = h + n * hidden, *qk = qkv + n * qkv_n,
             *attn = qk + n * qk_heads * D, *y = attn + n * q_size, *gu = y + n * hidden,
             *act = gu + n * 2 * inter;
    for (int64_t l = 0; l < num_layers; l++) {
        const layer_t *L = layers + l;
        const int64_t plane = num_blocks * block_size * kv_size;   /* keys, then values */
        k->rms_norm(x, hidden, L->input_norm, hidden, eps, h, n);
        if (k->gemm(h, n, hidden, L->qkv, qkv_n, L->qkv_bias, qkv)) return 1;
        k->rotate(qkv, qkv_n, cos, sin, qk_heads, D, qk, n);   /* q and k side by side */
        for (int64_t i = 0; i < n; i++) {                        /* this step's keys and values */
            memcpy(L->cache + slots[i] * kv_size, qk + (i * qk_heads + heads) * D,
                   kv_size * sizeof(scalar_t));
            memcpy(L->cache + plane + slots[i] * kv_size, qkv + i * qkv_n + q_size + kv_size,
                   kv_size * sizeof(scalar_t));
        }
        k->decode(qk, qk_heads * D, L->cache, num_blocks, kv_heads, block_tables, bt_stride,
                  seq_lens, n, scale, attn, q_size);
        if (k->gemm(attn, n, q_size, L->o, hidden, L->o_bias, y)) return 1;
        add_into(x, y, n * hidden);
        k->rms_norm(x, hidden, L->post_norm, hidden, eps, h, n);
        if (k->gemm(h, n, hidden, L->gate_up, 2 * inter, L->gu_bias, gu)) return 1;
        k->silu_and_mul(gu, inter, act, n);
        if (k->gemm(act, n, inter, L->down, hidden, L->down_bias, y)) return 1;
        add_into(x, y, n * hidden);
    }
    return 0;
}
