/* QLinear on AMX-INT8 tiles: the products of qconv.c's linear (a 1x1 conv over the rows),
 * 16 rows x 16 channels x 64 bytes of K per tile instruction instead of 16 x 4 per VNNI one,
 * then the same epilogue (qepi.h). Built with the other kernels; runs only when the CPU has
 * AMX and the kernel grants the process the tile state (qp_amx_ok).
 *
 * Per block of 16 rows the inputs are copied into tile buffers of kp bytes a row (K rounded
 * up to 64, zeros past K and past the last row):
 *   int8:  xu = x ^ 0x80 (uint8), acc = TDPBUSD(xu, w), corr as qconv.c's (bias - 128 sum w);
 *   int16: x = 256 hi + lo with hi = x >> 8 (int8) and lo = x & 255 (uint8), so
 *          acc = 256 TDPBSSD(hi, w) + TDPBUSD(lo, w), corr = bias.
 * Every sum wraps modulo 2**32 like VNNI's, and the caller proves |acc| < 2**31, so the
 * wrapped value is the true one. Weights: exec_native.amx_weights' whole tiles (qamx.h's
 * weight_tile, zero rows past K): the B tile of channel block j and K chunk c is 16 rows of
 * 64 bytes one after another, a pair of blocks' tiles over K one run. */
#ifdef QPARITY_SIMDE
/* The AVX2 build (qavx2.h) has no AMX: the tile kernel reports itself unavailable. */
#include <stdint.h>
int qp_amx_ok(void) { return 0; }
int qp_linear_amx(const void *x, int64_t wide, int64_t rows, int64_t k, int64_t kp,
                  const int8_t *w, int64_t ob, int64_t o, const int32_t *corr, const void *scale,
                  const void *scale_b, int64_t f64, const void *b, int64_t bshift, int64_t lo,
                  int64_t hi, int64_t half_even, void *out, int64_t out_shift) {
    return 1;
}
#else
#include <sys/syscall.h>
#include <unistd.h>

#include "qamx.h"
#include "qpool.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define AMX_KP_MAX 512 /* longest padded row the per-thread buffers take */

/* 1 when this CPU has AMX-INT8 (and AVX512-VBMI, which qamxconv.c's stores use) and the
 * kernel lets this process use the tile registers. */
int qp_amx_ok(void) {
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return 0; /* AMX-TILE, AMX-INT8 */
    if (!((c >> 1) & 1)) return 0;                       /* AVX512-VBMI */
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* Rows r0 .. r0+nr-1 of x [rows, k] into hi (and lo when wide), kp bytes a row, zero past k
 * and past nr. */
AMX static void split_rows(const void *x, int wide, int64_t r0, int nr, int64_t k, int64_t kp,
                           uint8_t *hi, uint8_t *lo) {
    for (int i = 0; i < 16; i++)
        for (int64_t j = 0; j < kp; j += 32) {
            __mmask32 m = i >= nr || j >= k ? 0 : k - j >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << (k - j)) - 1);
            int64_t at = (r0 + i) * k + j;
            if (!wide) { /* x ^ 0x80: past k (zero weights) and past nr the bytes are 0x80 */
                __m256i v = _mm256_maskz_loadu_epi8(m, (const int8_t *)x + (m ? at : 0));
                _mm256_storeu_si256((__m256i *)(hi + i * kp + j), _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)));
                continue;
            }
            __m512i v = _mm512_maskz_loadu_epi16(m, (const int16_t *)x + (m ? at : 0));
            _mm256_storeu_si256((__m256i *)(hi + i * kp + j), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
            _mm256_storeu_si256((__m256i *)(lo + i * kp + j), _mm512_cvtepi16_epi8(v));
        }
}

typedef struct {
    const void *x;
    int wide;
    int64_t rows, k, kp, ob, o;
    const int8_t *w;
    const char *b;
    char *out;
    const epi_t *e;
} lin_t;

/* Channel blocks j0, j0+1 (nj of them) of the 16 rows whose inputs hi / lo hold: the tile
 * products into acc [nj][2][16][16] (hi part, lo part; the lo part only for int16). */
AMX static void block_products(const lin_t *l, const uint8_t *hi, const uint8_t *lo, int64_t j0,
                               int nj, int32_t *acc) {
    _tile_zero(0);
    _tile_zero(1);
    if (l->wide) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t c = 0; c < l->kp / 64; c++) {
        const int8_t *wc = weight_tile(l->w, l->kp / 64, c, j0);
        _tile_loadd(4, hi + c * 64, l->kp);
        _tile_loadd(6, wc, 64);
        if (nj > 1) _tile_loadd(7, wc + 1024, 64);
        if (!l->wide) {
            _tile_dpbusd(0, 4, 6);
            if (nj > 1) _tile_dpbusd(1, 4, 7);
            continue;
        }
        _tile_loadd(5, lo + c * 64, l->kp);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbusd(2, 5, 6);
        if (nj > 1) {
            _tile_dpbssd(1, 4, 7);
            _tile_dpbusd(3, 5, 7);
        }
    }
    _tile_stored(0, acc, 64);
    if (nj > 1) _tile_stored(1, acc + 512, 64);
    if (l->wide) {
        _tile_stored(2, acc + 256, 64);
        if (nj > 1) _tile_stored(3, acc + 768, 64);
    }
}

