/* The AVX2 build's replacements (included by qavx2.h) for the SIMDe intrinsics that run
 * lane by lane, through memory or through SIMDe's generic permutes: gathers by AVX2's own
 * VPGATHER, and arithmetic, blends, permutes, compares and scalef as two 256-bit halves,
 * each giving the lanes the AVX-512 instruction gives. */
#ifndef QPARITY_QAVX2_HALVES_H
#define QPARITY_QAVX2_HALVES_H

/* ---- masked gathers: AVX2's own, a half at a time; lanes outside k keep src and their
 * index is never dereferenced (as VPGATHER guarantees) ---- */
/* (qa_lanes32 / qa_lanes64, the masks as lanes: qavx2.h) */
/* VPGATHER takes its scale as an immediate: one call per scale. */
#define QA_SCALED(call, scale)                          \
    switch (scale) {                                    \
    case 1: return call(1);                             \
    case 2: return call(2);                             \
    case 4: return call(4);                             \
    default: return call(8);                            \
    }
QA __m256i qa_gather8_epi32(__m256i src, const void *base, __m256i idx, __m256i m, int scale) {
#define QA_G(sc) _mm256_mask_i32gather_epi32(src, (const int *)base, idx, m, sc)
    QA_SCALED(QA_G, scale)
#undef QA_G
}
QA __m256 qa_gather8_ps(__m256 src, const void *base, __m256i idx, __m256i m, int scale) {
#define QA_G(sc) _mm256_mask_i32gather_ps(src, (const float *)base, idx, _mm256_castsi256_ps(m), sc)
    QA_SCALED(QA_G, scale)
#undef QA_G
}
QA __m256d qa_gather4_pd(__m256d src, const void *base, __m256i idx, __m256i m, int scale) {
#define QA_G(sc) _mm256_mask_i64gather_pd(src, (const double *)base, idx, _mm256_castsi256_pd(m), sc)
    QA_SCALED(QA_G, scale)
#undef QA_G
}
#undef QA_SCALED
/* The 512-bit gather `name` from its half `half` (lanes per half n, mask lanes `lanes`). */
#define QA_MASK_GATHER(name, vt, ht, half, lanes, n, mt)                                   \
    QA vt qa_##name(vt src, mt k, __m512i idx, const void *base, int scale) {              \
        ht s[2];                                                                           \
        __m256i ix[2];                                                                     \
        memcpy(s, &src, sizeof s), memcpy(ix, &idx, sizeof ix);                            \
        for (int h = 0; h < 2; h++) s[h] = half(s[h], base, ix[h], lanes((unsigned)k >> (n) * h), scale); \
        return qa_join_##vt(s);                                                            \
    }
QA_MASK_GATHER(mm512_mask_i32gather_ps, __m512, __m256, qa_gather8_ps, qa_lanes32, 8, __mmask16)
QA_MASK_GATHER(mm512_mask_i32gather_epi32, __m512i, __m256i, qa_gather8_epi32, qa_lanes32, 8, __mmask16)
QA_MASK_GATHER(mm512_mask_i64gather_pd, __m512d, __m256d, qa_gather4_pd, qa_lanes64, 4, __mmask8)
#undef _mm512_mask_i32gather_ps
#undef _mm512_mask_i32gather_epi32
#undef _mm512_mask_i64gather_pd
#undef _mm512_i64gather_pd
#define _mm512_mask_i32gather_ps qa_mm512_mask_i32gather_ps
#define _mm512_mask_i32gather_epi32 qa_mm512_mask_i32gather_epi32
#define _mm512_mask_i64gather_pd qa_mm512_mask_i64gather_pd
#define _mm512_i64gather_pd(idx, base, scale) \
    qa_mm512_mask_i64gather_pd(_mm512_setzero_pd(), (__mmask8)0xFF, (idx), (base), (scale))

/* ---- what SIMDe 0.8 does lane by lane (or through its generic permutes): two AVX2
 * halves. The 512-bit unpacks and madd work within 128-bit lanes, so halves give the same
 * lanes. ---- */
#define QA_BINARY_HALVES(name, vt, ht, f)                                 \
    QA vt qa_##name(vt a, vt b) {                                         \
        ht x[2], y[2];                                                    \
        memcpy(x, &a, sizeof x), memcpy(y, &b, sizeof y);                 \
        x[0] = f(x[0], y[0]), x[1] = f(x[1], y[1]);                       \
        memcpy(&a, x, sizeof a);                                          \
        return a;                                                         \
    }
