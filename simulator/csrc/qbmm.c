/* The executor's compiled batched QMatMul (simulator/kernels/exec_native_rows.py proves the bound
 * and calls it):
 *   y[g, i, j] = clamp(round(sum_k a[g, i, k] b[g, k, j] * scale), lo, hi)
 * with float64 sums of exact products (max|a| max|b| K |m| below the float64 limit, so the
 * order of the sum cannot change it), four rows per pass. qp_bmm takes contiguous
 * operands; qp_bmm_strided reads views (a transposed k, a head-split q) in place.
 */
#include "qsimd.h"

/* a[row, k] as float64: TA 0 int8, 1 int16, 2 already float64 (a widened copy). */
AI double lda(const void *a, int64_t i, int TA) {
    return TA == 2 ? ((const double *)a)[i]
           : TA    ? (double)((const int16_t *)a)[i]
                   : (double)((const int8_t *)a)[i];
}

/* Four rows at a time (independent FMA chains): out rows i0..i0+nr-1, columns j0..j0+n-1;
 * b from the widened copy wb (row stride cp) or, wb NULL, from b itself. */
TGT AI void bmm_rows(const void *a, int TA, int64_t r0, int64_t r1, int64_t r2, int64_t r3,
                     const double *wb, int64_t cp, const void *b, int tb, int64_t bbase,
                     int64_t cols, int64_t inner, int64_t j0, int n, __m512d *acc) {
    __m512d c0 = _mm512_setzero_pd(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t k = 0; k < inner; k++) {
        __m512d bv = wb ? _mm512_loadu_pd(wb + k * cp + j0) : load8(b, bbase + k * cols + j0, tb, n);
        c0 = _mm512_fmadd_pd(_mm512_set1_pd(lda(a, r0 + k, TA)), bv, c0);
        c1 = _mm512_fmadd_pd(_mm512_set1_pd(lda(a, r1 + k, TA)), bv, c1);
        c2 = _mm512_fmadd_pd(_mm512_set1_pd(lda(a, r2 + k, TA)), bv, c2);
        c3 = _mm512_fmadd_pd(_mm512_set1_pd(lda(a, r3 + k, TA)), bv, c3);
    }
    acc[0] = c0, acc[1] = c1, acc[2] = c2, acc[3] = c3;
}

/* The arguments of qp_bmm, qp_bmm_strided and qp_bmm_pairs, for their loops' parts
 * (each part function reads a copy of it; qp_bmm's batch is nb1 * nb2 = batch * 1). */
typedef struct {
    const void *a, *b;
    int64_t ta, tb;
    const int64_t *sa, *sb;
    int64_t nb2, rows, inner, cols, half_even, out_shift;
    double scale, lo, hi;
    void *out;
} bmm_t;

/* Where batch g = (g / nb2, g % nb2) starts in an operand of strides s (elements). */
static inline int64_t batch_at(const bmm_t *t, const int64_t *s, int64_t g) {
    return g / t->nb2 * s[0] + g % t->nb2 * s[1];
}

/* QMatMul, batched: y[g, i, j] = sum_k a[g, i, k] * b[g, k, j] * scale, float64 sums of
 * exact products (the caller proves max|a| max|b| K |m| < the float64 limit). Each batch's
 * a and b are widened to float64 once when they fit the stack buffers (else on the fly). */
