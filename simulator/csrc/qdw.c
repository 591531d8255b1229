/* The executor's compiled depthwise convolution (group = input channels = output channels):
 * NHWC int8 input read in place, AVX-512 VNNI, epilogue fused (simulator/kernels/exec_depthwise.py
 * proves the bounds and calls it).
 *
 * Per output pixel and block of 32 channels c0.., in int32 lanes:
 *   acc[c] = sum over the taps (i, j) inside the input of x[n, y*sh - pt + i*dh,
 *            x*sw - pl + j*dw, c] * w[i, j, c]
 * (taps in the zero padding add nothing: they are skipped), then qepi.h's epilogue adds
 * corr[c] = bias[c] and requantizes: y = clamp(round(acc * scale[c]), lo, hi) -> int8 or
 * int16, in float32 or float64 as the caller proves exact. |acc| < 2**31 is proven by the
 * caller, so the int32 sums are exact.
 *
 * VNNI pairing: a tap's 32 input bytes are widened to 32 int16 lanes, and VPDPWSSD (pairs of
 * int16 products summed into int32) runs twice on them: against the tap's weights at the
 * even lanes (odd lanes 0), giving the even channels c0 + 2k in int32 lane k, and against
 * the weights at the odd lanes, giving the odd channels. One instruction per 16 channels
 * and tap multiplies and accumulates (|x w| <= 2**14, no saturation); the two sums are
 * interleaved back into channel order once per pixel, before the epilogue.
 *
 * Layouts: x [N, H, W, cx] int8 (channels 0..c-1 real); w [kh, kw, cb, 2, 32] int16, cb =
 * ceil(c / 32) blocks of even / odd lanes (zeros past c); out [N, OH, OW, ostride],
 * channels c..ostride-1 written as 0. */
#include <string.h>

#include "qepi.h"

typedef struct {
    const int8_t *x;
    int64_t h, w, cx, c;
    const int16_t *wk;
    int64_t kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
    char *out;
    int64_t ostride;
} dw_t;

/* The first `left` of 32 lanes (all 32 when left >= 32, none when left <= 0). */
TGT AI __mmask32 mask32(int64_t left) {
    return left >= 32 ? (__mmask32)0xFFFFFFFFu : left <= 0 ? 0 : (__mmask32)((1u << left) - 1);
}

/* Taps i0..i1 x j0..j1 of one pixel's 32 channels (x0: the offset in x of tap (0, 0),
 * channel c0, possibly outside x; wb: the block's weights at tap (0, 0)) into the even and
 * odd sums. */
TGT AI void taps(const dw_t *d, int64_t x0, const int16_t *wb, __mmask32 m, int64_t i0,
                 int64_t i1, int64_t j0, int64_t j1, __m512i *ae, __m512i *ao) {
    int64_t rs = d->dh * d->w * d->cx, cs = d->dw * d->cx;
    int64_t tstep = ((d->c + 31) / 32) * 64; /* int16 values per tap */
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = j0; j < j1; j++) {
            __m512i xv = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, d->x + x0 + i * rs + j * cs));
            const int16_t *wt = wb + (i * d->kw + j) * tstep;
            *ae = _mm512_dpwssd_epi32(*ae, xv, _mm512_loadu_si512(wt));
            *ao = _mm512_dpwssd_epi32(*ao, xv, _mm512_loadu_si512(wt + 32));
        }
}

/* The first tap index whose input coordinate o*s - p + t*dil lies inside [0, n) and the
 * end of that range (the taps in between are all inside). */
static inline void tap_range(int64_t o, int64_t s, int64_t p, int64_t dil, int64_t k,
                             int64_t n, int64_t *t0, int64_t *t1) {
    int64_t base = o * s - p, a = 0, b = k;
    while (a < k && base + a * dil < 0) a++;
    while (b > a && base + (b - 1) * dil >= n) b--;
    *t0 = a, *t1 = b;
}

