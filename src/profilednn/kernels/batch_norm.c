/* Training-mode batch normalisation (Ioffe & Szegedy 2015), forward and backward, with an
 * optional residual add and ReLU fused into the same passes:
 *
 *   forward   mean_c, var_c over (N, H, W);  a_c = w_c / sqrt(var_c + eps),  s_c = b_c - mean_c a_c
 *             y = x a_c + s_c  [+ z]  [relu]
 *   backward  g = dy [* (y > 0)]          (dz = g when z was added)
 *             db_c = sum g,   dw_c = sum g (x - mean_c) / sqrt(var_c + eps)
 *             dx = a_c (g - db_c / M) - (x - mean_c) a_c invstd_c^2 (sum g (x - mean_c)) / M
 *                = g k1_c + x k2_c + k3_c
 *
 * Memory sees the compulsory streams only: forward reads x twice (statistics, then the
 * output) and writes y; backward reads dy and x (and y where the ReLU mask cannot be
 * recomputed from x because a residual was added) twice and writes dx (and dz). Stock
 * PyTorch on a CPU runs batch norm, the residual add, ReLU and their backwards as separate
 * kernels, each a full pass over the activation, and its BF16 channels-last batch norm
 * converts through fp32 scratch tensors.
 *
 * Layouts: NCHW (contiguous: each (n, c) plane of HW elements) and NHWC (channels_last:
 * rows of C). Values fp32 or bf16 (x, z, y, dy, dx, dz of one type; bf16 stored rounded to
 * nearest even); statistics and parameters fp32. Sums are taken per fixed block of rows
 * (NHWC) or per plane (NCHW), with a shift (the channel's first value) against
 * cancellation, and combined in double in a fixed order: the result is the same for any
 * number of threads. Threads: OpenMP on the libgomp PyTorch loaded, sized by the caller.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROWS_PER_BLOCK 64
#include "values.h"

static void finish_stats(int64_t C, int64_t M, const float *shift, const double *s1, const double *s2,
                         float eps, float *mean, float *invstd, float *var) {
    for (int64_t c = 0; c < C; ++c) {
        const double m1 = s1[c] / (double)M;
        double v = s2[c] / (double)M - m1 * m1;
        if (v < 0.0) v = 0.0;
        mean[c] = (float)((double)shift[c] + m1);
        var[c] = (float)v;
        invstd[c] = (float)(1.0 / sqrt(v + (double)eps));
    }
}

/* Sum of per-block partials (block-major, [nblocks][C] floats) in double, block order. */
static void combine_blocks(int64_t nblocks, int64_t C, const float *pa, const float *pb, double *s1, double *s2) {
    for (int64_t c = 0; c < C; ++c) s1[c] = s2[c] = 0.0;
    for (int64_t blk = 0; blk < nblocks; ++blk) {
        const float *ra = pa + blk * C, *rb = pb + blk * C;
        for (int64_t c = 0; c < C; ++c) {
            s1[c] += ra[c];
            s2[c] += rb[c];
        }
    }
}

/* Each kernel below works on one span: an NHWC row (C channels, per-channel parameters
 * from arrays) or an NCHW plane (HW values of one channel, scalar parameters). Their flag
 * arguments (bf16 values, residual, ReLU, mask from y, residual gradient) are literals at
 * every call site, inside the parallel loops (FLAGS3/FLAGS4 below): GCC outlines OpenMP
 * regions before it propagates constants, so a flag tested inside the region would leave
 * one branchy scalar loop, several times slower than these vector loops. */

/* ---------------------------------------------------------------- forward: statistics */
INLINE void stats_row(const void *x, int64_t base, int64_t C, const float *k, float *a, float *b, const int bf16) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
        const float d = load(x, base + c, bf16) - k[c];
        a[c] += d;
        b[c] += d * d;
    }
}

INLINE void stats_plane(const void *x, int64_t base, int64_t HW, float k, double *ta, double *tb, const int bf16) {
    float fa = 0.0f, fb = 0.0f;
#pragma omp simd reduction(+ : fa, fb)
    for (int64_t j = 0; j < HW; ++j) {
        const float d = load(x, base + j, bf16) - k;
        fa += d;
        fb += d * d;
    }
    *ta += fa;
    *tb += fb;
}

