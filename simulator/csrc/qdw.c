/* The executor's compiled depthwise convolution (group = input channels = output channels):
 * NHWC int8 input read in place, AVX-512, epilogue fused (simulator/kernels/exec_depthwise.py
 * proves the bounds and calls it).
 *
 * Per output pixel and block of 16 channels, in int32 lanes:
 *   acc[c] = sum over the taps (i, j) inside the input of x[n, y*sh - pt + i*dh,
 *            x*sw - pl + j*dw, c] * w[i, j, c]
 * (taps in the zero padding add nothing: they are skipped), then qepi.h's epilogue adds
 * corr[c] = bias[c] and requantizes: y = clamp(round(acc * scale[c]), lo, hi) -> int8 or
 * int16, in float32 or float64 as the caller proves exact. |acc| < 2**31 is proven by the
 * caller, so the int32 sums are exact.
 *
 * Layouts: x [N, H, W, cx] int8 (channels 0..c-1 real); w [kh, kw, cb * 16] int32 (zeros
 * past c); out [N, OH, OW, ostride], channels c..ostride-1 written as 0. */
#include <string.h>

#include "qepi.h"

typedef struct {
    const int8_t *x;
    int64_t h, w, cx, c;
    const int32_t *wk;
    int64_t kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
    char *out;
    int64_t ostride;
} dw_t;

/* Every channel block of output pixel (ni, y, x). */
TGT static void dw_pixel(const dw_t *d, const epi_t *e, int64_t ni, int64_t y, int64_t x) {
    int64_t cb = (d->c + 15) / 16, q = (ni * d->oh + y) * d->ow + x;
    char *out = d->out + ((q * d->ostride) << e->out_shift);
    for (int64_t b = 0; b < cb; b++) {
        int64_t o0 = b * 16;
        __mmask16 m = mask16(d->c - o0), ms = mask16(d->ostride - o0);
        __m512i acc = _mm512_setzero_si512();
        for (int64_t i = 0; i < d->kh; i++) {
            int64_t iy = y * d->sh - d->pt + i * d->dh;
            if (iy < 0 || iy >= d->h) continue;
            const int8_t *row = d->x + ((ni * d->h + iy) * d->w) * d->cx + o0;
            for (int64_t j = 0; j < d->kw; j++) {
                int64_t ix = x * d->sw - d->pl + j * d->dw;
                if (ix < 0 || ix >= d->w) continue;
                __m512i xv = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, row + ix * d->cx));
                __m512i wv = _mm512_loadu_si512(d->wk + (i * d->kw + j) * cb * 16 + o0);
                acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(xv, wv));
            }
        }
        epilogue16(acc, e, o0, 0, out + (o0 << e->out_shift), m, ms);
    }
    int64_t tail = d->ostride - cb * 16; /* padding channels past the last block */
    if (tail > 0) memset(out + ((cb * 16) << e->out_shift), 0, tail << e->out_shift);
}

/* The depthwise conv of the module comment; one OpenMP task per output row. */
TGT void qp_dwconv(const void *x, int64_t n, int64_t h, int64_t w, int64_t cx, int64_t c,
                   const int32_t *wk, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                   int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t oh, int64_t ow,
                   const int32_t *corr, const void *scale, int64_t f64, int64_t lo, int64_t hi,
                   int64_t half_even, void *out, int64_t out_shift, int64_t ostride) {
    epi_t e = {corr, scale, 0, (double)lo, (double)hi, (int)f64, (int)half_even,
               (int)out_shift, 0};
    dw_t d = {(const int8_t *)x, h, w, cx, c, wk, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow,
              (char *)out, ostride};
#pragma omp parallel for schedule(static) if (n * oh * ow * c * kh * kw >= PAR_MIN)
    for (int64_t r = 0; r < n * oh; r++)
        for (int64_t xo = 0; xo < ow; xo++) dw_pixel(&d, &e, r / oh, r % oh, xo);
}
