/* The executor's compiled LayerNorm (simulator/kernels/exec_native_norm.py proves the bounds and
 * calls it): exec_dense.int_layernorm, row by row, operation for operation in float64.
 *
 * Per row of n < 2**10 values q (int8 or int16), s = in_shift:
 *   X1 = sum(q) 2^s, X2 = sum(q^2) 4^s (exact integers), mean = round(X1 / n),
 *   ssd = X2 - 2 X1 mean + n mean^2, v = round(ssd 2^G / n) + eps,
 *   k = (e - 14) >> 1 (e: frexp's exponent of v), vn = clamp(round(v 2^-2k), 0, 32767),
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

typedef struct {
    const void *q;
    int wide, half_even, frac, out_shift;
    int64_t n, rsqrt_qmin;
    double p_in, p_in2, p_guard, eps, y_top; /* p_in = 2^s, p_in2 = 4^s, p_guard = 2^G */
    const double *rsqrt, *w, *b;
    __m512d lo, hi;
    void *out;
} ln_t;

/* The row sums of rows r0 .. r0+7 (fewer at the end: nr) as float64: X1 = sum(q) 2^s,
 * X2 = sum(q^2) 4^s, exact (< 2^41). */
TGT AI void ln_sums8(const ln_t *t, int64_t r0, int nr, __m512d *X1, __m512d *X2) {
    double x1[8] = {0}, x2[8] = {0};
    for (int i = 0; i < nr; i++) {
        __m512d v1 = _mm512_setzero_pd(), v2 = v1;
        for (int64_t j = 0; j < t->n; j += 8) {
            __m512d x = load8(t->q, (r0 + i) * t->n + j, t->wide, t->n - j < 8 ? (int)(t->n - j) : 8);
            v1 = _mm512_add_pd(v1, x), v2 = _mm512_fmadd_pd(x, x, v2);
        }
        x1[i] = _mm512_reduce_add_pd(v1) * t->p_in, x2[i] = _mm512_reduce_add_pd(v2) * t->p_in2;
    }
    *X1 = _mm512_loadu_pd(x1), *X2 = _mm512_loadu_pd(x2);
}

/* The combine of tree16: int32 sum, int32 max, or float32 sum (of exact integers). */
enum { T_ADD, T_MAX, T_ADD_PS };
TGT AI __m512i combine(__m512i a, __m512i b, int kind) {
    return kind == T_ADD   ? _mm512_add_epi32(a, b)
           : kind == T_MAX ? _mm512_max_epi32(a, b)
                           : _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b)));
}

/* Sixteen vectors' lanes combined as one vector: lane 4k + i holds the combine of v[4k + i]'s
 * sixteen lanes. Four steps of pairwise merges (32-bit, 64-bit, then 128-bit lanes twice):
 * 45 operations where sixteen horizontal reductions take about 100. (Float32 sums are exact
 * here: integers whose every partial sum stays below 2^24, so the order does not matter.) */
TGT AI __m512i tree16(const __m512i v[16], int kind) {
    __m512i u[8], w[4], x[2];
    for (int i = 0; i < 8; i++)
        u[i] = combine(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                       _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]), kind);
    for (int i = 0; i < 4; i++)
        w[i] = combine(_mm512_unpacklo_epi64(u[2 * i], u[2 * i + 1]),
                       _mm512_unpackhi_epi64(u[2 * i], u[2 * i + 1]), kind);
    for (int i = 0; i < 2; i++)
        x[i] = combine(_mm512_shuffle_i32x4(w[2 * i], w[2 * i + 1], 0x88),
                       _mm512_shuffle_i32x4(w[2 * i], w[2 * i + 1], 0xDD), kind);
    return combine(_mm512_shuffle_i32x4(x[0], x[1], 0x88), _mm512_shuffle_i32x4(x[0], x[1], 0xDD), kind);
}

#ifdef QPARITY_SIMDE
#include "qnorm_avx2.h" /* its ln_sums16_i8, ln_stats8 and ln_out_row */
#else
/* The row sums of rows r0 .. r0+15 (nr of them) of int8 q, in int32: 32 values a step as
 * int16 pairs (VPMADDWD with 1 and with q), exact since n 2^14 < 2^31; lanes 0-7 and 8-15
 * of the result as float64, times 2^s and 4^s (the same values ln_sums8 sums in float64). */
