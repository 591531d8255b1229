/* The kernels' thread pool (qpool.c): a loop's items in chunks that the calling thread and
 * the pool's workers claim one at a time; the call returns when every chunk has run. */
#ifndef QPARITY_QPOOL_H
#define QPARITY_QPOOL_H
#include <stdint.h>

/* Runs items [lo, hi) of a loop; args is the loop's own struct. */
typedef void (*qp_part_fn)(void *args, int64_t lo, int64_t hi);

#define QP_CHUNK_WORK 16384 /* elements of work a chunk aims at (about 5-20 us) */
#define QP_PAR_MIN 32768    /* elements of work below which the caller runs the loop alone */

/* fn over items [0, n), each about `work` elements, on OpenMP's thread count of the calling
 * thread (omp_set_num_threads; simulator/runtime/threads.py sets it per run): alone when
 * n * work < QP_PAR_MIN, when one thread is asked for, or when another call holds the pool
 * (a kernel called from a chunk, or from another thread meanwhile); else in chunks of
 * items of about QP_CHUNK_WORK elements (at least one item). */
void qp_for(int64_t n, int64_t work, qp_part_fn fn, void *args);

/* Wakes sleeping workers ahead of a run's first job (qpool.c): 1 woken, 0 none asleep,
 * 2 a job in progress, 3 one thread. */
int qp_pool_wake(void);

/* For the tests: how many workers sleep now. */
int64_t qp_pool_sleepers(void);

/* For the tests: ns the last woken worker stayed awake before it slept again; 0: none
 * since the last call. */
int64_t qp_pool_woken_spin(void);

/* The two sizes above (0: as defined), for the tests: a small chunk splits every loop. */
void qp_pool_sizes(int64_t min_work, int64_t chunk);

/* For the tests: out[i] = the thread that ran item i of a loop of n items (0: the calling
 * thread, 1 + i: worker i), each busy for spin_ns; out[n + i] = 1 where a thread's claimed
 * run of items began. */
void qp_pool_owners(int64_t n, int64_t work, int64_t spin_ns, int64_t *out);
#endif