#define BMM_BUF 4096
TGT static void bmm_part(void *p, int64_t g0, int64_t g1) {
    const bmm_t t = *(const bmm_t *)p; /* a copy: the stores through out cannot alias it */
    int64_t cp = (t.cols + 7) / 8 * 8;
    int widen = cp * t.inner <= BMM_BUF && t.rows * t.inner <= BMM_BUF;
    for (int64_t g = g0; g < g1; g++) {
        __m512d vs = _mm512_set1_pd(t.scale), vlo = _mm512_set1_pd(t.lo), vhi = _mm512_set1_pd(t.hi);
        double buf[BMM_BUF], abuf[BMM_BUF];
        const double *wb = widen ? buf : 0;
        for (int64_t k = 0; widen && k < t.inner; k++)
            for (int64_t j0 = 0; j0 < t.cols; j0 += 8)
                _mm512_storeu_pd(buf + k * cp + j0, load8(t.b, (g * t.inner + k) * t.cols + j0, (int)t.tb,
                                                          t.cols - j0 < 8 ? (int)(t.cols - j0) : 8));
        for (int64_t i = 0; widen && i < t.rows * t.inner; i++)
            abuf[i] = lda(t.a, g * t.rows * t.inner + i, (int)t.ta);
        int64_t abase = widen ? g * t.rows * t.inner : 0; /* a's rows, as indexed below */
        for (int64_t i0 = 0; i0 < t.rows; i0 += 4)
            for (int64_t j0 = 0; j0 < t.cols; j0 += 8) {
                int n = t.cols - j0 < 8 ? (int)(t.cols - j0) : 8, nr = t.rows - i0 < 4 ? (int)(t.rows - i0) : 4;
                int64_t r[4];
                for (int q = 0; q < 4; q++) r[q] = (g * t.rows + i0 + (q < nr ? q : 0)) * t.inner - abase;
                __m512d acc[4];
                int64_t ob = g * t.inner * t.cols; /* b's batch */
                if (widen)
                    bmm_rows(abuf, 2, r[0], r[1], r[2], r[3], wb, cp, t.b, (int)t.tb, ob, t.cols,
                             t.inner, j0, n, acc);
                else if (t.ta)
                    bmm_rows(t.a, 1, r[0], r[1], r[2], r[3], wb, cp, t.b, (int)t.tb, ob, t.cols,
                             t.inner, j0, n, acc);
                else
                    bmm_rows(t.a, 0, r[0], r[1], r[2], r[3], wb, cp, t.b, (int)t.tb, ob, t.cols,
                             t.inner, j0, n, acc);
                for (int q = 0; q < nr; q++)
                    finish8(_mm512_mul_pd(acc[q], vs), (int)t.half_even, vlo, vhi, t.out,
                            (g * t.rows + i0 + q) * t.cols + j0, (int)t.out_shift, n);
            }
    }
}

TGT void qp_bmm(const void *a, int64_t ta, const void *b, int64_t tb, int64_t batch, int64_t rows,
                int64_t inner, int64_t cols, double scale, double lo, double hi,
                int64_t half_even, void *out, int64_t out_shift) {
    bmm_t t = {a, b, ta, tb, 0, 0, 1, rows, inner, cols, half_even, out_shift, scale, lo, hi, out};
    qp_for(batch, rows * inner * cols, bmm_part, &t);
}

/* qp_bmm on strided operands (views such as a transposed k, read in place): batch index
 * g = (g1, g2) over [nb1, nb2]; a[g, i, k] at g1 sa[0] + g2 sa[1] + i sa[2] + k sa[3],
 * b[g, k, j] likewise with sb (int8 or int16, read by lda). Each batch is widened into
 * the float64 buffers (the caller checks that rows * inner and cp * inner fit BMM_BUF), then the same products and
 * epilogue as qp_bmm; out is contiguous [nb1, nb2, rows, cols]. */
