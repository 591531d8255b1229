/* QConv on AMX-INT8 tiles (int8 inputs): qconv.c's products as tile products, 16 pixels x
 * 16 channels x 64 bytes of K per TDPBUSD instead of 1 x 16 x 4 per VPDPBUSD, then the same
 * epilogue (qepi.h). Runs only when the CPU has AMX and the OS grants the tile state
 * (qp_amx_ok); the caller (exec_native.run) falls back to qp_conv on a return of 1.
 *
 * Windows as rows. A task gathers the windows of up to 32 output pixels (flat over N, OH,
 * OW; two input tiles) into a buffer of kp bytes a row: row p is, tap after tap, the
 * tap's groups * 4 bytes at xu + window(p) + toff[t], so K = taps * groups * 4 in the
 * weights' own (tap, channel) order, rounded up to kp (a multiple of 64) with bytes that
 * meet zero weights. xu is offset (x ^ 0x80: qp_pad's copy, wide 0) or raw int8 read in
 * place (wide 2), offset here as it is gathered. Then, per pair of channel blocks, 2 x 2
 * accumulator tiles hold
 *   acc[p, o] = sum_k xu[p, k] * w[k, o]      (TDPBUSD: uint8 x int8, modulo 2**32)
 * and epilogue16 adds corr[o] = bias[o] - 128 * sum_k w[k, o]: exactly
 * sum_k x[p, k] w[k, o] + bias[o], as qconv.c (the caller proves |acc| < 2**31).
 * Weights: [kp/4][Ob][16][4] int8 (exec_native.amx_weights): the weight tile of channel
 * block j and K chunk c is 16 rows of 64 bytes at (c * 16 * Ob + j) * 64, row stride Ob * 64.
 * An unpadded stride-1 1x1 conv needs no gather: pixel q's row is its own bytes at
 * xu + q * pix, and a tile loads 16 of them pix bytes apart. Its last K chunk reads
 * kp - pix bytes into the next pixel, which meet zero weights, so a tile reads in place
 * only while a pixel follows it (the input's last tile is gathered). Raw int8 read in place
 * (wide 2) goes through TDPBSSD (int8 x int8) and the epilogue starts from bias itself;
 * qp_pad's offset copy (wide 0: channels stored past cs) through TDPBUSD and corr.
 * The arguments are qp_conv's, with kp added; int16 inputs (wide 1) are not taken. */
#include <stdint.h>
#ifdef QPARITY_SIMDE
int qp_conv_amx(const void *xs, int64_t wide, int64_t n, int64_t hp, int64_t wp, int64_t cs,
                int64_t groups, const int8_t *wk, int64_t kh, int64_t kw, int64_t ob, int64_t o,
                int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t oh, int64_t ow,
                const int32_t *corr, const int32_t *bias, const void *scale,
                const void *scale_b, int64_t f64, const void *b, int64_t bstride,
                int64_t bshift, int64_t lo, int64_t hi, int64_t half_even, void *out,
                int64_t out_shift, int64_t ostride, int64_t kp) {
    return 1; /* the AVX2 build has no AMX */
}
#else
#include <omp.h>
#include <stdlib.h>

#include "qamx.h"
#include "qpool.h"

#define PIX 32          /* output pixels per task: two input tiles */
#define KP_MAX (1 << 16) /* longest padded window row taken (64 KB; 2 MB of buffer a thread) */

typedef struct {
    const uint8_t *xu;
    uint8_t flip; /* 0x80 for raw int8 read in place (wide 2), else 0 */
    int64_t hp, wp, pix, tapb, taps, kp; /* pix: bytes per input pixel; tapb: bytes per tap */
    const int64_t *toff;
    const int8_t *w;
    int64_t ob, o, sh, sw, oh, ow, total, tiles, chunk;
    const char *b;
    int64_t bstride;
    char *out;
    int64_t ostride;
    const epi_t *e;
    epi_t raw;  /* e with corr = bias: the products of raw int8 by TDPBSSD need no offset */
    int direct; /* an unpadded stride-1 1x1 conv: pixel q's row at xu + q * pix */
} aconv_t;

/* The windows of output pixels q0 .. q0+PIX-1 as rows of buf (the module comment); pixels
 * from `total` on repeat the last one (computed, never stored). */
