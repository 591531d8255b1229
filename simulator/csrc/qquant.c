/* The executor's compiled QUANTIZE and DEQUANTIZE (simulator/kernels/exec_native_rows.py
 * proves the bounds and calls them; split from qrows.c, the row kernels):
 *   quantize:   y = clamp(round(x / s[c]), lo, hi), x float32 or float64
 *   dequantize: y = float32(q) * s[c]
 * in the float operations of the torch path, so they give the same integers and floats. */
#include <string.h>

#include "qsimd.h"

/* QUANTIZE of float input: y = clamp(round(x / s), lo, hi) in x's float type (float32, or
 * float64 when f64), s per channel of a [outer, C, inner] view (C = 1: one scale); round
 * half_even, or bpu_round as fixedpoint.round_half_away: t = trunc(q), t + sign(q) when
 * |q - t| >= 0.5 (exact: no |q| + 0.5). Returns 1 (and the caller discards the output)
 * when some q is not finite. */
#define NOT_FINITE 0x99 /* fpclass: QNaN | SNaN | +Inf | -Inf */

/* fixedpoint.round_half_away on any float: t = trunc(q), plus sign(q) when |q - t| >= 0.5
 * (q - t is exact; |q| + 0.5 would round for the float below 0.5 and large odd values). */
TGT AI __m512 away_ps(__m512 q) {
    __m512 t = _mm512_roundscale_ps(q, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(q, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    return _mm512_mask_add_ps(t, up, t, _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(q, _mm512_set1_ps(-0.0f))));
}

TGT AI __m512d away_pd(__m512d q) {
    __m512d t = _mm512_roundscale_pd(q, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask8 up = _mm512_cmp_pd_mask(_mm512_abs_pd(_mm512_sub_pd(q, t)), _mm512_set1_pd(0.5), _CMP_GE_OQ);
    return _mm512_mask_add_pd(t, up, t, _mm512_or_pd(_mm512_set1_pd(1.0), _mm512_and_pd(q, _mm512_set1_pd(-0.0))));
}

/* One vector of QUANTIZE: the floats of x under mask m (zero elsewhere) divided by vs,
 * rounded (half_even, or away from zero) and clamped to [lo, hi]: integral floats. The
 * lanes of m that are not finite after the division are set in *bad. */
TGT AI __m512 quant16_ps(const float *x, __mmask16 m, __m512 vs, int half_even, __m512 lo,
                         __m512 hi, __mmask16 *bad) {
    __m512 q = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x), vs);
    *bad |= _mm512_mask_fpclass_ps_mask(m, q, NOT_FINITE);
    __m512 r = half_even ? _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                         : away_ps(q);
    return _mm512_min_ps(_mm512_max_ps(r, lo), hi);
}

TGT AI int quant_ps(const float *x, int64_t i0, int64_t i1, float s, int half_even, float lo,
                    float hi, void *out, int out_shift) {
    __m512 vs = _mm512_set1_ps(s), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    __mmask16 bad = 0;
    for (int64_t i = i0; i < i1; i += 16) {
        __mmask16 m = mask16(i1 - i);
        __m512i v = _mm512_cvttps_epi32(quant16_ps(x + i, m, vs, half_even, vlo, vhi, &bad));
        if (out_shift == 0) _mm_mask_storeu_epi8((int8_t *)out + i, m, _mm512_cvtepi32_epi8(v));
        else _mm256_mask_storeu_epi16((int16_t *)out + i, m, _mm512_cvtepi32_epi16(v));
    }
    return bad != 0;
}

