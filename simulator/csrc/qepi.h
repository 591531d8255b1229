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
 * float clamp and a conversion per half, same integers.
 *
 * f64 == 3 (float32 scales, half_even, no fused add, and the caller proves |acc| < 2**24 and
 * |acc * scale| < 2**22: exec_native.magic32): the same rounding in float32, in one FMA of
 * the exact product and 1.5 * 2**23, all 16 lanes in one register: the float's bits are
 * 0x4B400000 + the integer. About half the instructions of f64 == 2. */
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

/* round_half_even(acc * scale) of 16 lanes, clamped, as the bits 0x4B400000 + value of
 * f64 == 3 above: the clamp compares the bits (positive floats of one binade order as
 * their bits), and the narrowing store keeps their low 8 or 16 bits, the value's own, so
 * no subtraction is needed. */
TGT AI __m512i magic_ps16_of(__m512i acc, __m512 scale, __m512i lo, __m512i hi) {
    __m512 y = _mm512_fmadd_round_ps(_mm512_cvtepi32_ps(acc), scale,
                                     _mm512_set1_ps(12582912.0f), /* 1.5 * 2**23 */
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_min_epi32(_mm512_max_epi32(_mm512_castps_si512(y), lo), hi);
}

/* magic_ps16's clamp bounds lo, hi as the bits of 1.5 * 2**23 + bound. */
TGT AI __m512i magic_bound(double v) { return _mm512_set1_epi32(0x4B400000 + (int32_t)v); }

TGT AI __m512i magic_ps16(__m512i acc, const epi_t *e, int64_t o0) {
    return magic_ps16_of(acc, _mm512_loadu_ps((const float *)e->scale + o0), magic_bound(e->lo),
                         magic_bound(e->hi));
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

/* The int32 output without a requantize: max(acc, lo) in the lanes of m, 0 in the lanes of
 * ms but not m (both builds' epilogue16_corr). */
TGT AI void store_int32(__m512i acc, const epi_t *e, void *out, __mmask16 m, __mmask16 ms) {
    acc = _mm512_max_epi32(acc, _mm512_set1_epi32((int32_t)e->lo));
    _mm512_mask_storeu_epi32(out, ms, _mm512_maskz_mov_epi32(m, acc));
}

#ifdef QPARITY_SIMDE
/* The AVX2 build's epilogue16_corr: the same float operations, in the same order, on two
 * halves of 8 lanes (SIMDe's generic lane permutes and narrowing loops cost more than the
 * arithmetic). Each half: h = lanes 8h .. 8h+7, two float64 quarters of 4 lanes. */
AI __m128i quarter_f64(__m128i a, __m128i b, const double *s, const double *sb, const epi_t *e,
                       int has_b) {
    __m256d y = _mm256_mul_pd(_mm256_cvtepi32_pd(a), _mm256_loadu_pd(s));
    if (has_b) y = _mm256_fmadd_pd(_mm256_cvtepi32_pd(b), _mm256_loadu_pd(sb), y);
    return to_int4(y, e->half_even, _mm256_set1_pd(e->lo), _mm256_set1_pd(e->hi));
}

/* f64 == 2 (magic_pd16) on 8 lanes: acc * s (+ b * sb) + 1.5 * 2**52, rounded once, and
 * the low 32 bits of each double gathered by one in-lane shuffle of the two quarters, so
 * the lanes come out in the order 0 1 4 5 | 2 3 6 7 (MIXED; epilogue16_halves puts them
 * back with the one permute it needs anyway). */
AI __m256i half_magic(__m256i a, __m256i b, const double *s, const double *sb, int has_b) {
    const __m256d magic = _mm256_set1_pd(6755399441055744.0); /* 1.5 * 2**52 */
    __m256d y[2];
    for (int q = 0; q < 2; q++) {
        __m256d x = _mm256_cvtepi32_pd(q ? _mm256_extracti128_si256(a, 1) : _mm256_castsi256_si128(a));
        __m256d sq = _mm256_loadu_pd(s + 4 * q);
        if (has_b) {
            __m128i bq = q ? _mm256_extracti128_si256(b, 1) : _mm256_castsi256_si128(b);
            y[q] = _mm256_add_pd(_mm256_fmadd_pd(_mm256_cvtepi32_pd(bq), _mm256_loadu_pd(sb + 4 * q),
                                                 _mm256_mul_pd(x, sq)), magic);
        } else
            y[q] = _mm256_fmadd_pd(x, sq, magic);
    }
    return _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castpd_ps(y[0]), _mm256_castpd_ps(y[1]), 0x88));
}