QA_BINARY_HALVES(mm512_madd_epi16, __m512i, __m256i, _mm256_madd_epi16)
QA_BINARY_HALVES(mm512_unpacklo_epi32, __m512i, __m256i, _mm256_unpacklo_epi32)
QA_BINARY_HALVES(mm512_unpackhi_epi32, __m512i, __m256i, _mm256_unpackhi_epi32)
#undef _mm512_madd_epi16
#undef _mm512_unpacklo_epi32
#undef _mm512_unpackhi_epi32
#define _mm512_madd_epi16 qa_mm512_madd_epi16
#define _mm512_unpacklo_epi32 qa_mm512_unpacklo_epi32
#define _mm512_unpackhi_epi32 qa_mm512_unpackhi_epi32

/* Lanes of k from a, the others from src (zero for maskz). */
QA __m512i qa_mm512_mask_mov_epi32(__m512i src, __mmask16 k, __m512i a) {
    __m256i s[2], x[2];
    memcpy(s, &src, sizeof s), memcpy(x, &a, sizeof x);
    for (int h = 0; h < 2; h++) s[h] = _mm256_blendv_epi8(s[h], x[h], qa_lanes32((unsigned)k >> 8 * h));
    memcpy(&src, s, sizeof src);
    return src;
}
QA __m512i qa_mm512_maskz_mov_epi32(__mmask16 k, __m512i a) {
    return qa_mm512_mask_mov_epi32(_mm512_setzero_si512(), k, a);
}
QA __m512 qa_mm512_mask_add_ps(__m512 src, __mmask16 k, __m512 a, __m512 b) {
    return _mm512_castsi512_ps(qa_mm512_mask_mov_epi32(_mm512_castps_si512(src), k,
                                                       _mm512_castps_si512(_mm512_add_ps(a, b))));
}
QA __m512d qa_mm512_mask_add_pd(__m512d src, __mmask8 k, __m512d a, __m512d b) {
    __m256d s[2], y[2];
    __m512d sum = _mm512_add_pd(a, b);
    memcpy(s, &src, sizeof s), memcpy(y, &sum, sizeof y);
    for (int h = 0; h < 2; h++)
        s[h] = _mm256_blendv_pd(s[h], y[h], _mm256_castsi256_pd(qa_lanes64((unsigned)k >> 4 * h)));
    memcpy(&src, s, sizeof src);
    return src;
}
QA __m512d qa_mm512_maskz_add_pd(__mmask8 k, __m512d a, __m512d b) {
    return qa_mm512_mask_add_pd(_mm512_setzero_pd(), k, a, b);
}
#undef _mm512_mask_mov_epi32
#undef _mm512_maskz_mov_epi32
#undef _mm512_mask_add_ps
#undef _mm512_mask_add_pd
#undef _mm512_maskz_add_pd
#define _mm512_mask_mov_epi32 qa_mm512_mask_mov_epi32
#define _mm512_maskz_mov_epi32 qa_mm512_maskz_mov_epi32
#define _mm512_mask_add_ps qa_mm512_mask_add_ps
#define _mm512_mask_add_pd qa_mm512_mask_add_pd
#define _mm512_maskz_add_pd qa_mm512_maskz_add_pd

/* permutexvar: output lane i = a[idx[i] mod 16] (epi32) or a[idx[i] mod 8] (pd): each half
 * permuted by AVX2's VPERMD from both halves of a, then the one bit that picks the half. */
QA __m512i qa_mm512_permutexvar_epi32(__m512i idx, __m512i a) {
    __m256i ix[2], x[2], r[2];
    memcpy(ix, &idx, sizeof ix), memcpy(x, &a, sizeof x);
    for (int h = 0; h < 2; h++) {
        __m256 lo = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(x[0], ix[h]));
        __m256 hi = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(x[1], ix[h]));
        r[h] = _mm256_castps_si256(_mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(ix[h], 28))));
    }
    memcpy(&a, r, sizeof a);
    return a;
}
QA __m512d qa_mm512_permutexvar_pd(__m512i idx, __m512d a) {
    __m256i ix[2], x[2];
    __m256d r[2];
    memcpy(ix, &idx, sizeof ix), memcpy(x, &a, sizeof x);
    for (int h = 0; h < 2; h++) { /* double j of a half: its int32 pair (2j, 2j + 1) */
        __m256i j2 = _mm256_slli_epi64(_mm256_and_si256(ix[h], _mm256_set1_epi64x(3)), 1);
        __m256i pair = _mm256_or_si256(j2, _mm256_slli_epi64(_mm256_add_epi64(j2, _mm256_set1_epi64x(1)), 32));
        __m256d lo = _mm256_castsi256_pd(_mm256_permutevar8x32_epi32(x[0], pair));
        __m256d hi = _mm256_castsi256_pd(_mm256_permutevar8x32_epi32(x[1], pair));
        r[h] = _mm256_blendv_pd(lo, hi, _mm256_castsi256_pd(_mm256_slli_epi64(ix[h], 61)));
    }
    memcpy(&a, r, sizeof a);
    return a;
}
#undef _mm512_permutexvar_epi32
#undef _mm512_permutexvar_pd
#define _mm512_permutexvar_epi32 qa_mm512_permutexvar_epi32
#define _mm512_permutexvar_pd qa_mm512_permutexvar_pd