/* Shifted per-channel moments of x (see finish_stats) into s1, s2. Returns -1 on no memory. */
static int moments(int nhwc, int64_t N, int64_t C, int64_t HW, const void *x, int bf16, float *shift,
                   double *s1, double *s2, int threads) {
    const int64_t M = N * HW;
    if (nhwc) {
        for (int64_t c = 0; c < C; ++c) shift[c] = load(x, c, bf16);
        const int64_t nblocks = (M + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
        float *pa = calloc((size_t)(nblocks * C * 2), sizeof(float));
        if (!pa) return -1;
        float *pb = pa + nblocks * C;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t blk = 0; blk < nblocks; ++blk) {
            const int64_t r1 = (blk + 1) * ROWS_PER_BLOCK < M ? (blk + 1) * ROWS_PER_BLOCK : M;
            for (int64_t r = blk * ROWS_PER_BLOCK; r < r1; ++r) {
                if (bf16) stats_row(x, r * C, C, shift, pa + blk * C, pb + blk * C, 1);
                else stats_row(x, r * C, C, shift, pa + blk * C, pb + blk * C, 0);
            }
        }
        combine_blocks(nblocks, C, pa, pb, s1, s2);
        free(pa);
    } else {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t c = 0; c < C; ++c) {
            const float k = load(x, c * HW, bf16);
            double ta = 0.0, tb = 0.0;
            for (int64_t n = 0; n < N; ++n) {
                if (bf16) stats_plane(x, (n * C + c) * HW, HW, k, &ta, &tb, 1);
                else stats_plane(x, (n * C + c) * HW, HW, k, &ta, &tb, 0);
            }
            shift[c] = k;
            s1[c] = ta;
            s2[c] = tb;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- forward: output */
INLINE void out_row(const void *x, const void *z, void *y, int64_t base, int64_t C, const float *scale,
                    const float *offs, const int bf16, const int has_z, const int relu) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
        float v = load(x, base + c, bf16) * scale[c] + offs[c];
        if (has_z) v += load(z, base + c, bf16);
        if (relu) v = v > 0.0f ? v : 0.0f;
        store(y, base + c, v, bf16);
    }
}

INLINE void out_plane(const void *x, const void *z, void *y, int64_t base, int64_t HW, float sc, float of,
                      const int bf16, const int has_z, const int relu) {
#pragma omp simd
    for (int64_t j = 0; j < HW; ++j) {
        float v = load(x, base + j, bf16) * sc + of;
        if (has_z) v += load(z, base + j, bf16);
        if (relu) v = v > 0.0f ? v : 0.0f;
        store(y, base + j, v, bf16);
    }
}

/* CALL(..., b, z, r) with the three flags of `flags` (b << 2 | z << 1 | r) as literals. */
#define FLAGS3(flags, CALL)                                                                    \
    switch (flags) {                                                                           \
    case 0: CALL(0, 0, 0); break; case 1: CALL(0, 0, 1); break;                                \
    case 2: CALL(0, 1, 0); break; case 3: CALL(0, 1, 1); break;                                \
    case 4: CALL(1, 0, 0); break; case 5: CALL(1, 0, 1); break;                                \
    case 6: CALL(1, 1, 0); break; default: CALL(1, 1, 1); break;                               \
    }

static void write_output(int nhwc, int64_t N, int64_t C, int64_t HW, const void *x, const void *z, void *y,
                         const float *scale, const float *offs, int bf16, int relu, int threads) {
    const int flags = (bf16 ? 4 : 0) | (z ? 2 : 0) | (relu ? 1 : 0);
    if (nhwc) {
        const int64_t M = N * HW;
#define ROW(B, Z, R) out_row(x, z, y, r * C, C, scale, offs, B, Z, R)
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t r = 0; r < M; ++r) {
            FLAGS3(flags, ROW)
        }
#undef ROW
    } else {
#define PLANE(B, Z, R) out_plane(x, z, y, p * HW, HW, scale[p % C], offs[p % C], B, Z, R)
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t p = 0; p < N * C; ++p) {
            FLAGS3(flags, PLANE)
        }
#undef PLANE
    }
}

/* Returns 0, or -1 when scratch memory could not be allocated. */
int profilednn_bn_forward(int nhwc, int64_t N, int64_t C, int64_t HW, const void *x, const void *z, void *y,
                          int bf16, const float *w, const float *bias, float eps, int relu, float *mean,
                          float *invstd, float *var, int threads) {
    const int64_t M = N * HW;
    if (M == 0 || C == 0) return 0;
    float *shift = malloc(sizeof(float) * C * 3);
    double *s1 = malloc(sizeof(double) * C * 2);
    int rc = -1;
    if (!shift || !s1) goto done;
    float *scale = shift + C, *offs = shift + 2 * C;
    double *s2 = s1 + C;
    if (moments(nhwc, N, C, HW, x, bf16, shift, s1, s2, threads) != 0) goto done;
    finish_stats(C, M, shift, s1, s2, eps, mean, invstd, var);
    for (int64_t c = 0; c < C; ++c) {
        scale[c] = (w ? w[c] : 1.0f) * invstd[c];
        offs[c] = (bias ? bias[c] : 0.0f) - mean[c] * scale[c];
    }
    write_output(nhwc, N, C, HW, x, z, y, scale, offs, bf16, relu, threads);
    rc = 0;
done:
    free(shift);
    free(s1);
    return rc;
}

