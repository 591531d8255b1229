/* The executor's compiled row kernels (simulator/kernels/exec_native_rows.py proves the bounds and
 * calls them): REDUCE_MEAN over adjacent axes, QMul, QAdd and the LUT gather, requantize
 * fused. QUANTIZE and DEQUANTIZE are in qquant.c.
 *
 * They evaluate the float64 formulas of the torch path, operation for operation, on
 * values the caller proved exact, so they give the same integers:
 *   mean: y[r] = clamp(round(fl(sum_i x[r, i] * m) / d), lo, hi)      (round_quotient)
 *   mul:  y[k] = clamp(round(a[k] * b[k'] * scale), lo, hi)          (scaled epilogue)
 *   add:  y[k] = clamp(round(a[k] * sa[c] + b[k'] * sb[c]), lo, hi)  (add epilogue)
 * with d = n * 2**shift, scale = mult * 2**-shift, b[k'] = b[k] (same shape) or b[r] for
 * every element of row r (a per-row operand, e.g. [N, C, 1, 1] against [N, C, H, W]).
 * round: half_even = roundeven; bpu_round = sign(y) * floor(|y| + 0.5). lo already holds
 * relu. Inputs int8 or int16 (wide; QAdd also int32), outputs int8 / int16 / int32
 * (1 << out_shift bytes). Batched QMatMul is in qbmm.c.
 */
#include "qsimd.h"

/* sum of x[start .. start+inner) (int8 or int16), 16 lanes at a time in int32, folded
 * into int64 every 2**19 elements (2**15 per lane: |lane sum| <= 2**30). */
TGT AI int64_t row_sum(const void *x, int64_t start, int64_t inner, int wide) {
    int64_t total = 0;
    for (int64_t c0 = start; c0 < start + inner; c0 += 1 << 19) {
        int64_t c1 = c0 + (1 << 19) < start + inner ? c0 + (1 << 19) : start + inner;
        __m512i acc = _mm512_setzero_si512();
        for (int64_t i = c0; i < c1; i += 16)
            acc = _mm512_add_epi32(acc, load16(x, i, wide, mask16(c1 - i)));
        total += _mm512_reduce_add_epi32(acc);
    }
    return total;
}

/* The arguments of qp_mean / qp_mean_cl / qp_mul / qp_mul_cl, for their loops' parts. */
typedef struct {
    const void *x, *b;
    int wx, wb, per_row, half_even, out_shift;
    int64_t rows, inner, c, pix, img;
    double m, d, lo, hi;
    void *out;
} rows_t;

/* Rows 8 * g0 .. 8 * g1 of qp_mean. */
TGT static void mean_part(void *p, int64_t g0, int64_t g1) {
    const rows_t *t = p;
    __m512d vm = _mm512_set1_pd(t->m), vd = _mm512_set1_pd(t->d);
    __m512d vlo = _mm512_set1_pd(t->lo), vhi = _mm512_set1_pd(t->hi);
    for (int64_t r0 = 8 * g0; r0 < t->rows && r0 < 8 * g1; r0 += 8) {
        int n = t->rows - r0 < 8 ? (int)(t->rows - r0) : 8;
        double s[8] = {0};
        for (int k = 0; k < n; k++) s[k] = (double)row_sum(t->x, (r0 + k) * t->inner, t->inner, t->wx);
        __m512d y = _mm512_div_pd(_mm512_mul_pd(_mm512_loadu_pd(s), vm), vd);
        finish8(y, t->half_even, vlo, vhi, t->out, r0, t->out_shift, n);
    }
}

TGT void qp_mean(const void *x, int64_t wide, int64_t rows, int64_t inner, double m, double d,
                 double lo, double hi, int64_t half_even, void *out, int64_t out_shift) {
    rows_t t = {.x = x, .wx = (int)wide, .rows = rows, .inner = inner, .m = m, .d = d, .lo = lo,
                .hi = hi, .half_even = (int)half_even, .out = out, .out_shift = (int)out_shift};
    qp_for((rows + 7) / 8, 8 * inner, mean_part, &t);
}