/* Where output row (ni, y), channel block b, starts: its channels o0.., its kernel rows
 * i0..i1-1 inside the input, the real (m) and stored (s) lanes, the offset in x of its
 * first pixel's tap (0, 0) (as taps' x0 before the column), and its first output byte. */
typedef struct {
    int64_t o0, i0, i1, xrow;
    __mmask32 m, s;
    char *out;
} dw_pos_t;

TGT AI dw_pos_t row_at(const dw_t *d, const epi_t *e, int64_t ni, int64_t y, int64_t b) {
    dw_pos_t p = {.o0 = b * 32};
    tap_range(y, d->sh, d->pt, d->dh, d->kh, d->h, &p.i0, &p.i1);
    p.m = mask32(d->c - p.o0), p.s = mask32(d->ostride - p.o0);
    p.xrow = (ni * d->h + y * d->sh - d->pt) * d->w * d->cx + p.o0;
    p.out = d->out + ((((ni * d->oh + y) * d->ow) * d->ostride + p.o0) << e->out_shift);
    return p;
}

/* The output columns xa .. xb-1 whose 3 x 3 windows lie wholly inside the input's width. */
static inline void whole_windows3(const dw_t *d, int64_t *xa, int64_t *xb) {
    int64_t a = (d->pl + d->sw - 1) / d->sw;
    int64_t last = d->w - 1 - 2 * d->dw + d->pl; /* xo * sw <= last */
    int64_t b = last < 0 ? 0 : last / d->sw + 1;
    *xa = a < d->ow ? a : d->ow, *xb = b < *xa ? *xa : b < d->ow ? b : d->ow;
}

/* One pixel's even and odd sums (started from corr's even and odd lanes) interleaved into
 * channel order, then the epilogue of each 16-channel half (m: real channels, s: stored). */
TGT AI void dw_store(const epi_t *e, __m512i ae, __m512i ao, int64_t o0, char *out, __mmask32 m,
                     __mmask32 s) {
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    epilogue16_corr(_mm512_permutex2var_epi32(ae, lo, ao), e, o0, 0, out, (__mmask16)m,
                    (__mmask16)s);
    if (s >> 16)
        epilogue16_corr(_mm512_permutex2var_epi32(ae, hi, ao), e, o0 + 16, 0,
                        out + (16 << e->out_shift), (__mmask16)(m >> 16), (__mmask16)(s >> 16));
}

/* corr of channels o0 .. o0+31 split into the even channels (ce) and the odd ones (co): the
 * sums start from them (mod 2**32 the same as adding corr after). */
TGT AI void corr_pairs(const epi_t *e, int64_t o0, __m512i *ce, __m512i *co) {
    __m512i a = _mm512_loadu_si512(e->corr + o0), b = _mm512_loadu_si512(e->corr + o0 + 16);
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    *ce = _mm512_permutex2var_epi32(a, even, b);
    *co = _mm512_permutex2var_epi32(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
}

/* Pixels xa .. xb-1 of a row whose 3 x 3 windows lie wholly inside the input (x0 of pixel
 * xa as in taps), the block's 18 weight vectors held in registers over the run. */
TGT static void dw_run3(const dw_t *dp, const epi_t *ep, int64_t x0, const int16_t *wb,
                        int64_t o0, char *out, int64_t xa, int64_t xb, __mmask32 m, __mmask32 s) {
    /* copies: the stores through char pointers could alias *dp and *ep, so their fields
     * would be reloaded (and the epilogue's modes re-tested) per pixel */
    const dw_t dl = *dp, *d = &dl;
    const epi_t el = *ep, *e = &el;
    int64_t tstep = ((d->c + 31) / 32) * 64, rs = d->dh * d->w * d->cx, cs = d->dw * d->cx;
    int64_t step = d->sw * d->cx, ostep = d->ostride << e->out_shift;
    __m512i we[9], wo[9], ce, co;
    corr_pairs(e, o0, &ce, &co);
    for (int t = 0; t < 9; t++) {
        we[t] = _mm512_loadu_si512(wb + t * tstep);
        wo[t] = _mm512_loadu_si512(wb + t * tstep + 32);
    }
    for (int64_t xo = xa; xo < xb; xo++, x0 += step, out += ostep) {
        __m512i ae = ce, ao = co;
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                __m512i xv = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, d->x + x0 + i * rs + j * cs));
                ae = _mm512_dpwssd_epi32(ae, xv, we[i * 3 + j]);
                ao = _mm512_dpwssd_epi32(ao, xv, wo[i * 3 + j]);
            }
        dw_store(e, ae, ao, o0, out, m, s);
    }
}