TGT static void bmm_strided_part(void *p, int64_t g0, int64_t g1) {
    const bmm_t t = *(const bmm_t *)p; /* a copy: the stores through out cannot alias it */
    int64_t cp = (t.cols + 7) / 8 * 8;
    for (int64_t g = g0; g < g1; g++) {
        __m512d vs = _mm512_set1_pd(t.scale), vlo = _mm512_set1_pd(t.lo), vhi = _mm512_set1_pd(t.hi);
        double buf[BMM_BUF], abuf[BMM_BUF];
        int64_t oa = batch_at(&t, t.sa, g), ob = batch_at(&t, t.sb, g);
        for (int64_t k = 0; k < t.inner; k++)
            for (int64_t j = 0; j < cp; j++)
                buf[k * cp + j] = j < t.cols ? lda(t.b, ob + k * t.sb[2] + j * t.sb[3], (int)t.tb) : 0;
        for (int64_t i = 0; i < t.rows; i++)
            for (int64_t k = 0; k < t.inner; k++)
                abuf[i * t.inner + k] = lda(t.a, oa + i * t.sa[2] + k * t.sa[3], (int)t.ta);
        for (int64_t i0 = 0; i0 < t.rows; i0 += 4)
            for (int64_t j0 = 0; j0 < t.cols; j0 += 8) {
                int n = t.cols - j0 < 8 ? (int)(t.cols - j0) : 8, nr = t.rows - i0 < 4 ? (int)(t.rows - i0) : 4;
                int64_t r[4];
                for (int q = 0; q < 4; q++) r[q] = (i0 + (q < nr ? q : 0)) * t.inner;
                __m512d acc[4];
                bmm_rows(abuf, 2, r[0], r[1], r[2], r[3], buf, cp, t.b, (int)t.tb, 0, t.cols, t.inner,
                         j0, n, acc);
                for (int q = 0; q < nr; q++)
                    finish8(_mm512_mul_pd(acc[q], vs), (int)t.half_even, vlo, vhi, t.out,
                            (g * t.rows + i0 + q) * t.cols + j0, (int)t.out_shift, n);
            }
    }
}

TGT void qp_bmm_strided(const void *a, int64_t ta, const int64_t *sa, const void *b, int64_t tb,
                        const int64_t *sb, int64_t nb1, int64_t nb2, int64_t rows, int64_t inner,
                        int64_t cols, double scale, double lo, double hi, int64_t half_even,
                        void *out, int64_t out_shift) {
    bmm_t t = {a, b, ta, tb, sa, sb, nb2, rows, inner, cols, half_even, out_shift, scale, lo, hi, out};
    qp_for(nb1 * nb2, rows * inner * cols, bmm_strided_part, &t);
}

#ifdef QPARITY_SIMDE
#include "qbmm_avx2.h" /* its bmm_pairs_part */
#else
/* n (<= 32) int8 (t 0) or int16 (t 1) values from p as 32 int16 lanes, zero past n. */
TGT AI __m512i row16(const void *p, int t, int64_t n) {
    __mmask32 m = n >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << n) - 1);
    return t ? _mm512_maskz_loadu_epi16(m, p) : _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, p));
}

/* b of one batch as pairs along k: bp[m * 16 + j] = (b[2m, j], b[2m+1, j]) as two int16 in
 * an int32 (0 past inner and cols). b[k, j] at b + (k sk + j sj) elements; sj == 1 (rows
 * contiguous: two rows interleaved by one permute) or sk == 1 (columns contiguous: each
 * column widened is its pairs, then the 16 x kp transpose by gathers from tmp). */
TGT AI void pack_pairs(const char *b, int tb, int64_t sk, int64_t sj, int64_t inner,
                       int64_t cols, int32_t *bp) {
    int64_t kp = (inner + 1) / 2, e = tb ? 2 : 1;
    if (sj == 1) {
        const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                             9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                             17, 1, 16, 0);
        for (int64_t m = 0; m < kp; m++) {
            __m512i r0 = row16(b + 2 * m * sk * e, tb, cols);
            __m512i r1 = 2 * m + 1 < inner ? row16(b + (2 * m + 1) * sk * e, tb, cols)
                                           : _mm512_setzero_si512();
            __m512i z = _mm512_inserti64x4(r0, _mm512_castsi512_si256(r1), 1);
            _mm512_storeu_si512(bp + m * 16, _mm512_permutexvar_epi16(idx, z));
        }
        return;
    }
    int32_t tmp[16 * 16];
    for (int64_t j = 0; j < 16; j++)
        _mm512_storeu_si512(tmp + j * 16, j < cols ? row16(b + j * sj * e, tb, inner)
                                                   : _mm512_setzero_si512());
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                                                             5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(16));
    for (int64_t m = 0; m < kp; m++)
        _mm512_storeu_si512(bp + m * 16, _mm512_i32gather_epi32(
                                             _mm512_add_epi32(rows, _mm512_set1_epi32((int)m)), tmp, 4));
}

