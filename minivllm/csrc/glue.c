/* The small element-wise layers of a Llama block on the CPU: RMSNorm, rotary embedding and
   SwiGLU's middle, each rounding where torch's ops round. Compile-time constant: BF16. */
#include <stdint.h>
#include <math.h>

#if BF16
typedef uint16_t scalar_t;
static inline float load(const scalar_t *p) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)*p << 16;
    return v.f;
}
static inline uint16_t to_bf16(float x) {
    union { uint32_t u; float f; } v;
    v.f = x;
    return (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}
static inline void store(scalar_t *p, float x) { *p = to_bf16(x); }
/* x rounded to bfloat16 */
static inline float rnd(float x) { const scalar_t b = to_bf16(x); return load(&b); }
#else
typedef float scalar_t;
static inline float load(const scalar_t *p) { return *p; }
static inline void store(scalar_t *p, float x) { *p = x; }
static inline float rnd(float x) { return x; }
#endif
#define BIG(work) if ((work) > 32768)   /* below this, one thread: forking costs more */

/* out[t] = w * rms_norm(x[t]): rows of n, normalised in float32 and rounded, then times w and
   rounded again */
void rms_norm(const scalar_t *x, int64_t x_stride, const scalar_t *w, int64_t n, float eps,
              scalar_t *out, int64_t rows) {
    #pragma omp parallel for schedule(static) BIG(rows * n)
    for (int64_t t = 0; t < rows; t++) {
        const scalar_t *xr = x + t * x_stride;
        scalar_t *o = out + t * n;
        float ss = 0.f;
        for (int64_t i = 0; i < n; i++) {
            const float v = load(xr + i);
            ss += v * v;
        }
        const float r = 1.f / sqrtf(ss / n + eps);
        for (int64_t i = 0; i < n; i++) store(o + i, load(w + i) * rnd(load(xr + i) * r));
    }
}

/* neox-style rotary: out[t, h] = x[t, h] * cos[t] + cat(-x2, x1)[t, h] * sin[t], heads of d
   dims, rows x_stride apart */
void rotate(const scalar_t *x, int64_t x_stride, const scalar_t *cos, const scalar_t *sin,
            int64_t heads, int64_t d, scalar_t *out, int64_t rows) {
    const int64_t half = d / 2;
    #pragma omp parallel for schedule(static) BIG(rows * heads * d)
    for (int64_t t = 0; t < rows; t++)
        for (int64_t h = 0; h < heads; h++) {
            const scalar_t *xr = x + t * x_stride + h * d, *c = cos + t * d, *s = sin + t * d;
            scalar_t *o = out + (t * heads + h) * d;
            for (int64_t i = 0; i < half; i++)
                store(o + i, rnd(load(xr + i) * load(c + i))
                             - rnd(load(xr + half + i) * load(s + i)));
            for (int64_t i = half; i < d; i++)
                store(o + i, rnd(load(xr + i) * load(c + i))
                             + rnd(load(xr + i - half) * load(s + i)));
        }
}

/* SwiGLU's middle: out[t, j] = silu(x[t, j]) * x[t, inter + j], silu rounded before the
   product, as torch's two ops */
void silu_and_mul(const scalar_t *x, int64_t inter, scalar_t *out, int64_t rows) {
    #pragma omp parallel for schedule(static) BIG(rows * inter)
    for (int64_t t = 0; t < rows; t++) {
        const scalar_t *g = x + t * 2 * inter, *u = g + inter;
        scalar_t *o = out + t * inter;
        for (int64_t j = 0; j < inter; j++) {
            const float a = load(g + j);
            store(o + j, rnd(a / (1.f + expf(-a))) * load(u + j));
        }
    }
}

/* x[i] += y[i]: the residual add, rounded as torch's add */
void add_into(scalar_t *x, const scalar_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) store(x + i, load(x + i) + load(y + i));
}