TGT AI void ln_sums16_i8(const ln_t *t, int64_t r0, int nr, __m512d X1[2], __m512d X2[2]) {
    __m512i s1[16], s2[16], ones = _mm512_set1_epi16(1);
    for (int i = 0; i < 16; i++) {
        s1[i] = s2[i] = _mm512_setzero_si512();
        for (int64_t j = 0; i < nr && j < t->n; j += 32) {
            __mmask32 m = t->n - j >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << (t->n - j)) - 1);
            __m512i x = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, (const int8_t *)t->q + (r0 + i) * t->n + j));
            s1[i] = _mm512_add_epi32(s1[i], _mm512_madd_epi16(x, ones));
            s2[i] = _mm512_add_epi32(s2[i], _mm512_madd_epi16(x, x));
        }
    }
    __m512i a = tree16(s1, T_ADD), b = tree16(s2, T_ADD);
    __m512d p1 = _mm512_set1_pd(t->p_in), p2 = _mm512_set1_pd(t->p_in2);
    X1[0] = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(a)), p1);
    X1[1] = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(a, 1)), p1);
    X2[0] = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(b)), p2);
    X2[1] = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(b, 1)), p2);
}

/* The statistics of eight rows from their sums X1, X2 (nr valid lanes), the scalar steps
 * done 8 rows per vector in the same float64 operations: mean, v, k (frexp's exponent from
 * getexp: e = floor(log2 v) + 1, 0 for v = 0), vn, the rsqrt lookup (a gather) and c; 2^x
 * factors by scalef (exact). Out: cs = c 2^s, mc = mean c. */
TGT AI void ln_stats8(const ln_t *t, __m512d X1, __m512d X2, int nr, double *cs, double *mc) {
    __m512d N = _mm512_set1_pd((double)t->n);
    __m512d mean = round_pd(_mm512_div_pd(X1, N), t->half_even);
    __m512d ssd = _mm512_add_pd(_mm512_sub_pd(X2, _mm512_mul_pd(_mm512_mul_pd(X1, mean), _mm512_set1_pd(2.0))),
                                _mm512_mul_pd(_mm512_mul_pd(mean, mean), N));
    __m512d v = _mm512_add_pd(round_pd(_mm512_div_pd(_mm512_mul_pd(ssd, _mm512_set1_pd(t->p_guard)), N),
                                       t->half_even), _mm512_set1_pd(t->eps));
    __mmask8 nz = _mm512_cmp_pd_mask(v, _mm512_setzero_pd(), _CMP_NEQ_OQ);
    __m512d e = _mm512_maskz_add_pd(nz, _mm512_getexp_pd(v), _mm512_set1_pd(1.0));
    __m512d k = _mm512_floor_pd(_mm512_mul_pd(_mm512_sub_pd(e, _mm512_set1_pd(14.0)), _mm512_set1_pd(0.5)));
    __m512d vn = round_pd(_mm512_scalef_pd(v, _mm512_mul_pd(k, _mm512_set1_pd(-2.0))), t->half_even);
    vn = _mm512_min_pd(_mm512_max_pd(vn, _mm512_setzero_pd()), _mm512_set1_pd(32767.0));
    __m512i idx = _mm512_sub_epi64(_mm512_cvttpd_epi64(vn), _mm512_set1_epi64(t->rsqrt_qmin));
    __m512d c = _mm512_mask_i64gather_pd(_mm512_setzero_pd(), (__mmask8)((1u << nr) - 1), idx,
                                         t->rsqrt, 8);
    c = _mm512_scalef_pd(c, _mm512_sub_pd(_mm512_set1_pd((double)(t->frac - 17)), k));
    _mm512_storeu_pd(cs, _mm512_mul_pd(c, _mm512_set1_pd(t->p_in)));
    _mm512_storeu_pd(mc, _mm512_mul_pd(mean, c));
}

