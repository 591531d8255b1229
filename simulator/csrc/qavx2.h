/* The AVX2 build of the compiled kernels: the AVX-512 intrinsics they are written in, on a
 * CPU with AVX2 + FMA only (simulator/runtime/native.py builds this variant with
 * -DQPARITY_SIMDE -mavx2 -mfma when the CPU lacks AVX-512 VNNI).
 *
 * SIMDe (the simde-py package's headers) implements each 512-bit intrinsic as two 256-bit
 * halves. What SIMDe gets wrong or lacks is replaced here, so every kernel computes the same
 * integers as its AVX-512 build:
 *   - masked loads, stores and gathers touch only the lanes of their mask (SIMDe loads all
 *     lanes and blends, and its mask_storeu writes zeros to the others: past the end of a
 *     buffer, or into another thread's outputs);
 *   - _mm512_cvtpd_epi32 and the embedded-rounding forms, which SIMDe lacks: every caller
 *     asks for round to nearest even, the MXCSR default, so they are the plain forms;
 *   - dpbusd / dpwssd (VNNI), which SIMDe does lane by lane: exact AVX2 forms,
 *       dpbusd(s, a, b) = s + sum_{j<4} a[4i+j] * b[4i+j]   (a uint8, b int8)
 *       = s + madd16(even bytes of a, even of b) + madd16(odd of a, odd of b),
 *     each product |a b| <= 255 * 128 fits int16 pairs summed in int32 (vpmaddwd); the sum
 *     wraps modulo 2**32 like VNNI's.
 * qavx2_halves.h holds the rest: gathers, and the intrinsics SIMDe runs lane by lane or
 * through generic permutes, written as two AVX2 halves. */
#ifndef QPARITY_QAVX2_H
#define QPARITY_QAVX2_H
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <string.h>

#define QA static inline __attribute__((always_inline))

/* ---- masked loads: lanes outside k are 0 and never read ---- */
/* A whole vector and its low half (the rest 0) from p, in loads of the register's own
 * width. Through memcpy into a SIMDe 512-bit union the compiler copied 16 or 8 bytes at a
 * time to the stack and read back 32: a store-forwarding stall per load (LayerNorm's
 * weight loads and int8 row loads were 20% of its time). */
QA __m128i qa_low___m128i(const void *p) { return _mm_loadl_epi64((const __m128i *)p); }
QA __m256i qa_low___m256i(const void *p) {
    return _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128((const __m128i *)p), 0);
}
/* A SIMDe 512-bit value from its two 256-bit halves h[0], h[1] (64 bytes at h). */
#define QA_JOIN(vt) \
    QA vt qa_join_##vt(const void *h) { vt r; memcpy(&r, h, sizeof r); return r; }
QA_JOIN(__m512i)
QA_JOIN(__m512d)
QA_JOIN(__m512)
#undef QA_JOIN
QA __m128i qa_full___m128i(const void *p) { return _mm_loadu_si128((const __m128i *)p); }
QA __m256i qa_full___m256i(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
#define QA_WIDE_LOADS(vt)                                                          \
    QA vt qa_full_##vt(const void *p) {                                            \
        __m256i h[2] = {_mm256_loadu_si256((const __m256i *)p),                    \
                        _mm256_loadu_si256((const __m256i *)p + 1)};               \
        return qa_join_##vt(h);                                                    \
    }                                                                              \
    QA vt qa_low_##vt(const void *p) {                                             \
        __m256i h[2] = {_mm256_loadu_si256((const __m256i *)p), _mm256_setzero_si256()}; \
        return qa_join_##vt(h);                                                    \
    }
