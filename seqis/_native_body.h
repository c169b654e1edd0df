/* seqis/_native_body.h: the passes of seqis/_native.c for one register width and one element type, included once
   per (width, type). Before it: W (floats per register: 4, 8 or 16), TAG (the width's name suffix), TARGET (the
   ISA attribute), and FT (float or double).

   A group is LANES elements of a row, lane e = t % LANES; a register holds EW of them (W floats or W / 2 doubles);
   a lane's running sums are doubles, ACC registers of W / 2 doubles cover the LANES lanes. */

#define CAT_(a, b, c) a##_##b##_##c
#define CAT(a, b, c) CAT_(a, b, c)
#define FN(name) CAT(seqis_##name, FT, TAG)
#define TY(name) CAT(name, FT, TAG)

typedef double TY(hd) __attribute__((vector_size(4 * W)));  /* W / 2 doubles: a sum register */
#if IS_FLOAT
#define EW W
typedef float TY(ev) __attribute__((vector_size(4 * W)));   /* a register of elements */
typedef int32_t TY(em) __attribute__((vector_size(4 * W))); /* its lane masks (-1 or 0) and integers */
#else
#define EW (W / 2)
typedef double TY(ev) __attribute__((vector_size(4 * W)));
typedef int64_t TY(em) __attribute__((vector_size(4 * W)));
#endif
typedef FT TY(eu) __attribute__((vector_size(4 * W), aligned(1), may_alias)); /* the same at any address */
#define EV TY(ev)
#define EM TY(em)
#define HD TY(hd)
#define CHUNKS (LANES / EW) /* registers of elements per group */
/* BODY for each register of a row of T elements: o its first element, w how many of its lanes are in the row */
#define EACH_REGISTER(T, ...)                                                                                     \
    for (int64_t t = 0; t < (T); t += LANES)                                                                      \
        for (int c = 0; c < CHUNKS; c++) {                                                                        \
            int64_t o = t + c * EW;                                                                               \
            int w = (T) - o >= EW ? EW : ((T) - o > 0 ? (int)((T) - o) : 0);                                      \
            __VA_ARGS__                                                                                           \
        }
#define ACC (2 * LANES / W) /* sum registers per group */

INLINE TARGET EV TY(sel)(EM m, EV a, EV b) { return (EV)(((EM)a & m) | ((EM)b & ~m)); } /* m ? a : b */
INLINE TARGET EV TY(splat)(FT x) { return (EV){0} + x; }
#define SEL TY(sel)
#define SPLAT TY(splat)

/* n elements at p (n < EW: the rest 0, which adds nothing to a sum), stored back, the loss mask's lanes */
INLINE TARGET EV TY(load)(const FT *p, int n) {
    EV v = {0};
    if (n == EW) v = *(const TY(eu) *)p;
    else for (int j = 0; j < n; j++) v[j] = p[j];
    return v;
}
INLINE TARGET void TY(store)(FT *p, EV v, int n) {
    if (n == EW) *(TY(eu) *)p = v;
    else for (int j = 0; j < n; j++) p[j] = v[j];
}
/* the loss mask's n bytes at m as lane masks: widened by the CPU's own instruction (GCC scalarises a
   __builtin_convertvector of bytes), a byte at a time past the row's end */
INLINE TARGET EM TY(on)(const uint8_t *m, int n) {
    EM v = {0};
#if defined(__x86_64__)
    if (n == EW) {
#if W == 16 && IS_FLOAT
        v = (EM)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)m));
#elif W == 16
        v = (EM)_mm512_cvtepu8_epi64(_mm_set_epi64x(0, *(const q1 *)m));
#elif W == 8 && IS_FLOAT
        v = (EM)_mm256_cvtepu8_epi32(_mm_set_epi64x(0, *(const q1 *)m));
#elif W == 8
        v = (EM)_mm256_cvtepu8_epi64(_mm_cvtsi32_si128(*(const d1 *)m));
#elif IS_FLOAT /* SSE2: bytes to words to double words */
        __m128i z = _mm_setzero_si128();
        v = (EM)_mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(*(const d1 *)m), z), z);
#else
        __m128i z = _mm_setzero_si128(), b = _mm_cvtsi32_si128(*(const w1 *)m);
        v = (EM)_mm_unpacklo_epi32(_mm_unpacklo_epi16(_mm_unpacklo_epi8(b, z), z), z);
#endif
        return v != 0;
    }
#endif
    for (int j = 0; j < n; j++) v[j] = m[j];
    return v != 0;
}
INLINE TARGET EM TY(finite)(EV x) { return (x - x) == 0; }

/* acc[c-th register's sums] += v, in doubles */
INLINE TARGET void TY(add)(HD *acc, int c, EV v) {
#if IS_FLOAT
#if W == 4
    acc[2 * c] += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1), HD);
    acc[2 * c + 1] += __builtin_convertvector(__builtin_shufflevector(v, v, 2, 3), HD);