AI __m256i half_f32(__m256i a, __m256i b, const float *s, const float *sb, const epi_t *e,
                    int has_b) {
    __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(a), _mm256_loadu_ps(s));
    if (has_b) y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(b), _mm256_loadu_ps(sb), y);
    y = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps((float)e->lo)), _mm256_set1_ps((float)e->hi));
    if (!e->half_even) {
        __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 t = _mm256_floor_ps(_mm256_add_ps(_mm256_andnot_ps(sign, y), _mm256_set1_ps(0.5f)));
        y = _mm256_or_ps(t, _mm256_and_ps(y, sign));
    }
    return _mm256_cvtps_epi32(y);
}

/* f64 == 3 (magic_ps16) on 8 lanes, clamped. */
AI __m256i half_magic32(__m256i a, const float *s, const epi_t *e) {
    __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_loadu_ps(s), _mm256_set1_ps(12582912.0f));
    __m256i r = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(0x4B400000));
    r = _mm256_max_epi32(r, _mm256_set1_epi32((int32_t)e->lo));
    return _mm256_min_epi32(r, _mm256_set1_epi32((int32_t)e->hi));
}

/* Lanes 8h .. 8h+7 requantized (int32, clamped to [lo, hi]); f64 == 2: in MIXED order. */
AI __m256i half_requant(__m256i a, __m256i b, const epi_t *e, int64_t o, int has_b) {
    if (e->f64 == 3) return half_magic32(a, (const float *)e->scale + o, e);
    if (!e->f64)
        return half_f32(a, b, (const float *)e->scale + o,
                        has_b ? (const float *)e->scale_b + o : 0, e, has_b);
    const double *s = (const double *)e->scale + o, *sb = has_b ? (const double *)e->scale_b + o : 0;
    if (e->f64 == 2) {
        __m256i r = half_magic(a, b, s, sb, has_b);
        r = _mm256_max_epi32(r, _mm256_set1_epi32((int32_t)e->lo));
        return _mm256_min_epi32(r, _mm256_set1_epi32((int32_t)e->hi));
    }
    __m128i lo = quarter_f64(_mm256_castsi256_si128(a), _mm256_castsi256_si128(b), s, sb, e, has_b);
    __m128i hi = quarter_f64(_mm256_extracti128_si256(a, 1), _mm256_extracti128_si256(b, 1), s + 4,
                             has_b ? sb + 4 : 0, e, has_b);
    return _mm256_set_m128i(hi, lo); /* clamped as floats */
}

/* 16 lanes of the add operand (int8, int16 or int32: bshift) as two int32 halves. */
AI void load_b16(const char *b, int bshift, __mmask16 m, __m256i h[2]) {
    if (bshift == 2) {
        h[0] = _mm256_maskz_loadu_epi32((__mmask8)m, b);
        h[1] = _mm256_maskz_loadu_epi32((__mmask8)(m >> 8), b + 32);
    } else if (bshift == 1) {
        __m256i v = _mm256_maskz_loadu_epi16(m, b);
        h[0] = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(v));
        h[1] = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1));
    } else {
        __m128i v = _mm_maskz_loadu_epi8(m, b);
        h[0] = _mm256_cvtepi8_epi32(v);
        h[1] = _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8));
    }
}