/* The normalized, affine, clamped outputs of row r, 8 at a time; 1 when some |y| passes
 * y_top. wide, half_even and out_shift come in as constants (qp_layernorm's dispatch), so
 * the loop has no dtype branches, and the fields are read once into registers. */
TGT AI int ln_out_row(const ln_t *t, int64_t r, double cs1, double mc1, int wide, int half_even,
                      int out_shift) {
    __m512d cs = _mm512_set1_pd(cs1), mc = _mm512_set1_pd(mc1), top = _mm512_set1_pd(t->y_top);
    __m512d lo = t->lo, hi = t->hi;
    const double *w = t->w, *b = t->b;
    const void *q = t->q;
    void *out = t->out;
    int64_t n = t->n, base = r * n;
    __mmask8 bad = 0;
    for (int64_t j = 0; j < n; j += 8) {
        int m = n - j < 8 ? (int)(n - j) : 8;
        __mmask8 mk = (__mmask8)((1u << m) - 1);
        __m512d y = round_pd(_mm512_sub_pd(_mm512_mul_pd(load8(q, base + j, wide, m), cs), mc), half_even);
        bad |= _mm512_mask_cmp_pd_mask(mk, _mm512_abs_pd(y), top, _CMP_GT_OQ);
        __m512d o = _mm512_fmadd_pd(y, _mm512_maskz_loadu_pd(mk, w + j), _mm512_maskz_loadu_pd(mk, b + j));
        finish8(o, half_even, lo, hi, out, base + j, out_shift, m);
    }
    return bad != 0;
}

#endif /* QPARITY_SIMDE */

/* Rows r0 .. r0+15 (nr of them): statistics, then outputs; the dtypes and rounding as
 * constants (see ln_out_row). */
TGT AI int ln_block(const ln_t *t, int64_t r0, int nr, int wide, int half_even, int out_shift) {
    double cs[16], mc[16];
    __m512d X1[2], X2[2];
    int bad = 0;
    if (wide == 0) ln_sums16_i8(t, r0, nr, X1, X2);
    else for (int h = 0; h < 2; h++) ln_sums8(t, r0 + 8 * h, nr - 8 * h, X1 + h, X2 + h);
    for (int h = 0; h * 8 < nr; h++) ln_stats8(t, X1[h], X2[h], nr - 8 * h < 8 ? nr - 8 * h : 8, cs + 8 * h, mc + 8 * h);
    for (int i = 0; i < nr; i++) bad |= ln_out_row(t, r0 + i, cs[i], mc[i], wide, half_even, out_shift);
    return bad;
}

/* ln_block with (wide, half_even, out_shift) as constants: one copy of the loop per case. */
TGT static int ln_block_case(const ln_t *t, int64_t r0, int nr) {
#define LN_CASE(w, h, o) \
    if (t->wide == w && t->half_even == h && t->out_shift == o) return ln_block(t, r0, nr, w, h, o)
    LN_CASE(0, 1, 0); LN_CASE(0, 1, 1); LN_CASE(0, 0, 0); LN_CASE(0, 0, 1);
    LN_CASE(1, 1, 0); LN_CASE(1, 1, 1); LN_CASE(1, 0, 0); LN_CASE(1, 0, 1);
#undef LN_CASE
    return ln_block(t, r0, nr, t->wide, t->half_even, t->out_shift);
}

typedef struct {
    const ln_t *t;
    int64_t rows;
    _Atomic int bad;
} ln_job_t;

/* Blocks g0 .. g1 of 16 rows. */
TGT static void ln_part(void *p, int64_t g0, int64_t g1) {
    ln_job_t *j = p;
    int bad = 0;
    for (int64_t r0 = 16 * g0; r0 < j->rows && r0 < 16 * g1; r0 += 16)
        bad |= ln_block_case(j->t, r0, j->rows - r0 < 16 ? (int)(j->rows - r0) : 16);
    if (bad) atomic_store(&j->bad, 1);
}

