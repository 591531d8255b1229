/* The epilogue of the compiled convolution and linear kernels (qconv.c, qamx.c):
 *   y = clamp(round(acc * scale[o] + b * scale_b[o]), lo, hi) -> int8 or int16
 * in float32 or float64 as the caller proves exact, or, without a requantize,
 * y = max(acc, lo) -> int32. acc already holds the per-channel corr (bias, minus the uint8
 * offset's sum for offset int8 inputs) once epilogue16 adds it (epilogue16_corr: already).
 *
 * f64 == 2 (float64, half_even, and the caller proves |acc * scale + b * scale_b| < 2**30):
 * round by adding 1.5 * 2**52 to the exact value: the sum's one rounding is round half to
 * even onto an integer, which is then the low 32 bits of the double (two's complement for
 * |v| < 2**31), gathered by one permute and clamped in int32. Fewer instructions than a
 * float clamp and a conversion per half, same integers. */
#ifndef QPARITY_QEPI_H
#define QPARITY_QEPI_H
#include "qsimd.h"

typedef struct {
    const int32_t *corr;  /* [Ob*16] */
    const void *scale;    /* [Ob*16] float or double */
    const void *scale_b;  /* [Ob*16] or NULL without a fused add */
    double lo, hi;
    int f64, half_even, out_shift; /* output element size 1 << out_shift bytes */
    int bshift;                    /* add operand element size 1 << bshift bytes */
} epi_t;

TGT AI __m256i half_pd(__m256i a, __m256i bi, const epi_t *e, int64_t o0, int has_b) {
    __m512d y = _mm512_mul_pd(_mm512_cvtepi32_pd(a), _mm512_loadu_pd((const double *)e->scale + o0));
    if (has_b)
        y = _mm512_fmadd_pd(_mm512_cvtepi32_pd(bi),
                            _mm512_loadu_pd((const double *)e->scale_b + o0), y);
    return to_int_pd(y, e->half_even, _mm512_set1_pd(e->lo), _mm512_set1_pd(e->hi));
}

/* round_half_even(acc * scale + b * scale_b) of 16 lanes as int32 (f64 == 2 above). */
TGT AI __m512i magic_pd16(__m512i acc, __m512i bi, const epi_t *e, int64_t o0, int has_b) {
    const __m512d magic = _mm512_set1_pd(6755399441055744.0); /* 1.5 * 2**52 */
    const double *s = (const double *)e->scale + o0, *sb = (const double *)e->scale_b + o0;
    __m512d a0 = _mm512_cvtepi32_pd(_mm512_castsi512_si256(acc));
    __m512d a1 = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(acc, 1)), y0, y1;
    if (has_b) { /* acc s + b sb is exact; adding the magic number rounds once */
        y0 = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(bi)), _mm512_loadu_pd(sb),
                             _mm512_mul_pd(a0, _mm512_loadu_pd(s)));
        y1 = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(bi, 1)),
                             _mm512_loadu_pd(sb + 8), _mm512_mul_pd(a1, _mm512_loadu_pd(s + 8)));
        y0 = _mm512_add_round_pd(y0, magic, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        y1 = _mm512_add_round_pd(y1, magic, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    } else { /* the exact product plus the magic number, rounded once: one FMA */
        y0 = _mm512_fmadd_round_pd(a0, _mm512_loadu_pd(s), magic,
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        y1 = _mm512_fmadd_round_pd(a1, _mm512_loadu_pd(s + 8), magic,
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    const __m512i low = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    __m512i r = _mm512_permutex2var_epi32(_mm512_castpd_si512(y0), low, _mm512_castpd_si512(y1));
    r = _mm512_max_epi32(r, _mm512_set1_epi32((int32_t)e->lo));
    return _mm512_min_epi32(r, _mm512_set1_epi32((int32_t)e->hi));
}

/* The epilogue of 16 channels o0.. of one pixel: lanes in m (real channels) computed,
 * lanes in ms but not m (padding channels) stored as 0, the rest not stored. int32 output
 * has no scale: y = max(acc, lo) (the caller proves acc fits int32). */
TGT AI void epilogue16_corr(__m512i acc, const epi_t *e, int64_t o0, const char *b,
                            void *out, __mmask16 m, __mmask16 ms);

TGT AI void epilogue16(__m512i acc, const epi_t *e, int64_t o0, const char *b,
                       void *out, __mmask16 m, __mmask16 ms) {
    epilogue16_corr(_mm512_add_epi32(acc, _mm512_loadu_si512(e->corr + o0)), e, o0, b, out, m, ms);
}

/* epilogue16 of an acc that already holds corr (qconv.c starts its sums from it). */
TGT AI void epilogue16_corr(__m512i acc, const epi_t *e, int64_t o0, const char *b,
                            void *out, __mmask16 m, __mmask16 ms) {
    if (!e->scale) {
        acc = _mm512_max_epi32(acc, _mm512_set1_epi32((int32_t)e->lo));
        _mm512_mask_storeu_epi32(out, ms, _mm512_maskz_mov_epi32(m, acc));
        return;
    }
    __m512i bi = b ? load16(b, 0, e->bshift, m) : _mm512_setzero_si512();
    __m512i r;
    if (e->f64 == 2) {
        r = magic_pd16(acc, bi, e, o0, b != 0);
    } else if (!e->f64) {
        __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_loadu_ps((const float *)e->scale + o0));
        if (b)
            y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(bi),
                                _mm512_loadu_ps((const float *)e->scale_b + o0), y);
        r = to_int_ps(y, e->half_even, _mm512_set1_ps((float)e->lo), _mm512_set1_ps((float)e->hi));
    } else {
        __m256i lo = half_pd(_mm512_castsi512_si256(acc), _mm512_castsi512_si256(bi), e, o0, b != 0);
        __m256i hi = half_pd(_mm512_extracti64x4_epi64(acc, 1), _mm512_extracti64x4_epi64(bi, 1),
                             e, o0 + 8, b != 0);
        r = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    if (m != ms) r = _mm512_maskz_mov_epi32(m, r); /* padding lanes: 0 */
    if (e->out_shift == 1) _mm256_mask_storeu_epi16(out, ms, _mm512_cvtepi32_epi16(r));
    else _mm_mask_storeu_epi8(out, ms, _mm512_cvtepi32_epi8(r));
}

#endif
