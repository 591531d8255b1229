/* QConv on AMX-INT8 tiles (int8 inputs): qconv.c's products as tile products, 16 pixels x
 * 16 channels x 64 bytes of K per TDPBUSD instead of 1 x 16 x 4 per VPDPBUSD, then the same
 * epilogue (qepi.h). Runs only when the CPU has AMX and the OS grants the tile state
 * (qp_amx_ok); the caller (exec_native.run) falls back to qp_conv on a return of 1.
 *
 * Windows as rows. A task gathers the windows of up to 32 output pixels (flat over N, OH,
 * OW; two input tiles) into a buffer of kp bytes a row: row p is, tap after tap, the
 * tap's groups * 4 bytes at xu + window(p) + toff[t] (taps that lie back to back in the
 * input copied as one run: a 3 x 3 conv over 16 channels, three runs of 48 bytes, not nine
 * of 16), so K = taps * groups * 4 in the weights' own (tap, channel) order, rounded up to
 * kp (a multiple of 64) with bytes that meet zero weights. xu is offset (x ^ 0x80: qp_pad's
 * copy, wide 0) or raw int8 read in place (wide 2), offset here as it is gathered. Then,
 * per pair of channel blocks, 2 x 2 accumulator tiles hold
 *   acc[p, o] = sum_k xu[p, k] * w[k, o]      (TDPBUSD: uint8 x int8, modulo 2**32)
 * with the tiles started from corr[o] = bias[o] - 128 * sum_k w[k, o] (each row loaded from
 * corr with stride 0): exactly sum_k x[p, k] w[k, o] + bias[o], as qconv.c (the caller
 * proves |acc| < 2**31), so the epilogue adds nothing (epilogue16_corr).
 * Weights: exec_native.amx_weights' tiles (qamx.h's weight_tile): the weight tile of channel
 * block j and K chunk c is 16 rows of 64 bytes (K groups c * 16 .. of 4 bytes, 16 channels)
 * one after another, a pair of blocks' tiles over K one stream.
 * An unpadded stride-1 1x1 conv needs no gather: pixel q's row is its own bytes at
 * xu + q * pix, and a tile loads 16 of them pix bytes apart. Its last K chunk reads
 * kp - pix bytes into the next pixels, which meet zero weights, so a tile reads in place
 * only while those bytes are inside the input (the input's last tiles are gathered). Raw
 * int8 read in place (wide 2) goes through TDPBSSD (int8 x int8) and the tiles start
 * from bias itself;
 * qp_pad's offset copy (wide 0: channels stored past cs) through TDPBUSD and corr.
 * A stride-1 conv whose taps are whole 64-byte chunks needs no gather either: on the
 * padded grid (positions g = y * wp + x of an image, x up to wp - 1), the window of g is at
 * xu + g * pix, so tap t's K chunks of 16 consecutive positions load pix bytes apart from
 * xu + g0 * pix + toff[t]. The positions x >= ow (kw - 1 of each padded row) are computed
 * and not stored; a tile whose last rows would read past the input is gathered.
 * The arguments are qp_conv's, with kp added; int16 inputs (wide 1) are not taken. */
#include <stdint.h>
#ifndef QPARITY_SIMDE /* the AVX2 build has no AMX: qp_conv_amx below returns 1 */
#include <omp.h>
#include <stdlib.h>

#include "qamx.h"
#include "qpool.h"

#define PIX 32          /* output pixels per task: two input tiles */
#define KP_MAX (1 << 16) /* longest padded window row taken (64 KB; 2 MB of buffer a thread) */
#define FLAT 1           /* an unpadded stride-1 1x1 conv: pixel q's row at xu + q * pix */
#define GRID 2           /* stride 1, whole-chunk taps: the padded grid (module comment) */

