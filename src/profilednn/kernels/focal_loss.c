/* Sigmoid focal loss (Lin et al. 2017, torchvision's sigmoid_focal_loss), loss and input
 * gradient in ONE pass over memory:
 *
 *   e = exp(-|x|),  r = 1 / (1 + e),  p = sigmoid(x) = x >= 0 ? r : e r,  q = 1 - p = x >= 0 ? e r : r
 *   ce  = max(x, 0) - x y + log1p(e)           (BCE with logits, no cancellation)
 *   m   = 1 - p_t = p (1 - y) + q y,  a_t = a0 + a1 y  (a0 = 1-alpha, a1 = 2alpha-1; 1, 0 if alpha < 0)
 *   FL  = a_t ce m^gamma
 *   dFL/dx = a_t [ (p (1-y) - q y) m^gamma + gamma ce p q (1 - 2y) m^(gamma-1) ]
 *   (p - y written as p (1-y) - q y: exact-ish for hard targets where p - 1 would cancel)
 *
 * Per element: read x and y, optionally write FL (reduction "none") and/or dFL/dx times
 * a constant (1, or 1/n for "mean"); the sum of FL comes back as one partial sum per block
 * of BLOCK elements (summed by the caller in double: deterministic for any thread count
 * and any schedule).
 *
 * exp and log1p are our own branch-free approximations (range reduction + polynomial,
 * ~1 ulp; log1p(e) = 2 atanh(e / (2 + e))); 1 / (1 + e) and e / (2 + e) share one
 * division. The loop is compute-bound (~75 AVX2 instructions per 8 elements, ~2.2 ns per
 * element per Zen 3 core: 1.1 ns on 2 cores, vs 0.43 ns for its 12 bytes at a 28 GB/s
 * triad), so every instruction counts.
 * Written so that the compiler vectorises the
 * loop for the ISA it is built for (SSE2 baseline, AVX2+FMA, AVX-512): no libm calls in
 * the loop. NaN logits give NaN loss and gradient, as torchvision's do. Inputs fp32 or
 * bf16 (x and y of the same type; the gradient has x's type, rounded to nearest even).
 * Threads: OpenMP on the libgomp PyTorch loaded, sized by the caller.
 */
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define BLOCK 4096
#define PARALLEL_MIN 32768
#include "values.h"

/* exp(t) for t in [-87.3, 88] (or NaN): Cody-Waite reduction and a degree-6 polynomial. */
INLINE float exp_in_range(float t) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float z = t * 1.44269504088896341f + magic;
    const uint32_t zb = as_bits(z);
    const float k = z - magic;
    float r = t - k * 0.693359375f; /* ln 2 in two parts (Cody-Waite) */
    r = r - k * -2.12194440e-4f;
    float poly = 1.9875691500e-4f;
    poly = poly * r + 1.3981999507e-3f;
    poly = poly * r + 8.3334519073e-3f;
    poly = poly * r + 4.1665795894e-2f;
    poly = poly * r + 1.6666665459e-1f;
    poly = poly * r + 5.0000001201e-1f;
    const float er = poly * (r * r) + r + 1.0f;
    return er * as_float((zb - 0x4B400000u + 127u) << 23);
}

/* exp(t): 0 below -87.3 (no subnormals), clamped at 88 above; NaN stays NaN. */
INLINE float fast_exp(float t) {
    float tc = t < -87.33654f ? -87.33654f : t; /* a NaN fails both compares and is kept */
    tc = tc > 88.0f ? 88.0f : tc;
    const float out = exp_in_range(tc);
    return t < -87.33654f ? 0.0f : out;
}

/* exp(-a) for a >= 0 (or NaN): one clamp instead of fast_exp's three selects; a > 87.3
 * gives ~1e-38 rather than 0, which no product below can tell apart (all underflow). */
INLINE float exp_neg(float a) {
    return exp_in_range(a > 87.33654f ? -87.33654f : -a); /* NaN fails the compare, stays NaN */
}

/* 2 atanh(s) / s as a polynomial in s^2 (fitted on s^2 in [0, 1/9], error < 4e-9). */
INLINE float atanh_ratio(float s2) {
    float q = 0.1408733706605646f;
    q = q * s2 + 0.1398071695212986f;
    q = q * s2 + 0.200124254302277f;
    q = q * s2 + 0.33333158036525606f;
    return 2.0f * (q * s2 + 1.0f);
}

/* log(m) for normal m > 0: m = 2^k f with f in [sqrt(1/2), sqrt(2)), log f = 2 atanh((f-1)/(f+1)). */
INLINE float fast_log(float m) {
    const uint32_t off = as_bits(m) - 0x3F3504F3u;
    const float k = (float)((int32_t)off >> 23);
    const float f = as_float((off & 0x007FFFFFu) + 0x3F3504F3u);
    const float s = (f - 1.0f) / (f + 1.0f);
    return k * 0.69314718055994531f + s * atanh_ratio(s * s);
}

typedef struct {
    float a0, a1;   /* a_t = a0 + a1 y for the loss */
    float ga0, ga1; /* the same times the gradient's constant factor */
    float gamma, gamma_m1;
} focal_params;

/* One block [lo, hi): returns the block's sum of FL. gcase: 0, 1, 2 (gamma exactly that)
 * or 3 (any gamma, m^gamma = exp(gamma log m)); all flags are compile-time constants. */