TGT int qp_layernorm(const void *q, int64_t wide, int64_t rows, int64_t n, int64_t in_shift,
                 int64_t guard, double eps, int64_t half_even, const double *rsqrt,
                 int64_t rsqrt_qmin, int64_t frac, const double *w, const double *b,
                 double y_top, double lo, double hi, void *out, int64_t out_shift) {
    ln_t t = {q, (int)wide, (int)half_even, (int)frac, (int)out_shift, n, rsqrt_qmin,
              pow2i((int)in_shift), pow2i(2 * (int)in_shift), pow2i((int)guard), eps, y_top,
              rsqrt, w, b, _mm512_set1_pd(lo), _mm512_set1_pd(hi), out};
    ln_job_t j = {&t, rows, 0};
    qp_for((rows + 15) / 16, 16 * n, ln_part, &j);
    return atomic_load(&j.bad);
}

/* SOFTMAX along the last axis: exec_dense.int_softmax row by row, in the same float ops.
 *   g = max(q) - q, e = exp[g] (float32 integers < 2^15), s = sum(e) (exact in float64),
 *   r_in = min(round(s * 2^-sum_shift), 32767), c = recip[r_in - recip_qmin] * mult,
 *   y = clamp(round(e * c), lo, hi)
 * with mult = out_mult * 2^-out_shift as the caller computes it; q int8 or int16 (every gap
 * is inside the exp table), 16 lanes at a time. */
#define SOFTMAX_KEEP 256 /* rows up to this long keep their exps between the two passes */

TGT AI void softmax_row(const void *q, int wide, int64_t r, int64_t n, const float *exp,
                        const double *recip, int64_t recip_qmin, double sum_scale, double mult,
                        int half_even, __m512d lo, __m512d hi, void *out, int out_shift) {
    int64_t base = r * n;
    __m512i top = _mm512_set1_epi32(INT32_MIN);
    for (int64_t j = 0; j < n; j += 16)
        top = _mm512_mask_max_epi32(top, mask16(n - j), top, load16(q, base + j, wide, mask16(n - j)));
    __m512i vmax = _mm512_set1_epi32(_mm512_reduce_max_epi32(top));
    __m512d sum = _mm512_setzero_pd();
    float kept[SOFTMAX_KEEP]; /* the row's exps, gathered once when the row fits */
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        __m512i g = _mm512_sub_epi32(vmax, load16(q, base + j, wide, m));
        __m512 e = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, g, exp, 4);
        if (n <= SOFTMAX_KEEP) _mm512_storeu_ps(kept + j, e);
        sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    double r_in = round_mode(_mm512_reduce_add_pd(sum) * sum_scale, half_even);
    r_in = r_in > 32767 ? 32767 : r_in;
    __m512d c = _mm512_set1_pd(recip[(int64_t)r_in - recip_qmin] * mult);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        __m512 e;
        if (n <= SOFTMAX_KEEP) e = _mm512_loadu_ps(kept + j);
        else e = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m,
                                          _mm512_sub_epi32(vmax, load16(q, base + j, wide, m)), exp, 4);
        int k = n - j < 16 ? (int)(n - j) : 16;
        finish8(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(e)), c), half_even, lo, hi,
                out, base + j, out_shift, k < 8 ? k : 8);
        if (k > 8)
            finish8(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)), c), half_even,
                    lo, hi, out, base + j + 8, out_shift, k - 8);
    }
}

#ifdef QPARITY_SIMDE
#include "qsoftmax_avx2.h" /* its softmax16 */
#else
/* The same steps for rows r0 .. r0+15 (nr of them) of n <= 16 values, one vector a row: the
 * row maxima and the exp sums (float32 integers < 2^15, n of them: exact) of all sixteen rows
 * by tree16, then r_in, the recip lookup and c for eight rows per float64 vector. */
