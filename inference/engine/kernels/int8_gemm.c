/* Int8-weight linear with exact integer sums: y = (x · wᵀ) * scale.
 *
 * Weights: symmetric int8, one float32 scale per output channel (layers/linear.py
 * quantize_int8). Activations: each row is quantised on the fly to int16 with its
 * own scale, amax(|x_row|) / A, where A = min(32767, (2^31 - 1) / (127 * K)) keeps
 * every int32 sum from overflowing (A = 29,357 at K = 576: about 15 bits, far finer
 * than the weights' 8). The products are summed exactly in int32 with AVX2's
 * vpmaddwd (16 multiply-adds per instruction, twice float32 FMA's rate on CPUs
 * without AVX-512 VNNI), then y[m, n] = (float)sum * sx[m] * scale[n].
 *
 * Integer sums do not depend on their order, so every kernel variant and the
 * scalar fallback give bitwise the same y, and a row's result never depends on the
 * other rows (batch invariance for decode and for chunked prefill).
 *
 * Packed weight layout (metrale_int8_pack): tiles of 16 output channels; inside a
 * tile, for each pair of k values, the 16 channels' two int8 values side by side:
 * packed[t][p][j][e] = w[16 t + j][2 p + e] (zero past N or K), 32 bytes per pair.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "kernels.h"
#if defined(__AVX2__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define GEMM_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define GEMM_VNNI512 1 /* vpdpwssd on zmm: a row's 16 channels x one k pair in one instruction */
#endif
#endif

#define QT 16 /* output channels per tile */
#ifdef GEMM_VNNI512
#define MR 12 /* rows per micro-kernel: 12 zmm accumulators of the 32 registers */
#else
#define MR 6 /* rows per micro-kernel: 12 ymm accumulators of the 16 registers */
#endif
#define MC 96 /* rows per cache block: their int16 activations stay in L2 */

/* Pairs of k values (vpmaddwd multiplies two at a time): K rounded up to even, halved. */
static long metrale_int8_pair_k(long K) { return (K + 1) / 2; }

/* The int16 range used for activations with K input channels (see above). */
static int32_t act_limit(long K) {
    const long kp = 2 * metrale_int8_pair_k(K);
    const long lim = 2147483647L / (127L * kp);
    return (int32_t)(lim < 32767 ? lim : 32767);
}

/* The vector paths this build compiled: "int8 GEMM <path>, attention <path>". */
const char *metrale_kernels_isa(void) {
#if defined(GEMM_VNNI512)
#define ISA_GEMM "int8 GEMM avx512-vnni"
#elif defined(GEMM_AVX2)
#define ISA_GEMM "int8 GEMM avx2"
#else
#define ISA_GEMM "int8 GEMM portable"
#endif
#if defined(METRALE_AVX512)
#define ISA_ATTN ", attention avx512"
#elif defined(METRALE_AVX2)
#define ISA_ATTN ", attention avx2"
#else
#define ISA_ATTN ", attention portable"
#endif
    return ISA_GEMM ISA_ATTN;
}

/* w: int8 [N, K] row-major -> packed: int8 [ceil(N / 16), ceil(K / 2), 16, 2] (layout above). */
void metrale_int8_pack(const int8_t *w, int8_t *packed, long N, long K) {
    const long tiles = (N + QT - 1) / QT, K2 = metrale_int8_pair_k(K);
    for (long t = 0; t < tiles; t++)
        for (long p = 0; p < K2; p++)
            for (int j = 0; j < QT; j++)
                for (int e = 0; e < 2; e++) {
                    const long n = t * QT + j, k = 2 * p + e;
                    packed[((t * K2 + p) * QT + j) * 2 + e] = (n < N && k < K) ? w[n * K + k] : 0;
                }
}

/* Row m of x as int16 (q, padded with a zero to an even length) and its scale sx.
 * q = round_half_even(x * (A / amax)) in float32: the AVX2 path (vcvtps2dq under the
 * default rounding mode) and the scalar one (lrintf) give the same values. */