INLINE float focal_block(int64_t lo, int64_t hi, const void *x, const void *y, const int bf16, const int gcase,
                         const focal_params P, float *loss_out, void *grad_out, const int want_loss,
                         const int want_grad) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = lo; i < hi; ++i) {
        const float xv = load(x, i, bf16), yv = load(y, i, bf16);
        const int pos = xv >= 0.0f; /* one sign test for all three selects */
        const float e = exp_neg(__builtin_fabsf(xv));
        const float d1 = 1.0f + e, d2 = 2.0f + e;
        const float inv = 1.0f / (d1 * d2);  /* one division for both quotients */
        const float r = d2 * inv;            /* 1 / (1 + e) */
        const float s = e * d1 * inv;        /* e / (2 + e) */
        const float er = e * r;
        const float p = pos ? r : er; /* sigmoid(x) and 1 - sigmoid(x), each without */
        const float q = pos ? er : r; /* cancellation */
        const float ce = (pos ? xv : 0.0f) - xv * yv + s * atanh_ratio(s * s); /* log1p(e) = 2 atanh(s) */
        const float pn = p * (1.0f - yv);
        const float m = pn + q * yv; /* 1 - p_t */
        float mg, mg1;               /* m^gamma, m^(gamma-1) */
        if (gcase == 0) {
            mg = 1.0f; mg1 = 0.0f;
        } else if (gcase == 1) {
            mg = m; mg1 = 1.0f;
        } else if (gcase == 2) {
            mg = m * m; mg1 = m;
        } else {
            const float mc = m > 1.17549435e-38f ? m : 1.17549435e-38f;
            mg1 = fast_exp(P.gamma_m1 * fast_log(mc));
            mg = mg1 * m;
        }
        const float loss = (P.a0 + P.a1 * yv) * ce * mg;
        acc += loss;
        if (want_loss) loss_out[i] = loss;
        if (want_grad) {
            float g = (pn - q * yv) * mg; /* (p - y) m^gamma */
            if (gcase != 0) g += P.gamma * ce * (p * q) * (1.0f - 2.0f * yv) * mg1;
            store(grad_out, i, (P.ga0 + P.ga1 * yv) * g, bf16);
        }
    }
    return acc;
}

#define VARIANT(B, G, L, W) (((B) << 4) | ((G) << 2) | ((L) << 1) | (W))
#define CASE(B, G, L, W)                                                                             \
    case VARIANT(B, G, L, W):                                                                        \
        s = focal_block(lo, hi, x, y, B, G, P, loss_out, grad_out, L, W);                            \
        break;
#define CASES_W(B, G, L) CASE(B, G, L, 0) CASE(B, G, L, 1)
#define CASES_L(B, G) CASES_W(B, G, 0) CASES_W(B, G, 1)
#define CASES_G(B) CASES_L(B, 0) CASES_L(B, 1) CASES_L(B, 2) CASES_L(B, 3)

/* Ask for transparent huge pages on a fresh output buffer before its first touch: a
 * 254 MB gradient otherwise costs ~62,000 page faults, as much time as computing it.
 * Only a hint (ignored where THP is off); the memory's contents and lifetime are unchanged. */
static void advise_huge_pages(void *p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    const uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    const uintptr_t hi = ((uintptr_t)p + (uintptr_t)bytes) & ~(huge - 1);
    if (bytes >= (int64_t)(8 << 20) && hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

/* The whole tensor: n elements of x and y (fp32, or bf16 when bf16 != 0). block_sums gets
 * ceil(n / BLOCK) partial sums of FL; loss_out (fp32, may be NULL) the per-element loss;
 * grad_out (x's type, may be NULL) grad_scale * dFL/dx. */
void profilednn_focal_loss(int64_t n, const void *x, const void *y, int bf16, float alpha, float gamma,
                           float grad_scale, double *block_sums, float *loss_out, void *grad_out, int threads) {
    focal_params P;
    P.a0 = alpha >= 0.0f ? 1.0f - alpha : 1.0f;
    P.a1 = alpha >= 0.0f ? 2.0f * alpha - 1.0f : 0.0f;
    P.ga0 = P.a0 * grad_scale;
    P.ga1 = P.a1 * grad_scale;
    P.gamma = gamma;
    P.gamma_m1 = gamma - 1.0f;
    const int gcase = gamma == 0.0f ? 0 : gamma == 1.0f ? 1 : gamma == 2.0f ? 2 : 3;
    const int variant = VARIANT(bf16 ? 1 : 0, gcase, loss_out != 0, grad_out != 0);
    const int64_t blocks = (n + BLOCK - 1) / BLOCK;
    const int nt = n >= PARALLEL_MIN && threads > 1 ? threads : 1;
    if (loss_out) advise_huge_pages(loss_out, n * 4);
    if (grad_out) advise_huge_pages(grad_out, n * (bf16 ? 2 : 4));
    /* Dynamic chunks of 8 blocks (32 Ki elements): a thread whose core is shared with another
     * process takes fewer chunks instead of holding the others up; the sums stay the same
     * (each block writes its own slot). */
#pragma omp parallel for num_threads(nt) schedule(dynamic, 8)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t lo = b * BLOCK, hi = lo + BLOCK < n ? lo + BLOCK : n;
        float s = 0.0f;
        switch (variant) {
            CASES_G(0)
            CASES_G(1)
        }
        block_sums[b] = (double)s;
    }
}

/* The number of partial sums profilednn_focal_loss writes for n elements. */
int64_t profilednn_focal_loss_blocks(int64_t n) { return (n + BLOCK - 1) / BLOCK; }
