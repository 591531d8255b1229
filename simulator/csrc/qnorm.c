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

#include "qsimd.h"

TGT AI double round_mode(double y, int half_even) {
    return half_even ? __builtin_roundeven(y) : copysign(floor(fabs(y) + 0.5), y);
}

/* One row: the statistics, then the normalized, affine, clamped outputs, 8 at a time.
 * Returns 1 when some |y| passes y_top. Sums of q and q^2 in float64 are exact (< 2^41). */
TGT AI int ln_row(const void *q, int wide, int64_t r, int64_t n, int in_shift, int guard,
                  double eps, int half_even, const double *rsqrt, int64_t rsqrt_qmin, int frac,
                  const double *w, const double *b, double y_top, __m512d lo, __m512d hi,
                  void *out, int out_shift) {
    __m512d v1 = _mm512_setzero_pd(), v2 = v1;
    for (int64_t j = 0; j < n; j += 8) {
        __m512d x = load8(q, r * n + j, wide, n - j < 8 ? (int)(n - j) : 8);
        v1 = _mm512_add_pd(v1, x), v2 = _mm512_fmadd_pd(x, x, v2);
    }
    double x1 = _mm512_reduce_add_pd(v1) * ldexp(1.0, in_shift);
    double x2 = _mm512_reduce_add_pd(v2) * ldexp(1.0, 2 * in_shift);
    double mean = round_mode(x1 / (double)n, half_even);
    double ssd = x2 - x1 * mean * 2.0 + mean * mean * (double)n;
    double v = round_mode(ssd * ldexp(1.0, guard) / (double)n, half_even) + eps;
    int e;
    frexp(v, &e);
    int k = (e - 14) >> 1;
    double vn = round_mode(v * ldexp(1.0, -2 * k), half_even);
    vn = vn < 0 ? 0 : vn > 32767 ? 32767 : vn;
    double c = rsqrt[(int64_t)vn - rsqrt_qmin] * ldexp(1.0, frac - 17 - k);
    __m512d cs = _mm512_set1_pd(c * ldexp(1.0, in_shift)), mc = _mm512_set1_pd(mean * c);
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
        bad |= ln_row(q, (int)wide, r, n, (int)in_shift, (int)guard, eps, (int)half_even, rsqrt,
                      rsqrt_qmin, (int)frac, w, b, y_top, vlo, vhi, out, (int)out_shift);
    return bad;
}
