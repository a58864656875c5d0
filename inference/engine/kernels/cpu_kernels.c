/* CPU kernel for the decode step: paged attention over block tables (the int8
 * linear is in int8_gemm.c, whole decode layers in decode_layer.c). Built at first use by inference/engine/kernels/build.py with
 * the system C compiler (-O3 -march=native -fopenmp) and called through ctypes on
 * torch tensors' data pointers; inference/engine/kernels/__init__.py wraps them.
 *
 * It is row-independent: a row's result is computed by the same instructions in
 * the same order whatever the other rows are, so greedy decoding gives bitwise the
 * same tokens alone or in any batch.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "kernels.h" /* defines METRALE_AVX2 (and includes immintrin.h) on AVX2 + FMA CPUs */


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

/* Bytes one KV head of one token takes in the cache. kv_dtype: 0 float32, 1 bfloat16, 2 int8
 * (head_dim int8 values, then their float32 scale: value = int8 * scale; layers/kv_quant.py). */
static inline long head_bytes(int kv_dtype, int head_dim) {
    return kv_dtype == 0 ? 4L * head_dim : kv_dtype == 1 ? 2L * head_dim : (long)head_dim + 4;
}

/* The float32 scale after an int8 head row of head_dim values. */
static inline float int8_scale(const char *head, int head_dim) {
    float s;
    memcpy(&s, head + head_dim, sizeof s);
    return s;
}

/* One token's K or V rows for KV heads [h0, h1) as float32: a pointer into the cache
 * (float32) or into dst after conversion (bfloat16, int8). */
static inline const float *load_heads(const void *base, long slot, int n_kv, int h0, int h1, int head_dim,
                                      int kv_dtype, float *dst) {
    if (kv_dtype == 0) return (const float *)base + (slot * n_kv + h0) * head_dim;
    const int n = (h1 - h0) * head_dim;
    if (kv_dtype == 1) {
        const uint16_t *src = (const uint16_t *)base + (slot * n_kv + h0) * head_dim;
        for (int i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
        return dst;
    }
    const long hb = head_bytes(kv_dtype, head_dim);
    for (int h = h0; h < h1; h++) {
        const char *head = (const char *)base + (slot * n_kv + h) * hb;
        const float sc = int8_scale(head, head_dim);
        float *o = dst + (long)(h - h0) * head_dim;
        for (int i = 0; i < head_dim; i++) o[i] = (float)((const int8_t *)head)[i] * sc;
    }
    return dst;
}

/* Addresses of the K rows (KV heads from h0 on) of keys t0 .. t0 + n - 1 for one block of
 * n scores; past len the block's first key is repeated, so a short last block scores
 * real keys the same way a full one does. tbytes, hb: cache bytes per token, per head. */
static inline void key_rows(const char **krows, int n, long t0, long len, const int64_t *table, int block_size,
                            const void *k_cache, long tbytes, int h0, long hb) {
    if (block_size % 16 == 0 && t0 % 16 == 0 && t0 + n <= len) { /* one block holds the n <= 16 tokens */
        const char *base = (const char *)k_cache + (table[t0 / block_size] * block_size + t0 % block_size) * tbytes +
                           (long)h0 * hb;
        for (int u = 0; u < n; u++) krows[u] = base + u * tbytes;
        return;
    }
    for (int u = 0; u < n; u++) {
        const long t = t0 + u < len ? t0 + u : t0;
        const long slot = table[t / block_size] * block_size + t % block_size;
        krows[u] = (const char *)k_cache + slot * tbytes + (long)h0 * hb;
    }
}

#define GROUP_ROWS 32 /* rows of one block table the vector attentions serve together */

/* A row's first key (seq_starts: NULL, every row from its table's first key; a sliding window
 * whose first position falls inside its table's first block starts later). The keys before it
 * are scored like the others (so a key's score never depends on the row) but take no part in
 * the maximum, the softmax or P·V. */
static inline long first_key(const int64_t *seq_starts, long d) { return seq_starts ? seq_starts[d] : 0; }

/* Prefetches the bytes [off, off + n) of the cache rows of tokens [t0, t0 + 16) (those below len):
 * the vector attentions ask for the block after the one they read, which sits elsewhere in the
 * pool (a block table's blocks are not adjacent), so the hardware prefetchers do not find it. */
static inline void prefetch_rows(const void *cache, const int64_t *table, int block_size, long tbytes, long t0,
                                 long len, long off, long n) {
#if defined(METRALE_AVX2)
    for (long t = t0; t < t0 + 16 && t < len; t++) {
        const char *row = (const char *)cache + (table[t / block_size] * block_size + t % block_size) * tbytes + off;
        for (long b = 0; b < n; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
    }
#else
    (void)cache, (void)table, (void)block_size, (void)tbytes, (void)t0, (void)len, (void)off, (void)n;
#endif
}

#if defined(METRALE_AVX2) && !defined(METRALE_AVX512) /* the AVX2 attention (the AVX-512 one is below) */
/* 8 K/V values as float32 from a float32 (kv_dtype 0) or bfloat16 (1) cache row; int8 (2):
 * the integers, unscaled (the caller applies the row's scale). */
static inline __m256 load8(const void *row, int i, int kv_dtype) {
    if (kv_dtype == 0) return _mm256_loadu_ps((const float *)row + i);
    if (kv_dtype == 2)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + i))));
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 16 K/V values of dims [i, i + 16) as two float32 vectors, in the order perm16 names:
 * bfloat16 as its even and its odd dims (one shift or one mask per 8 values: a dword holds
 * two bfloat16s), float32 and int8 (unscaled integers) in order. */
