/* The AVX2 build's LayerNorm row steps (qnorm.c includes this in place of its own forms):
 * natively on ymm, since SIMDe has no getexp, scalef, float64 -> int64 conversion or 512-bit
 * lane shuffle of its own, and their stand-ins were two thirds of a transformer's LayerNorm
 * (1.51 -> 0.55 ms a batch of 256 digit ViTs, one thread). The same values from the same
 * float64 operations as qnorm.c's forms; ln_t, load8, finish8 and round_pd come from there. */
#ifndef QPARITY_QNORM_AVX2_H
#define QPARITY_QNORM_AVX2_H

/* ln_sums16_i8's sums: 16 values a step as int16 (VPMADDWD with 1 and with q), each row's
 * eight int32 lanes added at the end, then times 2^s and 4^s. */
AI void ln_sums16_i8(const ln_t *t, int64_t r0, int nr, __m512d X1[2], __m512d X2[2]) {
    double x1[16] = {0}, x2[16] = {0};
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < nr; i++) {
        const int8_t *row = (const int8_t *)t->q + (r0 + i) * t->n;
        __m256i s1 = _mm256_setzero_si256(), s2 = s1;
        for (int64_t j = 0; j < t->n; j += 16) {
            __m128i v;
            if (t->n - j >= 16) v = _mm_loadu_si128((const __m128i *)(row + j));
            else v = _mm_maskz_loadu_epi8((__mmask16)((1u << (t->n - j)) - 1), row + j);
            __m256i x = _mm256_cvtepi8_epi16(v);
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(x, ones));
            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(x, x));
        }
        __m256i h = _mm256_hadd_epi32(s1, s2); /* s1 0+1 2+3, s2 0+1 2+3 | 4+5 6+7, ... */
        __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        q = _mm_hadd_epi32(q, q); /* sum s1, sum s2 */
        x1[i] = (double)_mm_cvtsi128_si32(q) * t->p_in;
        x2[i] = (double)_mm_extract_epi32(q, 1) * t->p_in2;
    }
    memcpy(X1, x1, sizeof x1);
    memcpy(X2, x2, sizeof x2);
}

/* 2^x for integer-valued x in [-1022, 1023], from its bits: scalef's factor, exact. */
AI __m256d pow2_4(__m256d x) {
    __m256i e = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(x));
    return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)), 52));
}

/* frexp's exponent of v >= 1 (getexp + 1): its biased exponent bits minus 1022, as a double
 * through 2^52 (v is an integer plus the integer eps: 0 or at least 1, never subnormal). */
AI __m256d frexp_e4(__m256d v) {
    __m256i b = _mm256_srli_epi64(_mm256_castpd_si256(v), 52);
    __m256d d = _mm256_castsi256_pd(_mm256_or_si256(b, _mm256_set1_epi64x(0x4330000000000000)));
    return _mm256_sub_pd(d, _mm256_set1_pd(4503599627370496.0 + 1022.0));
}

/* ln_stats8 of four rows (one half of X1, X2): the same operations, rsqrt read by a gather
 * of 32-bit indices (vn - qmin lies in the table for every lane, valid or not). */
AI void ln_stats4(const ln_t *t, __m256d X1, __m256d X2, double *cs, double *mc) {
    const __m256d N = _mm256_set1_pd((double)t->n);
    __m256d mean = round4(_mm256_div_pd(X1, N), t->half_even);
    __m256d ssd = _mm256_add_pd(_mm256_sub_pd(X2, _mm256_mul_pd(_mm256_mul_pd(X1, mean), _mm256_set1_pd(2.0))),
                                _mm256_mul_pd(_mm256_mul_pd(mean, mean), N));
    __m256d v = _mm256_add_pd(round4(_mm256_div_pd(_mm256_mul_pd(ssd, _mm256_set1_pd(t->p_guard)), N),
                                     t->half_even), _mm256_set1_pd(t->eps));
    __m256d nz = _mm256_cmp_pd(v, _mm256_setzero_pd(), _CMP_NEQ_OQ);
    __m256d e = _mm256_and_pd(nz, frexp_e4(v));
    __m256d k = _mm256_floor_pd(_mm256_mul_pd(_mm256_sub_pd(e, _mm256_set1_pd(14.0)), _mm256_set1_pd(0.5)));
    __m256d vn = round4(_mm256_mul_pd(v, pow2_4(_mm256_mul_pd(k, _mm256_set1_pd(-2.0)))), t->half_even);
    vn = _mm256_min_pd(_mm256_max_pd(vn, _mm256_setzero_pd()), _mm256_set1_pd(32767.0));
    __m128i idx = _mm_sub_epi32(_mm256_cvttpd_epi32(vn), _mm_set1_epi32((int)t->rsqrt_qmin));
    __m256d c = _mm256_i32gather_pd(t->rsqrt, idx, 8);
    c = _mm256_mul_pd(c, pow2_4(_mm256_sub_pd(_mm256_set1_pd((double)(t->frac - 17)), k)));
    _mm256_storeu_pd(cs, _mm256_mul_pd(c, _mm256_set1_pd(t->p_in)));
    _mm256_storeu_pd(mc, _mm256_mul_pd(mean, c));
}

