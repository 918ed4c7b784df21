/* y[M,N] = x[M,K] @ W[N,K]^T (+ b) with W kept in the layout of its file: GGUF's blocks as the
   file has them (read straight from its bytes), or plain float rows. Each group of 32 weights is
   unpacked to float32 in registers and multiplied by x. The layouts (KIND, a compile-time
   constant; f16: an IEEE half, read with F16C):
     0 Q4_0 (18 bytes / 32): d f16, 16 bytes of 4-bit codes q (byte j: q[j] low, q[j+16] high);
                             w = d * (q - 8)
     1 Q4_1 (20 bytes / 32): d, m f16, 16 bytes of codes as Q4_0;  w = d * q + m
     2 Q8_0 (34 bytes / 32): d f16, 32 int8 codes;  w = d * q
     3 Q4_K (144 bytes / 256): d, dmin f16, 12 bytes of 6-bit scales s[j] and mins m[j] of eight
                             groups of 32, 128 bytes of codes (32 bytes per two groups: the even
                             group in the low nibbles);  w = d * s[j] * q - dmin * m[j]
     4 Q5_K (176 bytes / 256): as Q4_K, with 32 bytes of fifth bits (bit j of byte l: weight l
                             of group j) between the scales and the codes
     5 Q6_K (210 bytes / 256): 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 int8 scales
                             (one per 16 weights), d f16;  w = d * s * (q - 32)
     6 F32 rows, 7 BF16 rows (the weights as they are; BF16 rows multiply bfloat16 x with
                             AVX512-BF16 dot products)
   BF16 (0/1): x, b, y in bfloat16, else float32; the sums are float32 either way. Every output
   is one sum over K in group order, whatever M is or however the rows are tiled, so a row's
   result does not depend on the other rows. `dequant` writes weight rows in T (a large batch
   multiplies a tile of them with a dense GEMM: no dense copy is kept).
   DOT (K-quants, bfloat16 x, a CPU with AVX512-BF16): the codes are not turned into weights.
   A code q (< 128) or'ed into 0x4300 is the bfloat16 number 128 + q, exactly, so one dot-product
   instruction multiplies 32 codes by 32 values of x. Each 16 weights of a block share a scale
   a and an offset c (w = a * (128 + q) + c), so their part of the sum is a * dot(x, 128 + q)
   + c * sum(x); the sums of x per 16 values are computed once per call. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if KIND == 0
#define BLOCK_BYTES 18
#elif KIND == 1
#define BLOCK_BYTES 20
#elif KIND == 2
#define BLOCK_BYTES 34
#elif KIND == 3
#define BLOCK_BYTES 144
#elif KIND == 4
#define BLOCK_BYTES 176
#elif KIND == 5
#define BLOCK_BYTES 210
#elif KIND == 6
#define BLOCK_BYTES 128
#else
#define BLOCK_BYTES 64
#endif
#if KIND >= 3 && KIND <= 5
#define GROUPS 8   /* groups of 32 weights in a block */
#else
#define GROUPS 1
#endif
#define MR 4   /* a tile: up to MR rows of x by NR rows of weights (MR x NR accumulators) */
#define NR 4
#define AHEAD 16384   /* bytes of the weight stream asked for in advance */
#if BF16 && KIND >= 3 && KIND <= 5 && defined(__AVX512BF16__)
#define DOT 1
#else
#define DOT 0
#endif

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

