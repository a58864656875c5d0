/* CPU kernels for the decode step: paged attention over block tables and an
 * int8-weight linear. Built at first use by inference/engine/kernels/build.py with
 * the system C compiler (-O3 -march=native -fopenmp) and called through ctypes on
 * torch tensors' data pointers; inference/engine/kernels/__init__.py wraps them.
 *
 * Both kernels are row-independent: a row's result is computed by the same
 * instructions in the same order whatever the other rows are, so greedy decoding
 * gives bitwise the same tokens alone or in any batch.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "kernels.h"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define METRALE_AVX2 1
#endif


#ifdef METRALE_AVX2
static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    lo = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, lo);
    lo = _mm_add_ss(lo, sh);
    return _mm_cvtss_f32(lo);
}
#endif

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = ((uint32_t)h) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* One token's K or V rows for KV heads [h0, h1) as float32: a pointer into the cache
 * (float32) or into dst after conversion (bfloat16). kv_dtype: 0 float32, 1 bfloat16. */
static inline const float *load_heads(const void *base, long slot, int n_kv, int h0, int h1, int head_dim,
                                      int kv_dtype, float *dst) {
    const long first = (slot * n_kv + h0) * head_dim;
    if (kv_dtype == 0) return (const float *)base + first;
    const uint16_t *src = (const uint16_t *)base + first;
    const int n = (h1 - h0) * head_dim;
    for (int i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
    return dst;
}

#ifdef METRALE_AVX2
/* 8 K/V values as float32 from a float32 (kv_dtype 0) or bfloat16 (1) cache row. */
static inline __m256 load8(const void *row, int i, int kv_dtype) {
    if (kv_dtype == 0) return _mm256_loadu_ps((const float *)row + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* exp(x) for 8 lanes: Cephes' expf (range reduction by ln 2, degree-5 polynomial), as in
 * avx_mathfun; relative error ~2e-7 on the range used here (x <= 0). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* The AVX2 path of attend() for head_dim a multiple of 64: the same steps (scores, max,
 * exp, sum, weighted V) vectorised; per (sequence, head) the order of operations is fixed. */
static void attend_avx2(const float *qh, const void *k_cache, const void *v_cache, const int64_t *table, long len,
                        float *out, int n_kv, int h0, int h1, int group, int head_dim, int block_size, float scale,
                        int kv_dtype, float *scores) {
    const int nh = (h1 - h0) * group;
    const size_t esize = kv_dtype == 0 ? 4 : 2;
    const long row = (long)n_kv * head_dim; /* elements per token */
    float maxs[256], sums[256];
    for (int j = 0; j < nh; j++) maxs[j] = -INFINITY;
    for (long t = 0; t < len; t++) {
        const long slot = table[t / block_size] * block_size + t % block_size;
        const char *krow = (const char *)k_cache + (slot * row + (long)h0 * head_dim) * esize;
        for (int j = 0; j < nh; j++) {
            const float *qj = qh + (long)j * head_dim;
            const void *kj = krow + (long)(j / group) * head_dim * esize;
            __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
            for (int i = 0; i < head_dim; i += 16) {
                a = _mm256_fmadd_ps(_mm256_loadu_ps(qj + i), load8(kj, i, kv_dtype), a);
                b = _mm256_fmadd_ps(_mm256_loadu_ps(qj + i + 8), load8(kj, i + 8, kv_dtype), b);
            }
            const float sc = hsum8(_mm256_add_ps(a, b)) * scale;
            scores[j * len + t] = sc;
            if (sc > maxs[j]) maxs[j] = sc;
        }
    }
    for (int j = 0; j < nh; j++) {
        float *r = scores + j * len;
        const __m256 mx = _mm256_set1_ps(maxs[j]);
        __m256 acc = _mm256_setzero_ps();
        long t = 0;
        for (; t + 8 <= len; t += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(r + t), mx));
            _mm256_storeu_ps(r + t, e);
            acc = _mm256_add_ps(acc, e);
        }
        float sum = hsum8(acc);
        if (t < len) {
            float tmp[8] = {0};
            for (long u = t; u < len; u++) tmp[u - t] = r[u] - maxs[j];
            _mm256_storeu_ps(tmp, exp8(_mm256_loadu_ps(tmp)));
            for (long u = t; u < len; u++) {
                r[u] = tmp[u - t];
                sum += r[u];
            }
        }
        sums[j] = sum;
    }
    /* Weighted V, token-major: each token's V row (all heads) is read once, in order. */
    float *acc = scores + (long)nh * len; /* [nh, head_dim] */
    memset(acc, 0, sizeof(float) * (size_t)nh * head_dim);
    for (long t = 0; t < len; t++) {
        const long slot = table[t / block_size] * block_size + t % block_size;
        const char *vrow = (const char *)v_cache + (slot * row + (long)h0 * head_dim) * esize;
        if ((t + 1) % block_size == 0 && t + 1 < len) {  /* the next block starts elsewhere: fetch it early */
            const char *next = (const char *)v_cache + (table[(t + 1) / block_size] * block_size * row +
                                                        (long)h0 * head_dim) * esize;
            for (long b = 0; b < (long)(h1 - h0) * head_dim * (long)esize; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
        }
        for (int j = 0; j < nh; j++) {
            const __m256 pt = _mm256_broadcast_ss(scores + j * len + t);
            const char *v = vrow + (long)(j / group) * head_dim * esize;
            float *aj = acc + (long)j * head_dim;
            for (int c = 0; c < head_dim; c += 8)
                _mm256_storeu_ps(aj + c, _mm256_fmadd_ps(pt, load8(v, c, kv_dtype), _mm256_loadu_ps(aj + c)));
        }
    }
    for (int j = 0; j < nh; j++) {
        const __m256 inv = _mm256_set1_ps(1.f / sums[j]);
        float *o = out + ((long)h0 * group + j) * head_dim;
        for (int c = 0; c < head_dim; c += 8) _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(acc + (long)j * head_dim + c), inv));
    }
}
#endif

