/* fp32 / bf16 values, shared by the kernels that take either (focal_loss.c, batch_norm.c):
 * load one as float, store a float back (bf16 rounded to nearest even). The `bf16` flag is
 * meant to be a compile-time constant where these are inlined, so each loop is one type.
 * (build.py hashes this header with every source that includes it.) */
#ifndef PROFILEDNN_VALUES_H
#define PROFILEDNN_VALUES_H

#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

INLINE float as_float(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }
INLINE uint32_t as_bits(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }

INLINE float load(const void *p, int64_t i, const int bf16) {
    if (bf16) return as_float((uint32_t)((const uint16_t *)p)[i] << 16);
    return ((const float *)p)[i];
}

INLINE void store(void *p, int64_t i, float v, const int bf16) {
    if (bf16) {
        uint32_t b = as_bits(v);
        b += 0x7FFFu + ((b >> 16) & 1u); /* round to nearest even (NaN stays NaN: only its payload moves) */
        ((uint16_t *)p)[i] = (uint16_t)(b >> 16);
    } else {
        ((float *)p)[i] = v;
    }
}

#endif
