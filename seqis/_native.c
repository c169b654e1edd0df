/* seqis/_native.c: the CPU's fused passes over a batch (seqis/_native.py compiles it once and loads it).

What a chain of torch operations over (B, T) tensors does in 8-11 passes (clean, mask, subtract, expm1, subtract,
three sums), one pass here does per element while it is in a register: Ratios.of's log-ratios and per-rollout
sums, k3 of log-ratios, masked row sums. Every formula is the one its Python caller states.

A result does not depend on the CPU or on how rows are shared between threads: element t of a row is in lane
t % LANES of a group; every lane's running sum is a double, the lanes added in one fixed tree at the row's end; a
row's last group is padded with elements that add nothing; no product is fused into an add (-ffp-contract=off),
so every lane computes the same IEEE operations whatever the register width. The passes are compiled for three
widths (_native_width.h and _native_body.h, in GCC's generic vectors: AVX-512, AVX2, and the SSE2 every x86-64 has;
the last alone elsewhere), the widest the CPU runs picked when the library loads, and a call's rows are shared among
torch's own threads (run, below). A float32 batch is computed in floats, its k3
too, and summed in doubles; a float64 one in doubles.

K3_DOC: k3 = expm1(x) - x for finite x, without the cancellation of expm1(x) - x near 0: with x = k ln 2 + r
(|r| <= ln 2 / 2), expm1(r) - r = r^2 (1/2! + r/3! + ... + r^n/(n+2)!), and for k != 0
expm1(x) = 2 (2^(k-1) (1 + expm1(r)) - 1/2) (2^(k-1): k = 128 still has a float). In doubles n = 12 (the next
term is below 2^-60 of the sum), in floats n = 7 (below 2^-34); the polynomial in Estrin's scheme (a short chain
of dependent steps). Past log(max) expm1 overflows (inf); far below 0 it is -1 (k3 = -1 - x). */

#include <math.h>
#include <stdint.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
/* 8, 4 and 2 bytes at any address (a mask's bytes, widened) */
typedef int64_t q1 __attribute__((aligned(1), may_alias));
typedef int32_t d1 __attribute__((aligned(1), may_alias));
typedef int16_t w1 __attribute__((aligned(1), may_alias));

#define LANES 16
#define INLINE static inline __attribute__((always_inline))

#define C(n) (1.0 / F##n) /* 1 / (n + 2)! */
#define F0 2.0
#define F1 6.0
#define F2 24.0
#define F3 120.0
#define F4 720.0
#define F5 5040.0
#define F6 40320.0
#define F7 362880.0
#define F8 3628800.0
#define F9 39916800.0
#define F10 479001600.0
#define F11 6227020800.0
#define F12 87178291200.0


#if defined(__x86_64__) && defined(__GNUC__)
#define W 16
#define TAG w16
#define TARGET __attribute__((target("arch=x86-64-v4")))
#include "_native_width.h"
#define W 8
#define TAG w8
#define TARGET __attribute__((target("arch=x86-64-v3")))
#include "_native_width.h"
#endif
#define W 4
#define TAG w4
#define TARGET
#include "_native_width.h"

/* The register width in use (in floats): the widest this CPU runs, or the one seqis_set_width chose (tests hold
   the widths to each other's bits). */
static int width;

int seqis_set_width(int w) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int v4 = __builtin_cpu_supports("x86-64-v4"), v3 = __builtin_cpu_supports("x86-64-v3");
    if (w == 0) w = v4 ? 16 : v3 ? 8 : 4;
    if ((w == 16 && !v4) || (w == 8 && !v3) || (w != 16 && w != 8 && w != 4)) return 0;
#else
    if (w == 0) w = 4;
    if (w != 4) return 0;
#endif
    width = w;
    return w;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define PICK(name, ...)                                                                                           \
    if (width == 16) name##_w16(__VA_ARGS__);                                                                     \
    else if (width == 8) name##_w8(__VA_ARGS__);                                                                  \
    else name##_w4(__VA_ARGS__);
#define PAUSE() __builtin_ia32_pause()
#else
#define PICK(name, ...) name##_w4(__VA_ARGS__);
#define PAUSE() ((void)0)
#endif

/* Rows shared between threads: the threads of the OpenMP runtime torch's own operations run on (its intra-op
   threads, warm after each of them), through the runtime's entry point for a parallel region, which seqis/_native.py
   finds among the process's libraries and hands over (seqis_set_parallel). Threads of our own would compete with
   torch's for the cores while those wait spinning after an operation. A job's rows are cut into equal contiguous
   parts, one per thread of the team; a row's result does not depend on its part. Without the runtime (another OS,
   another torch), and in a forked child (GNU's runtime hangs there once its parent has used it), the calling thread
   does every row. */
typedef void (*task)(const void *args, int64_t r0, int64_t r1);
static void (*gomp_parallel)(void (*fn)(void *), void *data, unsigned threads, unsigned flags);
static int (*thread_num)(void), (*num_threads)(void);
static pid_t owner; /* the process that set them */

void seqis_set_parallel(void *parallel, void *get_thread_num, void *get_num_threads) {
    gomp_parallel = parallel, thread_num = get_thread_num, num_threads = get_num_threads, owner = getpid();
}

typedef struct {
    task fn;
    const void *args;
    int64_t B;
} job;

static void part(void *p) {
    const job *j = p;
    int64_t i = thread_num(), n = num_threads();
    j->fn(j->args, j->B * i / n, j->B * (i + 1) / n);
}

