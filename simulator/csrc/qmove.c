/* The executor's compiled data movement (simulator/kernels/exec_native_move.py calls it): MAXPOOL
 * over NHWC, ToNHWC of a narrow input, and the strided copy of a Reshape that cannot be a
 * view. No arithmetic: every output value is an input value or a zero.
 *
 * MAXPOOL: y[n, oy, ox, c] = max over the window taps (i, j) inside x of
 *                            x[n, oy*sh - pt + i*dh, ox*sw - pl + j*dw, c]
 * Taps in the padding are skipped, which is max over x padded with the dtype's minimum
 * (the torch path's exec_kernels.max_pool): a window wholly in padding gives the minimum.
 * x [N, H, W, C] and y [N, OH, OW, C] contiguous, int8 or int16 (wide); 64 bytes of
 * channels per vector op, masked at the end.
 */
#include <string.h>

#include "qsimd.h"

typedef struct {
    const void *x;
    int wide;
    int64_t h, w, row, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
    void *out;
} pool_t;

/* The taps of one output pixel that lie inside x: window rows i0 .. i1, columns j0 .. j1,
 * at y0 + i*dh, x0 + j*dw (those in the padding are skipped: none for a window wholly in
 * it). Computed once per output pixel, for all its channels. */
typedef struct {
    int64_t y0, x0, i0, i1, j0, j1;
} taps_t;

/* The taps i of a window from p0 with dilation d and k taps with 0 <= p0 + i*d < size. */
AI void tap_range(int64_t p0, int64_t d, int64_t k, int64_t size, int64_t *i0, int64_t *i1) {
    int64_t first = p0 >= 0 ? 0 : (-p0 + d - 1) / d, end = p0 >= size ? 0 : (size - 1 - p0) / d + 1;
    *i0 = first;
    *i1 = end < k ? end : k;
}

AI taps_t pixel_taps(const pool_t *t, int64_t oy, int64_t ox) {
    taps_t a = {oy * t->sh - t->pt, ox * t->sw - t->pl, 0, 0, 0, 0};
    tap_range(a.y0, t->dh, t->kh, t->h, &a.i0, &a.i1);
    tap_range(a.x0, t->dw, t->kw, t->w, &a.j0, &a.j1);
    return a;
}

/* The tap (i, j) of ``a``, channel byte b0, in image ``img``. */
AI const char *tap(const pool_t *t, const char *img, const taps_t *a, int64_t i, int64_t j,
                   int64_t b0) {
    return img + ((a->y0 + i * t->dh) * t->w + a->x0 + j * t->dw) * t->row + b0;
}

#ifdef QPARITY_SIMDE
/* The AVX2 build's output pixel: 32, then 16 bytes of channels a step natively, the rest
 * element by element (SIMDe's masked 64-byte loads go byte by byte: 7x slower on the
 * digits example's 16 int8 channels). The same maxima. */
AI __m256i vmax32(__m256i a, __m256i b, int wide) {
    return wide ? _mm256_max_epi16(a, b) : _mm256_max_epi8(a, b);
}

AI __m128i vmax16(__m128i a, __m128i b, int wide) {
    return wide ? _mm_max_epi16(a, b) : _mm_max_epi8(a, b);
}

/* Channel bytes b0 .. b0 + span of one output pixel (span 32, 16, or one element). */
AI void pool_span(const pool_t *t, const char *img, const taps_t *a, int64_t b0, int span,
                  char *out) {
    int wide = t->wide;
    __m256i a32 = wide ? _mm256_set1_epi16(-32768) : _mm256_set1_epi8(-128);
    __m128i a16 = _mm256_castsi256_si128(a32);
    int a1 = wide ? -32768 : -128;
    for (int64_t i = a->i0; i < a->i1; i++)
        for (int64_t j = a->j0; j < a->j1; j++) {
            const char *src = tap(t, img, a, i, j, b0);
            if (span == 32) a32 = vmax32(a32, _mm256_loadu_si256((const __m256i *)src), wide);
            else if (span == 16) a16 = vmax16(a16, _mm_loadu_si128((const __m128i *)src), wide);
            else {
                int v = wide ? *(const int16_t *)src : *(const int8_t *)src;
                a1 = v > a1 ? v : a1;
            }
        }
    if (span == 32) _mm256_storeu_si256((__m256i *)(out + b0), a32);
    else if (span == 16) _mm_storeu_si128((__m128i *)(out + b0), a16);
    else if (wide) *(int16_t *)(out + b0) = (int16_t)a1;
    else *(int8_t *)(out + b0) = (int8_t)a1;
}