/* Elements [i0, i1) of a row; b one value for the row (per_row) or elementwise. */
TGT AI void mul_span(const void *a, int wa, const void *b, int wb, int64_t i0, int64_t i1,
                     int per_row, __m512d br, __m512d scale, int half_even, __m512d lo,
                     __m512d hi, void *out, int out_shift) {
    for (int64_t i = i0; i < i1; i += 8) {
        int n = i1 - i < 8 ? (int)(i1 - i) : 8;
        __m512d y = per_row ? _mm512_mul_pd(load8(a, i, wa, n), br)
                            : _mm512_mul_pd(_mm512_mul_pd(load8(a, i, wa, n), load8(b, i, wb, n)), scale);
        finish8(y, half_even, lo, hi, out, i, out_shift, n);
    }
}

/* Rows r0 .. r1 of qp_mul (m: the scale). */
TGT static void mul_part(void *p, int64_t r0, int64_t r1) {
    const rows_t *t = p;
    __m512d vs = _mm512_set1_pd(t->m), vlo = _mm512_set1_pd(t->lo), vhi = _mm512_set1_pd(t->hi);
    const void *a = t->x, *b = t->b;
    for (int64_t r = r0; r < r1; r++) {
        double bv = !t->per_row ? 0.0 : t->wb ? ((const int16_t *)b)[r] : ((const int8_t *)b)[r];
        __m512d br = _mm512_set1_pd(bv * t->m); /* b * m * 2**-s: exact */
        int64_t i0 = r * t->inner, i1 = i0 + t->inner;
        if (!t->wx && !t->out_shift && t->per_row && t->half_even)
            mul_span(a, 0, b, 0, i0, i1, 1, br, vs, 1, vlo, vhi, t->out, 0);
        else
            mul_span(a, t->wx, b, t->wb, i0, i1, t->per_row, br, vs, t->half_even, vlo, vhi,
                     t->out, t->out_shift);
    }
}

TGT void qp_mul(const void *a, int64_t wa, const void *b, int64_t wb, int64_t rows,
                int64_t inner, int64_t per_row, double scale, double lo, double hi,
                int64_t half_even, void *out, int64_t out_shift) {
    rows_t t = {.x = a, .wx = (int)wa, .b = b, .wb = (int)wb, .rows = rows, .inner = inner,
                .per_row = (int)per_row, .m = scale, .lo = lo, .hi = hi,
                .half_even = (int)half_even, .out = out, .out_shift = (int)out_shift};
    qp_for(rows, inner, mul_part, &t);
}

/* Channels-last forms: x[n, i, c] at n * img + i * pix + c (c contiguous), C channels.
 * mean: out[n, c] = the row formula over i; mul: out[n, i, c] (contiguous) = a[n, i, c] *
 * b[n, c] * scale. Sums stay exact in float64 (integers below 2**53). */
TGT static void mean_cl_part(void *p, int64_t r0, int64_t r1) {
    const rows_t *t = p;
    __m512d vm = _mm512_set1_pd(t->m), vd = _mm512_set1_pd(t->d);
    __m512d vlo = _mm512_set1_pd(t->lo), vhi = _mm512_set1_pd(t->hi);
    int64_t c = t->c;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c0 = 0; c0 < c; c0 += 8) {
            int k = c - c0 < 8 ? (int)(c - c0) : 8;
            __m512d sum = _mm512_setzero_pd();
            for (int64_t i = 0; i < t->inner; i++)
                sum = _mm512_add_pd(sum, load8(t->x, r * t->img + i * t->pix + c0, t->wx, k));
            __m512d y = _mm512_div_pd(_mm512_mul_pd(sum, vm), vd);
            finish8(y, t->half_even, vlo, vhi, t->out, r * c + c0, t->out_shift, k);
        }
}

TGT void qp_mean_cl(const void *x, int64_t wide, int64_t n, int64_t inner, int64_t c,
                    int64_t pix, int64_t img, double m, double d, double lo, double hi,
                    int64_t half_even, void *out, int64_t out_shift) {
    rows_t t = {.x = x, .wx = (int)wide, .inner = inner, .c = c, .pix = pix, .img = img, .m = m,
                .d = d, .lo = lo, .hi = hi, .half_even = (int)half_even, .out = out,
                .out_shift = (int)out_shift};
    qp_for(n, inner * c, mean_cl_part, &t);
}