/* Output row (ni, y), channel block b: every pixel's sums, interleaved, then the epilogue;
 * a 3 x 3 kernel's pixels wholly inside the input by dw_run3, the rest tap by tap. */
TGT static void dw_row(const dw_t *dp, const epi_t *ep, int64_t ni, int64_t y, int64_t b) {
    const dw_t dl = *dp, *d = &dl; /* copies, as in dw_run3 */
    const epi_t el = *ep, *e = &el;
    const dw_pos_t p = row_at(d, e, ni, y, b);
    int64_t o0 = p.o0, i0 = p.i0, i1 = p.i1, xrow = p.xrow;
    __mmask32 m = p.m, s = p.s;
    const int16_t *wb = d->wk + b * 64;
    char *out = p.out;
    int64_t xa = d->ow, xb = d->ow; /* the run of whole windows, if any */
    __m512i ce, co;
    corr_pairs(e, o0, &ce, &co);
    if (i0 == 0 && i1 == d->kh && d->kh == 3 && d->kw == 3) whole_windows3(d, &xa, &xb);
    for (int64_t xo = 0; xo < d->ow; xo++) {
        if (xo == xa && xb > xa) {
            dw_run3(d, e, xrow + (xo * d->sw - d->pl) * d->cx, wb, o0,
                    out + ((xo * d->ostride) << e->out_shift), xa, xb, m, s);
            xo = xb - 1;
            continue;
        }
        int64_t j0, j1;
        tap_range(xo, d->sw, d->pl, d->dw, d->kw, d->w, &j0, &j1);
        __m512i ae = ce, ao = co;
        taps(d, xrow + (xo * d->sw - d->pl) * d->cx, wb, m, i0, i1, j0, j1, &ae, &ao);
        dw_store(e, ae, ao, o0, out + ((xo * d->ostride) << e->out_shift), m, s);
    }
}

#ifndef QPARITY_SIMDE
/* The widened form (3 x 3, unit dilation, rows of at most DW_COLS padded columns): a task is
 * DW_BAND output rows of one channel block. Each input row it needs is widened once into a
 * ring of three rows, zero columns for the left and right padding and zero rows for the
 * top and bottom, so every pixel's taps are plain loads (a row-at-a-time task widened each
 * input pixel once per tap: 9 times at stride 1). A widened row holds, per padded column
 * sc, int16 pairs of neighbouring columns: pair k of its first 64 bytes is (x[sc][k],
 * x[sc + 1][k]) for channels k = o0 .. o0+15, of the next 64 bytes the same of channels
 * o0+16 .. . So one VPDPWSSD sums a kernel row's taps 0 and 1 of 16 channels (pairs at
 * column xo against the weight pairs (w[i][0], w[i][1])) and one more its tap 2 (the pairs
 * at column xo + 2 against (w[i][2], 0)): 12 a pixel of 32 channels, where one tap per
 * instruction took 18, and the sums come out in channel order. */
#define DW_BAND 8
#define DW_COLS 320

/* int16 pair k <- (a[k], b[k]) for k = 0..15 (half 0) or (a[16 + k], b[16 + k]) (half 1):
 * VPERMT2W's index. */
TGT AI __m512i pair_index(int half) {
    __m512i k = _mm512_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8,
                                 7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    __m512i from_b = _mm512_maskz_set1_epi16(0xAAAAAAAAu, 32); /* odd lanes: b's */
    return _mm512_add_epi16(_mm512_add_epi16(k, from_b), _mm512_set1_epi16((short)(16 * half)));
}