static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline __m512 f32(__m512i q) { return _mm512_cvtepi32_ps(q); }
static inline __m512i bytes16(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

#if KIND == 3 || KIND == 4
/* Scale and min of group j of a K-quant block's 12 packed bytes (llama.cpp's get_scale_min_k4). */
static inline void scale_min(int j, const uint8_t *q, float *s, float *m) {
    if (j < 4) {
        *s = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *s = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
#endif

/* Group g (32 weights) of weight row `row` in float32: lo = weights 0..15, hi = 16..31. */
static inline void weights(const uint8_t *row, int64_t g, __m512 *lo, __m512 *hi) {
    const uint8_t *b = row + (g / GROUPS) * BLOCK_BYTES;
    const int j = (int)(g % GROUPS);
    (void)j;
#if KIND == 0 || KIND == 1
    const __m512 d = _mm512_set1_ps(half(b));
    const __m512 m = _mm512_set1_ps(KIND == 0 ? -8.f * half(b) : half(b + 2));
    const __m512i q = bytes16(b + (KIND == 0 ? 2 : 4));
    *lo = _mm512_fmadd_ps(f32(_mm512_and_si512(q, _mm512_set1_epi32(15))), d, m);
    *hi = _mm512_fmadd_ps(f32(_mm512_srli_epi32(q, 4)), d, m);
#elif KIND == 2
    const __m512 d = _mm512_set1_ps(half(b));
    const __m128i *q = (const __m128i *)(b + 2);
    *lo = _mm512_mul_ps(f32(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), d);
    *hi = _mm512_mul_ps(f32(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), d);
#elif KIND == 3 || KIND == 4
    float s, mn;
    scale_min(j, b + 4, &s, &mn);
    const __m512 d = _mm512_set1_ps(half(b) * s), m = _mm512_set1_ps(-half(b + 2) * mn);
    const uint8_t *qs = b + (KIND == 3 ? 16 : 48) + 32 * (j / 2);
    const int shift = 4 * (j & 1);
    __m512i ql = _mm512_and_si512(_mm512_srli_epi32(bytes16(qs), shift), _mm512_set1_epi32(15));
    __m512i qh = _mm512_and_si512(_mm512_srli_epi32(bytes16(qs + 16), shift),
                                  _mm512_set1_epi32(15));
#if KIND == 4
    const __m512i one = _mm512_set1_epi32(1);
    ql = _mm512_or_si512(ql, _mm512_slli_epi32(
        _mm512_and_si512(_mm512_srli_epi32(bytes16(b + 16), j), one), 4));
    qh = _mm512_or_si512(qh, _mm512_slli_epi32(
        _mm512_and_si512(_mm512_srli_epi32(bytes16(b + 32), j), one), 4));
#endif
    *lo = _mm512_fmadd_ps(f32(ql), d, m);
    *hi = _mm512_fmadd_ps(f32(qh), d, m);
#elif KIND == 5
    const int n = j / 4, r = j % 4;
    const uint8_t *ql = b + 64 * n + 32 * (r & 1), *qh = b + 128 + 32 * n;
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * n + 2 * r;
    const float d = half(b + 208);
    const int nib = 4 * (r >> 1), hs = 2 * r;
    const __m512i f = _mm512_set1_epi32(15), three = _mm512_set1_epi32(3);
    const __m512i c = _mm512_set1_epi32(32);
    for (int h = 0; h < 2; h++) {
        __m512i q = _mm512_and_si512(_mm512_srli_epi32(bytes16(ql + 16 * h), nib), f);
        q = _mm512_or_si512(q, _mm512_slli_epi32(
            _mm512_and_si512(_mm512_srli_epi32(bytes16(qh + 16 * h), hs), three), 4));
        const __m512 v = _mm512_mul_ps(f32(_mm512_sub_epi32(q, c)), _mm512_set1_ps(d * sc[h]));
        if (h) *hi = v; else *lo = v;
    }
#elif KIND == 6
    *lo = _mm512_loadu_ps((const float *)b);
    *hi = _mm512_loadu_ps((const float *)b + 16);
#else
    const __m256i *p = (const __m256i *)b;
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p)), 16));
    *hi = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p + 1)), 16));
#endif
}

/* Rows x[0..mr) (K apart) times weight rows w[0..nr) (row_bytes apart): the mr x nr outputs
   y[i * N + j], each one accumulator (its sum in group order: the order does not depend on the
   tile). Inlined with mr, nr constants, so the accumulators stay in registers. x is float32, or
   for BF16 rows bfloat16 pairs multiplied by dot products. */
static inline __attribute__((always_inline)) void tile(const void *xv, int mr, int nr, int64_t K,
        const uint8_t *w, int64_t row_bytes, const T *b, T *y, int64_t N) {
    __m512 acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < K / 32; g++) {
#if KIND == 7 && BF16
        const uint16_t *x = (const uint16_t *)xv;
        __m512i wv[NR];
        for (int j = 0; j < nr; j++) {
            const uint8_t *p = w + j * row_bytes + g * 64;
            _mm_prefetch((const char *)(p + AHEAD), _MM_HINT_T0);
            wv[j] = _mm512_loadu_si512(p);
        }
        for (int i = 0; i < mr; i++) {
            const __m512i xi = _mm512_loadu_si512(x + i * K + 32 * g);
            for (int j = 0; j < nr; j++)
                acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xi, (__m512bh)wv[j]);
        }
