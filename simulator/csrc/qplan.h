/* The runners of frozen plans (qplan.c), for their numpy entries (qnpy.c). */
#ifndef QPARITY_QPLAN_H
#define QPARITY_QPLAN_H
#include <stdint.h>

/* OpenMP's thread count for the regions the calling thread opens from now on (n > 0; 0
 * leaves it); returns the count before. */
int qp_threads(int64_t n);

/* A frozen plan's run on n threads (its plan array: simulator/runtime/frozen.Slots.pointers),
 * inputs[k] the data pointer of input k; timed into plan[8] when `timed`. 1 when every
 * call ran, else 0. */
int64_t qp_plan_fast(const int64_t *plan, const int64_t *inputs, int64_t n, int64_t timed);

/* A batch split's chunks on nplans plans over n threads (qplan.c says how). */
int64_t qp_run_chunks(int64_t nplans, const int64_t *const *plans, int64_t nchunks, int64_t n,
                      int64_t nin, const int64_t *in_base, const int64_t *in_step, int64_t nout,
                      const int64_t *out_src, const int64_t *out_bytes, const int64_t *out_dst,
                      int64_t ngroups, double *acc);
#endif