static inline void load16_pair(const void *row, int i, int kv_dtype, __m256 *a, __m256 *b) {
    if (kv_dtype == 1) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
        *a = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        *b = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
        return;
    }
    *a = load8(row, i, kv_dtype);
    *b = load8(row, i + 8, kv_dtype);
}

/* Lane position p (0..15) of load16_pair's two vectors -> the dim (offset within the 16). */
static inline int perm16(int kv_dtype, int p) { return kv_dtype == 1 ? (p < 8 ? 2 * p : 2 * (p - 8) + 1) : p; }

/* The scores of one query row (qp: its head in load16_pair's lane order) against keys
 * t0 .. t0 + 7 (krows: their K rows of the head), scaled, into sc[8]. */
static inline __attribute__((always_inline)) void score8(const float *qp, const char *const *krows, int head_dim,
                                                         int kv_dtype, float scale, float *sc) {
    __m256 c[8];
    for (int u = 0; u < 8; u++) c[u] = _mm256_setzero_ps();
    for (int i = 0; i < head_dim; i += 16) {
        const __m256 qa = _mm256_load_ps(qp + i), qb = _mm256_load_ps(qp + i + 8);
        for (int u = 0; u < 8; u++) {
            __m256 ka, kb;
            load16_pair(krows[u], i, kv_dtype, &ka, &kb);
            c[u] = _mm256_fmadd_ps(qa, ka, c[u]);
            c[u] = _mm256_fmadd_ps(qb, kb, c[u]);
        }
    }
    const __m256 s01 = _mm256_hadd_ps(c[0], c[1]), s23 = _mm256_hadd_ps(c[2], c[3]);
    const __m256 s45 = _mm256_hadd_ps(c[4], c[5]), s67 = _mm256_hadd_ps(c[6], c[7]);
    const __m256 lo = _mm256_hadd_ps(s01, s23), hi = _mm256_hadd_ps(s45, s67);
    __m256 dots = _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
    if (kv_dtype == 2) {
        float ks[8];
        for (int u = 0; u < 8; u++) ks[u] = int8_scale(krows[u], head_dim);
        dots = _mm256_mul_ps(dots, _mm256_loadu_ps(ks));
    }
    _mm256_storeu_ps(sc, _mm256_mul_ps(dots, _mm256_set1_ps(scale)));
}

/* Rows of the AVX2 attention scratch: R rows' scores over max_len keys, their queries in lane
 * order and their P·V accumulators (floats; 32-byte aligned parts). */
static long avx2_scratch_floats(int R, long max_len, int head_dim) {
    return (long)R * (((max_len + 7) & ~7L) + 2L * head_dim) + 8;
}

/* The AVX2 path of the decode attention (head_dim a multiple of 64) for R query rows that
 * read one block table (R <= GROUP_ROWS: a sequence's verify rows, or one decode row), query
 * heads [j0, j1) (head j reads KV head j / group). Row r: query q + r * q_stride, lens[r]
 * keys, output out + r * o_stride. Scores 8 keys at a time (a short last block repeats its
 * first key, so a key's score never depends on where it falls, and a decode row scores a
 * key exactly as a prompt row does), softmax with exp8, then P·V summed over the tokens in
 * order. The query and the accumulators are kept in load16_pair's lane order, so a bfloat16
 * row is widened with one instruction per 8 values. Each K and V row is fetched once for
 * all R rows (the later rows read it from L1). Per (row, head) the operations and their
 * order are the same whatever R, [j0, j1) or the other rows are, so the same bits. */