TGT AI int quant_pd(const double *x, int64_t i0, int64_t i1, double s, int half_even,
                    double lo, double hi, void *out, int out_shift) {
    __m512d vs = _mm512_set1_pd(s);
    __mmask8 bad = 0;
    for (int64_t i = i0; i < i1; i += 8) {
        int n = i1 - i >= 8 ? 8 : (int)(i1 - i);
        __mmask8 m = (__mmask8)((1u << n) - 1);
        __m512d q = _mm512_div_pd(_mm512_maskz_loadu_pd(m, x + i), vs), r;
        bad |= _mm512_mask_fpclass_pd_mask(m, q, NOT_FINITE);
        r = half_even ? _mm512_roundscale_pd(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                      : away_pd(q);
        finish8(r, 1, _mm512_set1_pd(lo), _mm512_set1_pd(hi), out, i, out_shift, n);
    }
    return bad != 0;
}

typedef struct {
    const void *x;
    const double *scale;
    int f64, half_even, out_shift;
    int64_t c, inner, per, len;
    double lo, hi;
    void *out;
    _Atomic int bad;
} quant_t;

/* Tasks t0 .. t1: task t is part t % per of row t / per. */
TGT static void quant_part(void *p, int64_t t0, int64_t t1) {
    quant_t *q = p;
    int bad = 0;
    for (int64_t t = t0; t < t1; t++) {
        int64_t r = t / q->per, k = r % q->c, s0 = t % q->per * q->len, inner = q->inner;
        int64_t i0 = r * inner + s0, i1 = r * inner + (s0 + q->len < inner ? s0 + q->len : inner);
        bad |= q->f64 ? quant_pd((const double *)q->x, i0, i1, q->scale[k], q->half_even, q->lo,
                                 q->hi, q->out, q->out_shift)
                      : quant_ps((const float *)q->x, i0, i1, (float)q->scale[k], q->half_even,
                                 (float)q->lo, (float)q->hi, q->out, q->out_shift);
    }
    if (bad) atomic_store(&q->bad, 1);
}

TGT int qp_quantize(const void *x, int64_t f64, int64_t outer, int64_t c, int64_t inner,
                    const double *scale, int64_t half_even, double lo, double hi, void *out,
                    int64_t out_shift) {
    /* tasks of up to 8192 values of one channel: a batch-1 image splits across threads too */
    int64_t per = inner > 8192 ? (inner + 8191) / 8192 : 1, len = (inner + per - 1) / per;
    quant_t q = {x, scale, (int)f64, (int)half_even, (int)out_shift, c, inner, per, len, lo, hi,
                 out, 0};
    qp_for(outer * c * per, len, quant_part, &q);
    return atomic_load(&q.bad);
}

/* QUANTIZE, LAYOUT ToNHWC and a stem conv's qp_pad (qconv.c) in one pass, for a frozen
 * plan that makes those three calls in a row (simulator/runtime/fuse.py): x [N, C, H, W]
 * float32 -> xs [N, Hp, Wp, C] bytes (C <= 3: an RGB stem's row runs, qp_pad's Cs = C),
 * xs = y ^ xor where y = clamp(round(x / s), lo, hi) as qp_quantize computes it (s per
 * channel, or one) and xor (qp_pad_offset) where the pad puts zeros (Hp = H + pt + pb,
 * Wp = W + pl + pr). Returns 1 (the caller discards the output) when some x / s is not
 * finite, as qp_quantize does. */
typedef struct {
    const float *x;
    const double *scale;
    int64_t c, h, w, per_channel, half_even, pt, pl, pr, hp, wp, xor;
    double lo, hi;
    uint8_t *xs;
    _Atomic int bad;
} qpad_t;

/* Pixels j .. j+15 (those below w) of row hi of image ni: each channel's 16 values
 * quantized, one pixel's C bytes gathered into a dword, the dwords of each 128-bit lane
 * packed to C bytes a pixel, the lanes joined (a dword compress) and stored at dst. */
TGT static __mmask16 qpad_pixels(const qpad_t *a, int64_t ni, int64_t hi, int64_t j, uint8_t *dst) {
    static const int8_t pack[3][16] = {
        {0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
        {0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1},
        {0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1}};
    static const __mmask16 lanes[3] = {0x1111, 0x3333, 0x7777};
    int64_t c = a->c, left = a->w - j;
    __mmask16 m = mask16(left), bad = 0;
    __m512 lo = _mm512_set1_ps((float)a->lo), hi_v = _mm512_set1_ps((float)a->hi);
    __m512i v = _mm512_setzero_si512(), byte = _mm512_set1_epi32(0xff);
    for (int64_t ch = 0; ch < c; ch++) {
        __m512 vs = _mm512_set1_ps((float)a->scale[a->per_channel ? ch : 0]);
        const float *src = a->x + ((ni * c + ch) * a->h + hi) * a->w + j;
        __m512i q = _mm512_cvttps_epi32(quant16_ps(src, m, vs, (int)a->half_even, lo, hi_v, &bad));
        v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_and_si512(q, byte), (unsigned)(8 * ch)));
    }
    v = _mm512_xor_si512(v, _mm512_set1_epi8((char)a->xor));
    __m512i ctl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)pack[c - 1]));
    v = _mm512_maskz_compress_epi32(lanes[c - 1], _mm512_shuffle_epi8(v, ctl));
    int64_t px = left < 16 ? left : 16;
    _mm512_mask_storeu_epi8(dst, (((__mmask64)1 << (px * c)) - 1), v);
    return bad;
}

