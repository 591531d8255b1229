/* The AVX2 build's bmm_pairs_part (qbmm.c includes this in place of its own): the same
 * int16 pairs along k and exact int32 sums, by VPMADDWD on ymm halves of 8 columns, then
 * the same float64 epilogue (to_int4). SIMDe's stand-ins for qbmm.c's 512-bit word permute
 * and gathers built their index vectors through memory and zeroed buffers on each call:
 * half of a digit ViT's attention matmuls. */
#ifndef QPARITY_QBMM_AVX2_H
#define QPARITY_QBMM_AVX2_H

/* n values (int8 for t 0, int16 for t 1) from p as 16 int16 lanes, zero past n (n <= 0:
 * all zero). */
AI __m256i row16_h(const void *p, int t, int64_t n) {
    if (n <= 0) return _mm256_setzero_si256();
    __mmask16 m = mask16(n);
    return t ? _mm256_maskz_loadu_epi16(m, p) : _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(m, p));
}

/* b of one batch as pairs along k (qbmm.c's pack_pairs): bp[m * 16 + j] = (b[2m, j],
 * b[2m+1, j]) as two int16 in an int32, 0 past inner and cols. sj == 1: two rows widened
 * and interleaved (the unpacks work per 128-bit lane; two lane permutes put the columns
 * back in order); sk == 1: each column's values widened, then read as pairs. */
AI void pack_pairs(const char *b, int tb, int64_t sk, int64_t sj, int64_t inner, int64_t cols,
                   int32_t *bp) {
    int64_t kp = (inner + 1) / 2, e = tb ? 2 : 1;
    if (sj == 1) {
        for (int64_t m = 0; m < kp; m++) {
            __m256i r0 = row16_h(b + 2 * m * sk * e, tb, cols);
            __m256i r1 = 2 * m + 1 < inner ? row16_h(b + (2 * m + 1) * sk * e, tb, cols) : _mm256_setzero_si256();
            __m256i lo = _mm256_unpacklo_epi16(r0, r1), hi = _mm256_unpackhi_epi16(r0, r1);
            _mm256_storeu_si256((__m256i *)(bp + m * 16), _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(bp + m * 16 + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
        }
        return;
    }
    int32_t col[16][16]; /* column j's k pairs */
    for (int64_t j = 0; j < 16; j++)
        for (int h = 0; h < 2; h++)
            _mm256_storeu_si256((__m256i *)(col[j] + 8 * h),
                                j < cols ? row16_h(b + (j * sj + 16 * h) * e, tb, inner - 16 * h)
                                         : _mm256_setzero_si256());
    for (int64_t m = 0; m < kp; m++)
        for (int64_t j = 0; j < 16; j++) bp[m * 16 + j] = col[j][m];
}

/* QMatMul by VPMADDWD (qbmm.c's bmm_pairs_part): four rows per pass. */
static void bmm_pairs_part(void *p, int64_t g0, int64_t g1) {
    const bmm_t t = *(const bmm_t *)p; /* a copy: the stores through out cannot alias it */
    int64_t kp = (t.inner + 1) / 2, ea = t.ta ? 2 : 1, eb = t.tb ? 2 : 1;
    const __m256d vs = _mm256_set1_pd(t.scale), vlo = _mm256_set1_pd(t.lo), vhi = _mm256_set1_pd(t.hi);
    for (int64_t g = g0; g < g1; g++) {
        int32_t bp[16 * 16], ar[4][16];
        int64_t oa = batch_at(&t, t.sa, g), ob = batch_at(&t, t.sb, g);
        pack_pairs((const char *)t.b + ob * eb, (int)t.tb, t.sb[2], t.sb[3], t.inner, t.cols, bp);
        for (int64_t i0 = 0; i0 < t.rows; i0 += 4) {
            int nr = t.rows - i0 < 4 ? (int)(t.rows - i0) : 4;
            __m256i acc[4][2];
            for (int q = 0; q < 4; q++) {
                const char *row = (const char *)t.a + (oa + (i0 + (q < nr ? q : 0)) * t.sa[2]) * ea;
                for (int h = 0; h < 2; h++)
                    _mm256_storeu_si256((__m256i *)(ar[q] + 8 * h),
                                        row16_h(row + 16 * h * ea, (int)t.ta, t.inner - 16 * h));
                acc[q][0] = acc[q][1] = _mm256_setzero_si256();
            }
            for (int64_t m = 0; m < kp; m++) {
                __m256i b0 = _mm256_loadu_si256((const __m256i *)(bp + m * 16));
                __m256i b1 = _mm256_loadu_si256((const __m256i *)(bp + m * 16 + 8));
                for (int q = 0; q < 4; q++) {
                    __m256i x = _mm256_set1_epi32(ar[q][m]);
                    acc[q][0] = _mm256_add_epi32(acc[q][0], _mm256_madd_epi16(x, b0));
                    acc[q][1] = _mm256_add_epi32(acc[q][1], _mm256_madd_epi16(x, b1));
                }
            }
            for (int q = 0; q < nr; q++)
                for (int h = 0; 8 * h < t.cols; h++) {
                    __m128i r[2];
                    for (int k = 0; k < 2; k++) {
                        __m128i a4 = k ? _mm256_extracti128_si256(acc[q][h], 1) : _mm256_castsi256_si128(acc[q][h]);
                        r[k] = to_int4(_mm256_mul_pd(_mm256_cvtepi32_pd(a4), vs), (int)t.half_even, vlo, vhi);
                    }
                    int64_t at = (g * t.rows + i0 + q) * t.cols + 8 * h;
                    store8_4(r[0], r[1], (char *)t.out + (at << t.out_shift), (int)t.out_shift,
                             (__mmask8)mask16(t.cols - 8 * h));
                }
        }
    }
}

#endif