/* Input column ix of row iy (of image ni) as 32 int16 channels o0.. (m), zeros outside. */
TGT AI __m512i widen_px(const dw_t *d, int64_t ni, int64_t iy, int64_t ix, int64_t o0, __mmask32 m) {
    if (iy < 0 || iy >= d->h || ix < 0 || ix >= d->w) return _mm512_setzero_si512();
    const int8_t *px = d->x + ((ni * d->h + iy) * d->w + ix) * d->cx + o0;
    return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, px));
}

/* Input row iy (of image ni; outside the input: zeros) of channels o0.. (m) widened into
 * `row` over `cols` padded columns: column sc pairs input columns sc - pl and sc + 1 - pl. */
TGT static void widen_row(const dw_t *d, int64_t ni, int64_t iy, int64_t o0, __mmask32 m,
                          int64_t cols, int16_t *row) {
    const __m512i lo = pair_index(0), hi = pair_index(1);
    __m512i cur = widen_px(d, ni, iy, -d->pl, o0, m);
    for (int64_t sc = 0; sc < cols; sc++) {
        __m512i next = widen_px(d, ni, iy, sc + 1 - d->pl, o0, m);
        _mm512_store_si512(row + sc * 64, _mm512_permutex2var_epi16(cur, lo, next));
        _mm512_store_si512(row + sc * 64 + 32, _mm512_permutex2var_epi16(cur, hi, next));
        cur = next;
    }
}

/* One output row from the widened rows r[0..2]: per pixel and kernel row i, the pairs at
 * xo (taps 0, 1) and xo + 2 (tap 2) of each half against w01[i] and w2[i] (lo: channels
 * o0.., hi: o0 + 16..), then the epilogue. */
TGT AI void widened_row(const epi_t *e, int16_t *const r[3], const __m512i w01[6],
                        const __m512i w2[6], int64_t ow, int64_t sw, int64_t o0, char *out,
                        int64_t ostep, __mmask32 m, __mmask32 s) {
    __m512i ce = _mm512_loadu_si512(e->corr + o0), co = _mm512_loadu_si512(e->corr + o0 + 16);
    for (int64_t xo = 0; xo < ow; xo++, out += ostep) {
        __m512i ae = ce, ao = co;
        for (int i = 0; i < 3; i++) {
            const int16_t *at = r[i] + xo * sw * 64, *at2 = at + 2 * 64;
            ae = _mm512_dpwssd_epi32(ae, _mm512_load_si512(at), w01[2 * i]);
            ao = _mm512_dpwssd_epi32(ao, _mm512_load_si512(at + 32), w01[2 * i + 1]);
            ae = _mm512_dpwssd_epi32(ae, _mm512_load_si512(at2), w2[2 * i]);
            ao = _mm512_dpwssd_epi32(ao, _mm512_load_si512(at2 + 32), w2[2 * i + 1]);
        }
        epilogue16_corr(ae, e, o0, 0, out, (__mmask16)m, (__mmask16)s);
        if (s >> 16)
            epilogue16_corr(ao, e, o0 + 16, 0, out + (16 << e->out_shift), (__mmask16)(m >> 16),
                            (__mmask16)(s >> 16));
    }
}

