/* y[M,N] = x[M,K] @ W[N,K]^T (+ b), accumulated in float32, for the few rows of a decode step.
   A "unit" is 32 bits of K: one float32 or two bfloat16.
   w: [N/16][K/KU][16] units, one 64-byte vector per (16 columns, unit of K);
   xp: [K/KU][M] units (x transposed). Compile-time constant: BF16 (1: bfloat16, 0: float32). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#if BF16
typedef uint16_t T;
#define KU 2
#define FMA(acc, a, b) _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))
#define LOAD16(p) _mm512_castsi512_ps(_mm512_slli_epi32( \
    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define STORE16(p, v) _mm256_storeu_si256((__m256i *)(p), (__m256i)_mm512_cvtneps_pbh(v))
#else
typedef float T;
#define KU 1
#define FMA(acc, a, b) _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), acc)
#define LOAD16(p) _mm512_loadu_ps(p)
#define STORE16(p, v) _mm512_storeu_ps(p, v)
#endif
#define AHEAD 512   /* units of the weight stream asked for in advance: 2 KB */
#define UNROLL32 _Pragma("GCC unroll 32")
#define UNROLL4 _Pragma("GCC unroll 4")

/* One tile: MR rows by NB blocks of 16 columns, over the whole of K, the accumulators in
   registers. Every output element is a sum over K in order, whatever the tile. */
#define TILE(MR, NB)                                                                              \
static void tile_##MR##_##NB(const int32_t *xp, int64_t M, int64_t KN, const int32_t *w,          \
                             const T *b, T *y, int64_t N) {                                       \
    __m512 acc[MR][NB];                                                                           \
    UNROLL32 for (int i = 0; i < MR; i++)                                                         \
        UNROLL4 for (int j = 0; j < NB; j++) acc[i][j] = _mm512_setzero_ps();                     \
    for (int64_t k = 0; k < KN; k++, xp += M, w += 16) {                                          \
        __m512i wv[NB];                                                                           \
        UNROLL4 for (int j = 0; j < NB; j++) {                                                    \
            wv[j] = _mm512_loadu_si512(w + j * KN * 16);                                          \
            _mm_prefetch((const char *)(w + j * KN * 16 + AHEAD), _MM_HINT_T0);                   \
        }                                                                                         \
        UNROLL32 for (int i = 0; i < MR; i++) {                                                   \
            __m512i xv = _mm512_set1_epi32(xp[i]);                                                \
            UNROLL4 for (int j = 0; j < NB; j++) acc[i][j] = FMA(acc[i][j], xv, wv[j]);           \
        }                                                                                         \
    }                                                                                             \
    UNROLL4 for (int j = 0; j < NB; j++) {                                                        \
        __m512 bv = b ? LOAD16(b + 16 * j) : _mm512_setzero_ps();                                 \
        UNROLL32 for (int i = 0; i < MR; i++)                                                     \
            STORE16(y + i * N + 16 * j, _mm512_add_ps(acc[i][j], bv));                            \
    }                                                                                             \
}

#define ROWS6(NB) TILE(1,NB) TILE(2,NB) TILE(3,NB) TILE(4,NB) TILE(5,NB) TILE(6,NB)
#define ROWS14(NB) ROWS6(NB) TILE(7,NB) TILE(8,NB) TILE(9,NB) TILE(10,NB) TILE(11,NB) \
    TILE(12,NB) TILE(13,NB) TILE(14,NB)
ROWS6(4) ROWS14(2) ROWS14(1)
TILE(15,1) TILE(16,1) TILE(17,1) TILE(18,1) TILE(19,1) TILE(20,1) TILE(21,1)
TILE(22,1) TILE(23,1) TILE(24,1) TILE(25,1) TILE(26,1) TILE(27,1) TILE(28,1)

typedef void (*tile_fn)(const int32_t *, int64_t, int64_t, const int32_t *, const T *, T *,
                        int64_t);
#define L6(NB) tile_1_##NB, tile_2_##NB, tile_3_##NB, tile_4_##NB, tile_5_##NB, tile_6_##NB
#define L14(NB) L6(NB), tile_7_##NB, tile_8_##NB, tile_9_##NB, tile_10_##NB, tile_11_##NB,        \
    tile_12_##NB, tile_13_##NB, tile_14_##NB
static const tile_fn TILES4[] = {0, L6(4)}, TILES2[] = {0, L14(2)};
static const tile_fn TILES1[] = {0, L14(1), tile_15_1, tile_16_1, tile_17_1, tile_18_1,
                                 tile_19_1, tile_20_1, tile_21_1, tile_22_1, tile_23_1,
                                 tile_24_1, tile_25_1, tile_26_1, tile_27_1, tile_28_1};

/* Column blocks [b0, b1) for all M rows: tiles as wide as the rows allow (at most 28
   accumulators), rows split evenly. */
static void columns(const int32_t *xp, int64_t M, int64_t KN, const int32_t *w, const T *bias,
                    T *y, int64_t N, int64_t b0, int64_t b1) {
    int64_t wide = M <= 6 ? 4 : M <= 14 ? 2 : 1;
    for (int64_t c = b0; c < b1;) {
        int64_t nb = b1 - c < wide ? b1 - c : wide;
        if (nb == 3) nb = 2;
        int64_t most = nb == 4 ? 6 : nb == 2 ? 14 : 28, tiles = (M + most - 1) / most;
        int64_t mr = (M + tiles - 1) / tiles;
        const tile_fn *fns = nb == 4 ? TILES4 : nb == 2 ? TILES2 : TILES1;
        for (int64_t m = 0; m < M; m += mr)
            fns[M - m < mr ? M - m : mr](xp + m, M, KN, w + c * KN * 16,
                                         bias ? bias + 16 * c : 0, y + m * N + 16 * c, N);
        c += nb;
    }
}

static __thread int32_t *scratch;
static __thread int64_t scratch_len;

int gemm(const T *x, int64_t M, int64_t K, const T *w, int64_t N, const T *bias, T *y) {
    int64_t KN = K / KU, B = N / 16;
    if (scratch_len < M * KN) {
        free(scratch);
        scratch = (int32_t *)malloc(M * KN * 4);
        scratch_len = scratch ? M * KN : 0;
        if (!scratch) return 1;
    }
    const int32_t *x32 = (const int32_t *)x;
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < KN; k++) scratch[k * M + m] = x32[m * KN + k];
    const int32_t *xp = scratch;
    #pragma omp parallel
    {
        int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        columns(xp, M, KN, (const int32_t *)w, bias, y, N, B * t / nt, B * (t + 1) / nt);
    }
    return 0;
}
