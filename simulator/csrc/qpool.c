/* The kernels' thread pool (qpool.h), in place of OpenMP's parallel for.
 *
 * An OpenMP region ends in a barrier that waits for every thread of its team, also for one
 * that has not started yet. On this 2-core VM a worker asleep since the last run sometimes
 * starts a 4 ms tick after it is woken, and a worker on a core another process holds waits
 * for its turn: either way every region waits for it. Measured on examples/digits at batch
 * 256: 2.9 ms a run back to back, 13.7 ms after 50 ms idle, its first two regions 5.8 and
 * 4.3 ms. Here the calling thread claims chunks itself and waits only for chunks a worker
 * has claimed: a worker that comes late finds none left and costs nothing.
 *
 * One job at a time. Its ticket packs the job's generation and the chunks left, front ..
 * back - 1; a claim is a compare-and-swap of the ticket, so it can only take a chunk of the
 * job in progress. The caller claims from the front and the workers from the back, so each
 * thread runs a run of neighbouring chunks, and the kernels order their items by position
 * (rows, pixel tiles): the caller takes the top of every map and its worker the bottom, and
 * each reads mostly rows its own core wrote. Taking chunks in turn from the front, the two
 * threads interleaved: a MobileNetV2 depthwise conv at batch 1 then read half its input
 * from the other core's cache, and ran slower on two threads than on one (0.130 against
 * 0.114 ms; 0.067 ms front and back). A worker reads the job's fields after its claim:
 * the job cannot end (and its fields change) before that chunk is done. After a job a
 * worker spins SPIN_NS for the next one, then sleeps on a futex that the next job wakes.
 * The kernels of a frozen plan follow each other within microseconds, but a run that is
 * not frozen has gaps of a millisecond or more between them (the transformer at batch 256
 * after 50 ms idle: 14.5 ms a run with a 1 ms spin, its worker asleep 2-3 times a run;
 * 9.8 ms with 5 ms).
 *
 * A job that wakes sleeping workers first keeps them off the caller's core (steer_workers),
 * and they stay off it until a caller on another core steers them again. Woken freely,
 * Linux put the worker on the caller's core in 365 of 588 jobs when onnxruntime and torch
 * had just kept both cores busy (digits at batch 256: 8.4 ms a run against 2.3 ms; 2.6 ms
 * steered). */
#define _GNU_SOURCE
#include "qpool.h"
#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 63
#define CHUNK_BITS 18
#define MAX_CHUNKS ((INT64_C(1) << CHUNK_BITS) - 1)
#define SPIN_NS 5000000 /* about libgomp's default wait (GOMP_SPINCOUNT 300000) on a Zen 3 */

static struct {
    _Atomic uint64_t ticket; /* generation << 2 * CHUNK_BITS | chunks << CHUNK_BITS | next */
    _Atomic int64_t done;    /* chunks of the job in progress that have run */
    _Atomic uint32_t wake;   /* futex word: bumped by a job that finds workers asleep */
    _Atomic int sleepers;
    _Atomic int64_t woken_spin; /* ns a woken worker spun before it slept again (the tests) */
    _Atomic int team;        /* the job's threads: workers 0 .. team - 2 take part */
    qp_part_fn fn;           /* the job: set before its ticket, unchanged until it ends */
    void *args;
    int64_t n, grain;
    pthread_t threads[MAX_WORKERS]; /* set by the thread that starts them */
    _Atomic int off[MAX_WORKERS];   /* 1 + the core steer_workers keeps a worker off; 0: none */
    int workers;             /* started; only the thread holding `busy` starts more */
    pthread_mutex_t busy;    /* held by the calling thread of the job in progress */
} P = {.busy = PTHREAD_MUTEX_INITIALIZER};

static _Atomic int64_t par_min = QP_PAR_MIN, chunk_work = QP_CHUNK_WORK;
static __thread int64_t pool_thread; /* 0: a calling thread; 1 + i: worker i (qp_pool_owners) */

static uint64_t generation(void) { return atomic_load(&P.ticket) >> (2 * CHUNK_BITS); }

/* Takes a run of chunks of the job in progress, [*k, *k + *m): the first ones left (front)
 * or the last (back), a 2 * team-th of those left (at least one: guided self-scheduling).
 * 0 when none is left. The ticket's low bits hold front (the next chunk from the start)
 * and back (one past the next chunk from the end): chunks front .. back-1 are left. Each
 * claim moves the ticket's cache line between the cores: one per chunk cost about 100 ns
 * of a task of 0.4 us (MobileNetV2's depthwise convs: 1.5x faster on two threads than on
 * one), one per run of them takes a job's chunks in a few claims a thread. */