/* Output rows y0 .. y1-1 of image ni, channel block b, by the widened form. */
TGT static void dw_band(const dw_t *dp, const epi_t *ep, int64_t ni, int64_t y0, int64_t y1,
                        int64_t b) {
    const dw_t dl = *dp, *d = &dl; /* copies, as in dw_run3 */
    const epi_t el = *ep, *e = &el;
    int16_t ring[3][DW_COLS * 64] __attribute__((aligned(64)));
    int64_t tag[3] = {INT64_MIN, INT64_MIN, INT64_MIN}, o0 = b * 32;
    int64_t cols = (d->ow - 1) * d->sw + 3, tstep = ((d->c + 31) / 32) * 64;
    __mmask32 m = mask32(d->c - o0), s = mask32(d->ostride - o0);
    __m512i w[9], w01[6], w2[6];
    for (int t = 0; t < 9; t++) { /* the paired layout's two halves, summed: channel order */
        const int16_t *wt = d->wk + b * 64 + t * tstep;
        w[t] = _mm512_add_epi16(_mm512_loadu_si512(wt), _mm512_loadu_si512(wt + 32));
    }
    for (int i = 0; i < 3; i++)
        for (int h = 0; h < 2; h++) {
            w01[2 * i + h] = _mm512_permutex2var_epi16(w[3 * i], pair_index(h), w[3 * i + 1]);
            w2[2 * i + h] = _mm512_permutex2var_epi16(w[3 * i + 2], pair_index(h), _mm512_setzero_si512());
        }
    int64_t ostep = d->ostride << e->out_shift;
    for (int64_t y = y0; y < y1; y++) {
        int16_t *r[3];
        for (int i = 0; i < 3; i++) {
            int64_t iy = y * d->sh - d->pt + i, slot = (iy % 3 + 3) % 3;
            if (tag[slot] != iy) widen_row(d, ni, iy, o0, m, cols, ring[slot]), tag[slot] = iy;
            r[i] = ring[slot];
        }
        char *out = d->out + ((((ni * d->oh + y) * d->ow) * d->ostride + o0) << e->out_shift);
        widened_row(e, r, w01, w2, d->ow, d->sw, o0, out, ostep, m, s);
    }
}

/* Whether the widened form takes this conv. */
static int widened(const dw_t *d) {
    return d->sw == 1 && d->kh == 3 && d->kw == 3 && d->dh == 1 && d->dw == 1 && (d->ow - 1) * d->sw + 3 <= DW_COLS;
}
#endif

#ifdef QPARITY_SIMDE
/* The AVX2 build (no VPDPWSSD over 512 bits): taps in pairs (t, t + 1). Each channel's two
 * inputs, widened to int16, are interleaved with VPUNPCKLWD / VPUNPCKHWD and multiplied by
 * its two weights interleaved the same way, so one VPMADDWD gives 8 channels' two-tap sums
 * in int32 (exact: |x w| <= 2**14, pair sums < 2**15 + 1, int32 sums proven by the caller).
 * The unpacks work within 128-bit lanes: of 16 channels the lo sums hold 0-3 and 8-11, the
 * hi sums 4-7 and 12-15, and two VPERM2I128 restore channel order for the epilogue. A tap
 * outside the input reads as 0 (adds nothing, as the skipped taps of the AVX-512 form). */
#define DW_PAIRS 25 /* kernels up to 49 taps (7 x 7); larger ones take the emulated form */

typedef struct {
    __m256i lo[2], hi[2]; /* per 16-channel half: the interleaved weights of a tap pair */
} wpair_t;

/* The block's weights (channel o0 + k at tap t: the even- plus the odd-lane vector of the
 * packed layout) interleaved per tap pair; a missing last tap weighs 0. */
static void dw_pairs(const dw_t *d, const int16_t *wb, wpair_t *wp) {
    int64_t taps = d->kh * d->kw, tstep = ((d->c + 31) / 32) * 64;
    for (int64_t p = 0; p < (taps + 1) / 2; p++)
        for (int h = 0; h < 2; h++) {
            __m256i w[2];
            for (int q = 0; q < 2; q++) {
                const int16_t *wt = wb + (2 * p + q) * tstep + 16 * h;
                w[q] = 2 * p + q < taps ? _mm256_add_epi16(_mm256_loadu_si256((const __m256i *)wt),
                                                           _mm256_loadu_si256((const __m256i *)(wt + 32)))
                                        : _mm256_setzero_si256();
            }
            wp[p].lo[h] = _mm256_unpacklo_epi16(w[0], w[1]);
            wp[p].hi[h] = _mm256_unpackhi_epi16(w[0], w[1]);
        }
}

