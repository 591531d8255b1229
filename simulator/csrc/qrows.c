/* The executor's compiled row kernels: REDUCE_MEAN over trailing axes and QMul, requantize
 * fused (simulator/exec_native_rows.py proves the bounds and calls them).
 *
 * Both evaluate the float64 formulas of the torch path, operation for operation, on
 * values the caller proved exact, so they give the same integers:
 *   mean: y[r] = clamp(round(fl(sum_i x[r, i] * m) / d), lo, hi)      (round_quotient)
 *   mul:  y[k] = clamp(round(a[k] * b[k'] * scale), lo, hi)          (scaled epilogue)
 * with d = n * 2**shift, scale = mult * 2**-shift, b[k'] = b[k] (same shape) or b[r] for
 * every element of row r (a per-row operand, e.g. [N, C, 1, 1] against [N, C, H, W]).
 * round: half_even = roundeven; bpu_round = sign(y) * floor(|y| + 0.5). lo already holds
 * relu. Inputs int8 or int16 (wide), outputs int8 / int16 / int32 (1 << out_shift bytes).
 */
#include <math.h>
#include <stdint.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#define AI __attribute__((always_inline)) static inline
#define PAR_MIN 32768 /* elements below which one thread does the work */

AI double ld(const void *p, int64_t i, int wide) {
    return wide ? (double)((const int16_t *)p)[i] : (double)((const int8_t *)p)[i];
}

AI double round_clamp(double y, int half_even, double lo, double hi) {
    y = half_even ? __builtin_roundeven(y) : copysign(floor(fabs(y) + 0.5), y);
    return y < lo ? lo : y > hi ? hi : y;
}

AI void st(void *out, int64_t i, double y, int out_shift) {
    if (out_shift == 0) ((int8_t *)out)[i] = (int8_t)y;
    else if (out_shift == 1) ((int16_t *)out)[i] = (int16_t)y;
    else ((int32_t *)out)[i] = (int32_t)y;
}

TGT void qp_mean(const void *x, int64_t wide, int64_t rows, int64_t inner, double m, double d,
                 double lo, double hi, int64_t half_even, void *out, int64_t out_shift) {
#pragma omp parallel for schedule(static) if (rows * inner >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t sum = 0;
        if (wide)
            for (int64_t i = 0; i < inner; i++) sum += ((const int16_t *)x)[r * inner + i];
        else
            for (int64_t i = 0; i < inner; i++) sum += ((const int8_t *)x)[r * inner + i];
        st(out, r, round_clamp((double)sum * m / d, (int)half_even, lo, hi), (int)out_shift);
    }
}

TGT AI void mul_row(const void *a, int wa, const void *b, int wb, int64_t r, int64_t inner,
                    int per_row, double scale, int half_even, double lo, double hi, void *out,
                    int out_shift) {
    double br = per_row ? ld(b, r, wb) * scale : 0.0;
    for (int64_t i = r * inner; i < (r + 1) * inner; i++) {
        double y = per_row ? ld(a, i, wa) * br : ld(a, i, wa) * ld(b, i, wb) * scale;
        st(out, i, round_clamp(y, half_even, lo, hi), out_shift);
    }
}

TGT void qp_mul(const void *a, int64_t wa, const void *b, int64_t wb, int64_t rows,
                int64_t inner, int64_t per_row, double scale, double lo, double hi,
                int64_t half_even, void *out, int64_t out_shift) {
#pragma omp parallel for schedule(static) if (rows * inner >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        if (!wa && !wb && !out_shift && half_even)
            mul_row(a, 0, b, 0, r, inner, (int)per_row, scale, 1, lo, hi, out, 0);
        else if (!wa && !wb && !out_shift)
            mul_row(a, 0, b, 0, r, inner, (int)per_row, scale, 0, lo, hi, out, 0);
        else
            mul_row(a, (int)wa, b, (int)wb, r, inner, (int)per_row, scale, (int)half_even, lo,
                    hi, out, (int)out_shift);
    }
}
