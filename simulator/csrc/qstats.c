/* The analysis' per-sample sums of a stage pair's layer (analysis/metrics.py, `sums`) in one
 * pass over both tensors, where numpy needs about twenty (float64 copies, differences,
 * products, histogram indices): the same quantities in the same float64 arithmetic.
 *
 * For row r of a (rows x n) and b, x = a[r, i] and y = b[r, i] read as float64, a value that
 * is not finite counted (a_nan, b_nan) and then read as 0, d = y - x:
 *   ab = sum x*y, aa = sum x*x, bb = sum y*y, d2 = sum d*d, d1 = sum |d|, dmax = max |d|,
 *   exact = #(|d| <= tol), a_sum = sum x, b_sum = sum y, a_min/a_max = min/max x,
 *   a_abs = max |x|, b_min/b_max = min/max y (initial values +inf, -inf, 0 as numpy's)
 * and with bins > 0 the counts ha[r, j] (hb: y) of j = trunc(clip((x - lo) * k, 0, bins-1)).
 * Sums run in element order (numpy sums pairwise: the results agree to rounding); the
 * histogram indices are the same float64 operations as numpy's, so the counts are equal. */
#include <math.h>
#include <stdint.h>

enum { AB, AA, BB, D2, D1, DMAX, EXACT, A_SUM, B_SUM, A_NAN, B_NAN, A_MIN, A_MAX, A_ABS,
       B_MIN, B_MAX, NSUMS };

static inline int64_t bin_of(double x, double lo, double k, int64_t bins) {
    double v = (x - lo) * k;
    v = v < 0.0 ? 0.0 : v;
    v = v > (double)(bins - 1) ? (double)(bins - 1) : v;
    return (int64_t)v;
}

#define PAIR_ROW(NAME, TA, TB)                                                                 \
    static void NAME(const TA *a, const TB *b, int64_t n, double tol, double lo, double k,     \
                     int64_t bins, double *s, double *ha, double *hb) {                        \
        double ab = 0, aa = 0, bb = 0, d2 = 0, d1 = 0, dmax = 0, exact = 0, as = 0, bs = 0;   \
        double an = 0, bn = 0, amin = INFINITY, amax = -INFINITY, aabs = 0;                   \
        double bmin = INFINITY, bmax = -INFINITY;                                              \
        for (int64_t i = 0; i < n; i++) {                                                      \
            double x = (double)a[i], y = (double)b[i];                                         \
            if (!isfinite(x)) { an += 1; x = 0.0; }                                           \
            if (!isfinite(y)) { bn += 1; y = 0.0; }                                           \
            double d = y - x, ad = fabs(d);                                                    \
            ab += x * y; aa += x * x; bb += y * y; d2 += d * d; d1 += ad;                      \
            dmax = ad > dmax ? ad : dmax;                                                      \
            exact += ad <= tol;                                                                \
            as += x; bs += y;                                                                  \
            amin = x < amin ? x : amin; amax = x > amax ? x : amax;                            \
            aabs = fabs(x) > aabs ? fabs(x) : aabs;                                            \
            bmin = y < bmin ? y : bmin; bmax = y > bmax ? y : bmax;                            \
            if (bins > 0) { ha[bin_of(x, lo, k, bins)] += 1; hb[bin_of(y, lo, k, bins)] += 1; } \
        }                                                                                      \
        double v[NSUMS] = {ab, aa, bb, d2, d1, dmax, exact, as, bs, an, bn, amin, amax, aabs, \
                           bmin, bmax};                                                        \
        for (int j = 0; j < NSUMS; j++) s[j] = v[j];                                           \
    }

PAIR_ROW(row_ff, float, float)
PAIR_ROW(row_fd, float, double)
PAIR_ROW(row_df, double, float)
PAIR_ROW(row_dd, double, double)

/* Row r's sums into out[r * NSUMS ...] (the enum's order), its counts into ha/hb[r * bins ...]
 * (zeroed by the caller; unused when bins is 0). a_f64/b_f64: 1 for float64 data, 0 for
 * float32; both C-contiguous. */
void qp_pair_sums(const void *a, int64_t a_f64, const void *b, int64_t b_f64, int64_t rows,
                  int64_t n, double tol, double lo, double k, int64_t bins, void *out, void *ha,
                  void *hb) {
    double *s = (double *)out, *pa = (double *)ha, *pb = (double *)hb;
    for (int64_t r = 0; r < rows; r++) {
        double *sr = s + r * NSUMS, *har = bins ? pa + r * bins : 0, *hbr = bins ? pb + r * bins : 0;
        if (a_f64 && b_f64)
            row_dd((const double *)a + r * n, (const double *)b + r * n, n, tol, lo, k, bins, sr, har, hbr);
        else if (a_f64)
            row_df((const double *)a + r * n, (const float *)b + r * n, n, tol, lo, k, bins, sr, har, hbr);
        else if (b_f64)
            row_fd((const float *)a + r * n, (const double *)b + r * n, n, tol, lo, k, bins, sr, har, hbr);
        else
            row_ff((const float *)a + r * n, (const float *)b + r * n, n, tol, lo, k, bins, sr, har, hbr);
    }
}