static int claim(int64_t *k, int64_t *m, int back) {
    uint64_t t = atomic_load_explicit(&P.ticket, memory_order_acquire);
    int64_t share = 2 * (int64_t)atomic_load_explicit(&P.team, memory_order_relaxed);
    for (;;) {
        int64_t f = (int64_t)(t & MAX_CHUNKS), b = (int64_t)(t >> CHUNK_BITS & MAX_CHUNKS);
        if (f >= b) return 0;
        int64_t g = (b - f) / share > 1 ? (b - f) / share : 1;
        uint64_t next = back ? t - ((uint64_t)g << CHUNK_BITS) : t + (uint64_t)g;
        if (atomic_compare_exchange_weak_explicit(&P.ticket, &t, next, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *k = back ? b - g : f, *m = g;
            return 1;
        }
    }
}

static void run_chunks(int back) {
    int64_t k, m;
    while (claim(&k, &m, back)) {
        int64_t lo = k * P.grain, hi = (k + m) * P.grain < P.n ? (k + m) * P.grain : P.n;
        P.fn(P.args, lo, hi);
        atomic_fetch_add_explicit(&P.done, m, memory_order_release);
    }
}

static int64_t ns_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)(t.tv_sec - t0->tv_sec) * 1000000000 + (t.tv_nsec - t0->tv_nsec);
}

/* Returns once a job after generation gen is published: spinning SPIN_NS, then asleep.
 * sleepers is raised before the last look at the ticket, and the publisher looks at
 * sleepers after its ticket (both sequentially consistent): one of them sees the other. */
static void wait_job(uint64_t gen) {
    struct timespec t0, woke; /* woke: when the futex last let it go (woken: it has) */
    int woken = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 1; generation() == gen; i++) {
        __builtin_ia32_pause();
        if (i % 256 == 0 && ns_since(&t0) > SPIN_NS) {
            if (woken) atomic_store(&P.woken_spin, ns_since(&woke));
            uint32_t w = atomic_load(&P.wake);
            atomic_fetch_add(&P.sleepers, 1);
            if (generation() == gen)
                syscall(SYS_futex, &P.wake, FUTEX_WAIT_PRIVATE, w, NULL, NULL, 0);
            atomic_fetch_sub(&P.sleepers, 1);
            clock_gettime(CLOCK_MONOTONIC, &woke);
            t0 = woke; /* woken ahead of a job (qp_pool_wake): spins its SPIN_NS again */
            woken = 1;
        }
    }
}

/* Before a job wakes sleeping workers: keeps them off core `cpu`, the caller's, for the
 * wake-up. Else Linux may wake a worker onto the caller's core when both cores were busy
 * of late (another engine's threads spinning): its idle-core search is skipped then. A
 * worker keeps the narrowed set until a caller on another core steers it again: setting it
 * took 5-25 us after idle on this VM, on the caller's way to its first kernel (and as much
 * again on the worker's, when each gave the core back once awake). */
static void steer_workers(int cpu, int team) {
    int n = team - 1 < P.workers ? team - 1 : P.workers, stale = 0;
    for (int i = 0; i < n; i++) stale |= atomic_load(&P.off[i]) != cpu + 1;
    cpu_set_t others;
    if (!stale || cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof others, &others))
        return;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0) return;
    for (int i = 0; i < n; i++)
        if (atomic_exchange(&P.off[i], cpu + 1) != cpu + 1)
            pthread_setaffinity_np(P.threads[i], sizeof others, &others);
}

static void *worker(void *arg) {
    int index = (int)(intptr_t)arg;
    pool_thread = index + 1;
    for (;;) {
        uint64_t gen = generation();
        if (index < atomic_load_explicit(&P.team, memory_order_relaxed) - 1) run_chunks(1);
        wait_job(gen);
    }
    return NULL;
}

/* Workers up to n (fewer if the system will not start them: the jobs run on those there are). */
static void start_workers(int n) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (pthread_t t; P.workers < n; P.workers++) {
        if (pthread_create(&t, &attr, worker, (void *)(intptr_t)P.workers)) break;
        P.threads[P.workers] = t;
        pthread_setname_np(t, "qparity-pool"); /* as top -H and /proc/<pid>/task name it */
    }
    pthread_attr_destroy(&attr);
}