/* Padded rows r0 .. r1 of all images. */
TGT static void qpad_rows(void *p, int64_t r0, int64_t r1) {
    qpad_t *a = p;
    int64_t c = a->c, w = a->w;
    __mmask16 bad = 0;
    for (int64_t r = r0; r < r1; r++) {
        int64_t ni = r / a->hp, hi = r % a->hp - a->pt;
        uint8_t *dst = a->xs + r * a->wp * c;
        if (hi < 0 || hi >= a->h) {
            memset(dst, (int)a->xor, a->wp * c);
            continue;
        }
        memset(dst, (int)a->xor, a->pl * c);
        memset(dst + (a->pl + w) * c, (int)a->xor, a->pr * c);
        for (int64_t j = 0; j < w; j += 16) bad |= qpad_pixels(a, ni, hi, j, dst + (a->pl + j) * c);
    }
    if (bad) atomic_store(&a->bad, 1);
}

TGT int qp_quantize_pad(const float *x, int64_t n, int64_t c, int64_t h, int64_t w,
                        const double *scale, int64_t per_channel, int64_t half_even, double lo,
                        double hi, int64_t pt, int64_t pb, int64_t pl, int64_t pr, int64_t xor,
                        void *xs) {
    if (c < 1 || c > 3) return 1; /* fuse.py joins only row-run stems: never here */
    int64_t hp = h + pt + pb, wp = w + pl + pr;
    qpad_t a = {x, scale, c, h, w, per_channel, half_even, pt, pl, pr, hp, wp, xor, lo, hi, xs, 0};
    qp_for(n * hp, 4 * wp * c, qpad_rows, &a);
    return atomic_load(&a.bad);
}

/* DEQUANTIZE: y = float32(q) * s[c] in float32 (ONNX DequantizeLinear, as torch computes
 * it: both factors exact floats, one rounding), q int8 / int16 / int32 of shape
 * [outer, c, inner]. */
typedef struct {
    const void *q;
    int tq;
    int64_t c, inner;
    const float *s;
    float *out;
} deq_t;

TGT static void deq_part(void *p, int64_t r0, int64_t r1) {
    const deq_t *t = p;
    int64_t inner = t->inner;
    for (int64_t r = r0; r < r1; r++) {
        __m512 vs = _mm512_set1_ps(t->s[r % t->c]);
        for (int64_t i = 0; i < inner; i += 16) {
            __mmask16 m = mask16(inner - i);
            __m512i v = load16(t->q, r * inner + i, t->tq, m);
            _mm512_mask_storeu_ps(t->out + r * inner + i, m, _mm512_mul_ps(_mm512_cvtepi32_ps(v), vs));
        }
    }
}

TGT void qp_dequantize(const void *q, int64_t tq, int64_t outer, int64_t c, int64_t inner,
                       const float *s, float *out) {
    deq_t t = {q, (int)tq, c, inner, s, out};
    qp_for(outer * c, inner, deq_part, &t);
}