AI void pool_pixel(const pool_t *t, const char *img, const taps_t *a, char *out) {
    int64_t b0 = 0, bytes = t->row;
    for (; b0 + 32 <= bytes; b0 += 32) pool_span(t, img, a, b0, 32, out);
    for (; b0 + 16 <= bytes; b0 += 16) pool_span(t, img, a, b0, 16, out);
    for (; b0 < bytes; b0 += 1 + t->wide) pool_span(t, img, a, b0, 1, out);
}
#else
TGT AI __m512i vmax(__m512i a, __m512i b, int wide) {
    return wide ? _mm512_max_epi16(a, b) : _mm512_max_epi8(a, b);
}

/* One output pixel: all C channels, chunks of 64 bytes. */
TGT AI void pool_pixel(const pool_t *t, const char *img, const taps_t *a, char *out) {
    __m512i lowest = t->wide ? _mm512_set1_epi16(-32768) : _mm512_set1_epi8(-128);
    for (int64_t b0 = 0, bytes = t->row; b0 < bytes; b0 += 64) {
        __mmask64 m = bytes - b0 >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (bytes - b0)) - 1);
        __m512i acc = lowest;
        for (int64_t i = a->i0; i < a->i1; i++)
            for (int64_t j = a->j0; j < a->j1; j++)
                acc = vmax(acc, _mm512_maskz_loadu_epi8(m, tap(t, img, a, i, j, b0)), t->wide);
        _mm512_mask_storeu_epi8(out + b0, m, acc);
    }
}
#endif

/* Output rows r0 .. r1 (of all images). */
TGT static void pool_part(void *p, int64_t r0, int64_t r1) {
    const pool_t *t = p;
    for (int64_t r = r0; r < r1; r++) {
        int64_t ni = r / t->oh, oy = r % t->oh;
        const char *img = (const char *)t->x + ni * t->h * t->w * t->row;
        for (int64_t ox = 0; ox < t->ow; ox++) {
            taps_t a = pixel_taps(t, oy, ox);
            pool_pixel(t, img, &a, (char *)t->out + (r * t->ow + ox) * t->row);
        }
    }
}

TGT void qp_maxpool(const void *x, int64_t wide, int64_t n, int64_t h, int64_t w, int64_t c,
                    int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                    int64_t pt, int64_t pl, int64_t oh, int64_t ow, void *out) {
    pool_t t = {x, (int)wide, h, w, c << wide /* bytes per pixel */, kh, kw, sh, sw, dh, dw, pt,
                pl, oh, ow, out};
    qp_for(n * oh, ow * c, pool_part, &t);
}

/* Pixels p0 .. p0+15 (those below hw) of one int8 image x [C <= 4, HW] as 16-byte pixels of
 * out [HW, 16]: each pixel's C bytes gathered into one dword (the zero-extended channel
 * planes shifted and or'ed), then placed as the first dword of each pixel, the other 12
 * bytes zero, by zero-masked permutes: one 64-byte store per 4 pixels. */