/* Attention of sequence d's query heads that read KV heads [h0, h1). scratch holds
 * (h1 - h0) * group * len scores plus 2 * (h1 - h0) * head_dim conversion floats and
 * (h1 - h0) * group * head_dim accumulators. The operations for one (d, head) are the
 * same whatever [h0, h1) is. */
static void attend(const float *q, const void *k_cache, const void *v_cache, const int64_t *table, long len,
                   float *out, int n_heads, int n_kv, int h0, int h1, int head_dim, int block_size, float scale,
                   int kv_dtype, float *scratch) {
    const int group = n_heads / n_kv;
    const int nh = (h1 - h0) * group; /* query heads handled here */
    float *scores = scratch;
    float *kbuf = scores + (long)nh * len;
    float *acc = kbuf + (h1 - h0) * head_dim;
    const float *qh = q + (long)h0 * group * head_dim;
#ifdef METRALE_AVX2
    if (head_dim % 64 == 0) {
        attend_avx2(qh, k_cache, v_cache, table, len, out, n_kv, h0, h1, group, head_dim, block_size, scale, kv_dtype,
                    scores);
        return;
    }
#endif
    float maxs[256], sums[256];
    for (int j = 0; j < nh; j++) maxs[j] = -INFINITY;
    for (long t = 0; t < len; t++) {
        const long slot = table[t / block_size] * block_size + t % block_size;
        const float *k = load_heads(k_cache, slot, n_kv, h0, h1, head_dim, kv_dtype, kbuf);
        for (int j = 0; j < nh; j++) {
            const float *qj = qh + (long)j * head_dim;
            const float *kj = k + (long)(j / group) * head_dim;
            float s = 0.f;
#pragma omp simd reduction(+ : s)
            for (int i = 0; i < head_dim; i++) s += qj[i] * kj[i];
            s *= scale;
            scores[j * len + t] = s;
            if (s > maxs[j]) maxs[j] = s;
        }
    }
    for (int j = 0; j < nh; j++) {
        float sum = 0.f;
        float *row = scores + j * len;
        for (long t = 0; t < len; t++) {
            row[t] = expf(row[t] - maxs[j]);
            sum += row[t];
        }
        sums[j] = sum;
    }
    memset(acc, 0, sizeof(float) * (size_t)nh * head_dim);
    for (long t = 0; t < len; t++) {
        const long slot = table[t / block_size] * block_size + t % block_size;
        const float *v = load_heads(v_cache, slot, n_kv, h0, h1, head_dim, kv_dtype, kbuf);
        for (int j = 0; j < nh; j++) {
            const float p = scores[j * len + t];
            const float *vj = v + (long)(j / group) * head_dim;
            float *a = acc + (long)j * head_dim;
#pragma omp simd
            for (int i = 0; i < head_dim; i++) a[i] += p * vj[i];
        }
    }
    for (int j = 0; j < nh; j++) {
        float *o = out + ((long)h0 * group + j) * head_dim;
        const float inv = 1.f / sums[j];
        for (int i = 0; i < head_dim; i++) o[i] = acc[(long)j * head_dim + i] * inv;
    }
}

