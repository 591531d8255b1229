/* The executor's compiled LayerNorm (simulator/exec_native_norm.py proves the bounds and
 * calls it): exec_dense.int_layernorm, row by row, operation for operation in float64.
 *
 * Per row of n < 2**10 values q (int8 or int16), s = in_shift:
 *   X1 = sum(q) 2^s, X2 = sum(q^2) 4^s (exact integers), mean = round(X1 / n),
 *   ssd = X2 - 2 X1 mean + n mean^2, v = round(ssd 2^G / n) + eps,
 *   k = (frexp_exponent(v) - 14) >> 1, vn = clamp(round(v 2^-2k), 0, 32767),
 *   c = rsqrt[vn] 2^(F - 17 - k), y = round(q (c 2^s) - mean c),
 *   out = clamp(round(y w[j] + b[j]), lo, hi)        (w, b already times out_mult 2^-out_shift)
 * Every value is an exact float64 (the proofs are in exec_dense's docstrings) except the two
 * quotients, which round_quotient rounds exactly; |y| must stay <= y_top (checked here: the
 * call returns 1 and the caller runs the reference instead).
 */
#include <math.h>
#include <string.h>

#include "qsimd.h"

TGT AI double round_mode(double y, int half_even) {
    return half_even ? __builtin_roundeven(y) : copysign(floor(fabs(y) + 0.5), y);
}

/* 2^e as a double, built from its bits (-1022 <= e <= 1023): no libm call in the row loop. */
AI double pow2i(int e) {
    uint64_t bits = (uint64_t)(e + 1023) << 52;
    double d;
    memcpy(&d, &bits, 8);
    return d;
}

/* frexp's exponent of v >= 0 (v = m 2^e, 0.5 <= m < 1; 0 for v = 0), read from its bits
 * (v is an integer-valued double here: never subnormal). */
AI int frexp_exponent(double v) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    return v == 0 ? 0 : (int)((bits >> 52) & 0x7ff) - 1022;
}

/* One row: the statistics, then the normalized, affine, clamped outputs, 8 at a time
 * (p_in = 2^s, p_in2 = 4^s, p_guard = 2^G). Returns 1 when some |y| passes y_top. Sums of q and q^2 in float64 are exact (< 2^41). */
TGT AI int ln_row(const void *q, int wide, int64_t r, int64_t n, double p_in, double p_in2,
                  double p_guard, double eps, int half_even, const double *rsqrt,
                  int64_t rsqrt_qmin, int frac,
                  const double *w, const double *b, double y_top, __m512d lo, __m512d hi,
                  void *out, int out_shift) {
    __m512d v1 = _mm512_setzero_pd(), v2 = v1;
    for (int64_t j = 0; j < n; j += 8) {
        __m512d x = load8(q, r * n + j, wide, n - j < 8 ? (int)(n - j) : 8);
        v1 = _mm512_add_pd(v1, x), v2 = _mm512_fmadd_pd(x, x, v2);
    }
    double x1 = _mm512_reduce_add_pd(v1) * p_in;
    double x2 = _mm512_reduce_add_pd(v2) * p_in2;
    double mean = round_mode(x1 / (double)n, half_even);
    double ssd = x2 - x1 * mean * 2.0 + mean * mean * (double)n;
    double v = round_mode(ssd * p_guard / (double)n, half_even) + eps;
    int k = (frexp_exponent(v) - 14) >> 1;
    double vn = round_mode(v * pow2i(-2 * k), half_even);
    vn = vn < 0 ? 0 : vn > 32767 ? 32767 : vn;
    double c = rsqrt[(int64_t)vn - rsqrt_qmin] * pow2i(frac - 17 - k);
    __m512d cs = _mm512_set1_pd(c * p_in), mc = _mm512_set1_pd(mean * c);
    __m512d top = _mm512_set1_pd(y_top);
    __mmask8 bad = 0;
    for (int64_t j = 0; j < n; j += 8) {
        int m = n - j < 8 ? (int)(n - j) : 8;
        __mmask8 mk = (__mmask8)((1u << m) - 1);
        __m512d y = round_pd(_mm512_sub_pd(_mm512_mul_pd(load8(q, r * n + j, wide, m), cs), mc),
                             half_even);
        bad |= _mm512_mask_cmp_pd_mask(mk, _mm512_abs_pd(y), top, _CMP_GT_OQ);
        __m512d o = _mm512_fmadd_pd(y, _mm512_maskz_loadu_pd(mk, w + j), _mm512_maskz_loadu_pd(mk, b + j));
        finish8(o, half_even, lo, hi, out, r * n + j, out_shift, m);
    }
    return bad != 0;
}