#else
        const float *x = (const float *)xv;
        __m512 lo[NR], hi[NR];
        for (int j = 0; j < nr; j++) {
            const uint8_t *row = w + j * row_bytes;
            if (g % GROUPS == 0)
                _mm_prefetch((const char *)(row + g / GROUPS * BLOCK_BYTES + AHEAD), _MM_HINT_T0);
            weights(row, g, lo + j, hi + j);
        }
        for (int i = 0; i < mr; i++) {
            const __m512 xl = _mm512_loadu_ps(x + i * K + 32 * g);
            const __m512 xh = _mm512_loadu_ps(x + i * K + 32 * g + 16);
            for (int j = 0; j < nr; j++) {
                acc[i][j] = _mm512_fmadd_ps(lo[j], xl, acc[i][j]);
                acc[i][j] = _mm512_fmadd_ps(hi[j], xh, acc[i][j]);
            }
        }
#endif
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            store(y + i * N + j, _mm512_reduce_add_ps(acc[i][j]) + (b ? load(b + j) : 0.f));
}

#if DOT
static inline __m512i words32(const uint8_t *p) {   /* 32 bytes, each widened to 16 bits */
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
}
static inline __m512i set16(int v) { return _mm512_set1_epi16((short)v); }
#define OR3 0xFE   /* ternary logic a | b | c */
#define ANDOR 0xEA   /* (a & b) | c */

#if KIND == 5
#define RUN 16   /* weights that share a scale */
#else
#define RUN 32
#endif

/* Super-block b's scales and offsets, for w = a * (128 + q) + c. Q6_K: A lane s = a and C lane s
   = c of run s (weights 16s .. 16s + 15). Q4_K, Q5_K: A lanes 0..7 = a of group j (d s[j]),
   C lanes 0..7 = c of group j (-128 a - dmin m[j]), C lanes 8..15 = 0. */
static inline void block_scales(const uint8_t *b, __m512 *A, __m512 *C) {
#if KIND == 5
    *A = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
             _mm_loadu_si128((const __m128i *)(b + 192)))), _mm512_set1_ps(half(b + 208)));
    *C = _mm512_mul_ps(*A, _mm512_set1_ps(-160.f));   /* w = a * (q - 32) */
#else
    /* the 12 bytes as 32-bit lanes u0 u1 u2: scales s[0..3] are u0 & 0x3F (a byte each), s[4..7]
       u2 & 0x0F with u0's top two bits, minimums m[0..3] u1 & 0x3F, m[4..7] u2 >> 4 with u1's */
    const __m128i v = _mm_loadu_si128((const __m128i *)(b + 4));   /* (and 4 bytes past them) */
    const __m128i low = _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)),
                                       _mm_set_epi32(4, 0, 0, 0));   /* u0, u2, u1, u2 >> 4 */
    const __m128i top = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));   /* u0, u0, u1, u1 */
    const __m128i k = _mm_set_epi32(0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F);
    const __m128i sm8 = _mm_or_si128(_mm_and_si128(low, k), _mm_and_si128(_mm_srli_epi32(top, 2),
        _mm_set_epi32(0x30303030, 0, 0x30303030, 0)));   /* s[0..7], m[0..7]: a byte each */
    const __m512 dd = _mm512_insertf32x8(_mm512_set1_ps(half(b)), _mm256_set1_ps(half(b + 2)), 1);
    *A = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sm8)), dd);   /* d s, dmin m */
    const __m512 mins = _mm512_shuffle_f32x4(*A, *A, 0x4E);   /* the halves swapped */
    *C = _mm512_maskz_fnmsub_ps(0x00FF, *A, _mm512_set1_ps(128.f), mins);
#endif
}

/* Group g (32 weights) of super-block b as 32 bfloat16 numbers 128 + q. */
static inline __m512i codes(const uint8_t *b, int g) {
#if KIND == 5
    const int n = g / 4, r = g % 4;
    const __m512i v = words32(b + 64 * n + 32 * (r & 1)), h = words32(b + 128 + 32 * n);
    const __m512i lo = (r >> 1) ? _mm512_srli_epi16(v, 4) : _mm512_and_si512(v, set16(15));
    __m512i hi;   /* bits 2r, 2r + 1 of h, at bits 4, 5 */
    if (r == 0) hi = _mm512_slli_epi16(h, 4);
    else if (r == 1) hi = _mm512_slli_epi16(h, 2);
    else if (r == 2) hi = h;
    else hi = _mm512_srli_epi16(h, 2);
    hi = _mm512_and_si512(hi, set16(0x30));
    return _mm512_ternarylogic_epi32(lo, hi, set16(0x4300), OR3);
#else
    const __m512i v = words32(b + (KIND == 3 ? 16 : 48) + 32 * (g / 2));
    __m512i q = (g & 1) ? _mm512_srli_epi16(v, 4) : _mm512_and_si512(v, set16(15));
#if KIND == 4
    const __m512i h = words32(b + 16);   /* bit g of byte l: the fifth bit of weight l */
    const __m512i fifth = g <= 4 ? _mm512_slli_epi16(h, 4 - g) : _mm512_srli_epi16(h, g - 4);
    q = _mm512_or_si512(q, _mm512_and_si512(fifth, set16(16)));
#endif
    return _mm512_or_si512(q, set16(0x4300));
#endif
}