/* Decode attention through block tables (vLLM's PagedAttention layout, Kwon et al. 2023).
 *
 * q: float32 [D, n_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size, n_kv,
 * head_dim] in float32 (kv_dtype 0) or bfloat16 (1); block_tables: int64 [D, width];
 * seq_lens: int64 [D] (tokens to attend, the new one included); out: float32 [D,
 * n_heads, head_dim]. Grouped-query head h reads KV head h / (n_heads / n_kv).
 * softmax(q k^T * scale) v in float32. With at least as many sequences as threads a
 * task is one sequence (each token's K/V rows, all heads, are read once); otherwise
 * one (sequence, KV head). The result is the same either way. n_heads <= 256.
 */
void metrale_paged_decode_attention_strided(const float *q, long q_stride, const void *k_cache, const void *v_cache,
                                            const int64_t *block_tables, const int64_t *seq_lens, float *out,
                                            long D, int n_heads, int n_kv, int head_dim, int block_size, long width,
                                            float scale, int kv_dtype, int nthreads) {
    long max_len = 0;
    for (long d = 0; d < D; d++)
        if (seq_lens[d] > max_len) max_len = seq_lens[d];
    const int per_head = D < nthreads;
    const long tasks = per_head ? D * n_kv : D;
#pragma omp parallel num_threads(nthreads)
    {
        float *scratch = (float *)malloc(sizeof(float) * (size_t)(n_heads * max_len + 2 * n_kv * head_dim +
                                                                  n_heads * head_dim));
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < tasks; task++) {
            const long d = per_head ? task / n_kv : task;
            const int h0 = per_head ? (int)(task % n_kv) : 0, h1 = per_head ? h0 + 1 : n_kv;
            attend(q + d * q_stride, k_cache, v_cache, block_tables + d * width, seq_lens[d],
                   out + d * n_heads * head_dim, n_heads, n_kv, h0, h1, head_dim, block_size, scale, kv_dtype,
                   scratch);
        }
        free(scratch);
    }
}

void metrale_paged_decode_attention(const float *q, const void *k_cache, const void *v_cache,
                                    const int64_t *block_tables, const int64_t *seq_lens, float *out,
                                    long D, int n_heads, int n_kv, int head_dim, int block_size, long width,
                                    float scale, int kv_dtype, int nthreads) {
    metrale_paged_decode_attention_strided(q, (long)n_heads * head_dim, k_cache, v_cache, block_tables, seq_lens, out,
                                           D, n_heads, n_kv, head_dim, block_size, width, scale, kv_dtype, nthreads);
}

/* Above this many rows a tile is staged as float32 and reused (see metrale_int8_linear);
 * up to it, converting in registers per pair of rows measured faster on the real model
 * (SmolLM2 decode steps, weights coming from DRAM): 137 vs 151 ms at 32 rows, 240 vs
 * 275 ms the other way at 64. */
#ifndef STAGE_MIN
#define STAGE_MIN 32
#endif
#define NT 32 /* output channels per packed tile: four AVX2 vectors */
#define KB 128 /* k values staged at a time: 16 KiB of float32, in L1 */

/* Pack an int8 weight [N, K] into tiles of NT channels, k-major inside a tile:
 * packed[t][k][j] = w[t * NT + j][k] (zero for the padding channels of the last tile).
 * packed: int8 [ceil(N / NT), K, NT]. */
void metrale_int8_pack(const int8_t *w, int8_t *packed, long N, long K) {
    const long tiles = (N + NT - 1) / NT;
    for (long t = 0; t < tiles; t++)
        for (long k = 0; k < K; k++)
            for (int j = 0; j < NT; j++) {
                const long n = t * NT + j;
                packed[(t * K + k) * NT + j] = n < N ? w[n * K + k] : 0;
            }
}

#ifdef METRALE_AVX2
static inline __m256 cvt8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

#endif

#ifdef METRALE_AVX2
static inline void store16(float *y, const float *scale, int cnt, __m256 lo, __m256 hi) {
    if (cnt == 16) {
        _mm256_storeu_ps(y, _mm256_mul_ps(lo, _mm256_loadu_ps(scale)));
        _mm256_storeu_ps(y + 8, _mm256_mul_ps(hi, _mm256_loadu_ps(scale + 8)));
        return;
    }
    float tmp[16];
    _mm256_storeu_ps(tmp, lo);
    _mm256_storeu_ps(tmp + 8, hi);
    for (int j = 0; j < cnt; j++) y[j] = tmp[j] * scale[j];
}