static void quantize_row(const float *x, long K, int32_t A, int16_t *q, float *sx) {
    long k = 0;
    float amax = 0.f;
    int nan = 0; /* max() drops NaN operands, so NaN is looked for separately */
#ifdef GEMM_AVX2
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = _mm256_setzero_ps(), vnan = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) {
        const __m256 v = _mm256_loadu_ps(x + k);
        vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, absmask));
        vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, lanes[i]);
    nan = _mm256_movemask_ps(vnan) != 0;
#endif
    for (; k < K; k++) {
        amax = fmaxf(amax, fabsf(x[k]));
        nan |= isnan(x[k]);
    }
    const long kp = 2 * metrale_int8_pair_k(K);
    if (nan || !(amax > 0.f) || !isfinite(amax)) { /* all zeros; or inf/NaN, which must not pass as numbers */
        memset(q, 0, sizeof(int16_t) * (size_t)kp);
        *sx = (amax == 0.f && !nan) ? 0.f : NAN;
        return;
    }
    const float inv = (float)A / amax;
    k = 0;
#ifdef GEMM_AVX2
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i hi = _mm256_set1_epi32(A), lo = _mm256_set1_epi32(-A);
    for (; k + 16 <= K; k += 16) {
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vinv));
        a = _mm256_max_epi32(_mm256_min_epi32(a, hi), lo);
        b = _mm256_max_epi32(_mm256_min_epi32(b, hi), lo);
        /* packs works per 128-bit lane: reorder the quarters back to k order */
        _mm256_storeu_si256((__m256i *)(q + k), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8));
    }
#endif
    for (; k < K; k++) {
        long v = lrintf(x[k] * inv); /* round half to even (the default rounding mode) */
        q[k] = (int16_t)(v > A ? A : (v < -A ? -A : v));
    }
    for (k = K; k < kp; k++) q[k] = 0;
    *sx = amax / (float)A;
}

/* y[r][j] = ((float)acc[r][j] * sx[r]) * scale[j] for the nc real channels of a tile. */
static inline void finish(const int32_t *acc, int rows, const float *sx, const float *scale, int nc, float *y,
                          long ldy) {
#ifdef GEMM_AVX2
    if (nc == QT) {
        const __m256 s0 = _mm256_loadu_ps(scale), s1 = _mm256_loadu_ps(scale + 8);
        for (int r = 0; r < rows; r++) {
            const __m256 f = _mm256_set1_ps(sx[r]);
            const __m256 a = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(acc + r * QT)));
            const __m256 b = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(acc + r * QT + 8)));
            _mm256_storeu_ps(y + r * ldy, _mm256_mul_ps(_mm256_mul_ps(a, f), s0));
            _mm256_storeu_ps(y + r * ldy + 8, _mm256_mul_ps(_mm256_mul_ps(b, f), s1));
        }
        return;
    }
#endif
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < nc; j++) y[r * ldy + j] = ((float)acc[r * QT + j] * sx[r]) * scale[j];
}

#if defined(GEMM_AVX2) && !defined(GEMM_VNNI512) /* the AVX2 micro-kernels (the VNNI ones are below) */
/* One step of one row: broadcast its pair of int16 at ADDR, multiply-add into A0/A1. */
#define ROW(ADDR, A0, A1)                                                   \
    "vpbroadcastd " ADDR ", %%ymm14\n\t"                                    \
    "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t"                                \
    "vpaddd %%ymm15, %[" A0 "], %[" A0 "]\n\t"                              \
    "vpmaddwd %%ymm13, %%ymm14, %%ymm14\n\t"                                \
    "vpaddd %%ymm14, %[" A1 "], %[" A1 "]\n\t"
#define LOADW "vpmovsxbw (%[w]), %%ymm12\n\t" "vpmovsxbw 16(%[w]), %%ymm13\n\t"
#define CLOBBER "xmm12", "xmm13", "xmm14", "xmm15", "memory"

static inline void store_acc(int32_t *acc, int r, __m256i lo, __m256i hi) {
    _mm256_storeu_si256((__m256i *)(acc + r * QT), lo);
    _mm256_storeu_si256((__m256i *)(acc + r * QT + 8), hi);
}