/* Compares as two AVX2 compares and their sign-bit masks (p must be a constant). */
QA __m256d qa_half_pd(__m512d x, int h) {
    __m256d v[2];
    memcpy(v, &x, sizeof v);
    return v[h];
}
QA __m256 qa_half_ps(__m512 x, int h) {
    __m256 v[2];
    memcpy(v, &x, sizeof v);
    return v[h];
}
#undef _mm512_cmp_pd_mask
#undef _mm512_cmp_ps_mask
#define _mm512_cmp_pd_mask(a, b, p)                                                                  \
    ((__mmask8)(_mm256_movemask_pd(_mm256_cmp_pd(qa_half_pd((a), 0), qa_half_pd((b), 0), (p))) |     \
                (_mm256_movemask_pd(_mm256_cmp_pd(qa_half_pd((a), 1), qa_half_pd((b), 1), (p))) << 4)))
#define _mm512_cmp_ps_mask(a, b, p)                                                                  \
    ((__mmask16)(_mm256_movemask_ps(_mm256_cmp_ps(qa_half_ps((a), 0), qa_half_ps((b), 0), (p))) |    \
                 (_mm256_movemask_ps(_mm256_cmp_ps(qa_half_ps((a), 1), qa_half_ps((b), 1), (p))) << 8)))

QA __m512i qa_mm512_cvttps_epi32(__m512 x) {
    __m256 v[2];
    __m256i r[2];
    memcpy(v, &x, sizeof v);
    r[0] = _mm256_cvttps_epi32(v[0]), r[1] = _mm256_cvttps_epi32(v[1]);
    __m512i out;
    memcpy(&out, r, sizeof out);
    return out;
}
#undef _mm512_cvttps_epi32
#define _mm512_cvttps_epi32 qa_mm512_cvttps_epi32

/* scalef(a, b) = a * 2^floor(b): one multiplication by 2^floor(b), built from its bits,
 * when every floor(b) is in [-1022, 1023] (a normal power of two: the product's one
 * rounding is scalef's); otherwise SIMDe's (which calls exp2 per lane). */
QA __m512d qa_mm512_scalef_pd(__m512d a, __m512d b) {
    __m256d x[2], y[2];
    memcpy(x, &a, sizeof x), memcpy(y, &b, sizeof y);
    for (int h = 0; h < 2; h++) {
        __m256d fb = _mm256_floor_pd(y[h]);
        __m256d ok = _mm256_and_pd(_mm256_cmp_pd(fb, _mm256_set1_pd(-1022.0), _CMP_GE_OQ),
                                   _mm256_cmp_pd(fb, _mm256_set1_pd(1023.0), _CMP_LE_OQ));
        if (_mm256_movemask_pd(ok) != 0xF) return simde_mm512_scalef_pd(a, b);
        /* fb + 1023 + 2^52 holds fb + 1023 in its low mantissa bits: the exponent field */
        __m256i e = _mm256_castpd_si256(_mm256_add_pd(fb, _mm256_set1_pd(4503599627371519.0)));
        x[h] = _mm256_mul_pd(x[h], _mm256_castsi256_pd(_mm256_slli_epi64(e, 52)));
    }
    memcpy(&a, x, sizeof a);
    return a;
}
#undef _mm512_scalef_pd
#define _mm512_scalef_pd qa_mm512_scalef_pd

QA __m512i qa_mm512_i32gather_epi32(__m512i idx, const void *base, int scale) {
    return qa_mm512_mask_i32gather_epi32(_mm512_setzero_si512(), (__mmask16)0xFFFF, idx, base, scale);
}
#undef _mm512_i32gather_epi32
#define _mm512_i32gather_epi32 qa_mm512_i32gather_epi32

#endif