/* Load 16 partial sums (cnt real ones, the rest 0) saved by save16. */
static inline void load16(const float *y, int cnt, __m256 *lo, __m256 *hi) {
    if (cnt == 16) {
        *lo = _mm256_loadu_ps(y);
        *hi = _mm256_loadu_ps(y + 8);
        return;
    }
    float tmp[16] = {0};
    for (int j = 0; j < cnt; j++) tmp[j] = y[j];
    *lo = _mm256_loadu_ps(tmp);
    *hi = _mm256_loadu_ps(tmp + 8);
}

/* Save 16 partial sums unscaled (cnt real ones). */
static inline void save16(float *y, int cnt, __m256 lo, __m256 hi) {
    float tmp[16];
    if (cnt == 16) {
        _mm256_storeu_ps(y, lo);
        _mm256_storeu_ps(y + 8, hi);
        return;
    }
    _mm256_storeu_ps(tmp, lo);
    _mm256_storeu_ps(tmp + 8, hi);
    for (int j = 0; j < cnt; j++) y[j] = tmp[j];
}

/* R rows (R <= 6) against 16 staged float32 channels (columns h*16 .. h*16+15 of the tile)
 * over one block of kn values of k. The accumulators start at zero (first block) or at
 * the partial sums saved in y, so the chain of FMAs per (row, channel) is the same as
 * without blocking; the last block scales and stores the result. Named accumulators
 * (not an array) keep all twelve in registers. x points at the rows' first k of the block. */
static inline __attribute__((always_inline)) void mk_staged(const float *x, long K, long kn, const int R,
                                                            const float *wf, int h, float *y, long N,
                                                            const float *scale, int nc, int first, int last) {
    const int lo = 16 * h, cnt = nc - lo < 16 ? nc - lo : 16;
    if (cnt <= 0) return;
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0;
    __m256 a3 = a0, b3 = a0, a4 = a0, b4 = a0, a5 = a0, b5 = a0;
    if (!first) {
        load16(y + lo, cnt, &a0, &b0);
        if (R > 1) load16(y + N + lo, cnt, &a1, &b1);
        if (R > 2) load16(y + 2 * N + lo, cnt, &a2, &b2);
        if (R > 3) load16(y + 3 * N + lo, cnt, &a3, &b3);
        if (R > 4) load16(y + 4 * N + lo, cnt, &a4, &b4);
        if (R > 5) load16(y + 5 * N + lo, cnt, &a5, &b5);
    }
    const float *p = wf + 16 * h;
#define ROW(r, A, B)                                                \
    if (R > r) {                                                    \
        const __m256 s = _mm256_broadcast_ss(x + r * K + k);        \
        A = _mm256_fmadd_ps(s, w0, A);                              \
        B = _mm256_fmadd_ps(s, w1, B);                              \
    }
    for (long k = 0; k < kn; k++, p += NT) {
        const __m256 w0 = _mm256_loadu_ps(p), w1 = _mm256_loadu_ps(p + 8);
        ROW(0, a0, b0) ROW(1, a1, b1) ROW(2, a2, b2) ROW(3, a3, b3) ROW(4, a4, b4) ROW(5, a5, b5)
    }
#undef ROW
#define OUT(r, A, B) \
    if (R > r) { if (last) store16(y + r * N + lo, scale + lo, cnt, A, B); else save16(y + r * N + lo, cnt, A, B); }
    OUT(0, a0, b0) OUT(1, a1, b1) OUT(2, a2, b2) OUT(3, a3, b3) OUT(4, a4, b4) OUT(5, a5, b5)
#undef OUT
}

