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
        char *o = (char *)out + (((r0 + i) * n) << out_shift);
        for (int h = 0; h < 2; h++) { /* lanes 8h .. 8h+7 */
            __m128i r[2];
            for (int k = 0; k < 2; k++) {
                __m128 ek = k ? _mm256_extractf128_ps(e[h], 1) : _mm256_castps256_ps128(e[h]);
                r[k] = to_int4(_mm256_mul_pd(_mm256_cvtps_pd(ek), c), half_even, lo4, hi4);
            }
            __mmask8 mh = (__mmask8)(m >> 8 * h);
            if (mh) store8_4(r[0], r[1], o + ((8 * h) << out_shift), out_shift, mh);
        }
    }
}

#endif