QA_WIDE_LOADS(__m512i)
QA_WIDE_LOADS(__m512d)
QA_WIDE_LOADS(__m512)
#undef QA_WIDE_LOADS
#define QA_MASKZ_LOAD(name, vt, et, n, mt, part)                               \
    static __attribute__((noinline, unused)) vt qa_part_##name(mt k, const void *p) { \
        et buf[n];                                                             \
        const et *s = (const et *)p;                                           \
        if ((k & (mt)(k + 1)) == 0) { /* the first lanes (a row's tail): one copy */ \
            memset(buf, 0, sizeof buf);                                        \
            memcpy(buf, s, (size_t)__builtin_popcountll(k) * sizeof(et));      \
        } else                                                                 \
            for (int i = 0; i < (n); i++) buf[i] = ((k >> i) & 1) ? s[i] : (et)0; \
        vt r;                                                                  \
        memcpy(&r, buf, sizeof r);                                             \
        return r;                                                              \
    }                                                                          \
    QA vt qa_##name(mt k, const void *p) {                                     \
        mt all = (mt)~(mt)0 >> (sizeof(mt) * 8 - (n));                         \
        if (k == all) return qa_full_##vt(p);                                  \
        if (k == (mt)(all >> (n) / 2)) return qa_low_##vt(p); /* the low half: \
                                          * 8 of 16 bytes, a 16-value row of 32 */ \
        return part(k, p);                                                     \
    }
/* Masks of 32- and 64-bit lanes: AVX2's own masked loads (VMASKMOV / VPMASKMOV), a half at
 * a time, which read no masked lane (no fault past an array's end) and stay in registers:
 * a LayerNorm row's tail through the buffer above cost it 20% of its time. */
QA __m256i qa_lanes32(unsigned k) { /* bit i of k as 32-bit lane i all ones */
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)(k & 0xFF)), bit), bit);
}
QA __m256i qa_lanes64(unsigned k) { /* bit i of k as 64-bit lane i all ones */
    const __m256i bit = _mm256_setr_epi64x(1, 2, 4, 8);
    return _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi64x(k & 0xF), bit), bit);
}
QA __m256i qa_mask8_epi32(__mmask8 k, const void *p) {
    return _mm256_maskload_epi32((const int *)p, qa_lanes32(k));
}
#define QA_MASK_HALVES(name, vt, ht, load, bits, per, mt)                         \
    QA vt qa_mask_##name(mt k, const void *p) {                                   \
        ht h[2] = {load(p, bits((unsigned)k)), load((const char *)p + 32, bits((unsigned)k >> (per)))}; \
        return qa_join_##vt(h);                                                   \
    }