typedef struct {
    const uint8_t *xu;
    uint8_t flip; /* 0x80 for raw int8 read in place (wide 2), else 0 */
    int64_t n, hp, wp, pix, tapb, taps, kp; /* pix: bytes per input pixel; tapb: per tap */
    const int64_t *toff;
    const int64_t *runs; /* (input offset, bytes) of each run of taps back to back */
    int64_t nrun;
    const int8_t *w;
    int64_t ob, o, sh, sw, oh, ow, total, tiles, chunk, parts;
    const char *b;
    int64_t bstride;
    char *out;
    int64_t ostride;
    const epi_t *e;
    epi_t raw;   /* e with corr = bias: the products of raw int8 by TDPBSSD need no offset */
    int form;    /* 0 (gather), FLAT or GRID */
    const int64_t *place_off; /* rows read in place: K chunk c at row + place_off[c] (FLAT:
                               * c * 64; GRID: its tap's toff plus its place in the tap) */
    int cmajor;  /* tasks numbered channel chunk first (conv_part) */
} aconv_t;

typedef struct { /* one tile's rows: where they are, and which output pixel each is */
    const uint8_t *src;  /* row 0 */
    int64_t stride;      /* bytes from a row to the next */
    const int64_t *coff; /* K chunk c at src + coff[c]; NULL: c * 64 (gathered rows) */
    int64_t qs[PIX];     /* output pixel of each row; -1: computed, not stored */
    int rows, raw;       /* rows up to the last stored one; raw int8 (TDPBSSD) */
    int dense;           /* every row up to rows stored, at pixels qs[0], qs[0] + 1, ... */
} rows_t;

/* len bytes from src to dst, offset by flip: whole 64-byte chunks, then a masked tail. */
AMX AI void copy_run(uint8_t *dst, const uint8_t *src, int64_t len, __m512i flip) {
    int64_t j = 0;
    for (; j + 64 <= len; j += 64)
        _mm512_storeu_si512(dst + j, _mm512_xor_si512(_mm512_loadu_si512(src + j), flip));
    if (j < len) {
        __mmask64 m = (1ULL << (len - j)) - 1;
        __m512i v = _mm512_maskz_loadu_epi8(m, src + j);
        _mm512_mask_storeu_epi8(dst + j, m, _mm512_xor_si512(v, flip));
    }
}

/* Rows p of buf: the windows of output pixels qs[p] (the module comment), run by run (taps
 * that lie back to back in the input: a.runs); a row not stored repeats the window of
 * pixel `any`. A pixel that follows the previous one finds its place by a step, not by
 * divisions. */
AMX static void gather(const aconv_t *a, const int64_t *qs, int64_t any, uint8_t *buf) {
    const __m512i flip = _mm512_set1_epi8((char)a->flip);
    const int64_t per = a->oh * a->ow, fill = a->taps * a->tapb, kp = a->kp;
    int64_t prev = -2, ni = 0, y = 0, x = 0;
    for (int p = 0; p < PIX; p++) {
        int64_t q = qs[p] >= 0 ? qs[p] : any;
        if (q == prev + 1 && x + 1 < a->ow) x++;
        else if (q == prev + 1 && y + 1 < a->oh) x = 0, y++;
        else ni = q / per, y = q % per / a->ow, x = q % a->ow;
        prev = q;
        const uint8_t *win = a->xu + ((ni * a->hp + y * a->sh) * a->wp + x * a->sw) * a->pix;
        uint8_t *row = buf + p * kp;
        for (int64_t r = 0, at = 0; r < a->nrun; at += a->runs[2 * r + 1], r++)
            copy_run(row + at, win + a->runs[2 * r], a->runs[2 * r + 1], flip);
        for (int64_t j = fill; j < kp; j += 64) /* K's padding: zeros */
            _mm512_mask_storeu_epi8(row + j, kp - j >= 64 ? ~0ULL : (1ULL << (kp - j)) - 1,
                                    _mm512_setzero_si512());
    }
}

/* GRID: tile `tile` (image tile / per, position g0 = tile % per * PIX of its padded grid):
 * the output pixel of each row, -1 past the grid's rows or at x >= ow. */