/* R rows (R <= 2) against the 32 channels of one int8 tile, converted in registers. */
static inline __attribute__((always_inline)) void mk_direct(const float *x, long K, const int R, const int8_t *wt,
                                                            float *y, long N, const float *scale, int nc) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (long k = 0; k < K; k++) {
        const int8_t *p = wt + k * NT;
        const __m256 w0 = cvt8(p), w1 = cvt8(p + 8), w2 = cvt8(p + 16), w3 = cvt8(p + 24);
        const __m256 s = _mm256_broadcast_ss(x + k);
        a0 = _mm256_fmadd_ps(s, w0, a0); a1 = _mm256_fmadd_ps(s, w1, a1);
        a2 = _mm256_fmadd_ps(s, w2, a2); a3 = _mm256_fmadd_ps(s, w3, a3);
        if (R > 1) {
            const __m256 t = _mm256_broadcast_ss(x + K + k);
            b0 = _mm256_fmadd_ps(t, w0, b0); b1 = _mm256_fmadd_ps(t, w1, b1);
            b2 = _mm256_fmadd_ps(t, w2, b2); b3 = _mm256_fmadd_ps(t, w3, b3);
        }
    }
    const int cnt0 = nc < 16 ? nc : 16, cnt1 = nc - 16;
    store16(y, scale, cnt0, a0, a1);
    if (cnt1 > 0) store16(y + 16, scale + 16, cnt1, a2, a3);
    if (R > 1) {
        store16(y + N, scale, cnt0, b0, b1);
        if (cnt1 > 0) store16(y + N + 16, scale + 16, cnt1, b2, b3);
    }
}
#endif

/* Weight-only int8 linear: y[m, n] = scale[n] * sum_k x[m, k] * w[n, k].
 *
 * x: float32 [M, K]; packed: int8 [ceil(N / NT), K, NT] from metrale_int8_pack
 * (symmetric per-output-channel quantisation); scale: float32 [N]; y: float32 [M, N].
 * Every (row, channel) sum runs k = 0..K-1 in order on its own accumulator and the
 * int8 -> float32 conversion is exact, so a row's result is bitwise the same whatever
 * M is and whatever the other rows hold. For M <= STAGE_MIN each tile is converted in
 * registers for every pair of rows; for larger M, KB values of k at a time are
 * converted once into a float32 buffer that every block of up to 6 rows reuses. The
 * weights are read from memory once per call.
 */
void metrale_int8_linear(const float *x, const int8_t *packed, const float *scale, float *y, long M, long N, long K,
                         int nthreads) {
    const long tiles = (N + NT - 1) / NT;
    const int stage = M > STAGE_MIN;
#pragma omp parallel num_threads(nthreads)
    {
        float *wf = stage ? (float *)malloc(sizeof(float) * (size_t)(KB * NT)) : NULL;
#pragma omp for schedule(static)
        for (long t = 0; t < tiles; t++) {
            const int8_t *wt = packed + t * K * NT;
            const long n0 = t * NT;
            const int nc = (int)((N - n0) < NT ? (N - n0) : NT);
#ifdef METRALE_AVX2
            if (!stage) {
                long m = 0;
                for (; m + 2 <= M; m += 2) mk_direct(x + m * K, K, 2, wt, y + m * N + n0, N, scale + n0, nc);
                if (m < M) mk_direct(x + m * K, K, 1, wt, y + m * N + n0, N, scale + n0, nc);
                continue;
            }
            for (long k0 = 0; k0 < K; k0 += KB) {
                const long kn = K - k0 < KB ? K - k0 : KB;
                const int first = k0 == 0, last = k0 + kn == K;
                for (long k = 0; k < kn; k++)
                    for (int v = 0; v < 4; v++)
                        _mm256_storeu_ps(wf + k * NT + 8 * v, cvt8(wt + (k0 + k) * NT + 8 * v));
                for (int h = 0; h < 2; h++) {
                    long m = 0;
                    for (; m + 6 <= M; m += 6)
                        mk_staged(x + m * K + k0, K, kn, 6, wf, h, y + m * N + n0, N, scale + n0, nc, first, last);
                    const float *xm = x + m * K + k0;
                    float *ym = y + m * N + n0;
                    switch (M - m) {
                        case 5: mk_staged(xm, K, kn, 5, wf, h, ym, N, scale + n0, nc, first, last); break;
                        case 4: mk_staged(xm, K, kn, 4, wf, h, ym, N, scale + n0, nc, first, last); break;
                        case 3: mk_staged(xm, K, kn, 3, wf, h, ym, N, scale + n0, nc, first, last); break;
                        case 2: mk_staged(xm, K, kn, 2, wf, h, ym, N, scale + n0, nc, first, last); break;
                        case 1: mk_staged(xm, K, kn, 1, wf, h, ym, N, scale + n0, nc, first, last); break;
                        default: break;
                    }
                }
            }
#else
            for (long m = 0; m < M; m++)
                for (int j = 0; j < nc; j++) {
                    float s = 0.f;
                    for (long k = 0; k < K; k++) s += x[m * K + k] * (float)wt[k * NT + j];
                    y[m * N + n0 + j] = s * scale[n0 + j];
                }
#endif
        }
        free(wf);
    }
}