/* QMatMul by VPDPWSSD: a and b as int16, pairs along k, exact int32 sums (the caller
 * proves inner max|a| max|b| < 2**31), then the float64 epilogue of qp_bmm on the same
 * exact sums. Operands as qp_bmm_strided, with a's k contiguous (sa[3] == 1), b's j or k
 * contiguous, inner <= 32, cols <= 16. Four rows per pass (independent chains). */
TGT static void bmm_pairs_part(void *p, int64_t g0, int64_t g1) {
    const bmm_t t = *(const bmm_t *)p; /* a copy: the stores through out cannot alias it */
    int64_t kp = (t.inner + 1) / 2, ea = t.ta ? 2 : 1, eb = t.tb ? 2 : 1;
    for (int64_t g = g0; g < g1; g++) {
        __m512d vs = _mm512_set1_pd(t.scale), vlo = _mm512_set1_pd(t.lo), vhi = _mm512_set1_pd(t.hi);
        int32_t bp[16 * 16], ar[4][16];
        int64_t oa = batch_at(&t, t.sa, g), ob = batch_at(&t, t.sb, g);
        pack_pairs((const char *)t.b + ob * eb, (int)t.tb, t.sb[2], t.sb[3], t.inner, t.cols, bp);
        for (int64_t i0 = 0; i0 < t.rows; i0 += 4) {
            int nr = t.rows - i0 < 4 ? (int)(t.rows - i0) : 4;
            __m512i acc[4];
            for (int q = 0; q < 4; q++) {
                int64_t i = i0 + (q < nr ? q : 0);
                const char *row = (const char *)t.a + (oa + i * t.sa[2]) * ea;
                _mm512_storeu_si512(ar[q], row16(row, (int)t.ta, t.inner));
                acc[q] = _mm512_setzero_si512();
            }
            for (int64_t m = 0; m < kp; m++) {
                __m512i bv = _mm512_loadu_si512(bp + m * 16);
                for (int q = 0; q < 4; q++)
                    acc[q] = _mm512_dpwssd_epi32(acc[q], _mm512_set1_epi32(ar[q][m]), bv);
            }
            for (int q = 0; q < nr; q++)
                for (int64_t j0 = 0; j0 < t.cols; j0 += 8) {
                    __m256i h = j0 ? _mm512_extracti64x4_epi64(acc[q], 1) : _mm512_castsi512_si256(acc[q]);
                    finish8(_mm512_mul_pd(_mm512_cvtepi32_pd(h), vs), (int)t.half_even, vlo, vhi, t.out,
                            (g * t.rows + i0 + q) * t.cols + j0, (int)t.out_shift,
                            t.cols - j0 < 8 ? (int)(t.cols - j0) : 8);
                }
        }
    }
}

#endif

TGT void qp_bmm_pairs(const void *a, int64_t ta, const int64_t *sa, const void *b, int64_t tb,
                      const int64_t *sb, int64_t nb1, int64_t nb2, int64_t rows, int64_t inner,
                      int64_t cols, double scale, double lo, double hi, int64_t half_even,
                      void *out, int64_t out_shift) {
    bmm_t t = {a, b, ta, tb, sa, sb, nb2, rows, inner, cols, half_even, out_shift, scale, lo, hi, out};
    qp_for(nb1 * nb2, rows * inner * cols, bmm_pairs_part, &t);
}