static void grid_pixels(const aconv_t *a, int64_t tile, rows_t *r) {
    int64_t per = (a->oh * a->wp + PIX - 1) / PIX, ni = tile / per, g0 = tile % per * PIX;
    for (int p = 0; p < PIX; p++) {
        int64_t g = g0 + p, y = g / a->wp, x = g % a->wp;
        r->qs[p] = y < a->oh && x < a->ow ? (ni * a->oh + y) * a->ow + x : -1;
    }
    r->src = a->xu + (ni * a->hp * a->wp + g0) * a->pix;
}

/* Where tile `tile`'s rows are: read in place (FLAT, GRID) when every row's reads stay in
 * the input, else gathered into buf. */
AMX static void plan_rows(const aconv_t *a, int64_t tile, uint8_t *buf, rows_t *r) {
    int64_t end = a->n * a->hp * a->wp * a->pix, any = -1;
    if (a->form == GRID) {
        grid_pixels(a, tile, r);
        r->stride = a->pix, r->coff = a->place_off;
        int64_t last = (r->src - a->xu) + (PIX - 1) * a->pix + a->toff[a->taps - 1] + a->tapb;
        if (last > end) r->coff = 0; /* the input's last rows: gathered */
    } else {
        for (int p = 0; p < PIX; p++) r->qs[p] = tile * PIX + p < a->total ? tile * PIX + p : -1;
        r->src = a->xu + tile * PIX * a->pix, r->stride = a->pix, r->coff = a->place_off;
        /* FLAT: the last row's last chunk reads kp - pix bytes past its pixel */
        if (a->form != FLAT || (tile * PIX + PIX - 1) * a->pix + a->kp > end) r->coff = 0;
    }
    r->rows = 0, r->dense = r->qs[0] >= 0;
    for (int p = 0; p < PIX; p++)
        if (r->qs[p] >= 0) r->rows = p + 1, any = any < 0 ? r->qs[p] : any;
    for (int p = 1; p < r->rows; p++) r->dense &= r->qs[p] == r->qs[0] + p;
    r->raw = r->coff && a->flip;
    if (r->coff || !r->rows) return;
    gather(a, r->qs, any, buf);
    r->src = buf, r->stride = a->kp;
}

/* Channel blocks j0 (and j0+1 when nj is 2) of r's first np2 (1 or 2) input tiles: the
 * tile products into acc [input tile][channel block][16][16]; SGN: raw int8 rows by
 * TDPBSSD, else offset rows by TDPBUSD. */