AMX static void gather(const aconv_t *a, int64_t q0, uint8_t *buf) {
    const __m512i flip = _mm512_set1_epi8((char)a->flip);
    int64_t per = a->oh * a->ow;
    for (int p = 0; p < PIX; p++) {
        int64_t q = q0 + p < a->total ? q0 + p : a->total - 1;
        int64_t ni = q / per, y = q % per / a->ow, x = q % a->ow;
        const uint8_t *win = a->xu + ((ni * a->hp + y * a->sh) * a->wp + x * a->sw) * a->pix;
        uint8_t *row = buf + p * a->kp;
        for (int64_t t = 0; t < a->taps; t++)
            for (int64_t j = 0; j < a->tapb; j += 64) {
                int64_t left = a->tapb - j;
                __mmask64 m = left >= 64 ? ~0ULL : (1ULL << left) - 1;
                __m512i v = _mm512_maskz_loadu_epi8(m, win + a->toff[t] + j);
                _mm512_mask_storeu_epi8(row + t * a->tapb + j, m, _mm512_xor_si512(v, flip));
            }
        memset(row + a->taps * a->tapb, 0, a->kp - a->taps * a->tapb);
    }
}

/* Channel blocks j0 (and j0+1 when nj is 2) of the np2 (1 or 2) input tiles whose rows
 * start at src, `stride` bytes apart (the gathered rows, or the pixels themselves): the
 * tile products into acc [input tile][channel block][16][16]; SGN: raw int8 rows by
 * TDPBSSD, else offset rows by TDPBUSD. */
AMX AI void products_of(const aconv_t *a, const uint8_t *src, int64_t stride, int np2,
                        int64_t j0, int nj, int32_t *acc, int SGN) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    int64_t kp = a->kp, wstride = a->ob * 64;
    for (int64_t c = 0; c < kp / 64; c++) {
        const int8_t *wc = a->w + (c * 16 * a->ob + j0) * 64;
        _tile_loadd(4, src + c * 64, stride);
        _tile_loadd(6, wc, wstride);
        if (SGN) _tile_dpbssd(0, 4, 6); else _tile_dpbusd(0, 4, 6);
        if (nj > 1) {
            _tile_loadd(7, wc + 64, wstride);
            if (SGN) _tile_dpbssd(1, 4, 7); else _tile_dpbusd(1, 4, 7);
        }
        if (np2 > 1) {
            _tile_loadd(5, src + 16 * stride + c * 64, stride);
            if (SGN) _tile_dpbssd(2, 5, 6); else _tile_dpbusd(2, 5, 6);
            if (nj > 1) {
                if (SGN) _tile_dpbssd(3, 5, 7); else _tile_dpbusd(3, 5, 7);
            }
        }
    }
    _tile_stored(0, acc, 64);
    _tile_stored(1, acc + 256, 64);
    _tile_stored(2, acc + 512, 64);
    _tile_stored(3, acc + 768, 64);
}

AMX static void products(const aconv_t *a, const uint8_t *src, int64_t stride, int sgn,
                         int np2, int64_t j0, int nj, int32_t *acc) {
    if (sgn) products_of(a, src, stride, np2, j0, nj, acc, 1);
    else products_of(a, src, stride, np2, j0, nj, acc, 0);
}

/* The epilogue of pixels q0 .. q0+nq-1, channel blocks j0 .. j0+nj-1, with the epilogue's
 * float type, rounding and output size as given (constants in the copies block_epilogue
 * dispatches to, as qamx.c's). */
AMX AI void epilogue_px(const aconv_t *a, const epi_t *e0, const int32_t *acc, int64_t q0,
                        int nq, int64_t j0, int nj, int f64, int half_even, int out_shift) {
    epi_t e = *e0;
    e.f64 = f64, e.half_even = half_even, e.out_shift = out_shift;
    const char *b = a->b;
    char *out = a->out;
    int64_t o = a->o, ostride = a->ostride, bstride = a->bstride;
    for (int jj = 0; jj < nj; jj++) {
        int64_t o0 = (j0 + jj) * 16;
        __mmask16 m = mask16(o - o0), ms = mask16(ostride - o0);
        for (int p = 0; p < nq; p++) {
            int64_t q = q0 + p;
            __m512i v = _mm512_loadu_si512(acc + (p / 16 * 2 + jj) * 256 + p % 16 * 16);
            const char *bp = b ? b + ((q * bstride + o0) << e.bshift) : 0;
            epilogue16(v, &e, o0, bp, out + ((q * ostride + o0) << out_shift), m, ms);
        }
    }
}

AMX static void block_epilogue(const aconv_t *a, const epi_t *e, const int32_t *acc,
                               int64_t q0, int nq, int64_t j0, int nj) {
#define EPI_CASE(f, h, s)                                                   \
    if (e->scale && e->f64 == f && e->half_even == h && e->out_shift == s) \
        return epilogue_px(a, e, acc, q0, nq, j0, nj, f, h, s)
    EPI_CASE(0, 1, 0); EPI_CASE(1, 1, 0); EPI_CASE(2, 1, 0); EPI_CASE(0, 1, 1);
    EPI_CASE(1, 1, 1); EPI_CASE(2, 1, 1);
#undef EPI_CASE
    epilogue_px(a, e, acc, q0, nq, j0, nj, e->f64, e->half_even, e->out_shift);
}