static void run(task fn, const void *args, int64_t B, int threads) {
    if (!width) seqis_set_width(0);
    if (threads > B) threads = (int)B;
    if (threads <= 1 || !gomp_parallel || !thread_num || !num_threads || getpid() != owner) {
        fn(args, 0, B);
        return;
    }
    job j = {fn, args, B};
    gomp_parallel(part, &j, (unsigned)threads, 0);
}

/* The exported passes: (B, T, the pass's arguments, threads); each a task over its rows [r0, r1). */
#define ROW(p, stride) ((p) ? (p) + r0 * (stride) : 0)
#define EXPORTS(FT)                                                                                               \
    typedef struct {                                                                                              \
        int64_t T, tls, ils, ms, ls, k3s;                                                                         \
        const FT *tl, *il;                                                                                        \
        const uint8_t *m;                                                                                         \
        FT *l, *k3, *length, *seq, *logp_sum, *k3_sum, *row_max, *row_min, *rho2_sum;                             \
        double cap;                                                                                               \
    } ratios_args_##FT;                                                                                           \
    static void ratios_task_##FT(const void *p, int64_t r0, int64_t r1) {                                         \
        const ratios_args_##FT *a = p;                                                                            \
        PICK(seqis_ratios_##FT, r1 - r0, a->T, ROW(a->tl, a->tls), a->tls, ROW(a->il, a->ils), a->ils,            \
             ROW(a->m, a->ms), a->ms, ROW(a->l, a->ls), a->ls, ROW(a->k3, a->k3s), a->k3s, ROW(a->length, 1),     \
             ROW(a->seq, 1), ROW(a->logp_sum, 1), ROW(a->k3_sum, 1), ROW(a->row_max, 1), ROW(a->row_min, 1),      \
             ROW(a->rho2_sum, 1), a->cap)                                                                         \
    }                                                                                                             \
    void seqis_ratios_##FT(int64_t B, int64_t T, const FT *tl, int64_t tls, const FT *il, int64_t ils,            \
                           const uint8_t *m, int64_t ms, FT *l, int64_t ls, FT *k3, int64_t k3s, FT *length,      \
                           FT *seq, FT *logp_sum, FT *k3_sum, FT *row_max, FT *row_min, FT *rho2_sum,             \
                           double cap, int threads) {                                                             \
        ratios_args_##FT a = {T, tls, ils, ms, ls, k3s, tl, il, m, l, k3, length, seq, logp_sum, k3_sum,          \
                              row_max, row_min, rho2_sum, cap};                                                   \
        run(ratios_task_##FT, &a, B, threads);                                                                    \
    }                                                                                                             \
    typedef struct {                                                                                              \
        int64_t T, ls, k3s;                                                                                       \
        const FT *l;                                                                                              \
        FT *k3, *sums;                                                                                            \
    } k3_args_##FT;                                                                                               \
    static void k3_task_##FT(const void *p, int64_t r0, int64_t r1) {                                             \
        const k3_args_##FT *a = p;                                                                                \
        PICK(seqis_k3_##FT, r1 - r0, a->T, ROW(a->l, a->ls), a->ls, ROW(a->k3, a->k3s), a->k3s, ROW(a->sums, 1)) \
    }                                                                                                             \
    void seqis_k3_##FT(int64_t B, int64_t T, const FT *l, int64_t ls, FT *k3, int64_t k3s, FT *sums,              \
                       int threads) {                                                                             \
        k3_args_##FT a = {T, ls, k3s, l, k3, sums};                                                               \
        run(k3_task_##FT, &a, B, threads);                                                                        \
    }                                                                                                             \
    typedef struct {                                                                                              \
        int64_t T, ls, tls, keeps;                                                                                \
        const FT *l, *tl, *keep;                                                                                  \
        FT *k3_sums, *logp_sums;                                                                                  \
    } kept_args_##FT;                                                                                             \
    static void kept_task_##FT(const void *p, int64_t r0, int64_t r1) {                                           \
        const kept_args_##FT *a = p;                                                                              \
        PICK(seqis_kept_##FT, r1 - r0, a->T, ROW(a->l, a->ls), a->ls, ROW(a->tl, a->tls), a->tls,                 \
             ROW(a->keep, a->keeps), a->keeps, ROW(a->k3_sums, 1), ROW(a->logp_sums, 1))                          \
    }                                                                                                             \
    void seqis_kept_##FT(int64_t B, int64_t T, const FT *l, int64_t ls, const FT *tl, int64_t tls,               \
                         const FT *keep, int64_t keeps, FT *k3_sums, FT *logp_sums, int threads) {                \
        kept_args_##FT a = {T, ls, tls, keeps, l, tl, keep, k3_sums, logp_sums};                                  \
        run(kept_task_##FT, &a, B, threads);                                                                      \
    }                                                                                                             \
    typedef struct {                                                                                              \
        int64_t T, as, cs;                                                                                        \
        const FT *a, *c;                                                                                          \
        FT *sums;                                                                                                 \
    } dot_args_##FT;                                                                                              \
    static void dot_task_##FT(const void *p, int64_t r0, int64_t r1) {                                            \
        const dot_args_##FT *x = p;                                                                               \
        PICK(seqis_dot_##FT, r1 - r0, x->T, ROW(x->a, x->as), x->as, ROW(x->c, x->cs), x->cs, ROW(x->sums, 1))    \
    }                                                                                                             \
    void seqis_dot_##FT(int64_t B, int64_t T, const FT *a, int64_t as, const FT *c, int64_t cs, FT *sums,         \
                        int threads) {                                                                            \
        dot_args_##FT x = {T, as, cs, a, c, sums};                                                                \
        run(dot_task_##FT, &x, B, threads);                                                                       \
    }

EXPORTS(float)
EXPORTS(double)
