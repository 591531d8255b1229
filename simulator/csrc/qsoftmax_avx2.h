/* The AVX2 build's softmax of short rows (qnorm.c includes this in place of its
 * softmax16): each row of n <= 16 values as two ymm of 8 int32 lanes, natively (SIMDe's
 * stand-ins for the 512-bit lane shuffles, the float64 -> int64 conversion and the gathers
 * of qnorm.c's form spilled through memory). The same values from the same operations:
 *   g = max(q) - q, e = exp[g] (float32 integers < 2^15: every order of their sum is
 *   exact), r_in = min(round(sum(e) * sum_scale), 32767), c = recip[r_in - qmin] * mult,
 *   y = clamp(round(e * c), lo, hi). */
#ifndef QPARITY_QSOFTMAX_AVX2_H
#define QPARITY_QSOFTMAX_AVX2_H

/* Every lane of v as the maximum of its 8 lanes. */
AI __m256i hmax8(__m256i v) {
    v = _mm256_max_epi32(v, _mm256_permute2x128_si256(v, v, 1));
    v = _mm256_max_epi32(v, _mm256_shuffle_epi32(v, 0x4E));
    return _mm256_max_epi32(v, _mm256_shuffle_epi32(v, 0xB1));
}

/* The sum of e's 16 lanes (two halves), in float32: exact for these integers. */
AI float hsum16(__m256 e0, __m256 e1) {
    __m256 s8 = _mm256_add_ps(e0, e1);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1)));
}

/* clamp(round(e * c), lo, hi) of four lanes as int32 (finish8's steps). */
AI __m128i sm_quarter(__m128 e, __m256d c, __m256d lo, __m256d hi, int half_even) {
    __m256d y = _mm256_min_pd(_mm256_max_pd(_mm256_mul_pd(_mm256_cvtps_pd(e), c), lo), hi);
    return _mm256_cvtpd_epi32(round4(y, half_even)); /* an integer: exact */
}

/* A row's 16 int32 results r (lanes 0-7, 8-15) at out as int8, int16 or int32, lanes of m. */
AI void sm_store(const __m128i r[4], void *out, int out_shift, __mmask16 m) {
    __m128i w0 = _mm_packs_epi32(r[0], r[1]), w1 = _mm_packs_epi32(r[2], r[3]);
    if (out_shift == 0) _mm_mask_storeu_epi8(out, m, _mm_packs_epi16(w0, w1));
    else if (out_shift == 1) _mm256_mask_storeu_epi16(out, m, _mm256_set_m128i(w1, w0));
    else {
        _mm256_mask_storeu_epi32(out, (__mmask8)m, _mm256_set_m128i(r[1], r[0]));
        _mm256_mask_storeu_epi32((int32_t *)out + 8, (__mmask8)(m >> 8), _mm256_set_m128i(r[3], r[2]));
    }
}

AI void softmax16(const void *q, int wide, int64_t r0, int nr, int64_t n, const float *exp,
                  const double *recip, int64_t recip_qmin, double sum_scale, double mult,
                  int half_even, __m512d lo, __m512d hi, void *out, int out_shift) {
    __mmask16 m = mask16(n);
    const __m256i in[2] = {qa_lanes32(m & 0xFF), qa_lanes32(m >> 8)}, floor = _mm256_set1_epi32(INT32_MIN);
    __m256d lo4, hi4;
    memcpy(&lo4, &lo, sizeof lo4);
    memcpy(&hi4, &hi, sizeof hi4);
    for (int i = 0; i < nr; i++) {
        __m512i v = load16(q, (r0 + i) * n, wide, m);
        __m256i x[2];
        memcpy(x, &v, sizeof x);
        __m256i top = hmax8(_mm256_max_epi32(_mm256_blendv_epi8(floor, x[0], in[0]),
                                             _mm256_blendv_epi8(floor, x[1], in[1])));
        __m256 e[2];
        for (int h = 0; h < 2; h++)
            e[h] = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), exp, _mm256_sub_epi32(top, x[h]),
                                            _mm256_castsi256_ps(in[h]), 4);
        double r_in = round_mode((double)hsum16(e[0], e[1]) * sum_scale, half_even);
        r_in = r_in > 32767.0 ? 32767.0 : r_in;
        __m256d c = _mm256_set1_pd(recip[(int64_t)r_in - recip_qmin] * mult);
        __m128i r[4];
        for (int k = 0; k < 4; k++) {
            __m256 eh = e[k >> 1];
            r[k] = sm_quarter(k & 1 ? _mm256_extractf128_ps(eh, 1) : _mm256_castps256_ps128(eh), c,
                              lo4, hi4, half_even);
        }
        sm_store(r, (char *)out + (((r0 + i) * n) << out_shift), out_shift, m);
    }
}

#endif
