/* Shared AVX-512 helpers of the compiled kernels (qconv.c, qrows.c). */
#ifndef QPARITY_QSIMD_H
#define QPARITY_QSIMD_H
#include <immintrin.h>
#include <stdint.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#define AI __attribute__((always_inline)) static inline

/* half_even: round to nearest even; bpu_round: sign(y) * floor(|y| + 0.5) (exact inputs). */
TGT AI __m512 round_ps(__m512 y, int half_even) {
    if (half_even) return _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 t = _mm512_floor_ps(_mm512_add_ps(_mm512_abs_ps(y), _mm512_set1_ps(0.5f)));
    return _mm512_or_ps(t, _mm512_and_ps(y, _mm512_set1_ps(-0.0f)));
}

TGT AI __m512d round_pd(__m512d y, int half_even) {
    if (half_even) return _mm512_roundscale_pd(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d t = _mm512_floor_pd(_mm512_add_pd(_mm512_abs_pd(y), _mm512_set1_pd(0.5)));
    return _mm512_or_pd(t, _mm512_and_pd(y, _mm512_set1_pd(-0.0)));
}

#endif