/* ---------------------------------------------------------------- backward */
/* The gradient reaching the normalisation: dy, masked by the ReLU when there was one (its
 * output y > 0, read from y when given, else recomputed as x a + s > 0). */
INLINE float masked(const void *dy, const void *x, const void *y, int64_t i, const int bf16, const int relu,
                    const int has_y, float a, float s) {
    const float g = load(dy, i, bf16);
    if (!relu) return g;
    const float out = has_y ? load(y, i, bf16) : load(x, i, bf16) * a + s;
    return out > 0.0f ? g : 0.0f;
}

INLINE void gsum_row(const void *dy, const void *x, const void *y, int64_t base, int64_t C, const float *a,
                     const float *s, const float *mean, float *ra, float *rb, const int bf16, const int relu,
                     const int has_y) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
        const float g = masked(dy, x, y, base + c, bf16, relu, has_y, a[c], s[c]);
        ra[c] += g;
        rb[c] += g * (load(x, base + c, bf16) - mean[c]);
    }
}

INLINE void gsum_plane(const void *dy, const void *x, const void *y, int64_t base, int64_t HW, float a, float s,
                       float m, double *ta, double *tb, const int bf16, const int relu, const int has_y) {
    float fa = 0.0f, fb = 0.0f;
#pragma omp simd reduction(+ : fa, fb)
    for (int64_t j = 0; j < HW; ++j) {
        const float g = masked(dy, x, y, base + j, bf16, relu, has_y, a, s);
        fa += g;
        fb += g * (load(x, base + j, bf16) - m);
    }
    *ta += fa;
    *tb += fb;
}

/* Pass 1 of the backward: per channel sum g and sum g (x - mean), into sg, sgx.
 * flags = bf16 << 2 | relu << 1 | has_y (the middle FLAGS3 slot carries relu here). */
static int grad_sums(int nhwc, int64_t N, int64_t C, int64_t HW, const void *dy, const void *x, const void *y,
                     const float *a, const float *s, const float *mean, int flags, double *sg, double *sgx,
                     int threads) {
    const int64_t M = N * HW;
    if (nhwc) {
        const int64_t nblocks = (M + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
        float *pa = calloc((size_t)(nblocks * C * 2), sizeof(float));
        if (!pa) return -1;
        float *pb = pa + nblocks * C;
#define ROW(B, R, Y) gsum_row(dy, x, y, r * C, C, a, s, mean, pa + blk * C, pb + blk * C, B, R, Y)
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t blk = 0; blk < nblocks; ++blk) {
            const int64_t r1 = (blk + 1) * ROWS_PER_BLOCK < M ? (blk + 1) * ROWS_PER_BLOCK : M;
            for (int64_t r = blk * ROWS_PER_BLOCK; r < r1; ++r) {
                FLAGS3(flags, ROW)
            }
        }
#undef ROW
        combine_blocks(nblocks, C, pa, pb, sg, sgx);
        free(pa);
    } else {
#define PLANE(B, R, Y) gsum_plane(dy, x, y, (n * C + c) * HW, HW, a[c], s[c], mean[c], &ta, &tb, B, R, Y)
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t c = 0; c < C; ++c) {
            double ta = 0.0, tb = 0.0;
            for (int64_t n = 0; n < N; ++n) {
                FLAGS3(flags, PLANE)
            }
            sg[c] = ta;
            sgx[c] = tb;
        }
#undef PLANE
    }
    return 0;
}

INLINE void dx_row(const void *dy, const void *x, const void *y, void *dx, void *dz, int64_t base, int64_t C,
                   const float *a, const float *s, const float *k1, const float *k2, const float *k3,
                   const int bf16, const int relu, const int has_y, const int has_dz) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
        const float g = masked(dy, x, y, base + c, bf16, relu, has_y, a[c], s[c]);
        store(dx, base + c, g * k1[c] + load(x, base + c, bf16) * k2[c] + k3[c], bf16);
        if (has_dz) store(dz, base + c, g, bf16);
    }
}