#define QA_LOAD_PD(p, m) _mm256_maskload_pd((const double *)(p), m)
#define QA_LOAD_PS(p, m) _mm256_maskload_ps((const float *)(p), m)
#define QA_LOAD_EPI32(p, m) _mm256_maskload_epi32((const int *)(p), m)
QA_MASK_HALVES(mm512_maskz_loadu_pd, __m512d, __m256d, QA_LOAD_PD, qa_lanes64, 4, __mmask8)
QA_MASK_HALVES(mm512_maskz_loadu_ps, __m512, __m256, QA_LOAD_PS, qa_lanes32, 8, __mmask16)
QA_MASK_HALVES(mm512_maskz_loadu_epi32, __m512i, __m256i, QA_LOAD_EPI32, qa_lanes32, 8, __mmask16)
#undef QA_MASK_HALVES
#undef QA_LOAD_PD
#undef QA_LOAD_PS
#undef QA_LOAD_EPI32
QA_MASKZ_LOAD(mm_maskz_loadu_epi8, __m128i, int8_t, 16, __mmask16, qa_part_mm_maskz_loadu_epi8)
QA_MASKZ_LOAD(mm_maskz_loadu_epi16, __m128i, int16_t, 8, __mmask8, qa_part_mm_maskz_loadu_epi16)
QA_MASKZ_LOAD(mm256_maskz_loadu_epi8, __m256i, int8_t, 32, __mmask32, qa_part_mm256_maskz_loadu_epi8)
QA_MASKZ_LOAD(mm256_maskz_loadu_epi16, __m256i, int16_t, 16, __mmask16, qa_part_mm256_maskz_loadu_epi16)
QA_MASKZ_LOAD(mm256_maskz_loadu_epi32, __m256i, int32_t, 8, __mmask8, qa_mask8_epi32)
QA_MASKZ_LOAD(mm512_maskz_loadu_epi8, __m512i, int8_t, 64, __mmask64, qa_part_mm512_maskz_loadu_epi8)
QA_MASKZ_LOAD(mm512_maskz_loadu_epi16, __m512i, int16_t, 32, __mmask32, qa_part_mm512_maskz_loadu_epi16)
QA_MASKZ_LOAD(mm512_maskz_loadu_epi32, __m512i, int32_t, 16, __mmask16, qa_mask_mm512_maskz_loadu_epi32)
QA_MASKZ_LOAD(mm512_maskz_loadu_pd, __m512d, double, 8, __mmask8, qa_mask_mm512_maskz_loadu_pd)
QA_MASKZ_LOAD(mm512_maskz_loadu_ps, __m512, float, 16, __mmask16, qa_mask_mm512_maskz_loadu_ps)
#undef _mm_maskz_loadu_epi8
#undef _mm_maskz_loadu_epi16
#undef _mm256_maskz_loadu_epi8
#undef _mm256_maskz_loadu_epi16
#undef _mm256_maskz_loadu_epi32
#undef _mm512_maskz_loadu_epi8
#undef _mm512_maskz_loadu_epi16
#undef _mm512_maskz_loadu_epi32
#undef _mm512_maskz_loadu_pd
#undef _mm512_maskz_loadu_ps
#define _mm_maskz_loadu_epi8 qa_mm_maskz_loadu_epi8
#define _mm_maskz_loadu_epi16 qa_mm_maskz_loadu_epi16
#define _mm256_maskz_loadu_epi8 qa_mm256_maskz_loadu_epi8
#define _mm256_maskz_loadu_epi16 qa_mm256_maskz_loadu_epi16
#define _mm256_maskz_loadu_epi32 qa_mm256_maskz_loadu_epi32
#define _mm512_maskz_loadu_epi8 qa_mm512_maskz_loadu_epi8
#define _mm512_maskz_loadu_epi16 qa_mm512_maskz_loadu_epi16
#define _mm512_maskz_loadu_epi32 qa_mm512_maskz_loadu_epi32
#define _mm512_maskz_loadu_pd qa_mm512_maskz_loadu_pd
#define _mm512_maskz_loadu_ps qa_mm512_maskz_loadu_ps

/* ---- masked stores: only the lanes of k are written ---- */
#define QA_MASK_STORE(name, vt, et, n, mt)                                       \
    static __attribute__((noinline)) void qa_part_##name(void *p, mt k, vt v) { \
        et w[n], *d = (et *)p;                                                   \
        memcpy(w, &v, sizeof w);                                                 \
        if ((k & (mt)(k + 1)) == 0) { /* the first lanes: one copy */           \
            memcpy(d, w, (size_t)__builtin_popcountll(k) * sizeof(et));          \
            return;                                                              \
        }                                                                        \
        for (int i = 0; i < (n); i++)                                            \
            if ((k >> i) & 1) d[i] = w[i];                                       \
    }                                                                            \
    QA void qa_##name(void *p, mt k, vt v) {                                     \
        if (k != (mt)~(mt)0 >> (sizeof(mt) * 8 - (n))) {                         \
            qa_part_##name(p, k, v);                                             \
            return;                                                              \
        }                                                                        \
        memcpy(p, &v, sizeof v); /* every lane: one unmasked store */            \
    }