TGT AI void softmax16(const void *q, int wide, int64_t r0, int nr, int64_t n, const float *exp,
                      const double *recip, int64_t recip_qmin, double sum_scale, double mult,
                      int half_even, __m512d lo, __m512d hi, void *out, int out_shift) {
    __m512i x[16], e[16], floor = _mm512_set1_epi32(INT32_MIN);
    __mmask16 m = mask16(n);
    for (int i = 0; i < 16; i++)
        x[i] = i < nr ? _mm512_mask_mov_epi32(floor, m, load16(q, (r0 + i) * n, wide, m)) : floor;
    __m512i top = tree16(x, T_MAX);
    for (int i = 0; i < 16; i++) {
        __m512i g = _mm512_sub_epi32(_mm512_permutexvar_epi32(_mm512_set1_epi32(i), top), x[i]);
        e[i] = _mm512_castps_si512(_mm512_mask_i32gather_ps(_mm512_setzero_ps(), i < nr ? m : 0, g, exp, 4));
    }
    __m512 sum = _mm512_castsi512_ps(tree16(e, T_ADD_PS));
    __m512d c[2], rmax = _mm512_set1_pd(32767.0), mv = _mm512_set1_pd(mult);
    for (int h = 0; h < 2; h++) {
        __m512d s = _mm512_cvtps_pd(h ? _mm512_extractf32x8_ps(sum, 1) : _mm512_castps512_ps256(sum));
        __m512d r_in = _mm512_min_pd(round_pd(_mm512_mul_pd(s, _mm512_set1_pd(sum_scale)), half_even), rmax);
        __m512i idx = _mm512_sub_epi64(_mm512_cvttpd_epi64(r_in), _mm512_set1_epi64(recip_qmin));
        c[h] = _mm512_mul_pd(_mm512_i64gather_pd(idx, recip, 8), mv);
    }
    int k = (int)n, k1 = k < 8 ? k : 8;
    for (int i = 0; i < nr; i++) {
        __m512d ci = _mm512_permutexvar_pd(_mm512_set1_epi64(i & 7), c[i >> 3]);
        __m512 ei = _mm512_castsi512_ps(e[i]);
        finish8(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(ei)), ci), half_even, lo, hi,
                out, (r0 + i) * n, out_shift, k1);
        if (k > 8)
            finish8(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(ei, 1)), ci), half_even,
                    lo, hi, out, (r0 + i) * n + 8, out_shift, k - 8);
    }
}

#endif

typedef struct {
    const void *q;
    int wide, half_even, out_shift;
    int64_t rows, n, recip_qmin;
    const float *exp;
    const double *recip;
    double sum_scale, mult, lo, hi;
    void *out;
} sm_t;

/* Blocks g0 .. g1 of 16 rows of n <= 16 values. */
TGT static void softmax16_part(void *p, int64_t g0, int64_t g1) {
    const sm_t *t = p;
    __m512d vlo = _mm512_set1_pd(t->lo), vhi = _mm512_set1_pd(t->hi);
    for (int64_t r0 = 16 * g0; r0 < t->rows && r0 < 16 * g1; r0 += 16)
        softmax16(t->q, t->wide, r0, t->rows - r0 < 16 ? (int)(t->rows - r0) : 16, t->n, t->exp,
                  t->recip, t->recip_qmin, t->sum_scale, t->mult, t->half_even, vlo, vhi, t->out,
                  t->out_shift);
}

/* Rows r0 .. r1. */
TGT static void softmax_part(void *p, int64_t r0, int64_t r1) {
    const sm_t *t = p;
    __m512d vlo = _mm512_set1_pd(t->lo), vhi = _mm512_set1_pd(t->hi);
    for (int64_t r = r0; r < r1; r++)
        softmax_row(t->q, t->wide, r, t->n, t->exp, t->recip, t->recip_qmin, t->sum_scale,
                    t->mult, t->half_even, vlo, vhi, t->out, t->out_shift);
}

TGT void qp_softmax(const void *q, int64_t wide, int64_t rows, int64_t n, const float *exp,
                    const double *recip, int64_t recip_qmin, double sum_scale, double mult,
                    int64_t half_even, double lo, double hi, void *out, int64_t out_shift) {
    sm_t t = {q, (int)wide, (int)half_even, (int)out_shift, rows, n, recip_qmin, exp, recip,
              sum_scale, mult, lo, hi, out};
    if (n <= 16) qp_for((rows + 15) / 16, 16 * n, softmax16_part, &t);
    else qp_for(rows, n, softmax_part, &t);
}