/* Tap t of the pixel whose tap (0, 0) is at x0: its 32 channels (m), or 0 outside rows
 * i0..i1-1 / columns j0..j1-1 of the kernel. */
AI __m256i dw_tap(const dw_t *d, int64_t x0, int64_t t, __mmask32 m, int64_t i0, int64_t i1,
                  int64_t j0, int64_t j1, int64_t kh, int64_t kw) {
    int64_t i = t / kw, j = t % kw;
    if (t >= kh * kw || i < i0 || i >= i1 || j < j0 || j >= j1) return _mm256_setzero_si256();
    return _mm256_maskz_loadu_epi8(m, d->x + x0 + i * d->dh * d->w * d->cx + j * d->dw * d->cx);
}

/* One pixel, 32 channels: the tap pairs' sums, channel order restored, then the epilogue
 * of each 16-channel half (m: real channels, s: stored). */
AI void dw_pixel(const dw_t *d, const epi_t *e, int64_t x0, const wpair_t *wp, int64_t o0,
                 char *out, __mmask32 m, __mmask32 s, int64_t i0, int64_t i1, int64_t j0,
                 int64_t j1, int64_t kh, int64_t kw) {
    __m256i lo[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, hi[2] = {lo[0], lo[0]};
#pragma GCC unroll 25 /* constant kh, kw (the 3 x 3 interior): constant taps, no range tests */
    for (int64_t p = 0; p < (kh * kw + 1) / 2; p++) {
        __m256i xa = dw_tap(d, x0, 2 * p, m, i0, i1, j0, j1, kh, kw);
        __m256i xb = dw_tap(d, x0, 2 * p + 1, m, i0, i1, j0, j1, kh, kw);
        for (int h = 0; h < 2; h++) {
            __m256i a = _mm256_cvtepi8_epi16(h ? _mm256_extracti128_si256(xa, 1) : _mm256_castsi256_si128(xa));
            __m256i b = _mm256_cvtepi8_epi16(h ? _mm256_extracti128_si256(xb, 1) : _mm256_castsi256_si128(xb));
            lo[h] = _mm256_add_epi32(lo[h], _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), wp[p].lo[h]));
            hi[h] = _mm256_add_epi32(hi[h], _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), wp[p].hi[h]));
        }
    }
    for (int h = 0; h < 2 && (h == 0 || s >> 16); h++) {
        const int32_t *corr = e->corr + o0 + 16 * h;
        __m256i a0 = _mm256_permute2x128_si256(lo[h], hi[h], 0x20);
        __m256i a1 = _mm256_permute2x128_si256(lo[h], hi[h], 0x31);
        epilogue16_halves(_mm256_add_epi32(a0, _mm256_loadu_si256((const __m256i *)corr)),
                          _mm256_add_epi32(a1, _mm256_loadu_si256((const __m256i *)(corr + 8))),
                          e, o0 + 16 * h, 0, out + ((16 * h) << e->out_shift),
                          (__mmask16)(m >> 16 * h), (__mmask16)(s >> 16 * h));
    }
}

/* dw_row on the AVX2 build: every pixel by dw_pixel, the taps outside the input as 0; a
 * 3 x 3 kernel's pixels whose windows lie wholly inside the input with the kernel size and
 * tap ranges as constants (no range test per tap, the pair loop unrolled). */