/* R rows x 16 channels over all K2 pairs; x rows are ldx int16 apart. Written in asm
 * because compilers hoist all six broadcasts and spill the twelve accumulators. */
static void mk6(const int16_t *x, long ldx, long K2, const int8_t *wt, int32_t *acc) {
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256i c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const int16_t *x3 = x + 3 * ldx;
    for (long p = 0; p < K2; p++) {
        __asm__(LOADW ROW("(%[a])", "c00", "c01") ROW("(%[a],%[s])", "c10", "c11") ROW("(%[a],%[s],2)", "c20", "c21")
                    ROW("(%[b])", "c30", "c31") ROW("(%[b],%[s])", "c40", "c41") ROW("(%[b],%[s],2)", "c50", "c51")
                : [c00] "+x"(c00), [c01] "+x"(c01), [c10] "+x"(c10), [c11] "+x"(c11), [c20] "+x"(c20),
                  [c21] "+x"(c21), [c30] "+x"(c30), [c31] "+x"(c31), [c40] "+x"(c40), [c41] "+x"(c41),
                  [c50] "+x"(c50), [c51] "+x"(c51)
                : [w] "r"(wt + p * 2 * QT), [a] "r"(x + 2 * p), [b] "r"(x3 + 2 * p), [s] "r"(ldx * 2)
                : CLOBBER);
    }
    store_acc(acc, 0, c00, c01); store_acc(acc, 1, c10, c11); store_acc(acc, 2, c20, c21);
    store_acc(acc, 3, c30, c31); store_acc(acc, 4, c40, c41); store_acc(acc, 5, c50, c51);
}

static void mk4(const int16_t *x, long ldx, long K2, const int8_t *wt, int32_t *acc) {
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    const int16_t *x3 = x + 3 * ldx;
    for (long p = 0; p < K2; p++) {
        __asm__(LOADW ROW("(%[a])", "c00", "c01") ROW("(%[a],%[s])", "c10", "c11") ROW("(%[a],%[s],2)", "c20", "c21")
                    ROW("(%[b])", "c30", "c31")
                : [c00] "+x"(c00), [c01] "+x"(c01), [c10] "+x"(c10), [c11] "+x"(c11), [c20] "+x"(c20),
                  [c21] "+x"(c21), [c30] "+x"(c30), [c31] "+x"(c31)
                : [w] "r"(wt + p * 2 * QT), [a] "r"(x + 2 * p), [b] "r"(x3 + 2 * p), [s] "r"(ldx * 2)
                : CLOBBER);
    }
    store_acc(acc, 0, c00, c01); store_acc(acc, 1, c10, c11); store_acc(acc, 2, c20, c21); store_acc(acc, 3, c30, c31);
}

static void mk2(const int16_t *x, long ldx, long K2, const int8_t *wt, int32_t *acc) {
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00;
    for (long p = 0; p < K2; p++) {
        __asm__(LOADW ROW("(%[a])", "c00", "c01") ROW("(%[a],%[s])", "c10", "c11")
                : [c00] "+x"(c00), [c01] "+x"(c01), [c10] "+x"(c10), [c11] "+x"(c11)
                : [w] "r"(wt + p * 2 * QT), [a] "r"(x + 2 * p), [s] "r"(ldx * 2)
                : CLOBBER);
    }
    store_acc(acc, 0, c00, c01); store_acc(acc, 1, c10, c11);
}

static void mk1(const int16_t *x, long ldx, long K2, const int8_t *wt, int32_t *acc) {
    (void)ldx;
    __m256i c00 = _mm256_setzero_si256(), c01 = c00;
    for (long p = 0; p < K2; p++) {
        __asm__(LOADW ROW("(%[a])", "c00", "c01")
                : [c00] "+x"(c00), [c01] "+x"(c01)
                : [w] "r"(wt + p * 2 * QT), [a] "r"(x + 2 * p)
                : CLOBBER);
    }
    store_acc(acc, 0, c00, c01);
}
#endif

