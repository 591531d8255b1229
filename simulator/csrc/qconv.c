/* The executor's compiled integer convolution: NHWC, AVX-512 VNNI, epilogue fused.
 *
 * Built and loaded by simulator/runtime/native.py (cc -O3 -fopenmp, cached per source hash);
 * the Python side (simulator/kernels/exec_native.py) proves every bound before calling it, so this
 * file holds no fixed-point rule of its own: it evaluates, in registers, the same
 * formulas the torch path evaluates in tensors.
 *
 * int8 input. VPDPBUSD multiplies unsigned by signed bytes, so the input is stored
 * offset by 128 (xu = x ^ 0x80 = x + 128, padding 0x80 = a 0 input) and the offset is
 * removed per output channel:
 *   acc[o] = sum_k xu[k] * w[k, o] + corr[o],   corr[o] = bias[o] - 128 * sum_k w[k, o]
 * which is sum_k x[k] w[k, o] + bias[o] exactly: VPDPBUSD wraps modulo 2**32, and the
 * caller proves |acc| < 2**31, so the wrapped sum is the true one. An input that needs no
 * padding (a QLinear's rows, an unpadded 1x1 conv) is read in place and offset as each
 * 4-byte group is broadcast (tile_s8), saving the copy.
 * int16 input: VPDPWSSD (int16 x int16 pairs, weights widened), corr[o] = bias[o].
 * The AVX2 build (QPARITY_SIMDE) has no VNNI: window2 widens signed int8 to int16 pairs
 * (VPMADDWD), and window4 runs int16 inputs (VPMADDWD) and int8 inputs whose values all lie
 * in [0, 127] (checked per call: VPMADDUBSW on x itself from corr + 128 * sum_k w[k, o] =
 * bias[o]); it reads every int8 input raw (qp_pad copies without the offset: PAD_XOR) and
 * holds one register block, 1 x 12 pixels.
 *
 * Epilogue (exec_epilogue.Epilogue in one pass, float32 or float64 as proven exact):
 *   y = clamp(round(acc * scale[o] + b * scale_b[o]), lo, hi) -> int8 or int16
 * or, without a requantize, y = max(acc, lo) -> int32.
 * round: half_even = round to nearest even; bpu_round = sign(y) * floor(|y| + 0.5).
 *
 * Layouts: xu [N, Hp, Wp, Cs] uint8 (Cs = real channels rounded up to 4, spatial padding
 * applied) or int16 (rounded up to 2); weights [kh][kw][Cs/4][Ob][16][4] int8, or
 * [kh][kw][Cs/2][Ob][16][2] int16 (Ob = ceil(O / 16), zero beyond the real channels).
 * Row runs (channels not a multiple of 4 bytes, unit W dilation): Cs = C, and each kernel
 * row's kw * C contiguous values are one tap of a (kh, 1) kernel (4x fewer products for a
 * 1-channel 3x3 stem);
 * b [N, OH, OW, stride] int8, int16 or int32; out [N, OH, OW, stride] int8, int16 or int32,
 * channels O..stride written as 0 (the padding channels of an nhwc buffer).
 */
#include <omp.h>
#include <string.h>

#include "qepi.h"

int qp_cpu_ok(void) {
    __builtin_cpu_init();
#ifdef QPARITY_SIMDE
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
}

