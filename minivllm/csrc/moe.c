/* The routed experts of an MoE layer for a decode step's few tokens, in one call: the step's
   (token, expert) pairs grouped by expert, and each chosen expert's weights read once for all
   its tokens (each weight row is dotted with every token of the group while it is in cache).
   Weights stacked as HF stores them: gate_up [E, 2I, H], down [E, H, I]; x, out [T, H] in the
   weights' dtype. Plain C that the compiler vectorises for the CPU it runs on (AVX2 or
   AVX-512). Compile-time constant: BF16 (the weights, x and out in bfloat16, else float32). */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>

#define MAX_ROWS 16      /* a decode step's tokens at most: per-token sums live on the stack */
#define BIG(work) if ((work) > 65536)   /* below this, one thread: forking costs more */

#if BF16
typedef uint16_t scalar_t;
static inline float load(const scalar_t *p) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)*p << 16;
    return v.f;
}
static inline void store(scalar_t *p, float x) {
    union { uint32_t u; float f; } v;
    v.f = x;
    *p = (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);   /* round to nearest even */
}
#else
typedef float scalar_t;
static inline float load(const scalar_t *p) { return *p; }
static inline void store(scalar_t *p, float x) { *p = x; }
#endif

/* s[j] = sum_i w[i] * x[j][i] over n for the n <= 4 vectors x[j] (float32): w is loaded once for
   all four, the compiler vectorises over i */
static inline void dot4(const scalar_t *w, const float *const x[4], int64_t n, float s[4]) {
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    for (int64_t i = 0; i < n; i++) {
        const float v = load(w + i);
        s0 += v * x0[i], s1 += v * x1[i], s2 += v * x2[i], s3 += v * x3[i];
    }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

/* out[t] = sum over t's k experts e of weights[t, j] * down[e] @ (silu(g) * u), where
   (g, u) = gate_up[e] @ x[t] (ids[t, j] = e). T <= MAX_ROWS. Returns 0; -1 if T is too
   large, -2 if out of memory. Each token's k contributions are summed in expert order, as
   the torch loop sums them. */
int moe_experts(const scalar_t *x, int64_t T, int64_t H, int64_t I, const scalar_t *gate_up,
                const scalar_t *down, const float *weights, const int64_t *ids, int64_t k,
                int64_t E, scalar_t *out) {
    if (T > MAX_ROWS) return -1;
    /* float32 scratch: x, the output sums, each token's gate/up and SwiGLU results */
    float *xf = malloc(sizeof(float) * T * (2 * H + 3 * I));
    if (!xf) return -2;
    float *acc = xf + T * H, *g = acc + T * H, *h = g + T * 2 * I;
    for (int64_t i = 0; i < T * H; i++) { xf[i] = load(x + i); acc[i] = 0.f; }
    for (int64_t e = 0; e < E; e++) {
        int64_t tok[MAX_ROWS], n = 0;   /* the tokens routed to e (a token picks e once) */
        float w[MAX_ROWS];
        for (int64_t p = 0; p < T * k; p++)
            if (ids[p] == e) { tok[n] = p / k; w[n] = weights[p]; n++; }
        if (!n) continue;                  /* an expert nobody chose is not read */
        const scalar_t *gu = gate_up + e * 2 * I * H, *dn = down + e * H * I;
        /* gate and up: each of the 2I rows read once, dotted with the group's tokens 4 at a
           time (a short group repeats its last token: computed, not stored) */
        #pragma omp parallel for schedule(static) BIG(2 * I * H)
        for (int64_t r = 0; r < 2 * I; r++)
            for (int64_t j = 0; j < n; j += 4) {
                const float *xs[4];
                float s[4];
                for (int q = 0; q < 4; q++) xs[q] = xf + tok[j + q < n ? j + q : n - 1] * H;
                dot4(gu + r * H, xs, H, s);
                for (int q = 0; q < 4 && j + q < n; q++) g[(j + q) * 2 * I + r] = s[q];
            }
        for (int64_t j = 0; j < n; j++)
            for (int64_t c = 0; c < I; c++) {
                const float a = g[j * 2 * I + c];
                h[j * I + c] = a / (1.f + expf(-a)) * g[j * 2 * I + I + c];
            }
        /* down: each of the H rows read once, each token's result scaled by its weight */
        #pragma omp parallel for schedule(static) BIG(H * I)
        for (int64_t r = 0; r < H; r++)
            for (int64_t j = 0; j < n; j += 4) {
                const float *hs[4];
                float s[4];
                for (int q = 0; q < 4; q++) hs[q] = h + (j + q < n ? j + q : n - 1) * I;
                dot4(dn + r * I, hs, I, s);
                for (int q = 0; q < 4 && j + q < n; q++) acc[tok[j + q] * H + r] += w[j + q] * s[q];
            }
    }
    for (int64_t i = 0; i < T * H; i++) store(out + i, acc[i]);
    free(xf);
    return 0;
}