#ifdef GEMM_VNNI512
/* R rows x 16 channels over all K2 pairs with AVX-512 VNNI: per pair, the tile's 32
 * int8 weights are widened once to int16 and each row adds its pair's products with
 * one vpdpwssd (non-saturating, so the int32 sums equal the AVX2 path's bitwise).
 * vpdpwssd's latency (~5 cycles) would serialise a row's single accumulator, so with
 * few rows each row keeps CH partial sums over interleaved pairs (integer sums: the
 * order does not change the result). */
static inline __attribute__((always_inline)) void mkv(const int16_t *x, long ldx, long K2, const int8_t *wt,
                                                       int32_t *acc, const int R) {
    const int CH = R <= 2 ? 4 : (R <= 5 ? 2 : 1);
    __m512i c[MR];
#pragma GCC unroll 12
    for (int i = 0; i < R * CH; i++) c[i] = _mm512_setzero_si512();
    long p = 0;
    for (; p + CH <= K2; p += CH) {
#pragma GCC unroll 4
        for (int h = 0; h < CH; h++) {
            const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wt + (p + h) * 2 * QT)));
#pragma GCC unroll 12
            for (int r = 0; r < R; r++) {
                int32_t pair;
                memcpy(&pair, x + r * ldx + 2 * (p + h), sizeof pair);
                c[h * R + r] = _mm512_dpwssd_epi32(c[h * R + r], w, _mm512_set1_epi32(pair));
            }
        }
    }
    for (; p < K2; p++) {
        const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wt + p * 2 * QT)));
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            int32_t pair;
            memcpy(&pair, x + r * ldx + 2 * p, sizeof pair);
            c[r] = _mm512_dpwssd_epi32(c[r], w, _mm512_set1_epi32(pair));
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        __m512i sum = c[r];
#pragma GCC unroll 4
        for (int h = 1; h < CH; h++) sum = _mm512_add_epi32(sum, c[h * R + r]);
        _mm512_storeu_si512((void *)(acc + r * QT), sum);
    }
}
#define MKV(R) static void mkv##R(const int16_t *x, long ldx, long K2, const int8_t *wt, int32_t *acc) { \
        mkv(x, ldx, K2, wt, acc, R); }
MKV(1) MKV(2) MKV(3) MKV(4) MKV(5) MKV(6) MKV(7) MKV(8) MKV(9) MKV(10) MKV(11) MKV(12)
typedef void (*mkv_fn)(const int16_t *, long, long, const int8_t *, int32_t *);
static const mkv_fn MKV_BY_ROWS[MR + 1] = {0, mkv1, mkv2, mkv3, mkv4, mkv5, mkv6, mkv7, mkv8, mkv9, mkv10, mkv11, mkv12};
#endif

/* Exact int32 sums for `rows` (1..MR) rows against one tile: acc[r][j]. */
static void tile_sums(const int16_t *x, long ldx, long K2, const int8_t *wt, int rows, int32_t *acc) {
#if defined(GEMM_VNNI512)
    MKV_BY_ROWS[rows](x, ldx, K2, wt, acc);
#elif defined(GEMM_AVX2)
    switch (rows) {
        case 6: mk6(x, ldx, K2, wt, acc); return;
        case 5: mk4(x, ldx, K2, wt, acc); mk1(x + 4 * ldx, ldx, K2, wt, acc + 4 * QT); return;
        case 4: mk4(x, ldx, K2, wt, acc); return;
        case 3: mk2(x, ldx, K2, wt, acc); mk1(x + 2 * ldx, ldx, K2, wt, acc + 2 * QT); return;
        case 2: mk2(x, ldx, K2, wt, acc); return;
        default: mk1(x, ldx, K2, wt, acc); return;
    }
#else
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < QT; j++) {
            int32_t s = 0;
            for (long p = 0; p < K2; p++) {
                const int8_t *w = wt + (p * QT + j) * 2;
                s += (int32_t)x[r * ldx + 2 * p] * w[0] + (int32_t)x[r * ldx + 2 * p + 1] * w[1];
            }
            acc[r * QT + j] = s;
        }
#endif
}

/* Bytes of the scratch metrale_int8_linear_team needs for M rows of K values: their int16
 * activations and their scales. */