/* The epilogue of rows r0 .. r0+nr-1, channel blocks j0 .. j0+nj-1; the input width and
 * the epilogue's float type, rounding and output size as given (constants in the copies
 * block_epilogue dispatches to: a local copy of e with them set lets the compiler drop the
 * per-vector branches and keep the fields in registers). */
AMX AI void epilogue_rows(const lin_t *l, const epi_t *e0, const int32_t *acc, int64_t r0,
                          int nr, int64_t j0, int nj, int wide, int f64, int half_even,
                          int out_shift) {
    epi_t e = *e0;
    e.f64 = f64, e.half_even = half_even, e.out_shift = out_shift;
    const char *b = l->b;
    char *out = l->out;
    int64_t o = l->o;
    for (int jj = 0; jj < nj; jj++) {
        int64_t o0 = (j0 + jj) * 16;
        __mmask16 m = mask16(o - o0);
        const int32_t *a = acc + jj * 512;
        for (int i = 0; i < nr; i++) {
            __m512i v = _mm512_loadu_si512(a + i * 16);
            if (wide) v = _mm512_add_epi32(_mm512_slli_epi32(v, 8), _mm512_loadu_si512(a + 256 + i * 16));
            int64_t q = r0 + i;
            const char *bp = b ? b + ((q * o + o0) << e.bshift) : 0;
            epilogue16(v, &e, o0, bp, out + ((q * o + o0) << out_shift), m, m);
        }
    }
}

AMX static void block_epilogue(const lin_t *l, const epi_t *e, const int32_t *acc, int64_t r0,
                               int nr, int64_t j0, int nj) {
#define EPI_CASE(w, f, h, s)                                                                 \
    if (e->scale && l->wide == w && e->f64 == f && e->half_even == h && e->out_shift == s) \
        return epilogue_rows(l, e, acc, r0, nr, j0, nj, w, f, h, s)
    EPI_CASE(0, 0, 1, 0); EPI_CASE(0, 1, 1, 0); EPI_CASE(0, 0, 1, 1); EPI_CASE(0, 1, 1, 1);
    EPI_CASE(1, 0, 1, 0); EPI_CASE(1, 1, 1, 0); EPI_CASE(1, 0, 1, 1); EPI_CASE(1, 1, 1, 1);
    EPI_CASE(0, 3, 1, 0); EPI_CASE(0, 3, 1, 1);
#undef EPI_CASE
    epilogue_rows(l, e, acc, r0, nr, j0, nj, l->wide, e->f64, e->half_even, e->out_shift);
}

/* Row blocks i0 .. i1-1 (16 rows each) on this thread's tiles. */
AMX static void lin_part(void *p, int64_t i0, int64_t i1) {
    const lin_t *l = p;
    uint8_t bh[16 * AMX_KP_MAX], bl[16 * AMX_KP_MAX];
    int32_t acc[4 * 256];
    tile_config();
    for (int64_t r0 = i0 * 16; r0 < i1 * 16 && r0 < l->rows; r0 += 16) {
        int nr = l->rows - r0 < 16 ? (int)(l->rows - r0) : 16;
        split_rows(l->x, l->wide, r0, nr, l->k, l->kp, bh, bl);
        for (int64_t j0 = 0; j0 < l->ob; j0 += 2) {
            int nj = l->ob - j0 < 2 ? (int)(l->ob - j0) : 2;
            block_products(l, bh, bl, j0, nj, acc);
            block_epilogue(l, l->e, acc, r0, nr, j0, nj);
        }
    }
    _tile_release();
}

/* y [rows, o] = epilogue(x [rows, k] @ w + corr (+ b [rows, o])): x int8 (wide 0) or int16
 * (1); the epilogue arguments as qp_conv's. Returns 1 (nothing written) when kp is beyond
 * the buffers. Row blocks on the kernels' pool (qpool.c: the caller never waits for a
 * worker that has not started; an OpenMP region here waited a 4 ms tick for one, the
 * transformer's first linear 3.1 ms of its 5.5, and 90 ms a run with a busy core). Work
 * per block: its outputs, plus its products at about 512 a cycle. */
AMX int qp_linear_amx(const void *x, int64_t wide, int64_t rows, int64_t k, int64_t kp,
                      const int8_t *w, int64_t ob, int64_t o, const int32_t *corr,
                      const void *scale, const void *scale_b, int64_t f64, const void *b,
                      int64_t bshift, int64_t lo, int64_t hi, int64_t half_even, void *out,
                      int64_t out_shift) {
    if (kp > AMX_KP_MAX || kp % 64) return 1;
    epi_t e = {corr, scale, scale_b, (double)lo, (double)hi, (int)f64, (int)half_even,
               (int)out_shift, (int)bshift};
    lin_t l = {x, (int)wide, rows, k, kp, ob, o, w, (const char *)b, (char *)out, &e};
    qp_for((rows + 15) / 16, 256 * ob * (1 + kp / 512), lin_part, &l);
    return 0;
}
#endif /* QPARITY_SIMDE */
