/* One LAMB step (You et al. 2019, Algorithm 2) over a list of dense fp32 tensors, fused:
 *
 *   pass 1, per tensor: m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *                       u = (m / bc1) / (sqrt(v / bc2) + eps) + wd x;
 *                       accumulate ||x||^2 and ||u||^2 (in double);
 *   trust = ||x|| / ||u|| (1 when either is 0);
 *   pass 2, same tensor: u again from the new m, v and the unchanged x (the same float
 *                       operations, so the same u); x += -lr * trust * u.
 *
 * Main memory sees x, g, m, v read and m, v written in pass 1, then m, v, x read and x
 * written in pass 2; pass 2 walks backwards, so it reads from cache what pass 1 left there
 * (all of a tensor that fits), and the step costs about the 7 compulsory streams. No temporaries. Threads: OpenMP, the runtime PyTorch
 * itself loaded (same libgomp.so.1), sized by the caller.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>

/* Tensors below this many elements run on one thread: a parallel region costs more. */
#define PARALLEL_MIN 32768

/* (m / bc1) / (sqrt(v / bc2) + eps) + wd x, with the bias corrections as reciprocals
 * (one division and one square root per element: the kernel is compute bound otherwise). */
static inline float lamb_direction(float m, float v, float x, float inv_bc1, float inv_sqrt_bc2, float eps,
                                   float wd) {
    return (m * inv_bc1) / (sqrtf(v) * inv_sqrt_bc2 + eps) + wd * x;
}

/* The largest team the per-thread partial sums are sized for. */
#define MAX_THREADS 256

/* Pass 1 over [lo, hi): update m and v, accumulate ||x||^2 and ||u||^2 into out[0], out[1]. */
static void lamb_pass1(int64_t lo, int64_t hi, const float *restrict xi, const float *restrict gi,
                       float *restrict mi, float *restrict vi, float beta1, float beta2, float c1, float c2,
                       float inv_bc1, float inv_sqrt_bc2, float eps, float wd, double *out) {
    double wsq = 0.0, usq = 0.0;
#pragma omp simd reduction(+ : wsq, usq)
    for (int64_t j = lo; j < hi; ++j) {
        const float gj = gi[j];
        const float mj = beta1 * mi[j] + c1 * gj;
        const float vj = beta2 * vi[j] + c2 * (gj * gj);
        mi[j] = mj;
        vi[j] = vj;
        const float xj = xi[j];
        const float u = lamb_direction(mj, vj, xj, inv_bc1, inv_sqrt_bc2, eps, wd);
        wsq += (double)xj * (double)xj;
        usq += (double)u * (double)u;
    }
    out[0] = wsq;
    out[1] = usq;
}

/* Pass 2 over [lo, hi), BACKWARDS: pass 1 just walked this range forwards, so its end is
 * what the caches still hold; walking back from there reads that part from cache instead
 * of memory (a tensor larger than the last-level cache otherwise costs 3 extra streams). */
static void lamb_pass2(int64_t lo, int64_t hi, float *restrict xi, const float *restrict mi,
                       const float *restrict vi, float scale, float inv_bc1, float inv_sqrt_bc2, float eps,
                       float wd) {
#pragma omp simd
    for (int64_t j = hi - 1; j >= lo; --j) {
        const float xj = xi[j];
        xi[j] = xj + scale * lamb_direction(mi[j], vi[j], xj, inv_bc1, inv_sqrt_bc2, eps, wd);
    }
}

static float lamb_scale(double wsq, double usq, float lr) {
    const double ratio = (wsq > 0.0 && usq > 0.0) ? sqrt(wsq) / sqrt(usq) : 1.0;
    return (float)(-(double)lr * ratio);
}

/* ONE parallel region for the whole step (a fork/join per tensor costs more than a small
 * tensor's update): a tensor of at least PARALLEL_MIN elements is split into one contiguous
 * range per thread (pass 1, a barrier, the norms summed in thread order, so the same for
 * any timing, pass 2 over the same range); smaller tensors go whole to one thread each,
 * round robin, without barriers. */
void profilednn_lamb_step_f32(int64_t count, float *const *x, const float *const *g, float *const *m,
                              float *const *v, const int64_t *numel, float beta1, float beta2, float c1, float c2,
                              float bc1, float bc2, float eps, float weight_decay, float lr, int threads) {
    /* c1 = 1 - beta1 and c2 = 1 - beta2 come from the caller, computed in double as PyTorch
     * does for a Python scalar (1.0f - 0.99f is 1e-6 away from (float)(1.0 - 0.99)). */
    const float inv_bc1 = (float)(1.0 / (double)bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt((double)bc2));
    const int nt = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    double partial[2 * MAX_THREADS];
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num(), team = omp_get_num_threads();
        int64_t small = 0; /* the running index of small tensors, for the round robin */
        for (int64_t i = 0; i < count; ++i) {
            const int64_t n = numel[i];
            if (n < PARALLEL_MIN || team == 1) {
                if (small++ % team == tid) {
                    double norms[2];
                    lamb_pass1(0, n, x[i], g[i], m[i], v[i], beta1, beta2, c1, c2, inv_bc1, inv_sqrt_bc2, eps,
                               weight_decay, norms);
                    lamb_pass2(0, n, x[i], m[i], v[i], lamb_scale(norms[0], norms[1], lr), inv_bc1,
                               inv_sqrt_bc2, eps, weight_decay);
                }
                continue;
            }
            /* contiguous ranges, multiples of 16 elements (whole cache lines, whole vectors) */
            const int64_t per = ((n + team - 1) / team + 15) & ~(int64_t)15;
            const int64_t lo = per * tid < n ? per * tid : n, hi = lo + per < n ? lo + per : n;
            lamb_pass1(lo, hi, x[i], g[i], m[i], v[i], beta1, beta2, c1, c2, inv_bc1, inv_sqrt_bc2, eps,
                       weight_decay, partial + 2 * tid);
#pragma omp barrier
            double wsq = 0.0, usq = 0.0;
            for (int t = 0; t < team; ++t) {
                wsq += partial[2 * t];
                usq += partial[2 * t + 1];
            }
            lamb_pass2(lo, hi, x[i], m[i], v[i], lamb_scale(wsq, usq, lr), inv_bc1, inv_sqrt_bc2, eps,
                       weight_decay);
#pragma omp barrier /* everyone has read partial[] before the next tensor overwrites it */
        }
    }
}
