/* y[M,N] = x[M,K] @ W[N,K]^T (+ b) with W kept in GGUF's blocks of 32 weights, for the few rows
   of a decode step: each block is unpacked to 32 float32 weights in registers and multiplied by
   x in float32. The blocks as GGUF has them, with the float16 scales widened to float32:
     Q4_1 (24 bytes): d, m (float32), 16 bytes of 4-bit codes q (byte j: q[j] low, q[j+16] high);
                      w = d * q + m
     Q8_0 (36 bytes): d (float32), 32 int8 codes q;  w = d * q
   Compile-time constants: Q8 (1: Q8_0 blocks, 0: Q4_1), BF16 (x, b, y in bfloat16, else float32;
   the sums are float32 either way). Every output is one sum over K in block order, whatever M is
   or however the rows are tiled, so a row's result does not depend on the other rows. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#if Q8
#define BLOCK_BYTES 36
#else
#define BLOCK_BYTES 24
#endif
#define MR 4   /* a tile: up to MR rows of x by NR rows of weights (MR x NR accumulators) */
#define NR 4
#define AHEAD 16384   /* bytes of the weight stream asked for in advance */

#if BF16
typedef uint16_t T;
static inline float load(const T *p) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)*p << 16;
    return v.f;
}
static inline void store(T *p, float x) {
    union { uint32_t u; float f; } v;
    v.f = x;
    *p = (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);   /* round to nearest even */
}
#else
typedef float T;
static inline float load(const T *p) { return *p; }
static inline void store(T *p, float x) { *p = x; }
#endif

/* A block's 32 weights in float32: lo = weights 0..15, hi = weights 16..31. */
static inline void weights(const uint8_t *b, __m512 *lo, __m512 *hi) {
    const __m512 d = _mm512_set1_ps(*(const float *)b);
#if Q8
    const __m128i *q = (const __m128i *)(b + 4);
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), d);
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), d);
#else
    const __m512 m = _mm512_set1_ps(*(const float *)(b + 4));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 8)));
    *lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(15))), d, m);
    *hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d, m);
#endif
}

/* Rows x[0..mr) (float32, K apart) times weight rows w[0..nr) (row_bytes apart): the mr x nr
   outputs y[i * N + j], each one accumulator (its sum in block order: the order does not depend
   on the tile). Inlined with mr, nr constants, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(const float *x, int mr, int nr, int64_t K,
        const uint8_t *w, int64_t row_bytes, const T *b, T *y, int64_t N) {
    __m512 acc[MR][NR], lo[NR], hi[NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < K / 32; g++) {
        for (int j = 0; j < nr; j++) {
            const uint8_t *blk = w + j * row_bytes + g * BLOCK_BYTES;
            _mm_prefetch((const char *)(blk + AHEAD), _MM_HINT_T0);
            weights(blk, lo + j, hi + j);
        }
        for (int i = 0; i < mr; i++) {
            const __m512 xl = _mm512_loadu_ps(x + i * K + 32 * g);
            const __m512 xh = _mm512_loadu_ps(x + i * K + 32 * g + 16);
            for (int j = 0; j < nr; j++) {
                acc[i][j] = _mm512_fmadd_ps(lo[j], xl, acc[i][j]);
                acc[i][j] = _mm512_fmadd_ps(hi[j], xh, acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            store(y + i * N + j, _mm512_reduce_add_ps(acc[i][j]) + (b ? load(b + j) : 0.f));
}

#define TILE(MRC, NRC) case MRC * 8 + NRC: tile(x, MRC, NRC, K, w, rb, b, y, N); break;
#define TILES(MRC) TILE(MRC, 1) TILE(MRC, 2) TILE(MRC, 3) TILE(MRC, 4)

/* Weight rows [n0, n1), all M rows of x: tiles of up to MR rows by NR weight rows. */
static void rows(const float *x0, int64_t M, int64_t K, const uint8_t *w0, const T *b0, T *y0,
                 int64_t N, int64_t n0, int64_t n1) {
    const int64_t rb = K / 32 * BLOCK_BYTES;
    for (int64_t n = n0; n < n1; n += NR)
        for (int64_t m = 0; m < M; m += MR) {
            const float *x = x0 + m * K;
            const uint8_t *w = w0 + n * rb;
            const T *b = b0 ? b0 + n : 0;
            T *y = y0 + m * N + n;
            switch ((M - m < MR ? M - m : MR) * 8 + (n1 - n < NR ? n1 - n : NR)) {
                TILES(1) TILES(2) TILES(3) TILES(4)
            }
        }
}

#if BF16
static __thread float *scratch;   /* x in float32 */
static __thread int64_t scratch_len;
#endif

/* K a multiple of 32; w: N rows of K/32 blocks; b (may be null): [N]. Returns 1 when it could not
   allocate its scratch buffer, else 0. */
int qgemm(const T *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, const T *b, T *y) {
#if BF16
    if (scratch_len < M * K) {
        free(scratch);
        scratch = (float *)malloc(M * K * sizeof(float));
        scratch_len = scratch ? M * K : 0;
        if (!scratch) return 1;
    }
    for (int64_t i = 0; i < M * K; i++) scratch[i] = load(x + i);
    const float *xf = scratch;
#else
    const float *xf = x;
#endif
    #pragma omp parallel
    {
        const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        rows(xf, M, K, w, b, y, N, N * t / nt, N * (t + 1) / nt);
    }
    return 0;
}