TGT static void nhwc16_narrow(const int8_t *x, int64_t c, int64_t hw, int8_t *out, int64_t p0) {
    int64_t left = hw - p0;
    __mmask16 m = mask16(left);
    __m512i v = _mm512_setzero_si512();
    for (int64_t ch = 0; ch < c; ch++) {
        __m512i plane = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, x + ch * hw + p0));
        v = _mm512_or_si512(v, _mm512_slli_epi32(plane, (unsigned)(8 * ch)));
    }
    const __m512i first = _mm512_set_epi32(0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0);
    for (int64_t k = 0; k < 4 && 4 * k < left; k++) {
        __m512i y = _mm512_maskz_permutexvar_epi32(0x1111, _mm512_add_epi32(first, _mm512_set1_epi32((int)(4 * k))), v);
        int64_t px = left - 4 * k < 4 ? left - 4 * k : 4;
        __mmask64 bytes = px == 4 ? ~(__mmask64)0 : (((__mmask64)1 << (16 * px)) - 1);
        _mm512_mask_storeu_epi8(out + (p0 + 4 * k) * 16, bytes, y);
    }
}

/* LAYOUT ToNHWC of a narrow input: x [N, C, HW] -> y [N, HW, Cp], channels C..Cp zero
 * (int8, or int16 when wide): per image one memset, then each channel scattered; int8 with
 * C <= 4 into 16 channels (an RGB stem) 16 pixels at a time (nhwc16_narrow). */
typedef struct {
    const void *x;
    int wide;
    int64_t c, hw, cp, chunks;
    void *out;
} nhwc_t;

/* Tasks t0 .. t1 of 16 pixels (task t: chunk t % chunks of image t / chunks). */
TGT static void nhwc16_part(void *p, int64_t t0, int64_t t1) {
    const nhwc_t *a = p;
    for (int64_t t = t0; t < t1; t++) {
        int64_t ni = t / a->chunks;
        nhwc16_narrow((const int8_t *)a->x + ni * a->c * a->hw, a->c, a->hw,
                      (int8_t *)a->out + ni * a->hw * 16, t % a->chunks * 16);
    }
}

/* Images n0 .. n1. */
TGT static void nhwc_part(void *p, int64_t n0, int64_t n1) {
    const nhwc_t *a = p;
    int64_t c = a->c, hw = a->hw, cp = a->cp;
    for (int64_t ni = n0; ni < n1; ni++) {
        memset((char *)a->out + (ni * hw * cp << a->wide), 0, hw * cp << a->wide);
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t p = 0; p < hw; p++) {
                int64_t src = (ni * c + ch) * hw + p, dst = (ni * hw + p) * cp + ch;
                if (a->wide) ((int16_t *)a->out)[dst] = ((const int16_t *)a->x)[src];
                else ((int8_t *)a->out)[dst] = ((const int8_t *)a->x)[src];
            }
    }
}

TGT void qp_to_nhwc(const void *x, int64_t wide, int64_t n, int64_t c, int64_t hw, int64_t cp,
                    void *out) {
    nhwc_t t = {x, (int)wide, c, hw, cp, (hw + 15) / 16, out};
    if (!wide && c <= 4 && cp == 16) qp_for(n * t.chunks, 16 * cp, nhwc16_part, &t);
    else qp_for(n, hw * cp, nhwc_part, &t);
}

/* A strided tensor copied contiguous: shape and element strides of up to 6 axes (leading
 * axes of size 1 pad the front), elements of `size` bytes; the last axis is one memcpy when
 * its stride is 1 (one masked move up to 64 bytes). The two outer axes split across threads. */
typedef struct {
    const void *x;
    int64_t size;
    const int64_t *shape, *stride;
    void *out;
} copy_t;

/* A run of n <= 64 bytes (AVX-512: one masked move; AVX2: SIMDe's 64-byte masked moves go
 * through a buffer, two calls a run, which made a head-merging copy of 16-byte runs 8x
 * slower than this: 16 and 32 bytes as one move, other lengths by memcpy). */
TGT AI void move_run(char *dst, const char *src, int64_t n, __mmask64 m) {
#ifdef QPARITY_SIMDE
    (void)m;
    if (n == 16) _mm_storeu_si128((__m128i *)dst, _mm_loadu_si128((const __m128i *)src));
    else if (n == 32) _mm256_storeu_si256((__m256i *)dst, _mm256_loadu_si256((const __m256i *)src));
    else memcpy(dst, src, n);
#else
    (void)n;
    _mm512_mask_storeu_epi8(dst, m, _mm512_maskz_loadu_epi8(m, src));
#endif
}