static void attend_avx2(const float *q, long q_stride, const int64_t *lens, const int64_t *starts, int R,
                        const void *k_cache, const void *v_cache, const int64_t *table, float *out, long o_stride,
                        int n_kv, int j0, int j1, int group, int head_dim, int kv_dtype, int block_size, float scale,
                        float *scratch) {
    const long hb = head_bytes(kv_dtype, head_dim), tbytes = (long)n_kv * hb;
    long max_len = 0;
    for (int r = 0; r < R; r++) max_len = lens[r] > max_len ? lens[r] : max_len;
    const long ls = (max_len + 7) & ~7L;
    float *base = (float *)(((uintptr_t)scratch + 31) & ~(uintptr_t)31);
    float *scores = base, *qp = base + (long)R * ls, *acc = qp + (long)R * head_dim;
    float maxs[GROUP_ROWS], sums[GROUP_ROWS];
    for (int j = j0; j < j1; j++) {
        const long off = (long)(j / group) * hb;
        for (int r = 0; r < R; r++) {
            const float *qj = q + r * q_stride + (long)j * head_dim;
            for (int i = 0; i < head_dim; i += 16)
                for (int p = 0; p < 16; p++) qp[r * head_dim + i + p] = qj[i + perm16(kv_dtype, p)];
            maxs[r] = -INFINITY;
        }
        for (long t0 = 0; t0 < max_len; t0 += 8) {
            const char *krows[8];
            if (t0 % block_size + 8 <= block_size) { /* 8 keys in one block: no division per key */
                const char *first = (const char *)k_cache + (table[t0 / block_size] * block_size + t0 % block_size) * tbytes;
                for (int u = 0; u < 8; u++) krows[u] = first + u * tbytes + off;
            } else {
                key_rows(krows, 8, t0, max_len, table, block_size, k_cache, tbytes, 0, hb);
                for (int u = 0; u < 8; u++) krows[u] += off;
            }
            if (t0 + 24 <= max_len) { /* the 8 keys after the next 8: fetched while these are scored */
                for (long t = t0 + 16; t < t0 + 24; t++) {
                    const char *ahead = (const char *)k_cache + (table[t / block_size] * block_size + t % block_size) * tbytes + off;
                    for (long bt = 0; bt < hb; bt += 64) _mm_prefetch(ahead + bt, _MM_HINT_T0);
                }
            }
            for (int r = 0; r < R; r++) {
                const long len = lens[r];
                if (t0 >= len) continue;
                const int cnt = len - t0 < 8 ? (int)(len - t0) : 8;
                const char *own[8];
                const char *const *rows = krows;
                if (cnt < 8) { /* this row's last block: its first key in the unused lanes */
                    for (int u = 0; u < 8; u++) own[u] = u < cnt ? krows[u] : krows[0];
                    rows = own;
                }
                float sc[8];
                score8(qp + r * head_dim, rows, head_dim, kv_dtype, scale, sc);
                float *dst = scores + r * ls + t0, mx = maxs[r];
                const long st = first_key(starts, r);
                for (int u = 0; u < cnt; u++) {
                    dst[u] = sc[u];
                    if (t0 + u >= st && sc[u] > mx) mx = sc[u];
                }
                maxs[r] = mx;
            }
        }
        for (int r = 0; r < R; r++) {
            const long len = lens[r];
            float *row = scores + r * ls;
            const __m256 mx = _mm256_set1_ps(maxs[r]);
            __m256 e8 = _mm256_setzero_ps();
            long t = first_key(starts, r);
            for (; t + 8 <= len; t += 8) {
                const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + t), mx));
                _mm256_storeu_ps(row + t, e);
                e8 = _mm256_add_ps(e8, e);
            }
            float sum = hsum8(e8);
            if (t < len) {
                float tmp[8] = {0};
                for (long u = t; u < len; u++) tmp[u - t] = row[u] - maxs[r];
                _mm256_storeu_ps(tmp, exp8(_mm256_loadu_ps(tmp)));
                for (long u = t; u < len; u++) {
                    row[u] = tmp[u - t];
                    sum += row[u];
                }
            }
            sums[r] = sum;
        }
        /* P·V, 64 dims at a time, one KV block at a time: a row's 8 accumulators go to
         * registers for the block's tokens (summed in order) and back to acc between blocks. */
        for (int s = 0; s < head_dim; s += 64) {
            memset(acc, 0, sizeof(float) * (size_t)R * 64);
            for (long tb = 0; tb * block_size < max_len; tb++) {
                const long t_first = tb * block_size;
                const char *vblock = (const char *)v_cache + table[tb] * block_size * tbytes + off;
                for (int r = 0; r < R; r++) {
                    const long len = lens[r];
                    const long st = first_key(starts, r);
                    if (t_first >= len) continue;
                    const long t_end = t_first + block_size < len ? t_first + block_size : len;
                    const float *p = scores + r * ls;
                    float *ar = acc + r * 64;
                    __m256 a8[8];
                    for (int c = 0; c < 8; c++) a8[c] = _mm256_load_ps(ar + 8 * c);
                    for (long t = t_first > st ? t_first : st; t < t_end; t++) {
                        const char *v = vblock + (t - t_first) * tbytes;
                        const __m256 pt = _mm256_set1_ps(kv_dtype == 2 ? p[t] * int8_scale(v, head_dim) : p[t]);
                        for (int c = 0; c < 4; c++) {
                            __m256 va, vb;
                            load16_pair(v, s + 16 * c, kv_dtype, &va, &vb);
                            a8[2 * c] = _mm256_fmadd_ps(pt, va, a8[2 * c]);
                            a8[2 * c + 1] = _mm256_fmadd_ps(pt, vb, a8[2 * c + 1]);
                        }
                    }
                    for (int c = 0; c < 8; c++) _mm256_store_ps(ar + 8 * c, a8[c]);
                }
            }
            for (int r = 0; r < R; r++) {
                const __m256 inv = _mm256_set1_ps(1.f / sums[r]);
                float *o = out + r * o_stride + (long)j * head_dim + s;
                for (int c = 0; c < 4; c++) {
                    const __m256 x = _mm256_mul_ps(_mm256_load_ps(acc + r * 64 + 16 * c), inv);
                    const __m256 y = _mm256_mul_ps(_mm256_load_ps(acc + r * 64 + 16 * c + 8), inv);
                    if (kv_dtype == 1) { /* even and odd dims back in order */
                        const __m256 lo = _mm256_unpacklo_ps(x, y), hi = _mm256_unpackhi_ps(x, y);
                        _mm256_storeu_ps(o + 16 * c, _mm256_permute2f128_ps(lo, hi, 0x20));
                        _mm256_storeu_ps(o + 16 * c + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
                    } else {
                        _mm256_storeu_ps(o + 16 * c, x);
                        _mm256_storeu_ps(o + 16 * c + 8, y);
                    }
                }
            }
        }
    }
}
#endif

#ifdef METRALE_AVX512
/* 16 K/V values as float32 from a float32 (kv_dtype 0) or bfloat16 (1) cache row; int8 (2):
 * the integers, unscaled (the caller applies the row's scale). */
static inline __m512 load16(const void *row, int i, int kv_dtype) {
    if (kv_dtype == 0) return _mm512_loadu_ps((const float *)row + i);
    if (kv_dtype == 2)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)row + i))));
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Lane u of the result = the sum of c[u]'s 16 lanes (a transposing add tree: 24
 * shuffles and 15 adds for 16 dot products instead of 16 horizontal sums). */