QA_MASK_STORE(mm_mask_storeu_epi8, __m128i, int8_t, 16, __mmask16)
QA_MASK_STORE(mm_mask_storeu_epi16, __m128i, int16_t, 8, __mmask8)
QA_MASK_STORE(mm256_mask_storeu_epi16, __m256i, int16_t, 16, __mmask16)
QA_MASK_STORE(mm256_mask_storeu_epi32, __m256i, int32_t, 8, __mmask8)
QA_MASK_STORE(mm512_mask_storeu_epi8, __m512i, int8_t, 64, __mmask64)
QA_MASK_STORE(mm512_mask_storeu_epi16, __m512i, int16_t, 32, __mmask32)
QA_MASK_STORE(mm512_mask_storeu_epi32, __m512i, int32_t, 16, __mmask16)
QA_MASK_STORE(mm512_mask_storeu_ps, __m512, float, 16, __mmask16)

/* Truncating narrowings (vpmovdw, vpmovdb) of 8 int32 lanes: int16 lanes, or int8 lanes in
 * the low 8 bytes, by one byte shuffle per 128-bit lane and one unpack. */
QA __m128i qa_narrow8_epi16(__m256i v) {
    const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i s = _mm256_shuffle_epi8(v, pick);
    return _mm_unpacklo_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}
QA __m128i qa_narrow8_epi8(__m256i v) {
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i s = _mm256_shuffle_epi8(v, pick);
    return _mm_unpacklo_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}
QA __m256i qa_mm512_cvtepi32_epi16(__m512i x) {
    __m256i h[2];
    memcpy(h, &x, sizeof h);
    return _mm256_set_m128i(qa_narrow8_epi16(h[1]), qa_narrow8_epi16(h[0]));
}
QA __m128i qa_mm512_cvtepi32_epi8(__m512i x) {
    __m256i h[2];
    memcpy(h, &x, sizeof h);
    return _mm_unpacklo_epi64(qa_narrow8_epi8(h[0]), qa_narrow8_epi8(h[1]));
}

/* Narrowing masked stores: narrowed in registers, then stored as the lanes of k. */
QA void qa_mm256_mask_cvtepi32_storeu_epi8(void *p, __mmask8 k, __m256i v) {
    __m128i w = qa_narrow8_epi8(v);
    if (k == 0xFF) _mm_storel_epi64((__m128i *)p, w);
    else qa_part_mm_mask_storeu_epi8(p, k, w);
}
QA void qa_mm256_mask_cvtepi32_storeu_epi16(void *p, __mmask8 k, __m256i v) {
    qa_mm_mask_storeu_epi16(p, k, qa_narrow8_epi16(v));
}
QA void qa_mm512_mask_cvtepi32_storeu_epi8(void *p, __mmask16 k, __m512i v) {
    qa_mm_mask_storeu_epi8(p, k, qa_mm512_cvtepi32_epi8(v));
}
QA void qa_mm512_mask_cvtepi32_storeu_epi16(void *p, __mmask16 k, __m512i v) {
    qa_mm256_mask_storeu_epi16(p, k, qa_mm512_cvtepi32_epi16(v));
}
#undef _mm_mask_storeu_epi8
#undef _mm_mask_storeu_epi16
#undef _mm256_mask_storeu_epi16
#undef _mm256_mask_storeu_epi32
#undef _mm256_mask_cvtepi32_storeu_epi8
#undef _mm256_mask_cvtepi32_storeu_epi16
#undef _mm512_mask_storeu_epi8
#undef _mm512_mask_storeu_epi16
#undef _mm512_mask_storeu_epi32
#undef _mm512_mask_storeu_ps
#undef _mm512_mask_cvtepi32_storeu_epi8
#undef _mm512_mask_cvtepi32_storeu_epi16
#undef _mm512_cvtepi32_epi16
#undef _mm512_cvtepi32_epi8
#define _mm_mask_storeu_epi8 qa_mm_mask_storeu_epi8
#define _mm_mask_storeu_epi16 qa_mm_mask_storeu_epi16
#define _mm256_mask_storeu_epi16 qa_mm256_mask_storeu_epi16
#define _mm256_mask_storeu_epi32 qa_mm256_mask_storeu_epi32
#define _mm256_mask_cvtepi32_storeu_epi8 qa_mm256_mask_cvtepi32_storeu_epi8
#define _mm256_mask_cvtepi32_storeu_epi16 qa_mm256_mask_cvtepi32_storeu_epi16
#define _mm512_mask_storeu_epi8 qa_mm512_mask_storeu_epi8
#define _mm512_mask_storeu_epi16 qa_mm512_mask_storeu_epi16
#define _mm512_mask_storeu_epi32 qa_mm512_mask_storeu_epi32
#define _mm512_mask_storeu_ps qa_mm512_mask_storeu_ps
#define _mm512_mask_cvtepi32_storeu_epi8 qa_mm512_mask_cvtepi32_storeu_epi8
#define _mm512_mask_cvtepi32_storeu_epi16 qa_mm512_mask_cvtepi32_storeu_epi16
#define _mm512_cvtepi32_epi16 qa_mm512_cvtepi32_epi16
#define _mm512_cvtepi32_epi8 qa_mm512_cvtepi32_epi8