#elif W == 8
    acc[2 * c] += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3), HD);
    acc[2 * c + 1] += __builtin_convertvector(__builtin_shufflevector(v, v, 4, 5, 6, 7), HD);
#else
    acc[2 * c] += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), HD);
    acc[2 * c + 1] += __builtin_convertvector(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), HD);
#endif
#else
    acc[c] += v;
#endif
}

/* the LANES lanes' sum, in one fixed order */
INLINE TARGET double TY(tree)(const HD *acc) {
    double h[LANES];
    for (int a = 0; a < ACC; a++)
        for (int j = 0; j < W / 2; j++) h[a * (W / 2) + j] = acc[a][j];
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) h[j] = h[2 * j] + h[2 * j + 1];
    return h[0];
}

/* k3 = expm1(x) - x for finite x (K3_DOC in seqis/_native.c) */
INLINE TARGET EV TY(k3)(EV x) {
#if IS_FLOAT
    const float magic = 0x1.8p23f, inv_ln2 = 1.44269504f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float low = -40.0f, high = 88.7228f;
    const int32_t bias = 127, mant = 23;
#else
    const double magic = 0x1.8p52, inv_ln2 = 1.4426950408889634, ln2_hi = 6.93147180369123816490e-01,
                 ln2_lo = 1.90821492927058770002e-10, low = -60.0, high = 709.78;
    const int64_t bias = 1023, mant = 52;
#endif
    EV xc = SEL(x < low, SPLAT(low), SEL(x > high, SPLAT(high), x));
    EV t = xc * inv_ln2 + magic; /* adding magic rounds to an integer, which t's low bits then hold */
    EV kf = t - magic;           /* k = round(x / ln 2) */
    EV r = (xc - kf * ln2_hi) - kf * ln2_lo;
    EV r2 = r * r, r4 = r2 * r2;
    EV a = ((FT)C(0) + (FT)C(1) * r) + ((FT)C(2) + (FT)C(3) * r) * r2;
    EV b = ((FT)C(4) + (FT)C(5) * r) + ((FT)C(6) + (FT)C(7) * r) * r2;
#if IS_FLOAT
    EV p = (a + b * r4) * r2; /* expm1(r) - r */
#else
    EV c = (C(8) + C(9) * r) + (C(10) + C(11) * r) * r2;
    EV p = ((a + b * r4) + (c + C(12) * r4) * (r4 * r4)) * r2;
#endif
    EV half_k = (EV)(((EM)t - (EM)SPLAT(magic) + (bias - 1)) << mant); /* 2^(k-1) */
    EV e = 2 * (half_k * (r + p) + (half_k - (FT)0.5));                /* expm1(x) */
    EV k3 = SEL(kf == 0, p, e - xc);
    k3 = SEL(x > high, SPLAT(INFINITY), k3);
    return SEL(x < low, -1 - x, k3);
}

/* One group of Ratios.of's pass at t (full: all LANES elements are in the row), into the row's sums; K3 and RHO2 say
   which optional outputs there are (constants, so each combination is its own loop). */
INLINE TARGET void TY(ratios_group)(const FT *tr, const FT *ir, const uint8_t *mr, FT *lr, FT *kr, int64_t t,
                                    int64_t T, HD *s, HD *lp, HD *kk, HD *n, HD *r2, EV *hi, EV *lo, FT cap,
                                    const int full, const int K3, const int RHO2) {
    for (int c = 0; c < CHUNKS; c++) {
        int64_t o = t + c * EW;
        int w = full || T - o >= EW ? EW : (T - o > 0 ? (int)(T - o) : 0);
        EV x = TY(load)(tr + o, w), q = TY(load)(ir + o, w);
        EM on = TY(on)(mr + o, w);
        EV p = SEL(on & TY(finite)(x), x, SPLAT(0));
        EV d = p - q;
        EV v = SEL(on & TY(finite)(d), d, SPLAT(0));
        EV k = TY(k3)(v);
        TY(store)(lr + o, v, w);
        if (K3) TY(store)(kr + o, k, w);
        TY(add)(s, c, v), TY(add)(lp, c, p), TY(add)(kk, c, k), TY(add)(n, c, SEL(on, SPLAT(1), SPLAT(0)));
        if (RHO2) {
            EV e = k + v; /* expm1(l) */
            e = SEL(e > cap, SPLAT(cap), e);
            TY(add)(r2, c, e * (e + 2));
        }
        if (full) {
            *hi = SEL(v > *hi, v, *hi), *lo = SEL(v < *lo, v, *lo);
        } else {
            EM lane, real;
            for (int j = 0; j < EW; j++) lane[j] = j;
            real = lane < w;
            *hi = SEL(real & (v > *hi), v, *hi), *lo = SEL(real & (v < *lo), v, *lo);
        }
    }
}