#ifdef QPARITY_SIMDE
#define PAD_XOR 0 /* the AVX2 build pads raw int8 (a 0 input is 0) and offsets as it reads
                   * (wide 2): its non-negative form multiplies x itself, and an offset copy
                   * cost it an XOR per broadcast to undo (ResNet-18's 3x3 convs) */
#else
#define PAD_XOR 0x80
#endif

/* The byte qp_pad XORs into int8 values (and stores as a 0 input): 0x80, or 0 (AVX2). */
int qp_pad_offset(void) { return PAD_XOR; }

/* n values from src to dst: int8 as uint8 x ^ PAD_XOR, int16 (wide) as they are. */
static inline void copy_run(char *dst, const char *src, int64_t n, int64_t wide) {
    if (wide || !PAD_XOR) {
        memcpy(dst, src, n << wide);
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = (char)((uint8_t)src[i] ^ PAD_XOR);
}

typedef struct {
    const void *x;
    int64_t wide, h, w, cx, c, pt, pl, pr, cs, hp, wp;
    void *xs;
} pad_t;

/* Padded rows r0 .. r1 (of all images) of qp_pad. */
static void pad_part(void *p, int64_t r0, int64_t r1) {
    const pad_t *a = p;
    const void *x = a->x;
    int64_t wide = a->wide, h = a->h, w = a->w, cx = a->cx, c = a->c, pt = a->pt, pl = a->pl;
    int64_t pr = a->pr, cs = a->cs, hp = a->hp, wp = a->wp, e = wide ? 2 : 1;
    int zero = wide ? 0 : PAD_XOR;
    for (int64_t r = r0; r < r1; r++) {
        int64_t ni = r / hp, hi = r % hp - pt, inside = hi >= 0 && hi < h;
        char *dst = (char *)a->xs + r * wp * cs * e;
        if (!inside || cs != c) memset(dst, zero, wp * cs * e);
        if (!inside) continue;
        if (pl) memset(dst, zero, pl * cs * e);
        if (pr) memset(dst + (pl + w) * cs * e, zero, pr * cs * e);
        const char *src = (const char *)x + (ni * h + hi) * w * cx * e;
        char *d = dst + pl * cs * e;
        if (cs == cx && c == cx) copy_run(d, src, w * c, wide);
        else if (!wide && c < 4 && cs == c && cx >= 4 && w > 0) { /* an RGB stem's row runs: 4-byte */
            int64_t j = 0; /* moves, each overwriting the last's extra bytes, while they end inside
                            * the row (another thread may be writing the next row; 1 channel: all
                            * but the last 3 pixels, 3 channels: all but the last) */
            for (; j * c + 4 <= w * c; j++) {
                uint32_t v;
                memcpy(&v, src + j * cx, 4);
                v ^= PAD_XOR * 0x01010101u;
                memcpy(d + j * c, &v, 4);
            }
            for (; j < w; j++) /* the rest byte by byte */
                for (int64_t t = 0; t < c; t++) d[j * c + t] = (char)((uint8_t)src[j * cx + t] ^ PAD_XOR);
        } else if (!wide && c < 16) /* a few channels of each pixel: one strided loop */
            for (int64_t j = 0; j < w; j++)
                for (int64_t t = 0; t < c; t++) d[j * cs + t] = (char)((uint8_t)src[j * cx + t] ^ PAD_XOR);
        else for (int64_t j = 0; j < w; j++) copy_run(d + j * cs * e, src + j * cx * e, c, wide);
    }
}

/* x [N, H, W, Cx] (first C channels real) -> xs [N, Hp, Wp, Cs] padded by (t, b, l, r)
 * with zeros (PAD_XOR for int8, 0 for int16) and channels C..Cs zero. */
void qp_pad(const void *x, int64_t wide, int64_t n, int64_t h, int64_t w, int64_t cx,
            int64_t c, int64_t pt, int64_t pb, int64_t pl, int64_t pr, int64_t cs, void *xs) {
    int64_t hp = h + pt + pb, wp = w + pl + pr;
    pad_t a = {x, wide, h, w, cx, c, pt, pl, pr, cs, hp, wp, xs};
    qp_for(n * hp, wp * cs, pad_part, &a);
}

typedef struct {
    const uint8_t *xu; /* int8 offset to uint8, or int16 (wide) */
    int64_t hp, wp, pix, c4; /* pix: bytes per input pixel; c4: 4-byte groups per tap */
    const int8_t *wk;
    int64_t kh, kw, ob, o, sh, sw, dh, dw, oh, ow;
    const char *b; /* the add operand (int8, int16 or int32: epi_t.bshift) */
    int64_t bstride;
    char *out;
    int64_t ostride; /* elements */
    int64_t tile;    /* pixel blocks per task, at most TILE */
    int ub;          /* the AVX2 build's non-negative form (window4): corr then holds bias */
    const int64_t *toff; /* [kh * kw]: tap t = (i, j)'s bytes from a window's first,
                          * (i dh wp + j dw) pix; its weights at t * c4 * ob * 64 */
} conv_t;

#ifdef QPARITY_SIMDE
#include "qconv_avx2.h" /* its window2, window4 and micro */
#else
/* acc[b * NP + p] = sum over the window of pixel p of xu * w, channel block b (NB x NP
 * accumulators in registers: one weight load serves NP pixels, one broadcast NB blocks).
 * Each 4-byte group is 4 uint8 x int8 products (VPDPBUSD) or, WIDE, 2 int16 x int16
 * (VPDPWSSD); both wrap modulo 2**32 like the int8 sums. */
TGT AI void micro(const uint8_t *const *xs, const int8_t *wb, const int32_t *corr,
                  const conv_t *c, int NB, int NP, int WIDE, int FLIP, __m512i *acc) {
    int64_t kstep = c->ob * 64;
    for (int b = 0; b < NB; b++) { /* the sums start from corr (mod 2**32 all the same) */
        __m512i c0 = _mm512_loadu_si512(corr + b * 16);
        for (int p = 0; p < NP; p++) acc[b * NP + p] = c0;
    }
    for (int64_t t = 0; t < c->kh * c->kw; t++) {
        const int8_t *wt = wb + t * c->c4 * kstep;
        for (int64_t k = 0; k < c->c4; k++) {
            __m512i wv[4];
            for (int b = 0; b < NB; b++) wv[b] = _mm512_loadu_si512(wt + k * kstep + b * 64);
            for (int p = 0; p < NP; p++) {
                int32_t four;
                memcpy(&four, xs[p] + c->toff[t] + 4 * k, 4);
                __m512i bx = _mm512_set1_epi32(FLIP ? four ^ (int32_t)0x80808080 : four);
                for (int b = 0; b < NB; b++)
                    acc[b * NP + p] = WIDE ? _mm512_dpwssd_epi32(acc[b * NP + p], bx, wv[b])
                                           : _mm512_dpbusd_epi32(acc[b * NP + p], bx, wv[b]);
            }
        }
    }
}

#endif

/* The input windows' first bytes of output pixels q0 .. q0+n-1 (flat over N, OH, OW); the
 * pixels from `total` on repeat the last one (computed, never stored). */
TGT static void pixel_ptrs(const conv_t *c, int64_t q0, int64_t n, int64_t total,
                           const uint8_t **xs) {
    int64_t per = c->oh * c->ow, ni = q0 / per, y = q0 % per / c->ow, x = q0 % c->ow;
    for (int64_t p = 0; p < n; p++) {
        xs[p] = c->xu + ((ni * c->hp + y * c->sh) * c->wp + x * c->sw) * c->pix;
        if (q0 + p + 1 < total && ++x == c->ow) {
            x = 0;
            if (++y == c->oh) y = 0, ni++;
        }
    }
}

/* Output pixels q0 .. q0+nq-1 (their windows at xs), channel blocks b0 .. b0+NB-1. */
TGT AI void conv_block(const conv_t *c, const epi_t *e, const uint8_t *const *xs, int64_t q0,
                       int64_t nq, int64_t b0, int NB, int NP, int WIDE, int FLIP) {
    __m512i acc[24];
    micro(xs, c->wk + b0 * 64, e->corr + b0 * 16, c, NB, NP, WIDE, FLIP, acc);
    /* locals: the stores below go through char pointers, which could alias *e and *c, so
     * their fields would be reloaded (and branched on) per vector */
    const epi_t el = *e;
    const char *badd = c->b;
    char *out = c->out;
    int64_t o = c->o, ostride = c->ostride, bstride = c->bstride;
    for (int b = 0; b < NB; b++) {
        int64_t o0 = (b0 + b) * 16;
        __mmask16 m = mask16(o - o0), ms = mask16(ostride - o0);
        for (int p = 0; p < nq; p++) {
            int64_t q = q0 + p;
            const char *bp = badd ? badd + ((q * bstride + o0) << el.bshift) : 0;
            epilogue16_corr(acc[b * NP + p], &el, o0, bp,
                            out + ((q * ostride + o0) << el.out_shift), m, ms);
        }
    }
    int64_t tail = c->ostride - c->ob * 16; /* padding channels past the last block */
    if (b0 + NB == c->ob && tail > 0)
        for (int p = 0; p < nq; p++)
            memset(c->out + (((q0 + p) * c->ostride + c->ob * 16) << e->out_shift), 0,
                   tail << e->out_shift);
}

#define TILE 8 /* pixel blocks per task: a chunk of weights is reused over TILE blocks */

/* Register blocks for nb channel blocks (chosen per pixel count np, below) at b0. */
TGT AI void block_at(const conv_t *c, const epi_t *e, const uint8_t *const *xs, int64_t q0,
                     int64_t nq, int64_t b0, int nb, int np, int WIDE, int FLIP) {
#ifdef QPARITY_SIMDE /* 1 x 12: its micro kernel holds 4 pixels (window2: 2) at a time */
    conv_block(c, e, xs, q0, nq, b0, 1, 12, WIDE, FLIP);
#else
    if (nb == 4) conv_block(c, e, xs, q0, nq, b0, 4, 6, WIDE, FLIP);
    else if (nb == 3) conv_block(c, e, xs, q0, nq, b0, 3, 8, WIDE, FLIP);
    else if (nb == 2 && np == 6) conv_block(c, e, xs, q0, nq, b0, 2, 6, WIDE, FLIP);
    else if (nb == 2) conv_block(c, e, xs, q0, nq, b0, 2, 10, WIDE, FLIP);
    else if (np == 6) conv_block(c, e, xs, q0, nq, b0, 1, 6, WIDE, FLIP);
    else if (np == 10) conv_block(c, e, xs, q0, nq, b0, 1, 10, WIDE, FLIP);
    else conv_block(c, e, xs, q0, nq, b0, 1, 16, WIDE, FLIP);
#endif
}

static inline int blocks_at(int np, int64_t left) {
    return np == 8 ? 3 : np == 6 ? (left >= 4 ? 4 : left >= 2 ? 2 : 1) : left >= 2 && np == 10 ? 2 : 1;
}

#define SMALL_WEIGHTS 65536 /* bytes: a chunk's weights that stay in cache over its pixels */

/* Channel blocks blo .. bhi-1 of c->tile pixel blocks from block t0, NB blocks at a time:
 * 4 x 6 pixels (and 2 or 1 x 6 for the last blocks), 3 x 8 when the blocks are a multiple
 * of 3 and not of 4 (96 or 144 channels: no short passes), 2 x 10, or 1 x 16. Large
 * weights: channel blocks outer, a block's weights reused over the tile's pixels; small
 * ones (a 1x1 conv of 64 input channels: 16 KB) pixels outer, so the output (and a fused
 * add's operand) is written and read pixel by pixel, not in one stride per channel block
 * (ResNet-50's 64 -> 256 1x1 + int32 add at 56 x 56, batch 8: 8.2-9.8 -> 7.4 ms). */
TGT AI void conv_tile(const conv_t *c, const epi_t *e, int64_t t0, int64_t total, int np,
                      int64_t blo, int64_t bhi, int WIDE, int FLIP) {
    const uint8_t *ptrs[TILE * 16]; /* once per tile, not per block of channels */
    pixel_ptrs(c, t0 * np, c->tile * np, total, ptrs);
    int64_t t1 = t0 + c->tile < (total + np - 1) / np ? t0 + c->tile : (total + np - 1) / np;
    if (c->kh * c->kw * c->c4 * 64 * (bhi - blo) <= SMALL_WEIGHTS) {
        for (int64_t t = t0; t < t1; t++) {
            int64_t q0 = t * np, nq = total - q0 < np ? total - q0 : np;
            for (int64_t b0 = blo, nb; b0 < bhi; b0 += nb) {
                nb = blocks_at(np, bhi - b0);
                block_at(c, e, ptrs + (t - t0) * np, q0, nq, b0, (int)nb, np, WIDE, FLIP);
            }
        }
        return;
    }
    for (int64_t b0 = blo, nb; b0 < bhi; b0 += nb) {
        nb = blocks_at(np, bhi - b0);
        for (int64_t t = t0; t < t1; t++) {
            int64_t q0 = t * np, nq = total - q0 < np ? total - q0 : np;
            block_at(c, e, ptrs + (t - t0) * np, q0, nq, b0, (int)nb, np, WIDE, FLIP);
        }
    }
}

#ifndef QPARITY_SIMDE /* the AVX2 build reads every int8 input raw (PAD_XOR) */
TGT static void tile_u8(const conv_t *c, const epi_t *e, int64_t t0, int64_t total, int np,
                        int64_t blo, int64_t bhi) {
    conv_tile(c, e, t0, total, np, blo, bhi, 0, 0);
}
#endif

/* Raw int8 input: each 4-byte group is offset to uint8 as it is broadcast. */
TGT static void tile_s8(const conv_t *c, const epi_t *e, int64_t t0, int64_t total, int np,
                        int64_t blo, int64_t bhi) {
    conv_tile(c, e, t0, total, np, blo, bhi, 0, 1);
}

TGT static void tile_i16(const conv_t *c, const epi_t *e, int64_t t0, int64_t total, int np,
                         int64_t blo, int64_t bhi) {
    conv_tile(c, e, t0, total, np, blo, bhi, 1, 0);
}

/* Channel blocks per task: all of them when the pixel tiles give each thread 4 tasks or
 * more; else chunks (a multiple of the register block's nb) so that small maps (7 x 7 at
 * batch 1: one or two tiles) still spread over the threads. */
static int64_t block_chunk(int64_t tiles, int64_t ob, int np) {
    int64_t nb = np == 8 ? 3 : np == 6 ? 4 : np == 10 ? 2 : 1, want = 4 * omp_get_max_threads();
    int64_t units = (ob + nb - 1) / nb, groups = tiles >= want ? 1 : (want + tiles - 1) / tiles;
    if (groups > units) groups = units;
    return nb * ((units + groups - 1) / groups);
}

#ifdef QPARITY_SIMDE
/* Whether every (raw) int8 input value is in [0, 127], in chunks so that a signed input
 * stops early. */
static int nonneg(const void *x, int64_t size) {
    const uint8_t *v = (const uint8_t *)x;
    for (int64_t i0 = 0; i0 < size; i0 += 4096) {
        uint8_t any = 0;
        int64_t i1 = i0 + 4096 < size ? i0 + 4096 : size;
        for (int64_t i = i0; i < i1; i++) any |= v[i];
        if (any & 0x80) return 0;
    }
    return 1;
}

#endif

typedef struct {
    const conv_t *c;
    const epi_t *e;
    int64_t tiles, total, chunk, parts;
    int np, wide;
} conv_job_t;

/* Tasks t0 .. t1: pixel tile t / parts, channel chunk t % parts. Tile major, so that the
 * pool's caller, claiming from the first task, and its worker, from the last, each take a
 * run of whole pixels: the rows the next kernel reads from the same core's cache (qpool.c). */
TGT static void conv_part(void *p, int64_t t0, int64_t t1) {
    const conv_job_t *j = p;
    const conv_t *c = j->c;
    for (int64_t t = t0; t < t1; t++) {
        int64_t first = t / j->parts * c->tile, blo = t % j->parts * j->chunk;
        int64_t bhi = blo + j->chunk < c->ob ? blo + j->chunk : c->ob;
        if (j->wide == 1) tile_i16(c, j->e, first, j->total, j->np, blo, bhi);
#ifdef QPARITY_SIMDE
        else tile_s8(c, j->e, first, j->total, j->np, blo, bhi);
#else
        else if (j->wide == 2) tile_s8(c, j->e, first, j->total, j->np, blo, bhi);
        else tile_u8(c, j->e, first, j->total, j->np, blo, bhi);
#endif
    }
}

/* xs: qp_pad's copy (wide 0: int8 ^ PAD_XOR; 1: int16) or an input that needs no padding
 * read in place (wide 2: raw int8, offset in the kernel; 1: int16), cs channels per pixel; groups: 4-byte
 * groups read per kernel tap from the tap's first byte (cs * bytes / 4, or, for row runs,
 * the kernel row's kw * cs values as one tap of a (kh, 1) kernel; the bytes past the run
 * meet zero weights, and the caller leaves 4 bytes of slack after xs). scale NULL: int32
 * output acc + corr, relu by lo. bias: corr + 128 * sum_k w[k, o] (the bias itself), where
 * the AVX2 build's non-negative form starts its sums. */
TGT void qp_conv(const void *xs, int64_t wide, int64_t n, int64_t hp, int64_t wp, int64_t cs,
                 int64_t groups, const int8_t *wk, int64_t kh, int64_t kw, int64_t ob, int64_t o,
                 int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t oh, int64_t ow,
                 const int32_t *corr, const int32_t *bias, const void *scale, const void *scale_b, int64_t f64,
                 const void *b, int64_t bstride, int64_t bshift, int64_t lo, int64_t hi,
                 int64_t half_even, void *out, int64_t out_shift, int64_t ostride) {
    epi_t e = {corr, scale, scale_b, (double)lo, (double)hi, (int)f64, (int)half_even,
               (int)out_shift, (int)bshift};
    int64_t pix = cs << (wide == 1 ? 1 : 0);
#ifdef QPARITY_SIMDE
    int np = 12; /* the AVX2 build's one register block (block_at) */
#else
    int np = ob % 3 == 0 && ob % 4 ? 8 : ob >= 4 ? 6 : ob >= 2 ? 10 : 16;
#endif
    /* tiles of at most TILE pixel blocks, as even as they go (9 blocks: 5 + 4, not 8 + 1) */
    int64_t total = n * oh * ow, blocks = (total + np - 1) / np;
    int64_t tiles = (blocks + TILE - 1) / TILE, tile = tiles ? (blocks + tiles - 1) / tiles : 1;
    tiles = (blocks + tile - 1) / tile;
    int64_t toff[kh * kw]; /* read by the pool's threads while this call waits in qp_for */
    for (int64_t t = 0; t < kh * kw; t++) toff[t] = (t / kw * dh * wp + t % kw * dw) * pix;
    conv_t c = {(const uint8_t *)xs, hp, wp, pix, groups, wk, kh, kw, ob, o, sh, sw, dh, dw,
                oh, ow, (const char *)b, bstride, (char *)out, ostride, tile, 0, toff};
#ifdef QPARITY_SIMDE
    if (wide == 0) wide = 2; /* qp_pad's raw copy (PAD_XOR 0) */
    if (wide != 1 && nonneg(xs, n * hp * wp * cs)) {
        e.corr = bias;
        c.ub = 1;
    }
#endif
    int64_t chunk = block_chunk(tiles, ob, np), parts = (ob + chunk - 1) / chunk;
    conv_job_t j = {&c, &e, tiles, total, chunk, parts, np, (int)wide};
    qp_for(tiles * parts, QP_CHUNK_WORK, conv_part, &j); /* a task is a chunk */
}