TGT int qp_layernorm(const void *q, int64_t wide, int64_t rows, int64_t n, int64_t in_shift,
                 int64_t guard, double eps, int64_t half_even, const double *rsqrt,
                 int64_t rsqrt_qmin, int64_t frac, const double *w, const double *b,
                 double y_top, double lo, double hi, void *out, int64_t out_shift) {
    int bad = 0;
    __m512d vlo = _mm512_set1_pd(lo), vhi = _mm512_set1_pd(hi);
#pragma omp parallel for schedule(static) reduction(| : bad) if (rows * n >= 32768)
    for (int64_t r = 0; r < rows; r++)
        bad |= ln_row(q, (int)wide, r, n, pow2i((int)in_shift), pow2i(2 * (int)in_shift),
                      pow2i((int)guard), eps, (int)half_even, rsqrt,
                      rsqrt_qmin, (int)frac, w, b, y_top, vlo, vhi, out, (int)out_shift);
    return bad;
}

/* SOFTMAX along the last axis: exec_dense.int_softmax row by row, in the same float ops.
 *   g = max(q) - q, e = exp[g] (float32 integers < 2^15), s = sum(e) (exact in float64),
 *   r_in = min(round(s * 2^-sum_shift), 32767), c = recip[r_in - recip_qmin] * mult,
 *   y = clamp(round(e * c), lo, hi)
 * with mult = out_mult * 2^-out_shift as the caller computes it; q int8 or int16 (every gap
 * is inside the exp table), 16 lanes at a time. */
TGT AI __m512i load16(const void *q, int64_t i, int wide, __mmask16 m) {
    return wide ? _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m, (const int16_t *)q + i))
                : _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, (const int8_t *)q + i));
}

TGT AI __mmask16 mask16(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

TGT AI void softmax_row(const void *q, int wide, int64_t r, int64_t n, const float *exp,
                        const double *recip, int64_t recip_qmin, double sum_scale, double mult,
                        int half_even, __m512d lo, __m512d hi, void *out, int out_shift) {
    int64_t base = r * n;
    __m512i top = _mm512_set1_epi32(INT32_MIN);
    for (int64_t j = 0; j < n; j += 16)
        top = _mm512_mask_max_epi32(top, mask16(n - j), top, load16(q, base + j, wide, mask16(n - j)));
    __m512i vmax = _mm512_set1_epi32(_mm512_reduce_max_epi32(top));
    __m512d sum = _mm512_setzero_pd();
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        __m512i g = _mm512_sub_epi32(vmax, load16(q, base + j, wide, m));
        __m512 e = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, g, exp, 4);
        sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    double r_in = round_mode(_mm512_reduce_add_pd(sum) * sum_scale, half_even);
    r_in = r_in > 32767 ? 32767 : r_in;
    __m512d c = _mm512_set1_pd(recip[(int64_t)r_in - recip_qmin] * mult);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        __m512i g = _mm512_sub_epi32(vmax, load16(q, base + j, wide, m));
        __m512 e = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, g, exp, 4);
        int k = n - j < 16 ? (int)(n - j) : 16;
        finish8(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(e)), c), half_even, lo, hi,
                out, base + j, out_shift, k < 8 ? k : 8);
        if (k > 8)
            finish8(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)), c), half_even,
                    lo, hi, out, base + j + 8, out_shift, k - 8);
    }
}

TGT void qp_softmax(const void *q, int64_t wide, int64_t rows, int64_t n, const float *exp,
                    const double *recip, int64_t recip_qmin, double sum_scale, double mult,
                    int64_t half_even, double lo, double hi, void *out, int64_t out_shift) {
    __m512d vlo = _mm512_set1_pd(lo), vhi = _mm512_set1_pd(hi);
#pragma omp parallel for schedule(static) if (rows * n >= 32768)
    for (int64_t r = 0; r < rows; r++)
        softmax_row(q, (int)wide, r, n, exp, recip, recip_qmin, sum_scale, mult, (int)half_even,
                    vlo, vhi, out, (int)out_shift);
}