TGT static void mul_cl_part(void *p, int64_t r0, int64_t r1) {
    const rows_t *t = p;
    __m512d vs = _mm512_set1_pd(t->m), vlo = _mm512_set1_pd(t->lo), vhi = _mm512_set1_pd(t->hi);
    int64_t c = t->c;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c0 = 0; c0 < c; c0 += 8) {
            int k = c - c0 < 8 ? (int)(c - c0) : 8;
            __m512d br = _mm512_mul_pd(load8(t->b, r * c + c0, t->wb, k), vs);
            for (int64_t i = 0; i < t->inner; i++) {
                __m512d y = _mm512_mul_pd(load8(t->x, r * t->img + i * t->pix + c0, t->wx, k), br);
                finish8(y, t->half_even, vlo, vhi, t->out, (r * t->inner + i) * c + c0,
                        t->out_shift, k);
            }
        }
}

TGT void qp_mul_cl(const void *a, int64_t wa, const void *b, int64_t wb, int64_t n,
                   int64_t inner, int64_t c, int64_t pix, int64_t img, double scale, double lo,
                   double hi, int64_t half_even, void *out, int64_t out_shift) {
    rows_t t = {.x = a, .wx = (int)wa, .b = b, .wb = (int)wb, .inner = inner, .c = c,
                .pix = pix, .img = img, .m = scale, .lo = lo, .hi = hi,
                .half_even = (int)half_even, .out = out, .out_shift = (int)out_shift};
    qp_for(n, inner * c, mul_cl_part, &t);
}

/* QAdd: y[r, c] = a[r, c] * sa[c] + b[(r * C + c) % period] * sb[c] (b repeats every
 * period elements: a constant broadcast over leading axes), C the last axis; ta, tb dtype
 * codes of load8. single: sa, sb are float32 and every step is exact in float32 (the caller's
 * proof), so sixteen lanes a vector instead of eight. The elements run as one flat range in
 * blocks (channel and b offsets stepped along), so short rows cost no per-row setup; a vector
 * never spans two rows when C is a multiple of its lanes, else the rows go one by one. */
typedef struct {
    const void *a, *b;
    int ta, tb, single, half_even, out_shift;
    int64_t c, period;
    const void *sa, *sb;
    double lo, hi;
    void *out;
    int64_t n, step;
} add_t;

/* Elements i0 .. i1 (multiples of the lanes L, or one whole row) of the flat range. */
TGT AI void add_pd(const add_t *t, int64_t i0, int64_t i1) {
    __m512d lo = _mm512_set1_pd(t->lo), hi = _mm512_set1_pd(t->hi);
    const double *sa = t->sa, *sb = t->sb;
    int64_t ch = i0 % t->c, bo = i0 % t->period;
    for (int64_t i = i0; i < i1; i += 8) {
        int k = i1 - i < 8 ? (int)(i1 - i) : 8;
        __mmask8 m = (__mmask8)((1u << k) - 1);
        __m512d y = _mm512_mul_pd(load8(t->a, i, t->ta, k), _mm512_maskz_loadu_pd(m, sa + ch));
        y = _mm512_fmadd_pd(load8(t->b, bo, t->tb, k), _mm512_maskz_loadu_pd(m, sb + ch), y);
        finish8(y, t->half_even, lo, hi, t->out, i, t->out_shift, k);
        ch = ch + 8 >= t->c ? 0 : ch + 8, bo = bo + 8 >= t->period ? 0 : bo + 8;
    }
}

TGT AI void add_ps(const add_t *t, int64_t i0, int64_t i1) {
    __m512 lo = _mm512_set1_ps((float)t->lo), hi = _mm512_set1_ps((float)t->hi);
    const float *sa = t->sa, *sb = t->sb;
    int64_t ch = i0 % t->c, bo = i0 % t->period;
    for (int64_t i = i0; i < i1; i += 16) {
        __mmask16 m = mask16(i1 - i);
        __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(load16(t->a, i, t->ta, m)),
                                 _mm512_maskz_loadu_ps(m, sa + ch));
        y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(load16(t->b, bo, t->tb, m)),
                            _mm512_maskz_loadu_ps(m, sb + ch), y);
        store16(to_int_ps(y, t->half_even, lo, hi), t->out, i, t->out_shift, m);
        ch = ch + 16 >= t->c ? 0 : ch + 16, bo = bo + 16 >= t->period ? 0 : bo + 16;
    }
}