/* ---- what SIMDe lacks: conversions and embedded rounding (round to nearest even) ---- */
QA __m256i qa_mm512_cvtpd_epi32(__m512d y) {
    __m256d h[2];
    memcpy(h, &y, sizeof h);
    __m128i lo = _mm256_cvtpd_epi32(_mm256_round_pd(h[0], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m128i hi = _mm256_cvtpd_epi32(_mm256_round_pd(h[1], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return _mm256_set_m128i(hi, lo);
}
#undef _mm512_cvtpd_epi32
#undef _mm512_cvt_roundpd_epi32
#undef _mm512_cvt_roundps_epi32
#undef _mm512_add_round_pd
#undef _mm512_fmadd_round_pd
#define _mm512_cvtpd_epi32 qa_mm512_cvtpd_epi32
#define _mm512_cvt_roundpd_epi32(y, r) qa_mm512_cvtpd_epi32(y)
#define _mm512_cvt_roundps_epi32(y, r) _mm512_cvtps_epi32(_mm512_roundscale_ps((y), 0))
#define _mm512_add_round_pd(a, b, r) _mm512_add_pd((a), (b))
#define _mm512_fmadd_round_pd(a, b, c, r) _mm512_fmadd_pd((a), (b), (c))

/* ---- what SIMDe 0.8 lacks: lane conversions (truncating like vpmovdw / vpmovdb) ---- */
#define QA_CVT(name, vin, ein, nin, vout, eout)       \
    QA vout qa_##name(vin x) {                        \
        ein a[nin];                                   \
        eout b[sizeof(vout) / sizeof(eout)];          \
        memcpy(a, &x, sizeof a);                      \
        memset(b, 0, sizeof b);                       \
        for (int i = 0; i < (nin); i++) b[i] = (eout)a[i]; \
        vout r;                                       \
        memcpy(&r, b, sizeof r);                      \
        return r;                                     \
    }
QA_CVT(mm512_cvttpd_epi64, __m512d, double, 8, __m512i, int64_t)
/* Widening conversions as two AVX2 halves (the loop above ran lane by lane: a vpextrb and
 * a scalar store per lane, 60% of the transformer's residual adds). */
#define QA_WIDEN(name, vin, vout, ht, lo, hi)         \
    QA vout qa_##name(vin x) {                        \
        ht h[2] = {lo, hi};                           \
        return qa_join_##vout(h);                     \
    }
QA_WIDEN(mm512_cvtepi32_pd, __m256i, __m512d, __m256d, _mm256_cvtepi32_pd(_mm256_castsi256_si128(x)),
         _mm256_cvtepi32_pd(_mm256_extracti128_si256(x, 1)))
QA_WIDEN(mm512_cvtepi8_epi32, __m128i, __m512i, __m256i, _mm256_cvtepi8_epi32(x),
         _mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)))
QA_WIDEN(mm512_cvtepu8_epi32, __m128i, __m512i, __m256i, _mm256_cvtepu8_epi32(x),
         _mm256_cvtepu8_epi32(_mm_srli_si128(x, 8)))
