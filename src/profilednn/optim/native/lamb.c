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
 * written in pass 2; for a tensor that fits in cache pass 2 reads from cache, so the step
 * costs the 7 compulsory streams. No temporaries. Threads: OpenMP, the runtime PyTorch
 * itself loaded (same libgomp.so.1), sized by the caller.
 */
#include <math.h>
#include <stdint.h>

/* Tensors below this many elements run on one thread: a parallel region costs more. */
#define PARALLEL_MIN 32768

/* (m / bc1) / (sqrt(v / bc2) + eps) + wd x, with the bias corrections as reciprocals
 * (one division and one square root per element: the kernel is compute bound otherwise). */
static inline float lamb_direction(float m, float v, float x, float inv_bc1, float inv_sqrt_bc2, float eps,
                                   float wd) {
    return (m * inv_bc1) / (sqrtf(v) * inv_sqrt_bc2 + eps) + wd * x;
}

void profilednn_lamb_step_f32(int64_t count, float *const *x, const float *const *g, float *const *m,
                              float *const *v, const int64_t *numel, float beta1, float beta2, float c1, float c2,
                              float bc1, float bc2, float eps, float weight_decay, float lr, int threads) {
    /* c1 = 1 - beta1 and c2 = 1 - beta2 come from the caller, computed in double as PyTorch
     * does for a Python scalar (1.0f - 0.99f is 1e-6 away from (float)(1.0 - 0.99)). */
    const float inv_bc1 = (float)(1.0 / (double)bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt((double)bc2));
    for (int64_t i = 0; i < count; ++i) {
        const int64_t n = numel[i];
        float *restrict xi = x[i];
        const float *restrict gi = g[i];
        float *restrict mi = m[i];
        float *restrict vi = v[i];
        const int nt = n >= PARALLEL_MIN ? threads : 1;
        double wsq = 0.0, usq = 0.0;
#pragma omp parallel for simd num_threads(nt) schedule(static) reduction(+ : wsq, usq)
        for (int64_t j = 0; j < n; ++j) {
            const float gj = gi[j];
            const float mj = beta1 * mi[j] + c1 * gj;
            const float vj = beta2 * vi[j] + c2 * (gj * gj);
            mi[j] = mj;
            vi[j] = vj;
            const float xj = xi[j];
            const float u = lamb_direction(mj, vj, xj, inv_bc1, inv_sqrt_bc2, eps, weight_decay);
            wsq += (double)xj * (double)xj;
            usq += (double)u * (double)u;
        }
        const double ratio = (wsq > 0.0 && usq > 0.0) ? sqrt(wsq) / sqrt(usq) : 1.0;
        const float scale = (float)(-(double)lr * ratio);
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t j = 0; j < n; ++j) {
            const float xj = xi[j];
            xi[j] = xj + scale * lamb_direction(mi[j], vi[j], xj, inv_bc1, inv_sqrt_bc2, eps, weight_decay);
        }
    }
}
