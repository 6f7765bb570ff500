/* Dropout in one pass, its mask regenerated instead of stored:
 *
 *   y_i = v_i * (r_i >= t ? 1 / (1 - p) : 0),    r_i = Philox-4x32-10(counter(i), key = seed)
 *
 * where t = round(p 2^32), so an element is kept with probability 1 - p (to 2^-32). The same
 * call serves the forward (v = x) and the backward (v = dy, with the forward's seed and
 * offset): the mask is a pure function of (seed, offset, i), so nothing is stored between
 * them and stock's separate passes (bernoulli_ one number at a time from the global
 * generator, the division, the multiply, the saved mask) become one read and one write.
 * A dropped element is multiplied by 0, as stock does: NaN and infinity stay NaN.
 *
 * Philox-4x32-10 (Salmon et al., SC'11, "Parallel random numbers: as easy as 1, 2, 3") is
 * a counter-based generator that passes TestU01's BigCrush: each 128-bit counter gives four
 * independent 32-bit words. Element i = 64 c + 16 j + l (chunk c, word j, lane l) takes word
 * j of counter (16 c + l, offset): within a chunk of 64 elements each word is 16 contiguous
 * elements, so the 16 counters of a chunk run in vector lanes and every load and store is
 * contiguous (no interleaving shuffles). The mapping is fixed, so the mask is the same for
 * any ISA and any number of threads. The 32 x 32 -> 64-bit products vectorise (vpmuludq).
 * Values fp32 or bf16 (computed in fp32, bf16 stored rounded to nearest even).
 */
#include <stdint.h>

#include "values.h"

#define LANES 16
#define CHUNK (4 * LANES)

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Four 32-bit words of one Philox draw. */
typedef struct {
    uint32_t w0, w1, w2, w3;
} words;

/* Ten Philox rounds on counter (c0, c1, c2, c3) with key (k0, k1). */
INLINE words philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
#pragma GCC unroll 10
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        const uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    return (words){c0, c1, c2, c3};
}

/* out[i] = in[i] times the scale when word w keeps the element, else times 0 (a bit mask on
 * the scale's bits, not a branch, so the loop stays one vector path). */
INLINE void apply(const void *in, void *out, int64_t i, uint32_t w, uint32_t threshold, uint32_t scale_bits,
                  const int bf16) {
    const uint32_t keep = 0u - (uint32_t)(w >= threshold);
    store(out, i, load(in, i, bf16) * as_float(scale_bits & keep), bf16);
}

/* One whole chunk of 64 elements from `base` (vector lanes over its 16 counters). */
INLINE void chunk(const void *in, void *out, int64_t base, uint64_t counter, uint32_t off_lo, uint32_t off_hi,
                  uint32_t k0, uint32_t k1, uint32_t threshold, uint32_t scale_bits, const int bf16) {
#pragma omp simd
    for (int l = 0; l < LANES; ++l) {
        const uint64_t ctr = counter + (uint64_t)l;
        const words r = philox((uint32_t)ctr, (uint32_t)(ctr >> 32), off_lo, off_hi, k0, k1);
        apply(in, out, base + l, r.w0, threshold, scale_bits, bf16);
        apply(in, out, base + LANES + l, r.w1, threshold, scale_bits, bf16);
        apply(in, out, base + 2 * LANES + l, r.w2, threshold, scale_bits, bf16);
        apply(in, out, base + 3 * LANES + l, r.w3, threshold, scale_bits, bf16);
    }
}

/* The last, partial chunk: the same mapping, bounds-checked. */
static void tail(const void *in, void *out, int64_t base, int64_t n, uint64_t counter, uint32_t off_lo,
                 uint32_t off_hi, uint32_t k0, uint32_t k1, uint32_t threshold, uint32_t scale_bits, int bf16) {
    for (int l = 0; l < LANES; ++l) {
        const uint64_t ctr = counter + (uint64_t)l;
        const words r = philox((uint32_t)ctr, (uint32_t)(ctr >> 32), off_lo, off_hi, k0, k1);
        const uint32_t w[4] = {r.w0, r.w1, r.w2, r.w3};
        for (int j = 0; j < 4; ++j) {
            const int64_t i = base + j * LANES + l;
            if (i < n) apply(in, out, i, w[j], threshold, scale_bits, bf16);
        }
    }
}

/* out[i] = in[i] * mask_i / (1 - p) for i < n (contiguous; in and out may be the same).
 * threshold = round(p 2^32) (0 < p < 1), scale = 1 / (1 - p). */
void profilednn_dropout(int64_t n, const void *in, void *out, int bf16, uint32_t threshold, float scale,
                        uint64_t seed, uint64_t offset, int threads) {
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const uint32_t off_lo = (uint32_t)offset, off_hi = (uint32_t)(offset >> 32);
    const uint32_t scale_bits = as_bits(scale);
    const int64_t whole = n / CHUNK;
    /* the bf16 flag is a literal at each call (GCC outlines the region before it propagates
     * constants; a flag tested inside would leave one branchy scalar loop) */
    if (bf16) {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t c = 0; c < whole; ++c)
            chunk(in, out, c * CHUNK, (uint64_t)c * LANES, off_lo, off_hi, k0, k1, threshold, scale_bits, 1);
    } else {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t c = 0; c < whole; ++c)
            chunk(in, out, c * CHUNK, (uint64_t)c * LANES, off_lo, off_hi, k0, k1, threshold, scale_bits, 0);
    }
    if (whole * CHUNK < n)
        tail(in, out, whole * CHUNK, n, (uint64_t)whole * LANES, off_lo, off_hi, k0, k1, threshold, scale_bits, bf16);
}
