/* The runner of a frozen plan (simulator/runtime/frozen.py): its calls in one ctypes call.
 *
 * Every argument of every call is an int64 slot (simulator/runtime/packed.py); qp_packed, written
 * from the kernels' ctypes signatures at build time, holds one wrapper per kernel that
 * unpacks its slots and calls it. */
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "qplan.h"
#include "qpool.h"

extern int64_t (*const qp_packed[])(const int64_t *);

static double seconds_since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* Set the nfill input pointers (fill: triples slot, input j, byte offset: slots[slot] =
 * inputs[j] + offset), then run calls 0 .. n-1: call i is kernel[i] (qp_packed's index) on
 * slots[start[i] ..]. Stops at the first call that returns another value than rc[i] and
 * returns its index; n when all ran. seconds (NULL: not timed) gets the time of the calls
 * of each group (group[i]: the call's instruction; one instruction's calls are adjacent). */
int64_t qp_run_plan(int64_t n, const int64_t *kernel, const int64_t *start, int64_t *slots,
                    const int64_t *rc, int64_t nfill, const int64_t *fill, const int64_t *inputs,
                    const int64_t *group, double *seconds) {
    for (int64_t f = 0; f < nfill; f++) slots[fill[3 * f]] = inputs[fill[3 * f + 1]] + fill[3 * f + 2];
    for (int64_t i = 0; i < n; i++) {
        struct timespec t0;
        if (seconds) clock_gettime(CLOCK_MONOTONIC, &t0);
        int64_t r = qp_packed[kernel[i]](slots + start[i]);
        if (seconds) seconds[group[i]] = (i && group[i] == group[i - 1] ? seconds[group[i]] : 0.0) + seconds_since(&t0);
        if (r != rc[i]) return i;
    }
    return n;
}

/* qp_run_plan of a plan array: its arguments but inputs and seconds in plan[0 .. 8]
 * (Slots.pointers(): plan[0] the call count, plan[8] the seconds array); 1 when every call
 * ran, else 0. */
static int run_plan_array(const int64_t *plan, const int64_t *inputs, double *seconds) {
    return qp_run_plan(plan[0], (const int64_t *)plan[1], (const int64_t *)plan[2],
                       (int64_t *)plan[3], (const int64_t *)plan[4], plan[5],
                       (const int64_t *)plan[6], inputs, (const int64_t *)plan[7],
                       seconds) == plan[0];
}

/* A frozen plan's fast run: the calling thread's OpenMP thread count n for the calls
 * (restored after), the pool's sleeping workers woken first when n > 1 (qp_pool_wake) so
 * that they spin by its first parallel job, then the plan, timed into plan[8] when
 * `timed`. Returns 1 when every call ran, else 0. */
int64_t qp_plan_fast(const int64_t *plan, const int64_t *inputs, int64_t n, int64_t timed) {
    int prev = qp_threads(n);
    if (n > 1) qp_pool_wake();
    int done = run_plan_array(plan, inputs, timed ? (double *)plan[8] : NULL);
    qp_threads(prev);
    return done;
}

/* A batch split's chunks (simulator/runtime/split.py) on the pool in one call. Task t runs
 * plan t (one executor's frozen plan, qp_plan_fast's plan array) on chunk after chunk while
 * one is left: chunk j's input k at in_base[k] + j * in_step[k]; after each run it copies
 * output m from out_src[t * nout + m] to out_dst[m] + j * out_bytes[m], before its plan's
 * next run writes there again. Task 0 (the caller claims it first: qpool.c) adds its
 * plan's seconds per instruction (ngroups of them) into acc when timed. */
typedef struct {
    const int64_t *const *plans;
    int64_t nchunks, nin, nout, ngroups, timed;
    const int64_t *in_base, *in_step, *out_src, *out_bytes, *out_dst;
    double *acc;
    _Atomic int64_t next, failed;
} chunks_t;

static int run_chunk(chunks_t *c, int64_t t, int64_t j) {
    const int64_t *plan = c->plans[t];
    int64_t inputs[c->nin > 0 ? c->nin : 1];
    for (int64_t k = 0; k < c->nin; k++) inputs[k] = c->in_base[k] + j * c->in_step[k];
    double *seconds = c->timed && t == 0 ? (double *)plan[8] : NULL;
    if (!run_plan_array(plan, inputs, seconds)) return 0;
    for (int64_t m = 0; m < c->nout; m++)
        memcpy((char *)c->out_dst[m] + j * c->out_bytes[m],
               (const char *)c->out_src[t * c->nout + m], (size_t)c->out_bytes[m]);
    for (int64_t g = 0; seconds && g < c->ngroups; g++) c->acc[g] += seconds[g];
    return 1;
}

static void chunk_tasks(void *p, int64_t t0, int64_t t1) {
    chunks_t *c = p;
    for (int64_t t = t0; t < t1; t++) {
        int prev = qp_threads(1); /* each chunk on its task's thread alone */
        for (int64_t j; !atomic_load(&c->failed) && (j = atomic_fetch_add(&c->next, 1)) < c->nchunks;)
            if (!run_chunk(c, t, j)) atomic_store(&c->failed, 1);
        qp_threads(prev);
    }
}

/* Runs the chunks on nplans tasks over n threads; 1 when every chunk ran, 0 when a call
 * of some plan returned another value than recorded (the caller then runs the batch its
 * own way: what was written here is the caller's scratch). */
int64_t qp_run_chunks(int64_t nplans, const int64_t *const *plans, int64_t nchunks, int64_t n,
                      int64_t nin, const int64_t *in_base, const int64_t *in_step, int64_t nout,
                      const int64_t *out_src, const int64_t *out_bytes, const int64_t *out_dst,
                      int64_t ngroups, double *acc) {
    chunks_t c = {plans, nchunks, nin, nout, ngroups, acc != NULL, in_base, in_step, out_src,
                  out_bytes, out_dst, acc, 0, 0};
    int prev = qp_threads(n);
    qp_for(nplans, INT64_C(1) << 40, chunk_tasks, &c); /* a task a chunk of the pool's */
    qp_threads(prev);
    return !atomic_load(&c.failed);
}

/* OpenMP's thread count for the regions the calling thread opens from now on (n > 0; 0
 * leaves it); returns the count before (simulator/runtime/threads.py sets it per run). */
int qp_threads(int64_t n) {
    int prev = omp_get_max_threads();
    if (n > 0) omp_set_num_threads((int)n);
    return prev;
}