#if KIND == 5
/* Group g's scales (Q6_K), two runs of 16: lanes 0..7 (weights 0..15) A[2g], lanes 8..15
   A[2g + 1]. */
static inline __m512 group_scale(__m512 A, int g) {
    const __m512i i = _mm512_inserti32x8(_mm512_set1_epi32(2 * g), _mm256_set1_epi32(2 * g + 1), 1);
    return _mm512_permutexvar_ps(i, A);
}
#endif

/* As `tile`, for DOT: x bfloat16, sx [rows, K / RUN] the sums of x's runs of RUN values. */
static inline __attribute__((always_inline)) void dot_tile(const uint16_t *x, const float *sx,
        int mr, int nr, int64_t K, const uint8_t *w, int64_t row_bytes, const T *b, T *y,
        int64_t N) {
    __m512 acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t s = 0; s < K / 256; s++) {
        __m512 A[NR];
#if KIND != 5
        float a1[NR][16];   /* A: one scale a group, read by broadcast */
#endif
        for (int j = 0; j < nr; j++) {
            const uint8_t *p = w + j * row_bytes + s * BLOCK_BYTES;
            for (int l = 0; l < BLOCK_BYTES; l += 64)   /* every cache line of the block */
                _mm_prefetch((const char *)(p + AHEAD + l), _MM_HINT_T0);
            __m512 C;
            block_scales(p, A + j, &C);
#if KIND != 5
            _mm512_storeu_ps(a1[j], A[j]);
#endif
            for (int i = 0; i < mr; i++) {
                const float *si = sx + i * (K / RUN) + 256 / RUN * s;
#if KIND == 5
                const __m512 sums = _mm512_loadu_ps(si);
#else
                const __m512 sums = _mm512_zextps256_ps512(_mm256_loadu_ps(si));
#endif
                acc[i][j] = _mm512_fmadd_ps(C, sums, acc[i][j]);
            }
        }
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {   /* unrolled: g is a constant in codes() */
            __m512i q[NR];
            __m512 a[NR];
            for (int j = 0; j < nr; j++) {
                q[j] = codes(w + j * row_bytes + s * BLOCK_BYTES, g);
#if KIND == 5
                a[j] = group_scale(A[j], g);
#else
                a[j] = _mm512_set1_ps(a1[j][g]);
#endif
            }
            for (int i = 0; i < mr; i++) {
                const __m512i xi = _mm512_loadu_si512(x + i * K + 256 * s + 32 * g);
                for (int j = 0; j < nr; j++)
                    acc[i][j] = _mm512_fmadd_ps(
                        _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)xi, (__m512bh)q[j]),
                        a[j], acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            store(y + i * N + j, _mm512_reduce_add_ps(acc[i][j]) + (b ? load(b + j) : 0.f));
}
#endif

#if DOT
#define TILE(MRC, NRC) \
    case MRC * 8 + NRC: dot_tile(x, sx0 + m * (K / RUN), MRC, NRC, K, w, rb, b, y, N); break;
#else
#define TILE(MRC, NRC) case MRC * 8 + NRC: tile(x, MRC, NRC, K, w, rb, b, y, N); break;
#endif
#define TILES(MRC) TILE(MRC, 1) TILE(MRC, 2) TILE(MRC, 3) TILE(MRC, 4)
#if (KIND == 7 && BF16) || DOT
typedef uint16_t X;   /* what the tiles read x as */
#else
typedef float X;
#endif

static inline int64_t row_bytes(int64_t K) { return K / (32 * GROUPS) * BLOCK_BYTES; }

/* Weight rows [n0, n1), all M rows of x: tiles of up to MR rows by NR weight rows (sx: DOT's
   sums of x). */
static void rows(const X *x0, const float *sx0, int64_t M, int64_t K, const uint8_t *w0,
                 const T *b0, T *y0, int64_t N, int64_t n0, int64_t n1) {
    const int64_t rb = row_bytes(K);
    (void)sx0;
    for (int64_t n = n0; n < n1; n += NR)
        for (int64_t m = 0; m < M; m += MR) {
            const X *x = x0 + m * K;
            const uint8_t *w = w0 + n * rb;
            const T *b = b0 ? b0 + n : 0;
            T *y = y0 + m * N + n;
            switch ((M - m < MR ? M - m : MR) * 8 + (n1 - n < NR ? n1 - n : NR)) {
                TILES(1) TILES(2) TILES(3) TILES(4)
            }
        }
}

#if BF16 && KIND != 7
static __thread float *scratch;   /* x in float32, or DOT's sums of x */
static __thread int64_t scratch_len;
#endif

/* K a multiple of 32 (256 for K-quants); w: N rows of K/32 groups; b (may be null): [N].
   Returns 1 when it could not allocate its scratch buffer, else 0. */
int qgemm(const T *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, const T *b, T *y) {
    const float *sx = 0;
#if BF16 && KIND != 7
#if DOT
    const int64_t need = M * K / RUN;
#else
    const int64_t need = M * K;
#endif
    if (scratch_len < need) {
        free(scratch);
        scratch = (float *)malloc(need * sizeof(float));
        scratch_len = scratch ? need : 0;
        if (!scratch) return 1;
    }
#if DOT
    for (int64_t i = 0; i < M * K / RUN; i++) {   /* the sum of each run of values of x */
        __m512 v = _mm512_setzero_ps();
        for (int l = 0; l < RUN; l += 16)
            v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                    _mm256_loadu_si256((const __m256i *)(x + RUN * i + l))), 16)));
        scratch[i] = _mm512_reduce_add_ps(v);
    }
    const X *xf = (const X *)x;
    sx = scratch;