AMX AI void products_of(const aconv_t *a, const rows_t *r, int np2, int64_t j0, int nj,
                        int32_t *acc, int SGN) {
    const int32_t *corr = (SGN ? a->raw.corr : a->e->corr) + j0 * 16;
    _tile_loadd(0, corr, 0); /* every row corr[o]: the sums start from it */
    _tile_loadd(2, corr, 0);
    if (nj > 1) {
        _tile_loadd(1, corr + 16, 0);
        _tile_loadd(3, corr + 16, 0);
    }
    int64_t kp = a->kp, stride = r->stride;
    for (int64_t c = 0; c < kp / 64; c++) {
        const int8_t *wc = weight_tile(a->w, kp / 64, c, j0);
        const uint8_t *src = r->src + (r->coff ? r->coff[c] : c * 64);
        _tile_loadd(4, src, stride);
        _tile_loadd(6, wc, 64);
        if (SGN) _tile_dpbssd(0, 4, 6); else _tile_dpbusd(0, 4, 6);
        if (nj > 1) {
            _tile_loadd(7, wc + 1024, 64);
            if (SGN) _tile_dpbssd(1, 4, 7); else _tile_dpbusd(1, 4, 7);
        }
        if (np2 > 1) {
            _tile_loadd(5, src + 16 * stride, stride);
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

AMX static void products(const aconv_t *a, const rows_t *r, int64_t j0, int nj, int32_t *acc) {
    int np2 = r->rows > 16 ? 2 : 1;
    if (r->raw) products_of(a, r, np2, j0, nj, acc, 1);
    else products_of(a, r, np2, j0, nj, acc, 0);
}

/* The epilogue of n accumulator rows acc[p][16] (corr already in them) of channel block o0
 * stored at consecutive pixels (rows_t.dense): out and b step by a pixel, and mode 3
 * without an add (the expand 1x1 convs of MobileNetV2) loads scale and bounds once for all
 * n. Per-row offsets and reloads had been half of the instructions of a 16-channel 1x1
 * conv's epilogue. */
AMX AI void dense_rows(const aconv_t *a, const epi_t *e, const int32_t *acc, int n, int64_t q0,
                       int64_t o0, __mmask16 m, __mmask16 ms) {
    int sh = e->out_shift;
    int64_t step = a->ostride << sh, bstep = a->bstride << e->bshift; /* out and b per pixel */
    char *out = a->out + ((q0 * a->ostride + o0) << sh);
    if (e->f64 == 3 && !a->b) {
        __m512i lo = magic_bound(e->lo), hi = magic_bound(e->hi);
        __m512 scale = _mm512_loadu_ps((const float *)e->scale + o0);
        for (int p = 0; p < n; p++, out += step) {
            store16_of(magic_ps16_of(_mm512_loadu_si512(acc + 16 * p), scale, lo, hi), out, sh, m, ms);
        }
        return;
    }
    const char *b = a->b ? a->b + ((q0 * a->bstride + o0) << e->bshift) : 0;
    for (int p = 0; p < n; p++, out += step, b = b ? b + bstep : 0)
        epilogue16_corr(_mm512_loadu_si512(acc + 16 * p), e, o0, b, out, m, ms);
}

/* dense_rows' mode 3 of two channel blocks o0 and o0 + 16 (int8 output, no add) at once: a
 * pixel's two results give the low byte of each lane (the value's own, as store16_of keeps)
 * to one 32-byte store by one VPERMT2B, where VPMOVDB took two shuffle micro-ops a block. */
AMX AI void dense_pair(const aconv_t *a, const epi_t *e, const int32_t *acc, int n, int64_t q0,
                       int64_t o0, __mmask32 m, __mmask32 ms) {
    int64_t step = a->ostride;
    char *out = a->out + q0 * a->ostride + o0;
    __m512i lo = magic_bound(e->lo), hi = magic_bound(e->hi), low = _mm512_setr_epi32(
        0x0C080400, 0x1C181410, 0x2C282420, 0x3C383430, 0x4C484440, 0x5C585450, 0x6C686460,
        0x7C787470, 0, 0, 0, 0, 0, 0, 0, 0); /* bytes 0..15: 4i of the first; 16..31: of the second */
    __m512 s0 = _mm512_loadu_ps((const float *)e->scale + o0), s1 = _mm512_loadu_ps((const float *)e->scale + o0 + 16);
    for (int p = 0; p < n; p++, out += step) {
        __m512i r0 = magic_ps16_of(_mm512_loadu_si512(acc + 16 * p), s0, lo, hi);
        __m512i r1 = magic_ps16_of(_mm512_loadu_si512(acc + 256 + 16 * p), s1, lo, hi);
        __m512i v = _mm512_maskz_permutex2var_epi8(m, r0, low, r1); /* padding lanes: 0 */
        _mm256_mask_storeu_epi8(out, ms, _mm512_castsi512_si256(v));
    }
}

/* The epilogue of r's stored rows, channel blocks j0 .. j0+nj-1, with the epilogue's float
 * type, rounding and output size as given (constants in the copies block_epilogue
 * dispatches to, as qamx.c's). */
AMX AI void epilogue_px(const aconv_t *a, const epi_t *e0, const int32_t *acc,
                        const rows_t *r, int64_t j0, int nj, int f64, int half_even,
                        int out_shift) {
    epi_t e = *e0;
    e.f64 = f64, e.half_even = half_even, e.out_shift = out_shift;
    const char *b = a->b;
    char *out = a->out;
    int64_t o = a->o, ostride = a->ostride, bstride = a->bstride;
    int pair = nj == 2 && f64 == 3 && !b && !out_shift; /* dense: both blocks in one pass */
    for (int jj = 0; jj < nj; jj++) {
        int64_t o0 = (j0 + jj) * 16;
        __mmask16 m = mask16(o - o0), ms = mask16(ostride - o0);
        __mmask32 m2 = pair ? (__mmask32)m | (__mmask32)mask16(o - o0 - 16) << 16 : 0;
        __mmask32 ms2 = pair ? (__mmask32)ms | (__mmask32)mask16(ostride - o0 - 16) << 16 : 0;
        for (int h = 0; r->dense && 16 * h < r->rows; h++) { /* rows 16h .. in tile h's acc */
            int n = r->rows - 16 * h < 16 ? r->rows - 16 * h : 16;
            if (pair) dense_pair(a, &e, acc + 2 * h * 256, n, r->qs[0] + 16 * h, o0, m2, ms2);
            else dense_rows(a, &e, acc + (2 * h + jj) * 256, n, r->qs[0] + 16 * h, o0, m, ms);
        }
        if (r->dense && pair) return;
        if (r->dense) continue;
        for (int p = 0; p < r->rows; p++) {
            int64_t q = r->qs[p];
            if (q < 0) continue;
            __m512i v = _mm512_loadu_si512(acc + (p / 16 * 2 + jj) * 256 + p % 16 * 16);
            const char *bp = b ? b + ((q * bstride + o0) << e.bshift) : 0;
            epilogue16_corr(v, &e, o0, bp, out + ((q * ostride + o0) << out_shift), m, ms);
        }
    }
}

AMX static void block_epilogue(const aconv_t *a, const rows_t *r, const int32_t *acc,
                               int64_t j0, int nj) {
    const epi_t *e = r->raw ? &a->raw : a->e;
#define EPI_CASE(f, h, s)                                                   \
    if (e->scale && e->f64 == f && e->half_even == h && e->out_shift == s) \
        return epilogue_px(a, e, acc, r, j0, nj, f, h, s)
    EPI_CASE(0, 1, 0); EPI_CASE(1, 1, 0); EPI_CASE(2, 1, 0); EPI_CASE(3, 1, 0);
    EPI_CASE(0, 1, 1); EPI_CASE(1, 1, 1); EPI_CASE(2, 1, 1); EPI_CASE(3, 1, 1);
#undef EPI_CASE
    epilogue_px(a, e, acc, r, j0, nj, e->f64, e->half_even, e->out_shift);
}

/* Padding channels past the last block (ostride > Ob * 16) of r's stored rows: 0. */
static void zero_tail(const aconv_t *a, const rows_t *r) {
    int64_t tail = a->ostride - a->ob * 16, shift = a->e->out_shift;
    for (int p = 0; tail > 0 && p < r->rows; p++)
        if (r->qs[p] >= 0)
            memset(a->out + ((r->qs[p] * a->ostride + a->ob * 16) << shift), 0, tail << shift);
}

static __thread uint8_t *tls_buf; /* a thread's gather buffer, PIX * KP_MAX bytes */

/* Tasks t0 .. t1: pixel tile t / parts, channel chunk t % parts (tile major: qconv.c's
 * conv_part); with cmajor, channel chunk t / tiles, pixel tile t % tiles. A map with fewer
 * pixels than output channels whose weights outweigh its input and output (MobileNetV2's
 * 7x7 layers at batch 1): numbered channel first, the caller and its worker (qpool.c: one
 * from each end) each read half the weights instead of all of them, as each read all the
 * pixels' (MobileNetV2's 1280x320 conv after idle, weights from memory: 0.063 -> 0.053 ms).
 * Where the weights are the smaller part (its 64 -> 384 and 96 -> 576 expands at 14x14:
 * 25 and 55 KB against 88 and 132 KB of input and output), tile major keeps each core on
 * its own rows, which the depthwise conv after it reads by rows: channel first, each core
 * had read half of those rows from the other's cache (two threads: the expands 10.4 ->
 * 8.9 us, the depthwise convs after them 16.6 -> 14.6 and 23.0 -> 20.6 us). */
AMX static void conv_part(void *p, int64_t t0, int64_t t1) {
    const aconv_t *a = p;
    int32_t acc[4 * 256];
    rows_t r;
    if (!tls_buf) tls_buf = aligned_alloc(64, PIX * (size_t)KP_MAX);
    tile_config();
    for (int64_t t = t0; t < t1; t++) {
        int64_t tile = a->cmajor ? t % a->tiles : t / a->parts;
        int64_t blo = (a->cmajor ? t / a->tiles : t % a->parts) * a->chunk;
        int64_t bhi = blo + a->chunk < a->ob ? blo + a->chunk : a->ob;
        plan_rows(a, tile, tls_buf, &r);
        for (int64_t j0 = blo; j0 < bhi && r.rows; j0 += 2) {
            int nj = bhi - j0 < 2 ? 1 : 2;
            products(a, &r, j0, nj, acc);
            block_epilogue(a, &r, acc, j0, nj);
        }
        if (bhi == a->ob) zero_tail(a, &r);
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

#define AMX_FN AMX
#else
#define AMX_FN
#endif

AMX_FN int qp_conv_amx(const void *xs, int64_t wide, int64_t n, int64_t hp, int64_t wp, int64_t cs,
                    int64_t groups, const int8_t *wk, int64_t kh, int64_t kw, int64_t ob, int64_t o,
                    int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t oh, int64_t ow,
                    const int32_t *corr, const int32_t *bias, const void *scale,
                    const void *scale_b, int64_t f64, const void *b, int64_t bstride,
                    int64_t bshift, int64_t lo, int64_t hi, int64_t half_even, void *out,
                    int64_t out_shift, int64_t ostride, int64_t kp) {
#ifdef QPARITY_SIMDE
    return 1;
#else
    int64_t taps = kh * kw, tapb = groups * 4;
    if (wide == 1 || kp % 64 || kp > KP_MAX || kp < taps * tapb) return 1;
    epi_t e = {corr, scale, scale_b, (double)lo, (double)hi, (int)f64, (int)half_even,
               (int)out_shift, (int)bshift};
    /* read by the pool's threads while this call waits in qp_for */
    int64_t toff[taps], coff[kp / 64];
    int64_t runs[2 * taps], nrun = 0;
    for (int64_t t = 0; t < taps; t++) {
        toff[t] = (t / kw * dh * wp + t % kw * dw) * cs;
        if (nrun && runs[2 * nrun - 2] + runs[2 * nrun - 1] == toff[t]) /* follows: one copy */
            runs[2 * nrun - 1] += tapb;
        else
            runs[2 * nrun] = toff[t], runs[2 * nrun + 1] = tapb, nrun++;
    }
    int form = taps == 1 && sh == 1 && sw == 1 && hp == oh && wp == ow ? FLAT
             : sh == 1 && sw == 1 && tapb % 64 == 0 ? GRID : 0;
    for (int64_t c = 0; c < kp / 64; c++)
        coff[c] = form == GRID ? toff[c / (tapb / 64)] + c % (tapb / 64) * 64 : c * 64;
    int64_t total = n * oh * ow;
    int64_t tiles = form == GRID ? n * ((oh * wp + PIX - 1) / PIX) : (total + PIX - 1) / PIX;
    int64_t chunk = chunk_of(tiles, ob), parts = (ob + chunk - 1) / chunk;
    aconv_t a = {(const uint8_t *)xs, wide == 2 ? 0x80 : 0, n, hp, wp, cs, tapb, taps, kp, toff,
                 runs, nrun, wk, ob, o, sh, sw, oh, ow, total, tiles, chunk, parts,
                 (const char *)b, bstride, (char *)out, ostride, &e, e, form, coff};
    a.raw.corr = bias;
    a.cmajor = ob * 16 > total && kp * ob * 16 > total * (kp + ob * 16 * ((int64_t)1 << out_shift));
    qp_for(tiles * parts, PIX * kp * chunk / 4, conv_part, &a); /* work: products / 64 */
    return 0;
#endif
}