/* Padding channels past the last block (ostride > Ob * 16) of pixels q0 .. q0+nq-1: 0. */
static void zero_tail(const aconv_t *a, int64_t q0, int nq) {
    int64_t tail = a->ostride - a->ob * 16, shift = a->e->out_shift;
    for (int p = 0; tail > 0 && p < nq; p++)
        memset(a->out + (((q0 + p) * a->ostride + a->ob * 16) << shift), 0, tail << shift);
}

static __thread uint8_t *tls_buf; /* a thread's gather buffer, PIX * KP_MAX bytes */

/* Tasks t0 .. t1: pixel tile t % tiles, channel chunk t / tiles. */
AMX static void conv_part(void *p, int64_t t0, int64_t t1) {
    const aconv_t *a = p;
    int32_t acc[4 * 256];
    if (!tls_buf) tls_buf = aligned_alloc(64, PIX * (size_t)KP_MAX);
    tile_config();
    for (int64_t t = t0; t < t1; t++) {
        int64_t q0 = t % a->tiles * PIX, blo = t / a->tiles * a->chunk;
        int64_t bhi = blo + a->chunk < a->ob ? blo + a->chunk : a->ob;
        int nq = a->total - q0 < PIX ? (int)(a->total - q0) : PIX;
        /* read in place while the rows' last chunk (kp - pix bytes past a pixel: zero
         * weights) stays inside the input: a pixel after the tile */
        int direct = a->direct && q0 + PIX < a->total;
        const uint8_t *src = direct ? a->xu + q0 * a->pix : tls_buf;
        if (!direct) gather(a, q0, tls_buf);
        for (int64_t j0 = blo; j0 < bhi; j0 += 2) {
            int nj = bhi - j0 < 2 ? 1 : 2;
            int raw = direct && a->flip; /* raw int8 in place; else offset bytes */
            products(a, src, direct ? a->pix : a->kp, raw, nq > 16 ? 2 : 1, j0, nj, acc);
            block_epilogue(a, raw ? &a->raw : a->e, acc, q0, nq, j0, nj);
        }
        if (bhi == a->ob) zero_tail(a, q0, nq);
    }
    _tile_release();
}

/* Channel blocks per task (even): all of them when the pixel tiles give each thread 4 tasks
 * or more, else fewer so that small maps still spread over the threads. */
static int64_t chunk_of(int64_t tiles, int64_t ob) {
    int64_t want = 4 * omp_get_max_threads(), pairs = (ob + 1) / 2;
    int64_t groups = tiles >= want ? 1 : (want + tiles - 1) / tiles;
    if (groups > pairs) groups = pairs;
    return 2 * ((pairs + groups - 1) / groups);
}

AMX int qp_conv_amx(const void *xs, int64_t wide, int64_t n, int64_t hp, int64_t wp, int64_t cs,
                    int64_t groups, const int8_t *wk, int64_t kh, int64_t kw, int64_t ob, int64_t o,
                    int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t oh, int64_t ow,
                    const int32_t *corr, const int32_t *bias, const void *scale,
                    const void *scale_b, int64_t f64, const void *b, int64_t bstride,
                    int64_t bshift, int64_t lo, int64_t hi, int64_t half_even, void *out,
                    int64_t out_shift, int64_t ostride, int64_t kp) {
    int64_t taps = kh * kw, tapb = groups * 4;
    if (wide == 1 || kp % 64 || kp > KP_MAX || kp < taps * tapb) return 1;
    epi_t e = {corr, scale, scale_b, (double)lo, (double)hi, (int)f64, (int)half_even,
               (int)out_shift, (int)bshift};
    int64_t toff[taps]; /* read by the pool's threads while this call waits in qp_for */
    for (int64_t t = 0; t < taps; t++) toff[t] = (t / kw * dh * wp + t % kw * dw) * cs;
    int64_t total = n * oh * ow, tiles = (total + PIX - 1) / PIX, chunk = chunk_of(tiles, ob);
    aconv_t a = {(const uint8_t *)xs, wide == 2 ? 0x80 : 0, hp, wp, cs, tapb, taps, kp, toff,
                 wk, ob, o, sh, sw, oh, ow, total, tiles, chunk, (const char *)b, bstride,
                 (char *)out, ostride, &e, e, 0};
    a.raw.corr = bias;
    a.direct = taps == 1 && sh == 1 && sw == 1 && hp == oh && wp == ow;
    int64_t parts = (ob + chunk - 1) / chunk;
    qp_for(tiles * parts, PIX * kp * chunk / 4, conv_part, &a); /* work: products / 64 */
    return 0;
}
#endif /* QPARITY_SIMDE */