static inline __m512 reduce16(const __m512 *c) {
    __m512 r1[8], r2[4];
    for (int k = 0; k < 8; k++)
        r1[k] = _mm512_add_ps(_mm512_unpacklo_ps(c[2 * k], c[2 * k + 1]), _mm512_unpackhi_ps(c[2 * k], c[2 * k + 1]));
    /* r1[k], per 128-bit block: [2k, 2k+1, 2k, 2k+1] partial sums */
    for (int k = 0; k < 4; k++)
        r2[k] = _mm512_add_ps(_mm512_shuffle_ps(r1[2 * k], r1[2 * k + 1], 0x44),
                              _mm512_shuffle_ps(r1[2 * k], r1[2 * k + 1], 0xee));
    /* r2[k], per 128-bit block b: keys 4k..4k+3, the part of block b */
    const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(r2[0], r2[1], 0x44), _mm512_shuffle_f32x4(r2[0], r2[1], 0xee));
    const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(r2[2], r2[3], 0x44), _mm512_shuffle_f32x4(r2[2], r2[3], 0xee));
    return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xdd));
}

/* P·V for HB query heads that read the same KV head, dims [s, s + 64): four zmm
 * accumulators per head stay in registers while the tokens stream by in order (so each
 * output element is the same sequential sum over t as pv_block's).
 * Head h's probabilities: scores + h * ldsc. hoff: the head's byte offset in a token's row
 * of tbytes bytes. */
static inline __attribute__((always_inline)) void pv_heads(const float *scores, long ldsc, long len, const void *v_cache,
                                                            const int64_t *table, int block_size, long tbytes,
                                                            long hoff, int s, int head_dim, int kv_dtype,
                                                            const float *sums, float *out, long ldo, const int HB) {
    __m512 acc[4][4];
    for (int h = 0; h < HB; h++)
        for (int c = 0; c < 4; c++) acc[h][c] = _mm512_setzero_ps();
    const char *v = NULL;
    for (long t = 0; t < len; t++, v += tbytes) {
        if (t % block_size == 0) { /* the block's first row; the next ones follow it */
            v = (const char *)v_cache + table[t / block_size] * block_size * tbytes + hoff;
            if (s == 0) prefetch_rows(v_cache, table, block_size, tbytes, t + block_size, len, hoff, head_bytes(kv_dtype, head_dim));
        }
        const float vs = kv_dtype == 2 ? int8_scale(v, head_dim) : 1.f;
        const __m512 v0 = load16(v, s, kv_dtype), v1 = load16(v, s + 16, kv_dtype);
        const __m512 v2 = load16(v, s + 32, kv_dtype), v3 = load16(v, s + 48, kv_dtype);
        for (int h = 0; h < HB; h++) {
            const __m512 p = _mm512_set1_ps(kv_dtype == 2 ? scores[h * ldsc + t] * vs : scores[h * ldsc + t]);
            acc[h][0] = _mm512_fmadd_ps(p, v0, acc[h][0]);
            acc[h][1] = _mm512_fmadd_ps(p, v1, acc[h][1]);
            acc[h][2] = _mm512_fmadd_ps(p, v2, acc[h][2]);
            acc[h][3] = _mm512_fmadd_ps(p, v3, acc[h][3]);
        }
    }
    for (int h = 0; h < HB; h++) {
        const __m512 inv = _mm512_set1_ps(1.f / sums[h]);
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(out + h * ldo + 16 * c, _mm512_mul_ps(acc[h][c], inv));
    }
}

/* The lanes of 16 keys from t0 at or after the first key st (all of them when st <= t0). */
static inline __mmask16 from_first(long st, long t0) {
    return st <= t0 ? (__mmask16)0xffff : st - t0 >= 16 ? (__mmask16)0 : (__mmask16)~((1u << (st - t0)) - 1u);
}

/* exp(row[t] - mx) in place for t < len (exp16), 16 at a time; returns their sum (in lane order,
 * then the lanes added: the same steps for every caller, so the same bits). */