#else
    for (int64_t i = 0; i < M * K; i++) scratch[i] = load(x + i);
    const X *xf = scratch;
#endif
#else
    const X *xf = (const X *)x;
#endif
    #pragma omp parallel
    {
        const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        /* threads split the weight rows in multiples of NR: whole tiles */
        const int64_t tiles = (N + NR - 1) / NR;
        const int64_t a = tiles * t / nt * NR, e = tiles * (t + 1) / nt * NR;
        rows(xf, sx, M, K, w, b, y, N, a, e < N ? e : N);
    }
    return 0;
}

/* Weight rows [n0, n1) of w as T, into out [n1 - n0, K] (the float weights of a tile). */
void dequant(const uint8_t *w, int64_t K, int64_t n0, int64_t n1, T *out) {
    const int64_t rb = row_bytes(K);
#if DOT   /* w = a * (128 + q) + c, from DOT's codes and scales: one rounding, in the FMA */
    #pragma omp parallel for
    for (int64_t n = n0; n < n1; n++)
        for (int64_t s = 0; s < K / 256; s++) {
            const uint8_t *p = w + n * rb + s * BLOCK_BYTES;
            __m512 A, C;
            float a[16], c[16];
            block_scales(p, &A, &C);
            _mm512_storeu_ps(a, A);
            _mm512_storeu_ps(c, C);
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m512i q = codes(p, g);
                const int r0 = KIND == 5 ? 2 * g : g, r1 = KIND == 5 ? 2 * g + 1 : g;   /* runs */
                const __m512 lo = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm512_castsi512_si256(q)), 16)), _mm512_set1_ps(a[r0]),
                    _mm512_set1_ps(c[r0]));
                const __m512 hi = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(q, 1)), 16)),
                    _mm512_set1_ps(a[r1]), _mm512_set1_ps(c[r1]));
                _mm512_storeu_si512(out + (n - n0) * K + 256 * s + 32 * g,
                                    (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
            }
        }
#else
    #pragma omp parallel for
    for (int64_t n = n0; n < n1; n++) {
        __m512 lo, hi;
        float buf[32];
        (void)buf;
        for (int64_t g = 0; g < K / 32; g++) {
            weights(w + n * rb, g, &lo, &hi);
            T *o = out + (n - n0) * K + 32 * g;
#if BF16 && defined(__AVX512BF16__)
            _mm256_storeu_si256((__m256i *)o, (__m256i)_mm512_cvtneps_pbh(lo));
            _mm256_storeu_si256((__m256i *)(o + 16), (__m256i)_mm512_cvtneps_pbh(hi));
#elif BF16
            _mm512_storeu_ps(buf, lo);
            _mm512_storeu_ps(buf + 16, hi);
            for (int l = 0; l < 32; l++) store(o + l, buf[l]);
#else
            _mm512_storeu_ps(o, lo);
            _mm512_storeu_ps(o + 16, hi);
#endif
        }
    }
#endif
}