/* Rows r0 .. r1 of the two outer axes. */
TGT static void copy_part(void *p, int64_t r0, int64_t r1) {
    const copy_t *t = p;
    const void *x = t->x;
    const int64_t *shape = t->shape, *stride = t->stride;
    int64_t size = t->size, inner = shape[2] * shape[3] * shape[4] * shape[5], run = shape[5] * size;
    __mmask64 m = run >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << run) - 1);
    for (int64_t r = r0; r < r1; r++) {
        const char *src01 = (const char *)x + (r / shape[1] * stride[0] + r % shape[1] * stride[1]) * size;
        char *dst = (char *)t->out + r * inner * size;
        for (int64_t i = 0; i < shape[2]; i++)
            for (int64_t j = 0; j < shape[3]; j++)
                for (int64_t k = 0; k < shape[4]; k++) {
                    const char *src = src01 + (i * stride[2] + j * stride[3] + k * stride[4]) * size;
                    if (stride[5] == 1 && run <= 64) move_run(dst, src, run, m); /* a short run */
                    else if (stride[5] == 1) memcpy(dst, src, run);
                    else
                        for (int64_t l = 0; l < shape[5]; l++)
                            memcpy(dst + l * size, src + l * stride[5] * size, size);
                    dst += shape[5] * size;
                }
    }
}

TGT void qp_copy(const void *x, int64_t size, const int64_t *shape, const int64_t *stride,
                 void *out) {
    copy_t t = {x, size, shape, stride, out};
    qp_for(shape[0] * shape[1], shape[2] * shape[3] * shape[4] * shape[5] * size, copy_part, &t);
}

/* CLIP: out[i] = min(max(x[i], lo), hi) over n int8 (wide 0) or int16 (wide 1) values, lo
 * and hi already cut to the dtype's range (a result is always an input value or a bound). */
typedef struct {
    const void *x;
    int64_t wide, n, lo, hi;
    void *out;
} clip_t;

/* Blocks b0 .. b1 of 64 bytes. */
TGT static void clip_part(void *p, int64_t b0, int64_t b1) {
    const clip_t *t = p;
    const void *x = t->x;
    void *out = t->out;
    int64_t wide = t->wide, n = t->n, lo = t->lo, hi = t->hi, step = wide ? 32 : 64;
    for (int64_t b = b0; b < b1; b++) {
        int64_t i = b * step, left = n - i < step ? n - i : step;
        __mmask64 m = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
        if (wide) {
            __m512i v = _mm512_maskz_loadu_epi16((__mmask32)m, (const int16_t *)x + i);
            v = _mm512_min_epi16(_mm512_max_epi16(v, _mm512_set1_epi16((int16_t)lo)),
                                 _mm512_set1_epi16((int16_t)hi));
            _mm512_mask_storeu_epi16((int16_t *)out + i, (__mmask32)m, v);
        } else {
            __m512i v = _mm512_maskz_loadu_epi8(m, (const int8_t *)x + i);
            v = _mm512_min_epi8(_mm512_max_epi8(v, _mm512_set1_epi8((int8_t)lo)),
                                _mm512_set1_epi8((int8_t)hi));
            _mm512_mask_storeu_epi8((int8_t *)out + i, m, v);
        }
    }
}

/* A move per 64 bytes: a block counts as 8 elements of work, so the caller runs alone below
 * 256 KB (as OpenMP's `if` had it). */
TGT void qp_clip(const void *x, int64_t wide, int64_t n, int64_t lo, int64_t hi, void *out) {
    clip_t t = {x, wide, n, lo, hi, out};
    int64_t step = wide ? 32 : 64;
    qp_for((n + step - 1) / step, 8, clip_part, &t);
}
