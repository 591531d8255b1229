/* Shared AVX-512 helpers of the compiled kernels (qconv.c, qrows.c). */
#ifndef QPARITY_QSIMD_H
#define QPARITY_QSIMD_H
#include <stdatomic.h>
#include <stdint.h>

#include "qpool.h"

#ifdef QPARITY_SIMDE
/* The AVX2 build (qavx2.h): the same kernels, the whole library compiled for AVX2 + FMA. */
#include "qavx2.h"
#define TGT
#else
#include <immintrin.h>
#define TGT __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#endif
#define AI __attribute__((always_inline)) static inline
#define PAR_MIN 32768 /* elements below which one thread does the work */

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

/* clamp(round(y), lo, hi) as int32 for integer lo, hi (clamping first gives the same value):
 * half_even rounds in the conversion itself (embedded rounding, one instruction less),
 * bpu_round by round_pd/round_ps first. */
TGT AI __m256i to_int_pd(__m512d y, int half_even, __m512d lo, __m512d hi) {
    y = _mm512_min_pd(_mm512_max_pd(y, lo), hi);
    return half_even ? _mm512_cvt_roundpd_epi32(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                     : _mm512_cvtpd_epi32(round_pd(y, 0));
}

TGT AI __m512i to_int_ps(__m512 y, int half_even, __m512 lo, __m512 hi) {
    y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
    return half_even ? _mm512_cvt_roundps_epi32(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                     : _mm512_cvtps_epi32(round_ps(y, 0));
}

/* n <= 8 values from p + i as float64: int8, int16 or int32 for t = 0, 1, 2 (exact). */
TGT AI __m512d load8(const void *p, int64_t i, int t, int n) {
    __mmask8 m = (__mmask8)((1u << n) - 1);
    __m256i v = t == 2   ? _mm256_maskz_loadu_epi32(m, (const int32_t *)p + i)
                : t == 1 ? _mm256_cvtepi16_epi32(_mm_maskz_loadu_epi16(m, (const int16_t *)p + i))
                         : _mm256_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, (const int8_t *)p + i));
    return _mm512_cvtepi32_pd(v);
}

#ifdef QPARITY_SIMDE
/* The AVX2 build's native forms on four float64 lanes (its LayerNorm, softmax, batched
 * matmul and epilogue): round_pd, to_int_pd, and the narrowing stores of finish8. */
AI __m256d round4(__m256d y, int half_even) {
    if (half_even) return _mm256_round_pd(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256d sign = _mm256_set1_pd(-0.0);
    __m256d t = _mm256_floor_pd(_mm256_add_pd(_mm256_andnot_pd(sign, y), _mm256_set1_pd(0.5)));
    return _mm256_or_pd(t, _mm256_and_pd(y, sign));
}

/* clamp(round(y), lo, hi) as int32 (clamping first gives the same value; an integer, so
 * the conversion is exact). */
AI __m128i to_int4(__m256d y, int half_even, __m256d lo, __m256d hi) {
    return _mm256_cvtpd_epi32(round4(_mm256_min_pd(_mm256_max_pd(y, lo), hi), half_even));
}

/* Lanes 0-3 (r0) and 4-7 (r1) of int32 values inside the output dtype at out as int8,
 * int16 or int32 (out_shift 0, 1, 2), the lanes of m: the saturating packs only narrow. */
AI void store8_4(__m128i r0, __m128i r1, void *out, int out_shift, __mmask8 m) {
    __m128i w = _mm_packs_epi32(r0, r1);
    if (out_shift == 0) {
        __m128i v = _mm_packs_epi16(w, w);
        if (m == 0xFF) _mm_storel_epi64((__m128i *)out, v);
        else _mm_mask_storeu_epi8(out, m, v);
    } else if (out_shift == 1) {
        if (m == 0xFF) _mm_storeu_si128((__m128i *)out, w);
        else _mm_mask_storeu_epi16(out, m, w);
    } else
        _mm256_mask_storeu_epi32(out, m, _mm256_set_m128i(r1, r0));
}
#endif

/* The first `left` of 16 lanes (all 16 when left >= 16). */
TGT AI __mmask16 mask16(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

/* 16 values (lanes in m; the rest 0) from p + i as int32: int8, int16 or int32 for t = 0, 1, 2. */
TGT AI __m512i load16(const void *p, int64_t i, int t, __mmask16 m) {
    return t == 2   ? _mm512_maskz_loadu_epi32(m, (const int32_t *)p + i)
           : t == 1 ? _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m, (const int16_t *)p + i))
                    : _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, (const int8_t *)p + i));
}

/* The lanes m of int32 r at out + i as int8, int16 or int32 (out_shift 0, 1, 2). */
TGT AI void store16(__m512i r, void *out, int64_t i, int out_shift, __mmask16 m) {
    if (out_shift == 0) _mm512_mask_cvtepi32_storeu_epi8((int8_t *)out + i, m, r);
    else if (out_shift == 1) _mm512_mask_cvtepi32_storeu_epi16((int16_t *)out + i, m, r);
    else _mm512_mask_storeu_epi32((int32_t *)out + i, m, r);
}

/* round, clamp to [lo, hi], store n <= 8 values at out + i (1 << out_shift bytes each). */
TGT AI void finish8(__m512d y, int half_even, __m512d lo, __m512d hi, void *out, int64_t i,
                    int out_shift, int n) {
    __mmask8 m = (__mmask8)((1u << n) - 1);
    __m256i r = to_int_pd(y, half_even, lo, hi);
    if (out_shift == 0) _mm256_mask_cvtepi32_storeu_epi8((int8_t *)out + i, m, r);
    else if (out_shift == 1) _mm256_mask_cvtepi32_storeu_epi16((int16_t *)out + i, m, r);
    else _mm256_mask_storeu_epi32((int32_t *)out + i, m, r);
}

#endif