QA_WIDEN(mm512_cvtps_pd, __m256, __m512d, __m256d, _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
         _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)))
#undef QA_WIDEN
#undef _mm512_cvtepi32_pd
#define _mm512_cvtepi32_pd qa_mm512_cvtepi32_pd
#undef _mm512_cvtepi8_epi32
#define _mm512_cvtepi8_epi32 qa_mm512_cvtepi8_epi32
#undef _mm512_cvtepu8_epi32
#define _mm512_cvtepu8_epi32 qa_mm512_cvtepu8_epi32
#undef _mm512_cvtps_pd
#define _mm512_cvtps_pd qa_mm512_cvtps_pd
#undef _mm512_cvttpd_epi64
#define _mm512_cvttpd_epi64 qa_mm512_cvttpd_epi64

/* getexp: floor(log2 |x|) (denormals normalized, -inf for 0, inf for inf, NaN for NaN). */
QA __m512d qa_mm512_getexp_pd(__m512d x) {
    double a[8];
    memcpy(a, &x, sizeof a);
    for (int i = 0; i < 8; i++)
        a[i] = a[i] == 0 ? -__builtin_inf() : __builtin_isnan(a[i]) ? a[i]
             : __builtin_isinf(a[i]) ? __builtin_inf() : (double)__builtin_ilogb(a[i]);
    memcpy(&x, a, sizeof a);
    return x;
}
#undef _mm512_getexp_pd
#define _mm512_getexp_pd qa_mm512_getexp_pd

/* fpclass: bit 0 QNaN, 1 +0, 2 -0, 3 +inf, 4 -inf, 5 denormal, 6 negative finite, 7 SNaN. */
#define QA_FPCLASS(name, vt, et, n, mt, ut)                                             \
    QA mt qa_##name(mt k, vt x, int imm) {                                              \
        et a[n];                                                                        \
        memcpy(a, &x, sizeof a);                                                        \
        mt r = 0;                                                                       \
        for (int i = 0; i < (n); i++) {                                                 \
            et v = a[i];                                                                \
            ut bits;                                                                    \
            memcpy(&bits, &v, sizeof bits);                                             \
            int neg = __builtin_signbit(v) != 0, c;                                     \
            if (__builtin_isnan(v))                                                     \
                c = (bits >> (sizeof(ut) * 8 - (sizeof(et) == 8 ? 13 : 10))) & 1 ? 0x01 : 0x80; \
            else if (__builtin_isinf(v)) c = neg ? 0x10 : 0x08;                         \
            else if (v == 0) c = neg ? 0x04 : 0x02;                                     \
            else c = (__builtin_isnormal(v) ? 0 : 0x20) | (neg ? 0x40 : 0);             \
            if (((k >> i) & 1) && (c & imm)) r |= (mt)(1u << i);                        \
        }                                                                               \
        return r;                                                                       \
    }
QA_FPCLASS(mm512_mask_fpclass_ps_mask, __m512, float, 16, __mmask16, uint32_t)
QA_FPCLASS(mm512_mask_fpclass_pd_mask, __m512d, double, 8, __mmask8, uint64_t)
#undef _mm512_mask_fpclass_ps_mask
#define _mm512_mask_fpclass_ps_mask qa_mm512_mask_fpclass_ps_mask
#undef _mm512_mask_fpclass_pd_mask
#define _mm512_mask_fpclass_pd_mask qa_mm512_mask_fpclass_pd_mask
#define _mm512_mask_cmp_pd_mask(k, a, b, p) ((__mmask8)((k) & _mm512_cmp_pd_mask((a), (b), (p))))

/* Reductions in GCC's order for the AVX-512 build (halves, then quarters, then the pair),
 * so float sums round as there. */
