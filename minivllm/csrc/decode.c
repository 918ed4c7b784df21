/* Paged decode attention on the CPU: one query token per request against its paged K/V cache.
   Compile-time constants: BS (block size), G (query heads per KV head), D (head dim),
   BF16 (1: bfloat16, 0: float32). */
#include <stdint.h>
#include <math.h>

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

/* Ask for a block's keys and values of KV head h before they are needed: blocks are scattered,
   so the hardware prefetcher cannot guess where the next one is, but the block table says. */
static inline void prefetch_block(const scalar_t *cache, const scalar_t *values, int64_t blk,
                                  int64_t row, int64_t h) {
    const char *k = (const char *)(cache + blk * BS * row + h * D);
    const char *v = (const char *)(values + blk * BS * row + h * D);
    for (int j = 0; j < BS; j++)
        for (int c = 0; c < D * (int)sizeof(scalar_t); c += 64) {
            __builtin_prefetch(k + j * row * sizeof(scalar_t) + c);
            __builtin_prefetch(v + j * row * sizeof(scalar_t) + c);
        }
}

void decode(const scalar_t *q, int64_t q_stride, const scalar_t *cache, int64_t num_blocks,
            int64_t hkv, const int64_t *block_tables, int64_t bt_stride, const int64_t *seq_lens,
            int64_t n, float scale, scalar_t *out, int64_t out_stride) {
    const int64_t row = hkv * D;              /* one token's keys (or values), all KV heads */
    const scalar_t *values = cache + num_blocks * BS * row;  /* cache: [2, blocks, BS, hkv, D] */
    #pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t i = 0; i < n; i++)
    for (int64_t h = 0; h < hkv; h++) {
        float qs[G][D], acc[G][D], s[G][BS], x[D], m[G], l[G];
        const int64_t len = seq_lens[i];
        const int64_t *table = block_tables + i * bt_stride;
        for (int g = 0; g < G; g++) {
            m[g] = -3.0e38f;
            l[g] = 0.f;
            for (int d = 0; d < D; d++) {
                qs[g][d] = load(q + i * q_stride + (h * G + g) * D + d) * scale;
                acc[g][d] = 0.f;
            }
        }
        prefetch_block(cache, values, table[0], row, h);
        for (int64_t t0 = 0; t0 < len; t0 += BS) {
            const int64_t blk = table[t0 / BS];
            const int nt = len - t0 < BS ? (int)(len - t0) : BS;
            const scalar_t *kb = cache + blk * BS * row + h * D;
            const scalar_t *vb = values + blk * BS * row + h * D;
            if (t0 + BS < len) prefetch_block(cache, values, table[t0 / BS + 1], row, h);
            for (int j = 0; j < nt; j++) {   /* scores: each key converted once, for G heads */
                for (int d = 0; d < D; d++) x[d] = load(kb + j * row + d);
                for (int g = 0; g < G; g++) {
                    float dot = 0.f;
                    for (int d = 0; d < D; d++) dot += qs[g][d] * x[d];
                    s[g][j] = dot;
                }
            }
            for (int g = 0; g < G; g++) {    /* online softmax: a new maximum rescales the past */
                float mx = m[g], sum = 0.f;
                for (int j = 0; j < nt; j++) mx = s[g][j] > mx ? s[g][j] : mx;
                for (int j = 0; j < nt; j++) {
                    s[g][j] = expf(s[g][j] - mx);
                    sum += s[g][j];
                }
                const float c = expf(m[g] - mx);
                for (int d = 0; d < D; d++) acc[g][d] *= c;
                l[g] = l[g] * c + sum;
                m[g] = mx;
            }
            for (int j = 0; j < nt; j++) {   /* values: each converted once, added for G heads */
                for (int d = 0; d < D; d++) x[d] = load(vb + j * row + d);
                for (int g = 0; g < G; g++)
                    for (int d = 0; d < D; d++) acc[g][d] += s[g][j] * x[d];
            }
        }
        for (int g = 0; g < G; g++)
            for (int d = 0; d < D; d++)
                store(out + i * out_stride + (h * G + g) * D + d, acc[g][d] / l[g]);
    }
}