/* Blocks g0 .. g1 of the flat range. */
TGT static void add_part(void *p, int64_t g0, int64_t g1) {
    const add_t *t = p;
    for (int64_t i0 = g0 * t->step; i0 < t->n && i0 < g1 * t->step; i0 += t->step) {
        int64_t i1 = i0 + t->step < t->n ? i0 + t->step : t->n;
        if (t->single) add_ps(t, i0, i1);
        else add_pd(t, i0, i1);
    }
}

TGT void qp_add(const void *a, int64_t ta, const void *b, int64_t tb, int64_t rows, int64_t c,
                int64_t period, const void *sa, const void *sb, int64_t single, double lo,
                double hi, int64_t half_even, void *out, int64_t out_shift) {
    add_t t = {a, b, (int)ta, (int)tb, (int)single, (int)half_even, (int)out_shift, c, period,
               sa, sb, lo, hi, out, rows * c, 0};
    int64_t lanes = single ? 16 : 8;
    t.step = c % lanes == 0 && period % lanes == 0 ? 4096 : c; /* a block: 4096 or a row */
    qp_for((t.n + t.step - 1) / t.step, t.step, add_part, &t);
}

/* Table lookup: y[i] = values[clamp(x[i], qmin, qmax) - qmin], x of dtype code tx (int8,
 * int16, int32), values and y of 1 << vshift bytes (int8, int16, int32). Sixteen at a time:
 * a gather of the aligned 4-byte word that holds each entry (words counted from the aligned
 * address `base` below the table, `lead` bytes before it), shifted down to the entry. The
 * entries are aligned to their size (the caller checks), so none straddles two words; an
 * aligned word never crosses a page, so the bytes read beside an entry cannot fault, and
 * only the entry's own bytes reach the output. */
TGT AI __m512i lut16(const void *x, int64_t i, int tx, __mmask16 m, __m512i lo, __m512i hi,
                     const void *base, __m512i lead, int vshift) {
    __m512i q = _mm512_sub_epi32(_mm512_min_epi32(_mm512_max_epi32(load16(x, i, tx, m), lo), hi), lo);
    __m512i byte = _mm512_add_epi32(_mm512_slli_epi32(q, vshift), lead);
    __m512i word = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m,
                                               _mm512_andnot_si512(_mm512_set1_epi32(3), byte), base, 1);
    return _mm512_srlv_epi32(word, _mm512_slli_epi32(_mm512_and_si512(byte, _mm512_set1_epi32(3)), 3));
}

typedef struct {
    const void *x, *values;
    int tx, vshift;
    int64_t n, qmin, qmax;
    void *out;
} gather_t;

/* Blocks of 4096 elements g0 .. g1. */
TGT static void gather_part(void *p, int64_t g0, int64_t g1) {
    const gather_t *t = p;
    __m512i lo = _mm512_set1_epi32((int32_t)t->qmin), hi = _mm512_set1_epi32((int32_t)t->qmax);
    const void *base = (const void *)((uintptr_t)t->values & ~(uintptr_t)3);
    __m512i lead = _mm512_set1_epi32((int32_t)((uintptr_t)t->values & 3));
    for (int64_t i0 = g0 * 4096; i0 < t->n && i0 < g1 * 4096; i0 += 4096) {
        int64_t i1 = i0 + 4096 < t->n ? i0 + 4096 : t->n;
        for (int64_t i = i0; i < i1; i += 16) {
            __mmask16 m = mask16(i1 - i);
            store16(lut16(t->x, i, t->tx, m, lo, hi, base, lead, t->vshift), t->out, i, t->vshift, m);
        }
    }
}

TGT void qp_gather(const void *x, int64_t tx, int64_t n, int64_t qmin, int64_t qmax,
                   const void *values, int64_t vshift, void *out) {
    gather_t t = {x, values, (int)tx, (int)vshift, n, qmin, qmax, out};
    qp_for((n + 4095) / 4096, 4096, gather_part, &t);
}