QA int qa_mm512_reduce_add_epi32(__m512i x) {
    int32_t a[16];
    uint32_t s = 0;
    memcpy(a, &x, sizeof a);
    for (int i = 0; i < 16; i++) s += (uint32_t)a[i];
    return (int32_t)s;
}
QA double qa_mm512_reduce_add_pd(__m512d x) {
    double a[8], h[4], q[2];
    memcpy(a, &x, sizeof a);
    for (int i = 0; i < 4; i++) h[i] = a[i + 4] + a[i];
    q[0] = h[2] + h[0], q[1] = h[3] + h[1];
    return q[0] + q[1];
}
#undef _mm512_reduce_add_epi32
#define _mm512_reduce_add_epi32 qa_mm512_reduce_add_epi32
#undef _mm512_reduce_add_pd
#define _mm512_reduce_add_pd qa_mm512_reduce_add_pd

/* roundscale with scale 0 (imm bits 7:4 zero, as every caller passes): SIMDe's ignores
 * _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC; vroundps / vroundpd take the same low bits. */
#define QA_ROUNDSCALE(name, vt, ht, rnd)                                           \
    QA vt qa_##name(vt x, int imm) {                                               \
        ht h[2];                                                                   \
        memcpy(h, &x, sizeof h);                                                   \
        for (int i = 0; i < 2; i++) switch (imm & 3) {                             \
            case 0: h[i] = rnd(h[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); break; \
            case 1: h[i] = rnd(h[i], _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); break;     \
            case 2: h[i] = rnd(h[i], _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); break;     \
            default: h[i] = rnd(h[i], _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC); break;       \
        }                                                                          \
        memcpy(&x, h, sizeof h);                                                   \
        return x;                                                                  \
    }
QA_ROUNDSCALE(mm512_roundscale_ps, __m512, __m256, _mm256_round_ps)
QA_ROUNDSCALE(mm512_roundscale_pd, __m512d, __m256d, _mm256_round_pd)
#undef _mm512_roundscale_ps
#undef _mm512_roundscale_pd
#define _mm512_roundscale_ps qa_mm512_roundscale_ps
#define _mm512_roundscale_pd qa_mm512_roundscale_pd

/* ---- VNNI as exact AVX2 (see the top) ---- */
QA __m256i qa_dpbusd256(__m256i s, __m256i a, __m256i b) {
    const __m256i lo = _mm256_set1_epi16(0x00FF);
    __m256i ae = _mm256_and_si256(a, lo), ao = _mm256_srli_epi16(a, 8);
    __m256i be = _mm256_srai_epi16(_mm256_slli_epi16(b, 8), 8), bo = _mm256_srai_epi16(b, 8);
    __m256i p = _mm256_add_epi32(_mm256_madd_epi16(ae, be), _mm256_madd_epi16(ao, bo));
    return _mm256_add_epi32(s, p);
}

QA __m256i qa_dpwssd256(__m256i s, __m256i a, __m256i b) {
    return _mm256_add_epi32(s, _mm256_madd_epi16(a, b));
}

/* The 512-bit form `name` of a 256-bit accumulate f(s, a, b): f on each half. */
#define QA_HALVES(name, f)                                                                \
    QA __m512i name(__m512i s, __m512i a, __m512i b) {                                    \
        __m256i sv[2], av[2], bv[2];                                                      \
        memcpy(sv, &s, sizeof sv), memcpy(av, &a, sizeof av), memcpy(bv, &b, sizeof bv); \
        sv[0] = f(sv[0], av[0], bv[0]);                                                   \
        sv[1] = f(sv[1], av[1], bv[1]);                                                   \
        __m512i r;                                                                        \
        memcpy(&r, sv, sizeof r);                                                         \
        return r;                                                                         \
    }
QA_HALVES(qa_mm512_dpbusd_epi32, qa_dpbusd256)
QA_HALVES(qa_mm512_dpwssd_epi32, qa_dpwssd256)
#undef _mm512_dpbusd_epi32
#undef _mm512_dpwssd_epi32
#define _mm512_dpbusd_epi32 qa_mm512_dpbusd_epi32
#define _mm512_dpwssd_epi32 qa_mm512_dpwssd_epi32

#include "qavx2_halves.h"

#endif