static inline float softmax_numerators(float *row, long len, float mx) {
    const __m512 m16 = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    for (long t = 0; t < len; t += 16) {
        const __mmask16 m = len - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (len - t)) - 1u);
        const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + t), m16)));
        _mm512_mask_storeu_ps(row + t, m, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

/* A row's softmax over its keys [st, len) (softmax_numerators), the ones before st given 0. */
static inline float softmax_from(float *row, long st, long len, float mx) {
    for (long t = 0; t < st; t++) row[t] = 0.f;
    return softmax_numerators(row + st, len - st, mx);
}

/* One block of cnt <= 16 tokens of P·V for HB heads of one row: acc[h] (head_dim floats each,
 * consecutive) += p[h][u] * V[u] in token order, V[u] the block's widened rows (vf, head_dim
 * floats apart), p[h] = scores + h * ldsc (times the token's int8 scale vs[u] for int8). */
static inline __attribute__((always_inline)) void pv_block(const float *scores, long ldsc, const float *vf,
                                                            const float *vs, int cnt, int kv_dtype, int head_dim,
                                                            float *acc, const int HB) {
    for (int s = 0; s < head_dim; s += 64) {
        __m512 a[3][4];
        for (int h = 0; h < HB; h++)
            for (int c = 0; c < 4; c++) a[h][c] = _mm512_loadu_ps(acc + h * head_dim + s + 16 * c);
        for (int u = 0; u < cnt; u++) {
            const float *v = vf + u * head_dim + s;
            const __m512 v0 = _mm512_load_ps(v), v1 = _mm512_load_ps(v + 16);
            const __m512 v2 = _mm512_load_ps(v + 32), v3 = _mm512_load_ps(v + 48);
            for (int h = 0; h < HB; h++) {
                const float ph = scores[h * ldsc + u];
                const __m512 pt = _mm512_set1_ps(kv_dtype == 2 ? ph * vs[u] : ph);
                a[h][0] = _mm512_fmadd_ps(pt, v0, a[h][0]);
                a[h][1] = _mm512_fmadd_ps(pt, v1, a[h][1]);
                a[h][2] = _mm512_fmadd_ps(pt, v2, a[h][2]);
                a[h][3] = _mm512_fmadd_ps(pt, v3, a[h][3]);
            }
        }
        for (int h = 0; h < HB; h++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc + h * head_dim + s + 16 * c, a[h][c]);
    }
}

/* Floats of the AVX-512 attention's scratch for R rows of nq query heads over max_len keys:
 * the scores, their maxima, sums and P·V accumulators, and one 16-token block of K or V rows
 * as float32 (64-byte aligned). */
static long avx512_scratch_floats(int R, int nq, long max_len, int head_dim) {
    return (long)R * nq * (((max_len + 15) & ~15L) + 2 + head_dim) + 16L * head_dim + 32;
}

/* The AVX-512 path of the decode attention (head_dim a multiple of 64) for R query rows that
 * read one block table (2 <= R <= GROUP_ROWS: a sequence's verify rows or prompt rows) and
 * query heads [j0, j1), all of one KV head (j / group). Row r: query q + r * q_stride,
 * lens[r] keys, output out + r * o_stride. Scores 16 keys at a time (a block past
 * the longest row's keys repeats its first key, so a key's score never depends on where it
 * falls, and a decode row scores a key exactly as a prompt row does); each block's K rows are
 * widened to float32 once for every row and head; softmax with exp16, then P·V, each block's V
 * rows widened once. Per (row, head) the operations and their order are the same whatever R,
 * [j0, j1) or the other rows are, and the same as attend_avx512_row's (one row), so the same
 * bits (one row takes attend_avx512_row). */
static void attend_avx512(const float *q, long q_stride, const int64_t *lens, const int64_t *starts, int R,
                          const void *k_cache,
                          const void *v_cache, const int64_t *table, float *out, long o_stride, int n_kv, int j0,
                          int j1, int group, int head_dim, int kv_dtype, int block_size, float scale, float *scratch) {
    const int nq = j1 - j0;
    const long hb = head_bytes(kv_dtype, head_dim), tbytes = (long)n_kv * hb, off = (long)(j0 / group) * hb;
    long max_len = 0;
    for (int r = 0; r < R; r++) max_len = lens[r] > max_len ? lens[r] : max_len;
    const long ls = (max_len + 15) & ~15L; /* scores of (row r, head j0 + i) at (r * nq + i) * ls */
    float *scores = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *kf = scores + (long)R * nq * ls, *maxs = kf + 16L * head_dim, *sums = maxs + (long)R * nq;
    float *acc = sums + (long)R * nq; /* P·V sums of (row r, head j0 + i) at (r * nq + i) * head_dim */
    for (int i = 0; i < R * nq; i++) maxs[i] = -INFINITY;
    const __m512 vscale = _mm512_set1_ps(scale);
    for (long t0 = 0; t0 < max_len; t0 += 16) {
        const char *krows[16];
        prefetch_rows(k_cache, table, block_size, tbytes, t0 + 16, max_len, off, hb);
        key_rows(krows, 16, t0, max_len, table, block_size, k_cache, tbytes, 0, hb);
        for (int u = 0; u < 16; u++) krows[u] += off;
        float ks[16];
        if (kv_dtype == 2)
            for (int u = 0; u < 16; u++) ks[u] = int8_scale(krows[u], head_dim);
        for (int u = 0; u < 16; u++)
            for (int i = 0; i < head_dim; i += 16) _mm512_store_ps(kf + u * head_dim + i, load16(krows[u], i, kv_dtype));
        for (int r = 0; r < R; r++) {
            if (t0 >= lens[r]) continue;
            const int cnt = lens[r] - t0 < 16 ? (int)(lens[r] - t0) : 16;
            const __mmask16 m = (__mmask16)((1u << cnt) - 1u);
            for (int j = j0; j < j1; j++) {
                const float *qj = q + r * q_stride + (long)j * head_dim;
                __m512 c[16];
                for (int u = 0; u < 16; u++) c[u] = _mm512_setzero_ps();
                for (int i = 0; i < head_dim; i += 16) {
                    const __m512 qv = _mm512_loadu_ps(qj + i);
                    for (int u = 0; u < 16; u++) c[u] = _mm512_fmadd_ps(qv, _mm512_load_ps(kf + u * head_dim + i), c[u]);
                }
                __m512 dots = reduce16(c);
                if (kv_dtype == 2) dots = _mm512_mul_ps(dots, _mm512_loadu_ps(ks));
                dots = _mm512_mul_ps(dots, vscale);
                const long at = (long)(r * nq + j - j0);
                _mm512_mask_storeu_ps(scores + at * ls + t0, m, dots);
                maxs[at] = fmaxf(maxs[at], _mm512_mask_reduce_max_ps(m & from_first(first_key(starts, r), t0), dots));
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const long len = lens[r];
        for (int i = 0; i < nq; i++)
            sums[r * nq + i] = softmax_from(scores + (long)(r * nq + i) * ls, first_key(starts, r), len, maxs[r * nq + i]);
    }
    /* P·V for several rows, 16 tokens at a time: their V rows widened to float32 once for every
     * row and head, then each (row, head) adds them in token order into its sums (in registers
     * for the 16 tokens, 64 dims at a time): per (row, head) the same operations as pv_heads. */
    memset(acc, 0, sizeof(float) * (size_t)R * nq * head_dim);
    for (long t0 = 0; t0 < max_len; t0 += 16) {
        const int n = max_len - t0 < 16 ? (int)(max_len - t0) : 16;
        const char *vrows[16];
        float vs[16];
        prefetch_rows(v_cache, table, block_size, tbytes, t0 + 16, max_len, off, hb);
        for (int u = 0; u < n; u++) {
            const long t = t0 + u;
            vrows[u] = (const char *)v_cache + (table[t / block_size] * block_size + t % block_size) * tbytes + off;
            vs[u] = kv_dtype == 2 ? int8_scale(vrows[u], head_dim) : 1.f;
        }
        for (int u = 0; u < n; u++)
            for (int i = 0; i < head_dim; i += 16) _mm512_store_ps(kf + u * head_dim + i, load16(vrows[u], i, kv_dtype));
        for (int r = 0; r < R; r++) {
            if (t0 >= lens[r]) continue;
            const int cnt = lens[r] - t0 < n ? (int)(lens[r] - t0) : n;
            for (int i = 0; i < nq; i += 3) { /* three heads at a time: 12 independent sums */
                const int nh = nq - i < 3 ? nq - i : 3;
                if (nh == 3) pv_block(scores + (long)(r * nq + i) * ls + t0, ls, kf, vs, cnt, kv_dtype, head_dim,
                                      acc + (long)(r * nq + i) * head_dim, 3);
                else if (nh == 2) pv_block(scores + (long)(r * nq + i) * ls + t0, ls, kf, vs, cnt, kv_dtype, head_dim,
                                           acc + (long)(r * nq + i) * head_dim, 2);
                else pv_block(scores + (long)(r * nq + i) * ls + t0, ls, kf, vs, cnt, kv_dtype, head_dim,
                              acc + (long)(r * nq + i) * head_dim, 1);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < nq; i++) {
            const __m512 inv = _mm512_set1_ps(1.f / sums[r * nq + i]);
            const float *ar = acc + (long)(r * nq + i) * head_dim;
            float *o = out + r * o_stride + (long)(j0 + i) * head_dim;
            for (int c = 0; c < head_dim; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(ar + c), inv));
        }
}

/* attend_avx512's work for one row and KV heads [h0, h1) in one pass over the keys (each
 * token's K and V rows of those heads read together; q: the row's query, all heads; out:
 * its output): per (row, head) the same operations in the same order, so the same bits.
 * scores: (h1 - h0) * group * len floats, then 16 * head_dim + 16 for a block of K rows widened
 * once per KV head. */
static void attend_avx512_row(const float *q, const void *k_cache, const void *v_cache, const int64_t *table, long len,
                          long st,
                          float *out, int n_kv, int h0, int h1, int group, int head_dim, int block_size, float scale,
                          int kv_dtype, float *scores) {
    const int nh = (h1 - h0) * group;
    const float *qh = q + (long)h0 * group * head_dim;
    const long hb = head_bytes(kv_dtype, head_dim), tbytes = (long)n_kv * hb;
    float maxs[256], sums[256];
    for (int j = 0; j < nh; j++) maxs[j] = -INFINITY;
    const __m512 vscale = _mm512_set1_ps(scale);
    float *kf = (float *)(((uintptr_t)(scores + (long)nh * len) + 63) & ~(uintptr_t)63); /* 16 K rows, float32 */
    for (long t0 = 0; t0 < len; t0 += 16) {
        const int cnt = len - t0 < 16 ? (int)(len - t0) : 16;
        const char *krows[16];
        prefetch_rows(k_cache, table, block_size, tbytes, t0 + 16, len, (long)h0 * hb, (long)(h1 - h0) * hb);
        key_rows(krows, 16, t0, len, table, block_size, k_cache, tbytes, h0, hb);
        for (int j = 0; j < nh; j++) {
            const float *qj = qh + (long)j * head_dim;
            const long off = (long)(j / group) * hb;
            if (j % group == 0) /* a new KV head: its rows widened once for the group's query heads */
                for (int u = 0; u < 16; u++)
                    for (int i = 0; i < head_dim; i += 16)
                        _mm512_store_ps(kf + u * head_dim + i, load16(krows[u] + off, i, kv_dtype));
            __m512 c[16];
            for (int u = 0; u < 16; u++) c[u] = _mm512_setzero_ps();
            for (int i = 0; i < head_dim; i += 16) {
                const __m512 qv = _mm512_loadu_ps(qj + i);
                for (int u = 0; u < 16; u++) c[u] = _mm512_fmadd_ps(qv, _mm512_load_ps(kf + u * head_dim + i), c[u]);
            }
            __m512 dots = reduce16(c);
            if (kv_dtype == 2) {
                float ks[16];
                for (int u = 0; u < 16; u++) ks[u] = int8_scale(krows[u] + off, head_dim);
                dots = _mm512_mul_ps(dots, _mm512_loadu_ps(ks));
            }
            dots = _mm512_mul_ps(dots, vscale);
            const __mmask16 m = (__mmask16)((1u << cnt) - 1u);
            _mm512_mask_storeu_ps(scores + j * len + t0, m, dots);
            maxs[j] = fmaxf(maxs[j], _mm512_mask_reduce_max_ps(m & from_first(st, t0), dots));
        }
    }
    for (int j = 0; j < nh; j++) sums[j] = softmax_from(scores + j * len, st, len, maxs[j]);
    for (int g = 0; g < h1 - h0; g++)
        for (int s = 0; s < head_dim; s += 64)
            for (int b = 0; b < group; b += 4) {
                const int nb = group - b < 4 ? group - b : 4, j = g * group + b;
                const long hoff = (long)(h0 + g) * hb;
                float *o = out + ((long)h0 * group + j) * head_dim + s;
                const float *sc = scores + (long)j * len;
                switch (nb) {
                    case 4: pv_heads(sc, len, len, v_cache, table, block_size, tbytes, hoff, s, head_dim, kv_dtype, sums + j, o, head_dim, 4); break;
                    case 3: pv_heads(sc, len, len, v_cache, table, block_size, tbytes, hoff, s, head_dim, kv_dtype, sums + j, o, head_dim, 3); break;
                    case 2: pv_heads(sc, len, len, v_cache, table, block_size, tbytes, hoff, s, head_dim, kv_dtype, sums + j, o, head_dim, 2); break;
                    default: pv_heads(sc, len, len, v_cache, table, block_size, tbytes, hoff, s, head_dim, kv_dtype, sums + j, o, head_dim, 1); break;
                }
            }
}
#endif

/* Attention of sequence d's query heads that read KV heads [h0, h1). scratch holds
 * (h1 - h0) * group * len scores plus 2 * (h1 - h0) * head_dim conversion floats and
 * (h1 - h0) * group * head_dim accumulators. The operations for one (d, head) are the
 * same whatever [h0, h1) is. */
static void attend(const float *q, const void *k_cache, const void *v_cache, const int64_t *table, long len,
                   long st, float *out, int n_heads, int n_kv, int h0, int h1, int head_dim, int block_size, float scale,
                   int kv_dtype, float *scratch) {
    const int group = n_heads / n_kv;
    const int nh = (h1 - h0) * group; /* query heads handled here */
    float *scores = scratch;
    float *kbuf = scores + (long)nh * len;
    float *acc = kbuf + (h1 - h0) * head_dim;
    const float *qh = q + (long)h0 * group * head_dim;
    float maxs[256], sums[256];
    for (int j = 0; j < nh; j++) maxs[j] = -INFINITY;
    for (long t = st; t < len; t++) {
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
        for (long t = st; t < len; t++) {
            row[t] = expf(row[t] - maxs[j]);
            sum += row[t];
        }
        sums[j] = sum;
    }
    memset(acc, 0, sizeof(float) * (size_t)nh * head_dim);
    for (long t = st; t < len; t++) {
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

/* Out of memory for a task's scratch: its rows' heads [j0, j1) become NaN (never silent zeros,
 * as block_gemm.c's linears on the same failure). */
static void nan_heads(float *out, long o_stride, long rows, int j0, int j1, int head_dim) {
    for (long r = 0; r < rows; r++)
        for (long i = (long)j0 * head_dim; i < (long)j1 * head_dim; i++) out[r * o_stride + i] = NAN;
}

/* Decode attention through block tables (vLLM's PagedAttention layout, Kwon et al. 2023).
 *
 * q: float32 [D, n_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size, n_kv,
 * head_dim] in float32 (kv_dtype 0) or bfloat16 (1), or int8 (2) as [..., n_kv, head_dim + 4]
 * bytes (each head's int8 values, then its float32 scale); block_tables: int64 [D, width];
 * seq_lens: int64 [D] (tokens to attend, the new one included); seq_starts: int64 [D] or NULL,
 * each row's first key in its table (keys [seq_starts[d], seq_lens[d]) attended: a sliding
 * window that starts inside the table's first block; NULL: every row from key 0); out: float32 [D,
 * n_heads, head_dim]. Grouped-query head h reads KV head h / (n_heads / n_kv).
 * softmax(q k^T * scale) v in float32. The vector paths (head_dim a multiple of 64) serve
 * consecutive rows with the same block table (a sequence's verify or prompt rows) as one
 * group of up to GROUP_ROWS (32), each K/V row fetched once for the group: on AVX-512 a task
 * is a group and all KV heads, or with fewer groups than threads a group's rows (split into
 * parts while there are fewer than twice as many tasks as threads) and one KV head; on AVX2
 * a group and KV head, or with fewer groups than threads a group and query head. The portable path: with at least as many sequences as threads a task
 * is one sequence, otherwise one (sequence, KV head). The result is the same either way.
 * n_heads <= 256.
 *
 * The _team form is the work of every thread of the enclosing OpenMP team (each calls it with the
 * same arguments; outside a parallel region one thread does it all): the tasks are handed out one
 * at a time, each thread with its own scratch. The _strided form runs it on nthreads threads.
 */
void metrale_paged_decode_attention_team(const float *q, long q_stride, const void *k_cache, const void *v_cache,
                                         const int64_t *block_tables, const int64_t *seq_lens,
                                         const int64_t *seq_starts, float *out, long D, int n_heads, int n_kv,
                                         int head_dim, int block_size, long width, float scale, int kv_dtype) {
    const int nthreads = omp_get_num_threads();
    long max_len = 0;
    for (long d = 0; d < D; d++)
        if (seq_lens[d] > max_len) max_len = seq_lens[d];
#if defined(METRALE_AVX2)
    if (head_dim % 64 == 0) {
        /* Consecutive rows with the same block table (a sequence's verify rows) form a group of
         * at most GROUP_ROWS, whose K/V rows are fetched once for all of them. */
        long starts[D + 1];
        long G = 0;
        for (long d = 0; d < D; d++) {
            const int same = d > 0 && d - starts[G - 1] < GROUP_ROWS &&
                             memcmp(block_tables + d * width, block_tables + (d - 1) * width, sizeof(int64_t) * width) == 0;
            if (!same) starts[G++] = d;
        }
        starts[G] = D;
        long most = 1;
        for (long g = 0; g < G; g++) most = starts[g + 1] - starts[g] > most ? starts[g + 1] - starts[g] : most;
        const int group = n_heads / n_kv;
#if defined(METRALE_AVX512)
        /* A task: with at least as many groups as threads, one group and every KV head (a lone row
         * reads each token's K and V rows of all heads together); otherwise one group's rows (or a
         * part of them, so that tasks outnumber threads twice where they can) and one KV head, or,
         * where that would split the rows one by one, one row and every KV head. */
        long parts = G >= nthreads ? 1 : (2L * nthreads + G * n_kv - 1) / (G * n_kv);
        parts = parts < most ? parts : most;
        const int whole = G >= nthreads || (most > 1 && parts == most); /* (or a task per row, all KV heads) */
        const long heads = whole ? 1 : n_kv;
        const long tasks = G * heads * parts;
        long floats = avx512_scratch_floats((int)most, group, max_len, head_dim);
        const long row_floats = (long)n_heads * max_len + 16L * head_dim + 16; /* attend_avx512_row's */
        floats = floats > row_floats ? floats : row_floats;
        {
            float *scratch = (float *)malloc(sizeof(float) * (size_t)floats);
#pragma omp for schedule(dynamic, 1)
            for (long task = 0; task < tasks; task++) {
                const long g = task / (heads * parts), unit = task % (heads * parts) / parts, part = task % parts;
                const long rows = starts[g + 1] - starts[g], per = (rows + parts - 1) / parts;
                const long d = starts[g] + part * per, n = rows - part * per < per ? rows - part * per : per;
                if (n <= 0) continue;
                const int h0 = whole ? 0 : (int)unit, h1 = whole ? n_kv : h0 + 1;
                if (!scratch) {
                    nan_heads(out + d * n_heads * head_dim, (long)n_heads * head_dim, n, h0 * group, h1 * group, head_dim);
                    continue;
                }
                if (n == 1) {
                    attend_avx512_row(q + d * q_stride, k_cache, v_cache, block_tables + d * width, seq_lens[d],
                                      first_key(seq_starts, d), out + d * n_heads * head_dim, n_kv, h0, h1, group, head_dim, block_size, scale,
                                      kv_dtype, scratch);
                    continue;
                }
                for (int h = h0; h < h1; h++)
                    attend_avx512(q + d * q_stride, q_stride, seq_lens + d, seq_starts ? seq_starts + d : NULL, (int)n, k_cache, v_cache,
                                  block_tables + d * width, out + d * n_heads * head_dim, (long)n_heads * head_dim, n_kv,
                                  h * group, (h + 1) * group, group, head_dim, kv_dtype, block_size, scale, scratch);
            }
            free(scratch);
        }
#else
        /* A task: one group and KV head, or with fewer groups than threads one group and query head. */
        const int by_query_head = G < nthreads;
        const long tasks = G * (by_query_head ? n_heads : n_kv);
        {
            float *scratch = (float *)malloc(sizeof(float) * (size_t)avx2_scratch_floats((int)most, max_len, head_dim));
#pragma omp for schedule(dynamic, 1)
            for (long task = 0; task < tasks; task++) {
                const long g = by_query_head ? task / n_heads : task / n_kv, d = starts[g];
                const int j0 = by_query_head ? (int)(task % n_heads) : (int)(task % n_kv) * group;
                const int j1 = by_query_head ? j0 + 1 : j0 + group;
                if (!scratch) {
                    nan_heads(out + d * n_heads * head_dim, (long)n_heads * head_dim, starts[g + 1] - d, j0, j1, head_dim);
                    continue;
                }
                attend_avx2(q + d * q_stride, q_stride, seq_lens + d, seq_starts ? seq_starts + d : NULL,
                            (int)(starts[g + 1] - d), k_cache, v_cache,
                            block_tables + d * width, out + d * n_heads * head_dim, (long)n_heads * head_dim, n_kv,
                            j0, j1, group, head_dim, kv_dtype, block_size, scale, scratch);
            }
            free(scratch);
        }
#endif
        return;
    }
#endif
    const int per_head = D < nthreads;
    const long tasks = per_head ? D * n_kv : D;
    {
        float *scratch = (float *)malloc(sizeof(float) * (size_t)(n_heads * max_len + 2 * n_kv * head_dim +
                                                                  n_heads * head_dim));
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < tasks; task++) {
            const long d = per_head ? task / n_kv : task;
            const int h0 = per_head ? (int)(task % n_kv) : 0, h1 = per_head ? h0 + 1 : n_kv;
            if (!scratch) {
                const int group = n_heads / n_kv;
                nan_heads(out + d * n_heads * head_dim, (long)n_heads * head_dim, 1, h0 * group, h1 * group, head_dim);
                continue;
            }
            attend(q + d * q_stride, k_cache, v_cache, block_tables + d * width, seq_lens[d],
                   first_key(seq_starts, d), out + d * n_heads * head_dim, n_heads, n_kv, h0, h1, head_dim, block_size, scale, kv_dtype,
                   scratch);
        }
        free(scratch);
    }
}

void metrale_paged_decode_attention_strided(const float *q, long q_stride, const void *k_cache, const void *v_cache,
                                            const int64_t *block_tables, const int64_t *seq_lens,
                                            const int64_t *seq_starts, float *out, long D, int n_heads, int n_kv,
                                            int head_dim, int block_size, long width, float scale, int kv_dtype,
                                            int nthreads) {
#pragma omp parallel num_threads(nthreads)
    metrale_paged_decode_attention_team(q, q_stride, k_cache, v_cache, block_tables, seq_lens, seq_starts, out, D,
                                        n_heads, n_kv, head_dim, block_size, width, scale, kv_dtype);
}

void metrale_paged_decode_attention(const float *q, const void *k_cache, const void *v_cache,
                                    const int64_t *block_tables, const int64_t *seq_lens, float *out,
                                    long D, int n_heads, int n_kv, int head_dim, int block_size, long width,
                                    float scale, int kv_dtype, int nthreads) {
    metrale_paged_decode_attention_strided(q, (long)n_heads * head_dim, k_cache, v_cache, block_tables, seq_lens, NULL, out,
                                           D, n_heads, n_kv, head_dim, block_size, width, scale, kv_dtype, nthreads);
}