AI void ln_stats8(const ln_t *t, __m512d X1, __m512d X2, int nr, double *cs, double *mc) {
    __m256d x1[2], x2[2];
    memcpy(x1, &X1, sizeof x1);
    memcpy(x2, &X2, sizeof x2);
    for (int h = 0; h < 2 && 4 * h < nr; h++) ln_stats4(t, x1[h], x2[h], cs + 4 * h, mc + 4 * h);
}
/* Eight values of row data at p (int8, or int16 when wide) as two float64 quarters. */
AI void load8_4(const void *p, int wide, __m256d x[2]) {
    __m256i v = wide ? _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)p))
                     : _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    x[0] = _mm256_cvtepi32_pd(_mm256_castsi256_si128(v));
    x[1] = _mm256_cvtepi32_pd(_mm256_extracti128_si256(v, 1));
}

/* ln_out_row on the AVX2 build: whole groups of 8 in ymm quarters (the same operations:
 * round(q cs - mc), the |y| check, fmadd with w and b, to_int4, store8_4); a row's tail
 * by the shared form. */
AI int ln_out_row(const ln_t *t, int64_t r, double cs1, double mc1, int wide, int half_even,
                  int out_shift) {
    double lo1, hi1;
    memcpy(&lo1, &t->lo, 8);
    memcpy(&hi1, &t->hi, 8);
    const __m256d cs = _mm256_set1_pd(cs1), mc = _mm256_set1_pd(mc1), lo = _mm256_set1_pd(lo1),
                  hi = _mm256_set1_pd(hi1), mag = _mm256_set1_pd(-0.0), top = _mm256_set1_pd(t->y_top);
    int64_t n = t->n, base = r * n, j = 0;
    int bad = 0;
    for (; j + 8 <= n; j += 8) {
        __m256d x[2];
        __m128i o[2];
        load8_4((const char *)t->q + ((base + j) << wide), wide, x);
        for (int h = 0; h < 2; h++) {
            __m256d y = round4(_mm256_sub_pd(_mm256_mul_pd(x[h], cs), mc), half_even);
            bad |= _mm256_movemask_pd(_mm256_cmp_pd(_mm256_andnot_pd(mag, y), top, _CMP_GT_OQ));
            y = _mm256_fmadd_pd(y, _mm256_loadu_pd(t->w + j + 4 * h), _mm256_loadu_pd(t->b + j + 4 * h));
            o[h] = to_int4(y, half_even, lo, hi);
        }
        store8_4(o[0], o[1], (char *)t->out + ((base + j) << out_shift), out_shift, 0xFF);
    }
    if (j < n) { /* the tail: the shared form's operations on the last n - j values */
        int m = (int)(n - j);
        __mmask8 mk = (__mmask8)((1u << m) - 1);
        __m512d y = round_pd(_mm512_sub_pd(_mm512_mul_pd(load8(t->q, base + j, wide, m), _mm512_set1_pd(cs1)),
                                           _mm512_set1_pd(mc1)), half_even);
        bad |= _mm512_mask_cmp_pd_mask(mk, _mm512_abs_pd(y), _mm512_set1_pd(t->y_top), _CMP_GT_OQ);
        __m512d o = _mm512_fmadd_pd(y, _mm512_maskz_loadu_pd(mk, t->w + j), _mm512_maskz_loadu_pd(mk, t->b + j));
        finish8(o, half_even, t->lo, t->hi, t->out, base + j, out_shift, m);
    }
    return bad != 0;
}
#endif
