/* Frozen plans run straight from numpy arrays (simulator/runtime/fast.py, fast_chunks.py): each
 * call given the arrays' object addresses checks them against the geometry its plans were
 * built on, reading numpy's array struct, takes their data pointers there and reads the
 * thread count as simulator/runtime/threads.kernel_count does, so that a run costs Python
 * one ctypes call (every Python call on the way costs tens of microseconds after idle). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qplan.h"

/* A numpy array as its struct lies in memory: numpy's PyArrayObject_fields
 * (numpy/ndarraytypes.h, the same since numpy 1.7), PyObject_HEAD (reference count, type)
 * of a CPython build without debug fields first. simulator/runtime/fast.py builds no fast
 * run where qp_np_view does not read an array as Python sees it. */
typedef struct {
    intptr_t refcount;
    const void *type;
    char *data;
    int nd;
    const int64_t *dims, *strides;
    const void *base, *descr;
    int flags;
} np_array;

#define NPY_WRITEABLE 0x0400
#define NP_VIEW_DIMS 8

/* For fast.py's check of the layout above: out = the type, dtype (descr), data pointer,
 * flags and rank of the numpy array at address obj, then its shape and byte strides when
 * the rank is at most NP_VIEW_DIMS. */
void qp_np_view(int64_t obj, int64_t *out) {
    const np_array *a = (const np_array *)(intptr_t)obj;
    out[0] = (int64_t)(intptr_t)a->type, out[1] = (int64_t)(intptr_t)a->descr;
    out[2] = (int64_t)(intptr_t)a->data, out[3] = a->flags, out[4] = a->nd;
    for (int d = 0; d < a->nd && a->nd <= NP_VIEW_DIMS; d++)
        out[5 + d] = a->dims[d], out[5 + a->nd + d] = a->strides[d];
}

/* The data pointer of the object at address spec[0] when it is a writeable numpy array
 * (exactly of type `type`) of dtype spec[1], rank spec[2], shape spec[4 ..] and byte
 * strides spec[4 + rank ..]; else 0. Any object's type lies where an array's does. */
static int64_t np_input(const int64_t *spec, const void *type) {
    const np_array *a = (const np_array *)(intptr_t)spec[0];
    if (!a || a->type != type || a->descr != (const void *)(intptr_t)spec[1])
        return 0;
    if (a->nd != spec[2] || !(a->flags & NPY_WRITEABLE))
        return 0;
    for (int d = 0; d < a->nd; d++)
        if (a->dims[d] != spec[4 + d] || a->strides[d] != spec[4 + a->nd + d]) return 0;
    return (int64_t)(intptr_t)a->data;
}

/* The data pointers of the inputs whose object addresses spec holds (qp_run_np says how)
 * into ptrs: 1, or 0 when one is not as its block says. */
static int np_inputs(const int64_t *spec, int64_t *ptrs) {
    const int64_t *block = spec + 2;
    for (int64_t j = 0; j < spec[0]; block += 4 + 2 * block[2], j++) {
        if (!(ptrs[j] = np_input(block, (const void *)(intptr_t)spec[1]))) return 0;
        int64_t first = 0;
        while (ptrs[first] != ptrs[j]) first++;
        if (first != block[3]) return 0;
    }
    return 1;
}

/* simulator/runtime/threads.kernel_count in C: $QPARITY_THREADS when it is a number >= 1,
 * every core this process may run on when it is unset or "auto"; 0 for anything else
 * (the Python path then names the value). */
static int64_t env_threads(void) {
    const char *v = getenv("QPARITY_THREADS");
    cpu_set_t cores;
    if (!v || !strcmp(v, "auto"))
        return sched_getaffinity(0, sizeof cores, &cores) ? 0 : CPU_COUNT(&cores);
    int64_t n = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9' || n > 1 << 20) return 0;
        n = 10 * n + (*c - '0');
    }
    return n;
}

/* A frozen plan's run from numpy inputs (simulator/runtime/fast.py) in one call. spec: the
 * input count, the address of numpy's ndarray type, then a block per input: the address
 * of the object given for it (set per run), its dtype's address, rank r, the index of the
 * first input with the same data pointer, its shape (r) and byte strides (r). Runs the
 * plan (qp_plan_fast) on n threads, or kernel_count's threads when n is 0. Returns 1 when
 * every call ran, 0 when one returned another value than recorded, -1 when an input is not
 * as its block says, -2 when $QPARITY_THREADS is not a thread count. */
int64_t qp_run_np(const int64_t *plan, const int64_t *spec, int64_t n, int64_t timed) {
    int64_t ptrs[spec[0] > 0 ? spec[0] : 1];
    if (!np_inputs(spec, ptrs)) return -1;
    if (n == 0 && (n = env_threads()) == 0) return -2;
    return qp_plan_fast(plan, ptrs, n, timed);
}

/* A batch split's chunks (qp_run_chunks) from numpy in one call: the whole batch's inputs
 * checked against spec as qp_run_np checks a plan's, chunk j's input k at their data
 * pointer + j * job's step[k]; each output copied into the numpy array at address outs[m]
 * (a fresh array of the batch's shape: only its type is checked). job: the plan count
 * (one a thread), the plans' array, the chunk count, the output count, the steps, the
 * outputs' sources and bytes a chunk (qp_run_chunks' arguments), the instruction groups
 * and the seconds to sum them into when `timed` (zeroed first). Returns 1 when every chunk
 * ran, 0 when a call returned another value than recorded, -1 when an input or output is
 * not as expected or kernel_count's threads are not the plan count (the Python path then
 * splits the batch its own way), -2 when $QPARITY_THREADS is not a thread count. */
int64_t qp_run_batch_np(const int64_t *spec, const int64_t *outs, const int64_t *job,
                        int64_t timed) {
    int64_t nin = spec[0], nout = job[3], ptrs[nin > 0 ? nin : 1], dst[nout > 0 ? nout : 1];
    if (!np_inputs(spec, ptrs)) return -1;
    for (int64_t m = 0; m < nout; m++) {
        const np_array *a = (const np_array *)(intptr_t)outs[m];
        if (!a || a->type != (const void *)(intptr_t)spec[1]) return -1;
        dst[m] = (int64_t)(intptr_t)a->data;
    }
    int64_t n = env_threads(), nplans = job[0], nchunks = job[2];
    if (n == 0) return -2;
    if ((n < nchunks ? n : nchunks) != nplans) return -1;
    double *acc = timed ? (double *)(intptr_t)job[8] : NULL;
    if (acc) memset(acc, 0, (size_t)job[7] * sizeof *acc);
    return qp_run_chunks(nplans, (const int64_t *const *)(intptr_t)job[1], nchunks, nplans, nin,
                         ptrs, (const int64_t *)(intptr_t)job[4], nout,
                         (const int64_t *)(intptr_t)job[5], (const int64_t *)(intptr_t)job[6],
                         dst, job[7], acc);
}