INLINE void dx_plane(const void *dy, const void *x, const void *y, void *dx, void *dz, int64_t base, int64_t HW,
                     float a, float s, float q1, float q2, float q3, const int bf16, const int relu,
                     const int has_y, const int has_dz) {
#pragma omp simd
    for (int64_t j = 0; j < HW; ++j) {
        const float g = masked(dy, x, y, base + j, bf16, relu, has_y, a, s);
        store(dx, base + j, g * q1 + load(x, base + j, bf16) * q2 + q3, bf16);
        if (has_dz) store(dz, base + j, g, bf16);
    }
}

/* FLAGS3 with a fourth flag (the residual gradient) as the lowest bit. */
#define FLAGS4(flags, CALL)                                                                    \
    if ((flags) & 1) {                                                                         \
        FLAGS3((flags) >> 1, CALL##_DZ)                                                        \
    } else {                                                                                   \
        FLAGS3((flags) >> 1, CALL)                                                             \
    }

/* Pass 2 of the backward: dx = g k1 + x k2 + k3, and dz = g when a residual was added. */
static void grad_input(int nhwc, int64_t N, int64_t C, int64_t HW, const void *dy, const void *x, const void *y,
                       const float *a, const float *s, const float *k1, const float *k2, const float *k3,
                       void *dx, void *dz, int flags, int threads) {
    if (nhwc) {
        const int64_t M = N * HW;
#define ROW(B, R, Y) dx_row(dy, x, y, dx, dz, r * C, C, a, s, k1, k2, k3, B, R, Y, 0)
#define ROW_DZ(B, R, Y) dx_row(dy, x, y, dx, dz, r * C, C, a, s, k1, k2, k3, B, R, Y, 1)
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t r = 0; r < M; ++r) {
            FLAGS4(flags, ROW)
        }
#undef ROW
#undef ROW_DZ
    } else {
#define PLANE(B, R, Y) dx_plane(dy, x, y, dx, dz, p * HW, HW, a[p % C], s[p % C], k1[p % C], k2[p % C], \
                                k3[p % C], B, R, Y, 0)
#define PLANE_DZ(B, R, Y) dx_plane(dy, x, y, dx, dz, p * HW, HW, a[p % C], s[p % C], k1[p % C], k2[p % C], \
                                   k3[p % C], B, R, Y, 1)
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t p = 0; p < N * C; ++p) {
            FLAGS4(flags, PLANE)
        }
#undef PLANE
#undef PLANE_DZ
    }
}

int profilednn_bn_backward(int nhwc, int64_t N, int64_t C, int64_t HW, const void *dy, const void *x,
                           const void *y, int bf16, const float *w, const float *bias, const float *mean,
                           const float *invstd, int relu, void *dx, void *dz, float *dw, float *db,
                           int threads) {
    const int64_t M = N * HW;
    if (M == 0 || C == 0) return 0;
    float *a = malloc(sizeof(float) * C * 5);
    double *sg = malloc(sizeof(double) * C * 2);
    int rc = -1;
    if (!a || !sg) goto done;
    float *s = a + C, *k1 = a + 2 * C, *k2 = a + 3 * C, *k3 = a + 4 * C;
    double *sgx = sg + C;
    for (int64_t c = 0; c < C; ++c) {
        a[c] = (w ? w[c] : 1.0f) * invstd[c];
        s[c] = (bias ? bias[c] : 0.0f) - mean[c] * a[c];
    }
    /* the ReLU mask: recomputed from x without a residual, read from y with one */
    const int flags = (bf16 ? 4 : 0) | (relu ? 2 : 0) | (relu && y ? 1 : 0);
    if (grad_sums(nhwc, N, C, HW, dy, x, y, a, s, mean, flags, sg, sgx, threads) != 0) goto done;
    for (int64_t c = 0; c < C; ++c) {
        db[c] = (float)sg[c];
        dw[c] = (float)(sgx[c] * (double)invstd[c]);
        k1[c] = a[c];
        k2[c] = (float)(-(double)a[c] * (double)invstd[c] * (double)invstd[c] * sgx[c] / (double)M);
        k3[c] = (float)(-(double)a[c] * sg[c] / (double)M - (double)mean[c] * (double)k2[c]);
    }
    grad_input(nhwc, N, C, HW, dy, x, y, a, s, k1, k2, k3, dx, dz, flags << 1 | (dz ? 1 : 0), threads);
    rc = 0;
done:
    free(a);
    free(sg);
    return rc;
}
