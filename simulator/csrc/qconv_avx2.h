/* The AVX2 build's conv micro-kernel (qconv.c includes this in place of its VNNI one):
 * window2, window4 and micro on ymm registers. conv_t, TGT and the epilogue come from
 * qconv.c and qepi.h. */
#ifndef QPARITY_QCONV_AVX2_H
#define QPARITY_QCONV_AVX2_H

/* The AVX2 build (no VNNI; qavx2.h): 16 zmm accumulators would be 32 ymm, so the register
 * block is re-tiled here as one channel block x 2 pixels (window2) or 4 (window4), the
 * whole window summed in ymm registers, then written to acc[] for the same epilogue.
 * Exact, wrapping modulo 2**32. window2, signed int8 (read raw: FLIP is always 1 here,
 * as this build's int8 inputs are): the 4-byte group x0..x3 as xu
 * (uint8) zero-extended to int16 and broadcast per 64 bits, the block's weights [16][4]
 * int8 sign-extended to int16 (4 channels a ymm): vpmaddwd gives each channel (x0 w0 +
 * x1 w1, x2 w2 + x3 w3), summed at the end. */
AI __m256i bcast_i32(const uint8_t *p) {
    int32_t two;
    memcpy(&two, p, 4);
    return _mm256_set1_epi32(two);
}

/* The raw 4-byte group at p as xu = x ^ 0x80: a broadcast load; the low 8 bytes of each
 * 128-bit lane, interleaved with zeros, are the group as 4 uint16 twice. */
AI __m256i bcast_u16x4(const uint8_t *p) {
    __m256i d = _mm256_xor_si256(bcast_i32(p), _mm256_set1_epi8((char)0x80));
    return _mm256_unpacklo_epi8(d, _mm256_setzero_si256());
}

/* Channels 0-7 of four accumulators of 4 channels x 2 partial sums: lanes (2i, 2i + 1). */
AI __m256i pair_sums(__m256i a, __m256i b) {
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0xD8);
}

/* One channel block (weights wb) at pixels x0 and x1 of a signed int8 input: s[pixel][half]
 * (channels 0-7, 8-15). */
AI void window2(const uint8_t *x0, const uint8_t *x1, const int8_t *wb, const conv_t *c,
                __m256i s[2][2]) {
    int64_t kstep = c->ob * 64;
    __m256i a[2][4];
    for (int p = 0; p < 2; p++)
        for (int q = 0; q < 4; q++) a[p][q] = _mm256_setzero_si256();
    for (int64_t t = 0; t < c->kh * c->kw; t++) {
        const int8_t *wt = wb + t * c->c4 * kstep;
        const uint8_t *p0 = x0 + c->toff[t], *p1 = x1 + c->toff[t];
        for (int64_t k = 0; k < c->c4; k++) {
            const int8_t *w = wt + k * kstep;
            __m256i u = bcast_u16x4(p0 + 4 * k), v = bcast_u16x4(p1 + 4 * k);
            for (int q = 0; q < 4; q++) {
                __m256i wq = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16 * q)));
                a[0][q] = _mm256_add_epi32(a[0][q], _mm256_madd_epi16(u, wq));
                a[1][q] = _mm256_add_epi32(a[1][q], _mm256_madd_epi16(v, wq));
            }
        }
    }
    for (int p = 0; p < 2; p++) {
        s[p][0] = pair_sums(a[p][0], a[p][1]);
        s[p][1] = pair_sums(a[p][2], a[p][3]);
    }
}

/* Four pixels at px, one channel block (weights wb), summed in 8 ymm registers; each
 * broadcast 4-byte group serves 16 channels in 4 multiplies (window2: 8, and 4 widenings):
 *   WIDE (int16 input): (x0, x1) times the block's weights [16][2] int16 (2 ymm of 8
 *     channels): VPMADDWD gives x0 w0 + x1 w1 per channel (VPDPWSSD's products);
 *   the non-negative form (conv_t.ub: every int8 input value in [0, 127], found per call by
 *     qp_conv): VPMADDUBSW multiplies the input bytes x (unsigned) by the weights [16][4]
 *     int8 (signed, 2 ymm of 8 channels as they lie) and adds each pair into int16, exact
 *     as |x0 w0 + x1 w1| <= 2 * 127 * 128 = 32512 < 2**15; VPMADDWD by ones adds a
 *     channel's two pairs into int32. x itself (this build's inputs are raw, PAD_XOR),
 *     not xu: the sums start from bias (corr + 128 * sum of the weights). */
AI void window4(const uint8_t *const *px, const int8_t *wb, const conv_t *c, int WIDE,
                __m256i s[4][2]) {
    int64_t kstep = c->ob * 64;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a[4][2];
    for (int p = 0; p < 4; p++) a[p][0] = a[p][1] = _mm256_setzero_si256();
    for (int64_t t = 0; t < c->kh * c->kw; t++) {
        const int8_t *wt = wb + t * c->c4 * kstep;
        for (int64_t k = 0; k < c->c4; k++) {
            const int8_t *w = wt + k * kstep;
            __m256i w0 = _mm256_loadu_si256((const __m256i *)w);
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + 32));
            for (int p = 0; p < 4; p++) {
                __m256i bx = bcast_i32(px[p] + c->toff[t] + 4 * k); /* from memory: a load */
                a[p][0] = _mm256_add_epi32(a[p][0], WIDE ? _mm256_madd_epi16(bx, w0)
                                                         : _mm256_madd_epi16(_mm256_maddubs_epi16(bx, w0), ones));
                a[p][1] = _mm256_add_epi32(a[p][1], WIDE ? _mm256_madd_epi16(bx, w1)
                                                         : _mm256_madd_epi16(_mm256_maddubs_epi16(bx, w1), ones));
                __asm__("" : "+x"(a[p][0]), "+x"(a[p][1])); /* keeps them in registers */
            }
        }
    }
    for (int p = 0; p < 4; p++) s[p][0] = a[p][0], s[p][1] = a[p][1];
}

TGT AI void micro(const uint8_t *const *xs, const int8_t *wb, const int32_t *corr,
                  const conv_t *c, int NB, int NP, int WIDE, int FLIP, __m512i *acc) {
    (void)FLIP; /* 1 for every int8 input of this build (raw: PAD_XOR 0) */
    for (int b = 0; b < NB; b++) {
        __m256i c0 = _mm256_loadu_si256((const __m256i *)(corr + b * 16));
        __m256i c1 = _mm256_loadu_si256((const __m256i *)(corr + b * 16 + 8));
        if (WIDE || c->ub) { /* NP 12: 3 blocks of 4 pixels */
            for (int p = 0; p < NP; p += 4) {
                __m256i s[4][2];
                if (WIDE) window4(xs + p, wb + b * 64, c, 1, s);
                else window4(xs + p, wb + b * 64, c, 0, s);
                for (int q = 0; q < 4; q++) {
                    __m256i both[2] = {_mm256_add_epi32(s[q][0], c0), _mm256_add_epi32(s[q][1], c1)};
                    memcpy(&acc[b * NP + p + q], both, sizeof both);
                }
            }
            continue;
        }
        for (int p = 0; p < NP; p += 2) {
            __m256i s[2][2];
            window2(xs[p], xs[p + 1 < NP ? p + 1 : p], wb + b * 64, c, s);
            for (int q = 0; q < 2 && p + q < NP; q++) {
                __m256i both[2] = {_mm256_add_epi32(s[q][0], c0), _mm256_add_epi32(s[q][1], c1)};
                memcpy(&acc[b * NP + p + q], both, sizeof both);
            }
        }
    }
}

#endif