INLINE TARGET void TY(ratios_rows)(int64_t B, int64_t T, const FT *tl, int64_t tls, const FT *il, int64_t ils,
                                   const uint8_t *m, int64_t ms, FT *l, int64_t ls, FT *k3, int64_t k3s, FT *length,
                                   FT *seq, FT *logp_sum, FT *k3_sum, FT *row_max, FT *row_min, FT *rho2_sum, FT cap,
                                   const int K3, const int RHO2) {
    for (int64_t b = 0; b < B; b++) {
        HD s[ACC] = {{0}}, lp[ACC] = {{0}}, kk[ACC] = {{0}}, n[ACC] = {{0}}, r2[ACC] = {{0}};
        EV hi = SPLAT(-INFINITY), lo = SPLAT(INFINITY);
        const FT *tr = tl + b * tls, *ir = il + b * ils;
        const uint8_t *mr = m + b * ms;
        FT *lr = l + b * ls, *kr = K3 ? k3 + b * k3s : 0;
        int64_t t = 0;
        for (; t + LANES <= T; t += LANES)
            TY(ratios_group)(tr, ir, mr, lr, kr, t, T, s, lp, kk, n, r2, &hi, &lo, cap, 1, K3, RHO2);
        if (t < T) TY(ratios_group)(tr, ir, mr, lr, kr, t, T, s, lp, kk, n, r2, &hi, &lo, cap, 0, K3, RHO2);
        length[b] = (FT)TY(tree)(n), seq[b] = (FT)TY(tree)(s), logp_sum[b] = (FT)TY(tree)(lp);
        k3_sum[b] = (FT)TY(tree)(kk);
        FT a = hi[0], c = lo[0];
        for (int j = 1; j < EW; j++) a = hi[j] > a ? hi[j] : a, c = lo[j] < c ? lo[j] : c;
        row_max[b] = a, row_min[b] = c;
        if (RHO2) rho2_sum[b] = (FT)TY(tree)(r2);
    }
}

TARGET void FN(ratios)(int64_t B, int64_t T, const FT *tl, int64_t tls, const FT *il, int64_t ils, const uint8_t *m,
                       int64_t ms, FT *l, int64_t ls, FT *k3, int64_t k3s, FT *length, FT *seq, FT *logp_sum,
                       FT *k3_sum, FT *row_max, FT *row_min, FT *rho2_sum, double cap) {
#define ROWS(K3_, RHO2_)                                                                                          \
    TY(ratios_rows)(B, T, tl, tls, il, ils, m, ms, l, ls, k3, k3s, length, seq, logp_sum, k3_sum, row_max,        \
                    row_min, rho2_sum, (FT)cap, K3_, RHO2_)
    if (k3 && rho2_sum) ROWS(1, 1);
    else if (k3) ROWS(1, 0);
    else if (rho2_sum) ROWS(0, 1);
    else ROWS(0, 0);
#undef ROWS
}

TARGET void FN(k3)(int64_t B, int64_t T, const FT *l, int64_t ls, FT *k3, int64_t k3s, FT *sums) {
    for (int64_t b = 0; b < B; b++) {
        HD kk[ACC] = {{0}};
        EACH_REGISTER(T, EV k = TY(k3)(TY(load)(l + b * ls + o, w)); if (k3) TY(store)(k3 + b * k3s + o, k, w);
                      TY(add)(kk, c, k);)
        sums[b] = (FT)TY(tree)(kk);
    }
}

TARGET void FN(kept)(int64_t B, int64_t T, const FT *l, int64_t ls, const FT *tl, int64_t tls, const FT *keep,
                     int64_t keeps, FT *k3_sums, FT *logp_sums) {
    for (int64_t b = 0; b < B; b++) {
        HD kk[ACC] = {{0}}, lp[ACC] = {{0}};
        EACH_REGISTER(T, EV x = TY(load)(tl + b * tls + o, w), kp = TY(load)(keep + b * keeps + o, w);
                      TY(add)(kk, c, TY(k3)(TY(load)(l + b * ls + o, w)) * kp);
                      TY(add)(lp, c, SEL(TY(finite)(x), x, SPLAT(0)) * kp);)
        k3_sums[b] = (FT)TY(tree)(kk), logp_sums[b] = (FT)TY(tree)(lp);
    }
}

TARGET void FN(dot)(int64_t B, int64_t T, const FT *a, int64_t as, const FT *c_, int64_t cs, FT *sums) {
    for (int64_t b = 0; b < B; b++) {
        HD acc[ACC] = {{0}};
        EACH_REGISTER(T, TY(add)(acc, c, TY(load)(a + b * as + o, w) * TY(load)(c_ + b * cs + o, w));)
        sums[b] = (FT)TY(tree)(acc);
    }
}

#undef FN
#undef TY
#undef EW
#undef EV
#undef EM
#undef HD
#undef CHUNKS
#undef EACH_REGISTER
#undef ACC
#undef SEL
#undef SPLAT