static void dw_row_avx2(const dw_t *dp, const epi_t *ep, int64_t ni, int64_t y, int64_t b) {
    const dw_t dl = *dp, *d = &dl; /* copies, as in dw_run3 */
    const epi_t el = *ep, *e = &el;
    wpair_t wp[DW_PAIRS];
    const dw_pos_t p = row_at(d, e, ni, y, b);
    int64_t xa = d->ow, xb = d->ow;
    if (d->kh == 3 && d->kw == 3 && p.i0 == 0 && p.i1 == 3) whole_windows3(d, &xa, &xb);
    dw_pairs(d, d->wk + b * 64, wp);
    for (int64_t xo = 0; xo < d->ow; xo++) {
        int64_t x0 = p.xrow + (xo * d->sw - d->pl) * d->cx;
        char *out = p.out + ((xo * d->ostride) << e->out_shift);
        if (xo >= xa && xo < xb) {
            dw_pixel(d, e, x0, wp, p.o0, out, p.m, p.s, 0, 3, 0, 3, 3, 3);
            continue;
        }
        int64_t j0, j1;
        tap_range(xo, d->sw, d->pl, d->dw, d->kw, d->w, &j0, &j1);
        dw_pixel(d, e, x0, wp, p.o0, out, p.m, p.s, p.i0, p.i1, j0, j1, d->kh, d->kw);
    }
}
#endif

typedef struct {
    const dw_t *d;
    const epi_t *e;
    int64_t cb, tail, band; /* band: output rows per task (widened form), 0: one row */
} dw_job_t;

/* Output row r (flat over images) of channel block b, by the form of its build. */
TGT static void dw_one_row(const dw_t *d, const epi_t *e, int64_t r, int64_t b) {
#ifdef QPARITY_SIMDE
    if (d->kh * d->kw <= 2 * DW_PAIRS) {
        dw_row_avx2(d, e, r / d->oh, r % d->oh, b);
        return;
    }
#endif
    dw_row(d, e, r / d->oh, r % d->oh, b);
}

/* Tasks t0 .. t1: task t is channel block t % cb of output row t / cb (of all images), or
 * with a band, of output rows band * (t / cb % bands) .. of image t / cb / bands. */
TGT static void dw_part(void *p, int64_t t0, int64_t t1) {
    const dw_job_t *j = p;
    const dw_t *d = j->d;
    int64_t oh = d->oh, ow = d->ow, cb = j->cb, shift = j->e->out_shift, band = j->band;
    int64_t bands = band ? (oh + band - 1) / band : oh;
    for (int64_t t = t0; t < t1; t++) {
        int64_t ni = t / cb / bands, y0 = band ? t / cb % bands * band : t / cb % oh, b = t % cb;
        int64_t y1 = band ? (y0 + band < oh ? y0 + band : oh) : y0 + 1;
#ifndef QPARITY_SIMDE
        if (band) dw_band(d, j->e, ni, y0, y1, b);
        else
#endif
            dw_one_row(d, j->e, ni * oh + y0, b);
        for (int64_t r = ni * oh + y0; j->tail > 0 && b == cb - 1 && r < ni * oh + y1; r++)
            for (int64_t xo = 0; xo < ow; xo++) /* padding channels past the last block */
                memset(d->out + (((r * ow + xo) * d->ostride + cb * 32) << shift), 0,
                       j->tail << shift);
    }
}

/* The depthwise conv of the module comment; one task per output row (or band of rows: the
 * widened form) and channel block (a 7 x 7 map of 960 channels: 210 tasks, not 7). corr and
 * scale hold cb * 32 lanes. */
TGT void qp_dwconv(const void *x, int64_t n, int64_t h, int64_t w, int64_t cx, int64_t c,
                   const int16_t *wk, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                   int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t oh, int64_t ow,
                   const int32_t *corr, const void *scale, int64_t f64, int64_t lo, int64_t hi,
                   int64_t half_even, void *out, int64_t out_shift, int64_t ostride) {
    epi_t e = {corr, scale, 0, (double)lo, (double)hi, (int)f64, (int)half_even,
               (int)out_shift, 0};
    dw_t d = {(const int8_t *)x, h, w, cx, c, wk, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow,
              (char *)out, ostride};
    int64_t cb = (c + 31) / 32, band = 0;
#ifndef QPARITY_SIMDE
    band = widened(&d) ? DW_BAND : 0;
#endif
    dw_job_t j = {&d, &e, cb, ostride - cb * 32, band};
    int64_t rows = band ? (oh + band - 1) / band : oh;
    qp_for(n * rows * cb, ow * 32 * kh * kw * (band ? band : 1), dw_part, &j);
}