/* A forked child has none of the parent's workers (and their job, if any, is the parent's). */
static void after_fork_child(void) {
    P.workers = 0;
    atomic_store(&P.sleepers, 0);
    for (int i = 0; i < MAX_WORKERS; i++) atomic_store(&P.off[i], 0);
    pthread_mutex_init(&P.busy, NULL);
}

__attribute__((constructor)) static void pool_init(void) {
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* Wakes the sleeping workers, those of a team of `team` threads steered off the caller's
 * core first (the caller holds `busy`). */
static void wake_sleepers(int team) {
    steer_workers(sched_getcpu(), team);
    atomic_fetch_add(&P.wake, 1);
    syscall(SYS_futex, &P.wake, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Wakes the sleeping workers of the team this thread would call (steered as a job steers
 * them), so that they spin by the time its first job comes: qp_plan_fast (qplan.c) calls it
 * before a frozen plan's first kernel (a worker woken by a job joins it tens of
 * microseconds late, after a VM's idle core wakes up). Nothing when none sleeps or a job
 * is in progress. */
int qp_pool_wake(void) {
    int team = omp_get_max_threads();
    if (team < 2) return 3;
    if (!atomic_load(&P.sleepers)) return 0;
    if (pthread_mutex_trylock(&P.busy)) return 2;
    wake_sleepers(team > MAX_WORKERS + 1 ? MAX_WORKERS + 1 : team);
    pthread_mutex_unlock(&P.busy);
    return 1;
}

/* For the tests: workers asleep now. */
int64_t qp_pool_sleepers(void) { return atomic_load(&P.sleepers); }

/* For the tests: how long the last worker woken from its sleep (by qp_pool_wake or a job
 * that ended at once) spun before it slept again, in ns; 0 when none has since the last
 * call. */
int64_t qp_pool_woken_spin(void) { return atomic_exchange(&P.woken_spin, 0); }

void qp_for(int64_t n, int64_t work, qp_part_fn fn, void *args) {
    int team = omp_get_max_threads();
    team = team > MAX_WORKERS + 1 ? MAX_WORKERS + 1 : team;
    if (n <= 0) return;
    if (team < 2 || n < 2 || n * work < par_min || pthread_mutex_trylock(&P.busy)) {
        fn(args, 0, n);
        return;
    }
    start_workers(team - 1);
    int64_t grain = work >= chunk_work ? 1 : chunk_work / (work > 0 ? work : 1);
    if ((n + grain - 1) / grain > MAX_CHUNKS) grain = (n + MAX_CHUNKS - 1) / MAX_CHUNKS;
    int64_t chunks = (n + grain - 1) / grain;
    P.fn = fn, P.args = args, P.n = n, P.grain = grain;
    atomic_store_explicit(&P.done, 0, memory_order_relaxed);
    atomic_store_explicit(&P.team, team, memory_order_relaxed);
    atomic_store(&P.ticket, (generation() + 1) << (2 * CHUNK_BITS) | (uint64_t)chunks << CHUNK_BITS);
    if (atomic_load(&P.sleepers)) wake_sleepers(team);
    run_chunks(0);
    while (atomic_load_explicit(&P.done, memory_order_acquire) < chunks) __builtin_ia32_pause();
    pthread_mutex_unlock(&P.busy);
}

/* The tests' probe: out[i] = the thread that ran item i of a loop of n items of `work`
 * elements (0: the caller, 1 + i: worker i), each item busy for about spin_ns, and
 * out[n + i] = 1 when item i began a run of items its thread claimed at once, else 0. */
typedef struct {
    int64_t *out, spin_ns, n;
} owners_t;

static void owners_part(void *p, int64_t lo, int64_t hi) {
    const owners_t *o = p;
    o->out[o->n + lo] = 1;
    for (int64_t i = lo; i < hi; i++) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (ns_since(&t0) < o->spin_ns) __builtin_ia32_pause();
        o->out[i] = pool_thread;
    }
}

void qp_pool_owners(int64_t n, int64_t work, int64_t spin_ns, int64_t *out) {
    owners_t o = {out, spin_ns, n};
    for (int64_t i = 0; i < n; i++) out[n + i] = 0;
    qp_for(n, work, owners_part, &o);
}

void qp_pool_sizes(int64_t min_work, int64_t chunk) {
    par_min = min_work > 0 ? min_work : QP_PAR_MIN;
    chunk_work = chunk > 0 ? chunk : QP_CHUNK_WORK;
}