long metrale_int8_scratch_bytes(long M, long K) {
    return (long)sizeof(int16_t) * M * 2 * metrale_int8_pair_k(K) + (long)sizeof(float) * M;
}

/* Quantises M rows of x (float32 [M, K]) into scratch (metrale_int8_scratch_bytes(M, K) bytes), by
 * the calling thread alone: what metrale_int8_tiles_team reads. */
void metrale_int8_quantize(const float *x, long M, long K, void *scratch) {
    const long kp = 2 * metrale_int8_pair_k(K);
    const int32_t A = act_limit(K);
    int16_t *xq = (int16_t *)scratch;
    float *sx = (float *)(xq + M * kp);
    for (long m = 0; m < M; m++) quantize_row(x + m * K, K, A, xq + m * kp, sx + m);
}

/* The tiles of y[m, n] = scale[n] * sum_k x[m, k] * w[n, k] from x's rows quantised in scratch
 * (metrale_int8_quantize's layout), shared by the threads of the enclosing team: the weights are
 * read once per block of MC rows; the tiles are handed out in shrinking contiguous runs (guided:
 * long streams of the weights, and a thread that falls behind, descheduled by another process,
 * holds up only its last run). */
void metrale_int8_tiles_team(const int8_t *packed, const float *scale, float *y, long M, long N, long K,
                             const void *scratch) {
    const long K2 = metrale_int8_pair_k(K), kp = 2 * K2, tiles = (N + QT - 1) / QT;
    const int16_t *xq = (const int16_t *)scratch;
    const float *sx = (const float *)(xq + M * kp);
    for (long m0 = 0; m0 < M; m0 += MC) {
        const long m1 = m0 + MC < M ? m0 + MC : M;
#pragma omp for schedule(guided)
        for (long t = 0; t < tiles; t++) {
            const int8_t *wt = packed + t * K2 * 2 * QT;
            const long n0 = t * QT;
            const int nc = (int)(N - n0 < QT ? N - n0 : QT);
            int32_t acc[MR * QT];
            for (long m = m0; m < m1; m += MR) {
                const int rows = (int)(m1 - m < MR ? m1 - m : MR);
                tile_sums(xq + m * kp, kp, K2, wt, rows, acc);
                finish(acc, rows, sx + m, scale + n0, nc, y + m * N + n0, N);
            }
        }
    }
}

/* y[m, n] = scale[n] * sum_k x[m, k] * w[n, k], x: float32 [M, K], packed: metrale_int8_pack
 * of w (int8 [N, K]), scale: float32 [N], y: float32 [M, N]: the work of every thread of the
 * enclosing OpenMP team (each calls it; outside a parallel region one thread does it all): the
 * rows quantised among the threads, then metrale_int8_tiles_team. scratch:
 * metrale_int8_scratch_bytes(M, K) bytes shared by the team. */
void metrale_int8_linear_team(const float *x, const int8_t *packed, const float *scale, float *y, long M, long N,
                              long K, void *scratch) {
    const long kp = 2 * metrale_int8_pair_k(K);
    const int32_t A = act_limit(K);
    int16_t *xq = (int16_t *)scratch;
    float *sx = (float *)(xq + M * kp);
#pragma omp for schedule(guided)
    for (long m = 0; m < M; m++) quantize_row(x + m * K, K, A, xq + m * kp, sx + m);
    metrale_int8_tiles_team(packed, scale, y, M, N, K, scratch);
}

/* metrale_int8_linear_team in a parallel region of nthreads threads, with its own scratch. */
void metrale_int8_linear(const float *x, const int8_t *packed, const float *scale, float *y, long M, long N, long K,
                         int nthreads) {
    void *scratch = malloc((size_t)metrale_int8_scratch_bytes(M, K));
    if (!scratch) {
        for (long i = 0; i < M * N; i++) y[i] = NAN; /* out of memory: never silently zeros */
        return;
    }
#pragma omp parallel num_threads(nthreads)
    metrale_int8_linear_team(x, packed, scale, y, M, N, K, scratch);
    free(scratch);
}