/* epilogue16_corr of the two halves a0 (lanes 0-7) and a1 (8-15) of an acc that holds corr:
 * the AVX2 kernels' entry. Lanes in m requantized, lanes in ms but not m 0, the rest not
 * stored. The int32 values lie in [lo, hi], inside the output dtype, so the saturating
 * packs only narrow them. A kernel that builds a (SIMDe) __m512i from two halves for
 * epilogue16 has the compiler write it to the stack in pieces and read it back whole: a
 * store-forwarding stall that was 14% of the AVX2 depthwise conv's time. */
TGT AI void epilogue16_halves(__m256i a0, __m256i a1, const epi_t *e, int64_t o0, const char *b,
                              void *out, __mmask16 m, __mmask16 ms) {
    __m256i a[2] = {a0, a1}, bh[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, r[2];
    if (!e->scale) {
        __m512i acc;
        memcpy(&acc, a, sizeof acc);
        store_int32(acc, e, out, m, ms);
        return;
    }
    if (b) load_b16(b, e->bshift, m, bh);
    for (int h = 0; h < 2; h++) r[h] = half_requant(a[h], bh[h], e, o0 + 8 * h, b != 0);
    int mixed = e->f64 == 2;
    if (m != ms) { /* padding lanes: 0 */
        const __m256i bit = mixed ? _mm256_setr_epi32(1, 2, 16, 32, 4, 8, 64, 128)
                                  : _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        for (int h = 0; h < 2; h++) {
            __m256i k = _mm256_set1_epi32((m >> (8 * h)) & 0xFF);
            r[h] = _mm256_and_si256(r[h], _mm256_cmpeq_epi32(_mm256_and_si256(k, bit), bit));
        }
    }
    /* 16 x int16 in order: the packed pairs of lanes are (0 1)(2 3)(4 5)(6 7) | (8 9)..., or,
     * MIXED, (0 1)(4 5)(8 9)(12 13) | (2 3)(6 7)(10 11)(14 15) */
    __m256i w = _mm256_packs_epi32(r[0], r[1]);
    w = mixed ? _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
              : _mm256_permute4x64_epi64(w, 0xD8);
    if (e->out_shift == 1) {
        if (ms == 0xFFFF) _mm256_storeu_si256((__m256i *)out, w);
        else _mm256_mask_storeu_epi16(out, ms, w);
        return;
    }
    __m128i v = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    if (ms == 0xFFFF) _mm_storeu_si128((__m128i *)out, v);
    else _mm_mask_storeu_epi8(out, ms, v);
}

TGT AI void epilogue16_corr(__m512i acc, const epi_t *e, int64_t o0, const char *b,
                            void *out, __mmask16 m, __mmask16 ms) {
    __m256i a[2];
    memcpy(a, &acc, sizeof a);
    epilogue16_halves(a[0], a[1], e, o0, b, out, m, ms);
}
#else
/* 16 requantized lanes r (int32, or magic_ps16's bits) narrowed to int8 or int16 (out_shift
 * 0 or 1) by their low bits: lanes in m stored, lanes in ms but not m stored as 0. */
TGT AI void store16_of(__m512i r, void *out, int out_shift, __mmask16 m, __mmask16 ms) {
    if (m != ms) r = _mm512_maskz_mov_epi32(m, r); /* padding lanes: 0 */
    if (out_shift == 1) _mm256_mask_storeu_epi16(out, ms, _mm512_cvtepi32_epi16(r));
    else _mm_mask_storeu_epi8(out, ms, _mm512_cvtepi32_epi8(r));
}

/* epilogue16 of an acc that already holds corr (qconv.c starts its sums from it). */
TGT AI void epilogue16_corr(__m512i acc, const epi_t *e, int64_t o0, const char *b,
                            void *out, __mmask16 m, __mmask16 ms) {
    if (!e->scale) {
        store_int32(acc, e, out, m, ms);
        return;
    }
    __m512i bi = b ? load16(b, 0, e->bshift, m) : _mm512_setzero_si512();
    __m512i r;
    if (e->f64 == 3) {
        r = magic_ps16(acc, e, o0);
    } else if (e->f64 == 2) {
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
    store16_of(r, out, e->out_shift, m, ms);
}
#endif

#endif
