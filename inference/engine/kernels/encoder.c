/* A BERT encoder's steps between its linears (models/bert.py), over packed sequences: no KV cache, no
 * causal mask, no padding; each sequence's rows lie together in the packed batch.
 *
 * Attention, every (sequence, head) one task of the thread team:
 *   S = scale * Q K^T (its L x L scores), P = softmax(S) per row (the row maximum subtracted),
 *   O = P V / sum(P).
 * metrale_encoder_attention: float32 throughout, as transformers' BertSelfAttention computes it up to
 * the order of the sums (attend_lanes on AVX-512 for head_dim a multiple of 16, attend_one elsewhere;
 * exp is kernels.h's exp16 / exp8 / exp1). metrale_encoder_attention_bf16: on Intel AMX's tile unit
 * straight from a linear's bfloat16 q/k/v product and its bias (attend_amx: flash attention's
 * precision). A sequence's output depends on that sequence alone.
 *
 * The row-wise steps: bias + erf GELU into bfloat16 (the next linear's input), bias + residual +
 * LayerNorm into float32 and bfloat16, bias into float32; the float32 form's bias + residual + LayerNorm
 * (metrale_encoder_add_norm_f32), its bias and GELU being the float32 linear's epilogue.
 *
 * The linears (metrale_encoder_linear_f32 / _bf16, at the end): batch-invariant, each output element one
 * chain of sums in K's order, the bias and the erf GELU applied as a sum is stored when asked.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "kernels.h"

#if defined(METRALE_AVX512)
/* 16 bfloat16 values -> float32, and float32 -> bfloat16 by float_to_bf16's rule (round to nearest even,
 * NaN kept; subnormals kept, unlike VCVTNEPS2BF16): kernels.h's bf16_to_float and float_to_bf16 on 16
 * lanes. */
static inline __m512 bf16x16_f32(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline void f32x16_bf16(__m512 f, uint16_t *p) {
    const __m512i bits = _mm512_castps_si512(f);
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1)))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    const __m512i out = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(out));
}

/* exp(x) within 4e-6 relative (degree-5 Taylor on |r| <= ln 2 / 2, then 2^n), for P that is
 * rounded to bfloat16 (3.9e-3) anyway: half exp16's operations. Below -87 the result is 0. */
static inline __m512 exp16_short(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.6931471805599453f), x);
    __m512 p = _mm512_set1_ps(1.f / 120.f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

/* 16 values of a q, k or v row of the bfloat16 product at p, plus their bias, in float32. */
static inline __m512 row16(const uint16_t *p, const float *bias) {
    return _mm512_add_ps(bf16x16_f32(p), _mm512_loadu_ps(bias));
}

/* Eight keys' scores of 16 queries (a0 .. a7: keys j .. j + 7) stored at st, 16 floats a key; the running
 * maximum mx per query, updated. */
static inline __m512 store8_max(float *st, __m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4, __m512 a5,
                                __m512 a6, __m512 a7, __m512 mx) {
    _mm512_storeu_ps(st, a0);
    _mm512_storeu_ps(st + 16, a1);
    _mm512_storeu_ps(st + 32, a2);
    _mm512_storeu_ps(st + 48, a3);
    _mm512_storeu_ps(st + 64, a4);
    _mm512_storeu_ps(st + 80, a5);
    _mm512_storeu_ps(st + 96, a6);
    _mm512_storeu_ps(st + 112, a7);
    return _mm512_max_ps(mx, _mm512_max_ps(_mm512_max_ps(_mm512_max_ps(a0, a1), _mm512_max_ps(a2, a3)),
                                           _mm512_max_ps(_mm512_max_ps(a4, a5), _mm512_max_ps(a6, a7))));
}

#endif

#define QB 8 /* queries a pass over the keys: 8 independent sums cover the FMA latency */

/* Scratch floats of one task: attend_one's K^T [head_dim][Lp] and QB rows of scores [QB][Lp], or
 * attend_lanes' keys, transposed queries and scores (Lp: L rounded up to 16). */
static long task_floats(long Lp, int hd) {
    const long rows = (long)hd * Lp + QB * Lp, lanes = Lp * hd + 16L * hd + 16 * Lp; /* attend_one's, attend_lanes' */
    return rows > lanes ? rows : lanes;
}

/* One (sequence, head): rows [0, L) of q, k, v (ld floats apart, head_dim values each) -> out (ldo apart),
 * on AVX2 (also on AVX-512 machines, for a head_dim attend_lanes does not take) or portable C.
 * Queries go QB at a time (a short last group repeats its last query, whose results are not stored),
 * so every loop below has a fixed count and the sums stay in registers. HD: head_dim where it is a
 * compile-time constant (0: hd). */
static inline __attribute__((always_inline)) void attend_one(const float *q, const float *k, const float *v, long ld,
                                                             long L, const int HD, int hd, float scale, float *out,
                                                             long ldo, float *scratch) {
    if (HD) hd = HD;
    const long Lp = (L + 15) & ~15L;
    float *kt = scratch, *s = scratch + (long)hd * Lp;
    for (long j = 0; j < Lp; j++) { /* each key row read once, in order */
        const float *kr = k + j * ld;
        for (int d = 0; d < hd; d++) kt[(long)d * Lp + j] = j < L ? kr[d] : 0.f;
    }
    for (long i0 = 0; i0 < L; i0 += QB) {
        const int nq = (int)(L - i0 < QB ? L - i0 : QB);
        const float *qr[QB];
        for (int r = 0; r < QB; r++) qr[r] = q + (i0 + (r < nq ? r : nq - 1)) * ld;
        /* scores of the QB queries against every key */
#if defined(METRALE_AVX2)
        for (long j = 0; j < Lp; j += 8) {
            __m256 acc[QB];
            for (int r = 0; r < QB; r++) acc[r] = _mm256_setzero_ps();
            for (int d = 0; d < hd; d++) {
                const __m256 kv = _mm256_loadu_ps(kt + (long)d * Lp + j);
                for (int r = 0; r < QB; r++) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(qr[r][d]), kv, acc[r]);
            }
            for (int r = 0; r < QB; r++) _mm256_storeu_ps(s + r * Lp + j, _mm256_mul_ps(acc[r], _mm256_set1_ps(scale)));
        }
#else
        for (int r = 0; r < QB; r++) {
            float *sr = s + r * Lp;
            for (long j = 0; j < Lp; j++) sr[j] = 0.f;
            for (int d = 0; d < hd; d++) {
                const float qd = qr[r][d], *kd = kt + (long)d * Lp;
                for (long j = 0; j < Lp; j++) sr[j] = fmaf(qd, kd[j], sr[j]);
            }
            for (long j = 0; j < Lp; j++) sr[j] *= scale;
        }
#endif
        /* softmax numerators and sums */
        float sum[QB];
        for (int r = 0; r < QB; r++) {
            float *sr = s + r * Lp, m = -INFINITY, t = 0.f;
            for (long j = 0; j < L; j++) m = fmaxf(m, sr[j]);
            long j = 0;
#if defined(METRALE_AVX2)
            __m256 tv = _mm256_setzero_ps();
            for (; j + 8 <= L; j += 8) {
                const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), _mm256_set1_ps(m)));
                _mm256_storeu_ps(sr + j, e);
                tv = _mm256_add_ps(tv, e);
            }
            float lanes[8];
            _mm256_storeu_ps(lanes, tv);
            for (int i = 0; i < 8; i++) t += lanes[i];
#endif
            for (; j < L; j++) {
                sr[j] = exp1(sr[j] - m);
                t += sr[j];
            }
            sum[r] = t;
        }
        /* O = P V / sum: each row of V read once for the QB queries */
        int d = 0;
#if defined(METRALE_AVX2)
        for (; d + 8 <= hd; d += 8) {
            __m256 a[QB];
            for (int r = 0; r < QB; r++) a[r] = _mm256_setzero_ps();
            for (long j = 0; j < L; j++) {
                const __m256 vv = _mm256_loadu_ps(v + j * ld + d);
                for (int r = 0; r < QB; r++) a[r] = _mm256_fmadd_ps(_mm256_set1_ps(s[r * Lp + j]), vv, a[r]);
            }
            for (int r = 0; r < nq; r++)
                _mm256_storeu_ps(out + (i0 + r) * ldo + d, _mm256_div_ps(a[r], _mm256_set1_ps(sum[r])));
        }
#endif
        for (; d < hd; d++)
            for (int r = 0; r < nq; r++) {
                float a = 0.f;
                for (long j = 0; j < L; j++) a = fmaf(s[r * Lp + j], v[j * ld + d], a);
                out[(i0 + r) * ldo + d] = a / sum[r];
            }
    }
}

#if defined(METRALE_AVX512)
/* attend_one's result on AVX-512 for head_dim a multiple of 16, sixteen queries a vector: scores,
 * softmax and sums run across the lanes of 16 queries, so the softmax needs no reduction across
 * lanes, and every product takes one key or value element by broadcast from memory (one load an FMA,
 * eight or sixteen independent sums). kc: the head's keys copied [L][hd]; per block of 16 queries
 * qt [hd][16] (the queries transposed, times scale) and st [L][16] (their scores, then P). */
static void attend_lanes(const float *q, const float *k, const float *v, long ld, long L, int hd, float scale,
                         float *out, long ldo, float *scratch) {
    float *kc = scratch, *qt = kc + L * hd, *st = qt + 16L * hd;
    for (long j = 0; j < L; j++) memcpy(kc + j * hd, k + j * ld, sizeof(float) * (size_t)hd);
    for (long i0 = 0; i0 < L; i0 += 16) {
        const int nq = (int)(L - i0 < 16 ? L - i0 : 16);
        for (int r = 0; r < 16; r++) { /* a short block repeats its last query (not stored) */
            const float *qr = q + (i0 + (r < nq ? r : nq - 1)) * ld;
            for (int d = 0; d < hd; d++) qt[d * 16 + r] = qr[d] * scale;
        }
        /* scores S^T[j] = sum_d qt[d] * k[j][d], eight keys at a time; their maximum */
        __m512 mx = _mm512_set1_ps(-INFINITY);
        long j = 0;
        for (; j + 8 <= L; j += 8) {
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            const float *kb = kc + j * hd;
            for (int d = 0; d < hd; d++) {
                const __m512 qd = _mm512_loadu_ps(qt + d * 16);
                a0 = _mm512_fmadd_ps(qd, _mm512_set1_ps(kb[d]), a0);
                a1 = _mm512_fmadd_ps(qd, _mm512_set1_ps(kb[hd + d]), a1);
                a2 = _mm512_fmadd_ps(qd, _mm512_set1_ps(kb[2 * hd + d]), a2);
                a3 = _mm512_fmadd_ps(qd, _mm512_set1_ps(kb[3 * hd + d]), a3);
                a4 = _mm512_fmadd_ps(qd, _mm512_set1_ps(kb[4 * hd + d]), a4);
                a5 = _mm512_fmadd_ps(qd, _mm512_set1_ps(kb[5 * hd + d]), a5);
                a6 = _mm512_fmadd_ps(qd, _mm512_set1_ps(kb[6 * hd + d]), a6);
                a7 = _mm512_fmadd_ps(qd, _mm512_set1_ps(kb[7 * hd + d]), a7);
            }
            mx = store8_max(st + j * 16, a0, a1, a2, a3, a4, a5, a6, a7, mx);
        }
        for (; j < L; j++) {
            __m512 a = _mm512_setzero_ps();
            for (int d = 0; d < hd; d++) a = _mm512_fmadd_ps(_mm512_loadu_ps(qt + d * 16), _mm512_set1_ps(kc[j * hd + d]), a);
            _mm512_storeu_ps(st + j * 16, a);
            mx = _mm512_max_ps(mx, a);
        }
        /* P = exp(S - max), and its sum per query */
        __m512 sum = _mm512_setzero_ps();
        for (j = 0; j < L; j++) {
            const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(st + j * 16), mx));
            _mm512_storeu_ps(st + j * 16, e);
            sum = _mm512_add_ps(sum, e);
        }
        const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), sum);
        /* O^T[d] = sum_j P[j] v[j][d], sixteen values of d a pass; then O / sum, rows written back */
        for (int d0 = 0; d0 < hd; d0 += 16) {
            __m512 o[16];
            for (int dd = 0; dd < 16; dd++) o[dd] = _mm512_setzero_ps();
            for (j = 0; j < L; j++) {
                const __m512 p = _mm512_loadu_ps(st + j * 16);
                const float *vr = v + j * ld + d0;
                for (int dd = 0; dd < 16; dd++) o[dd] = _mm512_fmadd_ps(p, _mm512_set1_ps(vr[dd]), o[dd]);
            }
            float ot[16][16] __attribute__((aligned(64)));
            for (int dd = 0; dd < 16; dd++) _mm512_store_ps(ot[dd], _mm512_mul_ps(o[dd], inv));
            for (int r = 0; r < nq; r++)
                for (int dd = 0; dd < 16; dd++) out[(i0 + r) * ldo + d0 + dd] = ot[dd][r];
        }
    }
}
#endif

#if defined(METRALE_AVX512) && defined(__AVX512BF16__)
/* Lane n of lo and of hi rounded to bfloat16 (VCVTNEPS2BF16) and paired in lane n's 32 bits, lo's in the low
 * half: a pair of products' operands as VDPBF16PS and TDPBF16PS read them. */
static inline __m512i bf16_pairs(__m512 lo, __m512 hi) {
    const __m512i l = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(lo));
    const __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(hi));
    return _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
}
#endif

#if defined(METRALE_AVX512) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define ENCODER_AMX 1
/* The (sequence, head) on Intel AMX's tile unit for head_dim 32 or 64, from a linear's bfloat16 q/k/v
 * product and its float32 bias: Q, K and V rounded to bfloat16, the products summed in float32 by
 * TDPBF16PS (flash attention's precision: scores S = Q K^T in float32 tiles of 16 queries x 16 keys; P = exp(S - max) in float32, its sum kept in float32, P rounded to
 * bfloat16 for P V, summed in float32 tiles of 16 queries x 16 values). The vector units do the
 * softmax; the tile unit the products (on 2 vCPUs of a Sapphire Rapids Xeon whose AVX-512 FMAs run at
 * about half a vector a cycle, 6-7x fewer cycles than attend_lanes).
 *
 * Layouts (all tiles 16 rows x 64 bytes): qb [Lp][hd] bfloat16, the queries times scale; kt per block
 * of 16 keys and half of head_dim, a weight tile: row p = (K[n][2p], K[n][2p + 1]) for the 16 keys n;
 * vt per block of 32 keys and 16 values: row p = (V[2p][n], V[2p + 1][n]) for the 16 values n; pb
 * [16][Lp32] bfloat16, zero past L. Padding keys and queries are zeros (their scores masked, their
 * outputs not stored). */

/* q, k, v: the head's first q, k and v values of the sequence's first row in the bfloat16 product, ld
 * elements a row; bq, bk, bv their biases; out (ldo apart) bfloat16. The thread has loaded
 * metrale_amx_begin_bf16's tile configuration. */
static void attend_amx(const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *bq, const float *bk,
                       const float *bv, long ld, long L, int hd, float scale, uint16_t *out, long ldo,
                       float *scratch) {
    const long Lp = (L + 15) & ~15L, L32 = (L + 31) & ~31L, halves = hd / 32;
    uint16_t *qb = (uint16_t *)scratch;                                /* [Lp][hd] */
    uint32_t *kt = (uint32_t *)(qb + Lp * hd);                         /* [Lp / 16][halves][16][16] */
    uint32_t *vt = kt + (Lp / 16) * halves * 256;                      /* [L32 / 32][hd / 16][16][16] */
    float *st = (float *)(vt + (L32 / 32) * (hd / 16) * 256);          /* [16][Lp] */
    uint16_t *pb = (uint16_t *)(st + 16 * Lp);                         /* [16][L32] */
    float *ot = (float *)(pb + 16 * L32);                               /* [16][16] */
    /* queries times scale, as bfloat16 rows */
    const __m512 sc = _mm512_set1_ps(scale);
    for (long i = 0; i < Lp; i++)
        for (int d = 0; d < hd; d += 16) {
            const __m512 x = i < L ? _mm512_mul_ps(row16(q + i * ld + d, bq + d), sc) : _mm512_setzero_ps();
            _mm256_storeu_si256((__m256i *)(qb + i * hd + d), (__m256i)_mm512_cvtneps_pbh(x));
        }
    /* keys: each row as bfloat16 (hd / 2 words of two dims), then each block of 16 keys transposed to words x keys */
    for (long blk = 0; blk < Lp / 16; blk++)
        for (int half = 0; half < halves; half++) {
            uint32_t rows16[16][16] __attribute__((aligned(64)));
            for (int n = 0; n < 16; n++) {
                const long key = blk * 16 + n;
                const uint16_t *kr = k + key * ld + 32 * half;
                const float *b = bk + 32 * half;
                const __m512 lo = key < L ? row16(kr, b) : _mm512_setzero_ps();
                const __m512 hi = key < L ? row16(kr + 16, b + 16) : _mm512_setzero_ps();
                _mm512_store_si512((void *)rows16[n], (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
            }
            uint32_t *dst = kt + (blk * halves + half) * 256;
            for (int p = 0; p < 16; p++)
                for (int n = 0; n < 16; n++) dst[p * 16 + n] = rows16[n][p];
        }
    /* values: rows 2p and 2p + 1 of a block of 32 keys interleaved, 16 values a tile */
    for (long j = 0; j < L32; j += 2)
        for (int d = 0; d < hd; d += 16) {
            const __m512 a = j < L ? row16(v + j * ld + d, bv + d) : _mm512_setzero_ps();
            const __m512 b = j + 1 < L ? row16(v + (j + 1) * ld + d, bv + d) : _mm512_setzero_ps();
            _mm512_storeu_si512((void *)(vt + ((j / 32) * (hd / 16) + d / 16) * 256 + ((j % 32) / 2) * 16),
                                bf16_pairs(a, b));
        }
    const __mmask16 tail = (__mmask16)((1u << (L & 15)) - 1u);
    for (long i0 = 0; i0 < L; i0 += 16) {
        const int nq = (int)(L - i0 < 16 ? L - i0 : 16);
        /* S = Q K^T, tile by tile */
        for (int h = 0; h < halves; h++) {
            if (h == 0) _tile_loadd(0, qb + i0 * hd, hd * 2);
            else _tile_loadd(3, qb + i0 * hd + 32, hd * 2);
        }
        for (long kb = 0; kb < Lp / 16; kb++) {
            _tile_zero(2);
            _tile_loadd(1, kt + (kb * halves) * 256, 64);
            _tile_dpbf16ps(2, 0, 1);
            if (halves == 2) {
                _tile_loadd(4, kt + (kb * halves + 1) * 256, 64);
                _tile_dpbf16ps(2, 3, 4);
            }
            _tile_stored(2, st + kb * 16, Lp * 4);
        }
        /* P = exp(S - max) per query row, its float32 sum; P as bfloat16, zero past L */
        float sums[16];
        for (int r = 0; r < 16; r++) {
            float *sr = st + r * Lp;
            __m512 mv = _mm512_set1_ps(-INFINITY);
            long j = 0;
            for (; j + 16 <= L; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sr + j));
            if (tail) mv = _mm512_mask_max_ps(mv, tail, mv, _mm512_maskz_loadu_ps(tail, sr + j));
            const __m512 mb = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
            __m512 tv = _mm512_setzero_ps();
            uint16_t *pr = pb + r * L32;
            for (j = 0; j + 16 <= L; j += 16) {
                const __m512 e = exp16_short(_mm512_sub_ps(_mm512_loadu_ps(sr + j), mb));
                tv = _mm512_add_ps(tv, e);
                _mm256_storeu_si256((__m256i *)(pr + j), (__m256i)_mm512_cvtneps_pbh(e));
            }
            if (tail) {
                const __m512 e = _mm512_maskz_mov_ps(tail, exp16_short(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, sr + j), mb)));
                tv = _mm512_add_ps(tv, e);
                _mm256_storeu_si256((__m256i *)(pr + j), (__m256i)_mm512_cvtneps_pbh(e));
                j += 16;
            }
            for (; j < L32; j += 16) _mm256_storeu_si256((__m256i *)(pr + j), _mm256_setzero_si256());
            sums[r] = _mm512_reduce_add_ps(tv);
        }
        /* O = P V, 16 values a tile (two tiles a pass), then O / sum */
        for (int d0 = 0; d0 < hd; d0 += 32) {
            _tile_zero(5);
            _tile_zero(6);
            for (long vb = 0; vb < L32 / 32; vb++) {
                _tile_loadd(3, pb + vb * 32, L32 * 2);
                _tile_loadd(4, vt + (vb * (hd / 16) + d0 / 16) * 256, 64);
                _tile_dpbf16ps(5, 3, 4);
                _tile_loadd(7, vt + (vb * (hd / 16) + d0 / 16 + 1) * 256, 64);
                _tile_dpbf16ps(6, 3, 7);
            }
            for (int c = 0; c < 2; c++) {
                if (c == 0) _tile_stored(5, ot, 64);
                else _tile_stored(6, ot, 64);
                for (int r = 0; r < nq; r++) {
                    const __m512 o = _mm512_div_ps(_mm512_loadu_ps(ot + 16 * r), _mm512_set1_ps(sums[r]));
                    f32x16_bf16(o, out + (i0 + r) * ldo + d0 + 16 * c);
                }
            }
        }
    }
}

/* Bytes of attend_amx's scratch for sequences of at most `longest` keys. */
static long amx_task_bytes(long longest, int hd) {
    const long Lp = (longest + 15) & ~15L, L32 = (longest + 31) & ~31L;
    return 2 * Lp * hd + 4 * Lp * hd / 2 + 4 * L32 * hd / 2 + 4 * 16 * Lp + 2 * 16 * L32 + 4 * 256 + 64;
}
#endif

#if defined(METRALE_AVX512) && defined(__AVX512BF16__)
#define ENCODER_DP 1
/* attend_amx's precision on AVX-512 BF16's dot products (VDPBF16PS: 16 float32 lanes, each adding a pair
 * of bfloat16 products), for head_dim a multiple of 16, where the tile unit is not: Q (times scale), K and V
 * rounded to bfloat16, S = Q K^T summed in float32, P = exp(S - max) in float32 (exp16_short), its sum
 * kept in float32, P rounded to bfloat16 for P V, summed in float32, O times 1 / sum rounded to bfloat16.
 * attend_lanes' shape: sixteen queries a vector, so the softmax needs no reduction across lanes, and every
 * product takes its other operand by broadcast of one 32-bit pair.
 *
 * Layouts: kb [L][hd] bfloat16 (a key's pairs of dims in order); vt [L2][hd] pairs (V[2p][d], V[2p + 1][d])
 * (L2 = L rounded up to even, halved; an odd last key pairs with zeros); per block of 16 queries qt [hd/2][16]
 * pairs (Q[r][2p], Q[r][2p + 1]), st [L][16] float32 scores, pt [L2][16] pairs (P[2p][r], P[2p + 1][r]).
 * A short last block repeats its last query (computed, not stored). */
/* The 32-bit pair of bfloat16 values at p in all 16 lanes. */
static inline __m512bh pair16(const uint16_t *p) {
    int32_t x;
    memcpy(&x, p, sizeof x);
    return (__m512bh)_mm512_set1_epi32(x);
}

static void attend_dp(const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *bq, const float *bk,
                      const float *bv, long ld, long L, int hd, float scale, uint16_t *out, long ldo,
                      uint8_t *scratch) {
    const long L2 = (L + 1) / 2;
    const int hp = hd / 2;
    uint32_t *vt = (uint32_t *)scratch;           /* [L2][hd] */
    uint32_t *pt = vt + L2 * hd;                  /* [L2][16] */
    float *st = (float *)(pt + L2 * 16);          /* [L][16] */
    uint32_t *qt = (uint32_t *)(st + L * 16);     /* [hp][16] */
    float *ot = (float *)(qt + hp * 16);          /* [16][16] */
    uint16_t *kb = (uint16_t *)(ot + 256);        /* [L][hd] */
    uint16_t *qb = kb + L * hd;                   /* [16][hd] */
    for (long j = 0; j < L; j++)
        for (int d = 0; d < hd; d += 16)
            _mm256_storeu_si256((__m256i *)(kb + j * hd + d), (__m256i)_mm512_cvtneps_pbh(row16(k + j * ld + d, bk + d)));
    for (long p = 0; p < L2; p++)
        for (int d = 0; d < hd; d += 16) {
            const __m512 a = row16(v + 2 * p * ld + d, bv + d);
            const __m512 b = 2 * p + 1 < L ? row16(v + (2 * p + 1) * ld + d, bv + d) : _mm512_setzero_ps();
            _mm512_storeu_si512((void *)(vt + p * hd + d), bf16_pairs(a, b));
        }
    const __m512 sc = _mm512_set1_ps(scale);
    for (long i0 = 0; i0 < L; i0 += 16) {
        const int nq = (int)(L - i0 < 16 ? L - i0 : 16);
        for (int r = 0; r < 16; r++) {
            const long i = i0 + (r < nq ? r : nq - 1);
            for (int d = 0; d < hd; d += 16)
                _mm256_storeu_si256((__m256i *)(qb + r * hd + d),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(row16(q + i * ld + d, bq + d), sc)));
        }
        for (int p = 0; p < hp; p++)
            for (int r = 0; r < 16; r++) memcpy(qt + p * 16 + r, qb + r * hd + 2 * p, sizeof(uint32_t));
        /* scores S^T[j] = sum_p qt[p] . K[j]'s pair p, eight keys at a time; their maximum */
#define KP(n) pair16(kr + (n) * hd)
        __m512 mx = _mm512_set1_ps(-INFINITY);
        long j = 0;
        for (; j + 8 <= L; j += 8) {
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (int p = 0; p < hp; p++) {
                const __m512bh qv = (__m512bh)_mm512_loadu_si512(qt + p * 16);
                const uint16_t *kr = kb + j * hd + 2 * p;
                a0 = _mm512_dpbf16_ps(a0, qv, KP(0));
                a1 = _mm512_dpbf16_ps(a1, qv, KP(1));
                a2 = _mm512_dpbf16_ps(a2, qv, KP(2));
                a3 = _mm512_dpbf16_ps(a3, qv, KP(3));
                a4 = _mm512_dpbf16_ps(a4, qv, KP(4));
                a5 = _mm512_dpbf16_ps(a5, qv, KP(5));
                a6 = _mm512_dpbf16_ps(a6, qv, KP(6));
                a7 = _mm512_dpbf16_ps(a7, qv, KP(7));
            }
            mx = store8_max(st + j * 16, a0, a1, a2, a3, a4, a5, a6, a7, mx);
        }
        for (; j < L; j++) {
            __m512 a = _mm512_setzero_ps();
            for (int p = 0; p < hp; p++) {
                const uint16_t *kr = kb + j * hd + 2 * p;
                a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(qt + p * 16), KP(0));
            }
            _mm512_storeu_ps(st + j * 16, a);
            mx = _mm512_max_ps(mx, a);
        }
#undef KP
        /* P = exp(S - max), its float32 sum per query, P in pairs of keys as bfloat16 */
        __m512 sum = _mm512_setzero_ps();
        for (long p = 0; p < L2; p++) {
            const __m512 e0 = exp16_short(_mm512_sub_ps(_mm512_loadu_ps(st + 2 * p * 16), mx));
            const __m512 e1 = 2 * p + 1 < L ? exp16_short(_mm512_sub_ps(_mm512_loadu_ps(st + (2 * p + 1) * 16), mx))
                                            : _mm512_setzero_ps();
            sum = _mm512_add_ps(_mm512_add_ps(sum, e0), e1);
            _mm512_storeu_si512((void *)(pt + p * 16), bf16_pairs(e0, e1));
        }
        const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), sum);
        /* O^T[d] = sum_p pt[p] . V's pair p at d, sixteen values of d a pass; then O times 1 / sum, rows written back */
        for (int d0 = 0; d0 < hd; d0 += 16) {
            __m512 o[16];
            for (int dd = 0; dd < 16; dd++) o[dd] = _mm512_setzero_ps();
            for (long p = 0; p < L2; p++) {
                const __m512bh pv = (__m512bh)_mm512_loadu_si512(pt + p * 16);
                const uint32_t *vr = vt + p * hd + d0;
                for (int dd = 0; dd < 16; dd++) o[dd] = _mm512_dpbf16_ps(o[dd], pv, (__m512bh)_mm512_set1_epi32((int)vr[dd]));
            }
            for (int dd = 0; dd < 16; dd++) _mm512_storeu_ps(ot + dd * 16, _mm512_mul_ps(o[dd], inv));
            for (int r = 0; r < nq; r++) {
                float row[16] __attribute__((aligned(64)));
                for (int dd = 0; dd < 16; dd++) row[dd] = ot[dd * 16 + r];
                f32x16_bf16(_mm512_load_ps(row), out + (i0 + r) * ldo + d0);
            }
        }
    }
}

/* Bytes of attend_dp's scratch for sequences of at most `longest` keys: vt, pt, st, qt, ot, kb and qb in that order
 * (attend_dp's layout), and 64 bytes of slack as amx_task_bytes keeps. */
static long dp_task_bytes(long longest, int hd) {
    const long L2 = (longest + 1) / 2;
    return 4 * L2 * hd + 64 * L2 + 64 * longest + 32L * hd + 1024 + 2 * longest * hd + 32L * hd + 64;
}
#endif

void metrale_encoder_attention(const float *qkv, long ld, const int64_t *starts, const int64_t *lens, long n_seqs,
                               int n_heads, int head_dim, float scale, float *out, long ldo, int nthreads) {
    long longest = 0;
    for (long i = 0; i < n_seqs; i++) longest = lens[i] > longest ? lens[i] : longest;
    const long per_task = task_floats((longest + 15) & ~15L, head_dim);
    const long hidden = (long)n_heads * head_dim, tasks = n_seqs * n_heads;
#pragma omp parallel num_threads(nthreads)
    {
        float *scratch = malloc(sizeof(float) * (size_t)per_task);
        /* longest sequences first (the packed order is shortest first): the last tasks are short */
#pragma omp for schedule(dynamic, 1)
        for (long t = 0; t < tasks; t++) {
            const long seq = n_seqs - 1 - t / n_heads;
            const int h = (int)(t % n_heads);
            const float *base = qkv + starts[seq] * ld + (long)h * head_dim;
            float *o = out + starts[seq] * ldo + (long)h * head_dim;
            if (!scratch) { /* out of memory: NaN, never a silent zero */
                for (long i = 0; i < lens[seq]; i++)
                    for (int d = 0; d < head_dim; d++) o[i * ldo + d] = NAN;
                continue;
            }
            const float *k = base + hidden, *v = base + 2 * hidden;
#if defined(METRALE_AVX512)
            if (head_dim % 16 == 0) {
                attend_lanes(base, k, v, ld, lens[seq], head_dim, scale, o, ldo, scratch);
                continue;
            }
#endif
            if (head_dim == 32) attend_one(base, k, v, ld, lens[seq], 32, 32, scale, o, ldo, scratch);
            else if (head_dim == 64) attend_one(base, k, v, ld, lens[seq], 64, 64, scale, o, ldo, scratch);
            else attend_one(base, k, v, ld, lens[seq], 0, head_dim, scale, o, ldo, scratch);
        }
        free(scratch);
    }
}

/* Which unit runs metrale_encoder_attention_bf16 for this head_dim: 2 the tile unit (attend_amx: head_dim 32 or
 * 64 where metrale_amx_ready), 1 AVX-512 BF16's dot products (attend_dp: head_dim a multiple of 16), 0 none. */
int metrale_encoder_bf16_attention(int head_dim) {
#if defined(ENCODER_AMX)
    if ((head_dim == 32 || head_dim == 64) && metrale_amx_ready()) return 2;
#endif
#if defined(ENCODER_DP)
    if (head_dim > 0 && head_dim % 16 == 0) return 1;
#endif
    (void)head_dim;
    return 0;
}

int metrale_encoder_attention_bf16(const uint16_t *qkv, long ld, const float *bias, const int64_t *starts,
                                   const int64_t *lens, long n_seqs, int n_heads, int head_dim, float scale,
                                   uint16_t *out, long ldo, int nthreads) {
    const int unit = metrale_encoder_bf16_attention(head_dim);
    if (!unit) {
        (void)qkv, (void)ld, (void)bias, (void)starts, (void)lens, (void)n_seqs, (void)n_heads;
        (void)scale, (void)out, (void)ldo, (void)nthreads;
        return 0;
    }
#if defined(ENCODER_AMX) || defined(ENCODER_DP)
    long longest = 0;
    for (long i = 0; i < n_seqs; i++) longest = lens[i] > longest ? lens[i] : longest;
    long per_task = 0;
#if defined(ENCODER_AMX)
    if (unit == 2) per_task = amx_task_bytes(longest, head_dim);
#endif
#if defined(ENCODER_DP)
    if (unit == 1) per_task = dp_task_bytes(longest, head_dim);
#endif
    const long hidden = (long)n_heads * head_dim, tasks = n_seqs * n_heads;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        uint8_t *scratch = aligned_alloc(64, (size_t)((per_task + 63) & ~63L));
        if (!scratch) {
#pragma omp atomic write
            failed = 1;
        }
#if defined(ENCODER_AMX)
        if (unit == 2) metrale_amx_begin_bf16();
#endif
        /* longest sequences first (the packed order is shortest first): the last tasks are short */
#pragma omp for schedule(dynamic, 1)
        for (long t = 0; t < tasks; t++) {
            if (!scratch) continue;
            const long seq = n_seqs - 1 - t / n_heads;
            const long h = t % n_heads;
            const uint16_t *base = qkv + starts[seq] * ld + h * head_dim;
            const float *bq = bias + h * head_dim, *bk = bq + hidden, *bv = bk + hidden;
            uint16_t *o = out + starts[seq] * ldo + h * head_dim;
#if defined(ENCODER_AMX)
            if (unit == 2) {
                attend_amx(base, base + hidden, base + 2 * hidden, bq, bk, bv, ld, lens[seq], head_dim, scale, o, ldo,
                           (float *)scratch);
                continue;
            }
#endif
#if defined(ENCODER_DP)
            attend_dp(base, base + hidden, base + 2 * hidden, bq, bk, bv, ld, lens[seq], head_dim, scale, o, ldo,
                      scratch);
#endif
        }
#if defined(ENCODER_AMX)
        if (unit == 2) metrale_amx_end();
#endif
        free(scratch);
    }
    return failed ? -1 : 1;
#else
    return 0;
#endif
}

/* erf(x) by Abramowitz and Stegun 7.1.26 (absolute error at most 1.5e-7): 1 - poly(t) exp(-x^2),
 * t = 1 / (1 + 0.3275911 |x|), sign restored; exp1's steps, so the vector form below agrees. */
static inline float erf1(float x) {
    const float a = fabsf(x), t = 1.f / (1.f + 0.3275911f * a);
    float p = 1.061405429f;
    p = p * t + -1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t + -0.284496736f;
    p = p * t + 0.254829592f;
    const float y = 1.f - p * t * exp1(-(a * a));
    return x < 0.f ? -y : y;
}

/* GELU, the erf form (transformers' "gelu", torch's gelu(approximate="none")): x / 2 (1 + erf(x / sqrt 2)). */
static inline float gelu_erf1(float x) { return 0.5f * x * (1.f + erf1(x * 0.7071067811865476f)); }

#if defined(METRALE_AVX512)
static inline __m512 gelu_erf16(__m512 x) {
    const __m512 z = _mm512_mul_ps(x, _mm512_set1_ps(0.7071067811865476f));
    const __m512 a = _mm512_abs_ps(z);
    /* t = 1 / (1 + p a): rcp14 and one Newton step (relative error ~1e-8; a zmm division costs ~16 cycles) */
    const __m512 den = _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), a, _mm512_set1_ps(1.f));
    __m512 t = _mm512_rcp14_ps(den);
    t = _mm512_mul_ps(t, _mm512_fnmadd_ps(den, t, _mm512_set1_ps(2.f)));
    __m512 p = _mm512_set1_ps(1.061405429f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
    const __m512 e = exp16_short(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(a, a)));
    __m512 y = _mm512_sub_ps(_mm512_set1_ps(1.f), _mm512_mul_ps(_mm512_mul_ps(p, t), e));
    y = _mm512_mask_sub_ps(y, _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_setzero_ps(), y);
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(_mm512_set1_ps(1.f), y));
}
#endif

#if defined(METRALE_AVX2)
/* gelu_erf16's form on 8 lanes, taking gelu_erf1's operations lane by lane (a true division for t, erf1's
 * separate products and sums, exp8 for exp1: kernels.h gives them the same values), so every lane is
 * bitwise gelu_erf1 of its input: the float32 linear's GELU has the same bits on the AVX-512, AVX2 and
 * portable paths. */
static inline __m256 gelu_erf8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.7071067811865476f));
    const __m256 a = _mm256_andnot_ps(sign, z);
    const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.f),
                                   _mm256_add_ps(_mm256_set1_ps(1.f), _mm256_mul_ps(_mm256_set1_ps(0.3275911f), a)));
    __m256 p = _mm256_set1_ps(1.061405429f);
    p = _mm256_add_ps(_mm256_mul_ps(p, t), _mm256_set1_ps(-1.453152027f));
    p = _mm256_add_ps(_mm256_mul_ps(p, t), _mm256_set1_ps(1.421413741f));
    p = _mm256_add_ps(_mm256_mul_ps(p, t), _mm256_set1_ps(-0.284496736f));
    p = _mm256_add_ps(_mm256_mul_ps(p, t), _mm256_set1_ps(0.254829592f));
    const __m256 e = exp8(_mm256_xor_ps(_mm256_mul_ps(a, a), sign));
    __m256 y = _mm256_sub_ps(_mm256_set1_ps(1.f), _mm256_mul_ps(_mm256_mul_ps(p, t), e));
    y = _mm256_xor_ps(y, _mm256_and_ps(_mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ), sign));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.f), y));
}
#endif


void metrale_encoder_bias_gelu(const uint16_t *y, const float *bias, uint16_t *out, long rows, long n, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(guided)
    for (long r = 0; r < rows; r++) {
        const uint16_t *yr = y + r * n;
        uint16_t *o = out + r * n;
        long i = 0;
#if defined(METRALE_AVX512)
        for (; i + 16 <= n; i += 16)
            f32x16_bf16(gelu_erf16(_mm512_add_ps(bf16x16_f32(yr + i), _mm512_loadu_ps(bias + i))), o + i);
#endif
        for (; i < n; i++) o[i] = float_to_bf16(gelu_erf1(bf16_to_float(yr[i]) + bias[i]));
    }
}

/* 1 / sqrt(variance + eps) of a row o[0, n) about `mean` (torch's layer_norm: the biased variance), `var` the
 * squared deviations of o[0, i) already summed (a vector path's), the rest added here in order. */
static inline float inv_std(const float *o, long i, long n, float mean, float var, float eps) {
    for (; i < n; i++) {
        const float c = o[i] - mean;
        var += c * c;
    }
    return 1.f / sqrtf(var / (float)n + eps);
}

/* out = LayerNorm(float(y) + bias + residual) * gamma + beta per row of n (mean and variance in float32,
 * the biased variance, eps inside the root: torch's layer_norm), and out16 = bfloat16(out) when not NULL.
 * y: the linear's bfloat16 output [rows, n]; residual, out: float32 (may be the same array). */
void metrale_encoder_add_norm(const uint16_t *y, const float *bias, const float *residual, const float *gamma,
                              const float *beta, float eps, float *out, uint16_t *out16, long rows, long n,
                              int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(guided)
    for (long r = 0; r < rows; r++) {
        const uint16_t *yr = y + r * n;
        const float *res = residual + r * n;
        float *o = out + r * n;
        float mean = 0.f, var = 0.f;
        long i = 0;
#if defined(METRALE_AVX512)
        __m512 acc = _mm512_setzero_ps();
        for (; i + 16 <= n; i += 16) {
            const __m512 x = _mm512_add_ps(_mm512_add_ps(bf16x16_f32(yr + i), _mm512_loadu_ps(bias + i)), _mm512_loadu_ps(res + i));
            _mm512_storeu_ps(o + i, x);
            acc = _mm512_add_ps(acc, x);
        }
        mean = _mm512_reduce_add_ps(acc);
#endif
        for (; i < n; i++) {
            o[i] = bf16_to_float(yr[i]) + bias[i] + res[i];
            mean += o[i];
        }
        mean /= (float)n;
        i = 0;
#if defined(METRALE_AVX512)
        const __m512 mv = _mm512_set1_ps(mean);
        acc = _mm512_setzero_ps();
        for (; i + 16 <= n; i += 16) {
            const __m512 c = _mm512_sub_ps(_mm512_loadu_ps(o + i), mv);
            acc = _mm512_fmadd_ps(c, c, acc);
        }
        var = _mm512_reduce_add_ps(acc);
#endif
        const float inv = inv_std(o, i, n, mean, var, eps);
        i = 0;
#if defined(METRALE_AVX512)
        const __m512 iv = _mm512_set1_ps(inv);
        for (; i + 16 <= n; i += 16) {
            const __m512 x = _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(o + i), mv), iv),
                                                         _mm512_loadu_ps(gamma + i)), _mm512_loadu_ps(beta + i));
            _mm512_storeu_ps(o + i, x);
            if (out16) f32x16_bf16(x, out16 + r * n + i);
        }
#endif
        for (; i < n; i++) {
            o[i] = (o[i] - mean) * inv * gamma[i] + beta[i];
            if (out16) out16[r * n + i] = float_to_bf16(o[i]);
        }
    }
}

/* metrale_encoder_add_norm's float32 form: out = LayerNorm((y + bias) + residual) * gamma + beta per row of n,
 * y the linear's float32 product [rows, n], bias float32 [n] or NULL (then y + residual), residual and out
 * float32 [rows, n]; out may be y or residual (each element is read before it is written). Mean and variance
 * in float32, eight lanes a sum on AVX2 (their lanes then added in order, the last n % 8 after), the biased
 * variance, eps inside the root: torch's layer_norm up to the order of the sums. Each row reads its own
 * elements alone, so its bits do not depend on the rows beside it or on the threads. */
void metrale_encoder_add_norm_f32(const float *y, const float *bias, const float *residual, const float *gamma,
                                  const float *beta, float eps, float *out, long rows, long n, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *yr = y + r * n, *res = residual + r * n;
        float *o = out + r * n;
        float mean = 0.f, var = 0.f;
        long i = 0;
#if defined(METRALE_AVX2)
        const long n8 = n & ~7L;
        float lanes[8];
        __m256 acc = _mm256_setzero_ps();
        for (; i < n8; i += 8) {
            __m256 x = _mm256_loadu_ps(yr + i);
            if (bias) x = _mm256_add_ps(x, _mm256_loadu_ps(bias + i));
            x = _mm256_add_ps(x, _mm256_loadu_ps(res + i));
            _mm256_storeu_ps(o + i, x);
            acc = _mm256_add_ps(acc, x);
        }
        _mm256_storeu_ps(lanes, acc);
        for (int j = 0; j < 8; j++) mean += lanes[j];
#endif
        for (; i < n; i++) {
            o[i] = (bias ? yr[i] + bias[i] : yr[i]) + res[i];
            mean += o[i];
        }
        mean /= (float)n;
        i = 0;
#if defined(METRALE_AVX2)
        const __m256 mv = _mm256_set1_ps(mean);
        acc = _mm256_setzero_ps();
        for (; i < n8; i += 8) {
            const __m256 c = _mm256_sub_ps(_mm256_loadu_ps(o + i), mv);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(c, c));
        }
        _mm256_storeu_ps(lanes, acc);
        for (int j = 0; j < 8; j++) var += lanes[j];
#endif
        const float inv = inv_std(o, i, n, mean, var, eps);
        i = 0;
#if defined(METRALE_AVX2)
        const __m256 iv = _mm256_set1_ps(inv);
        for (; i < n8; i += 8)
            _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(o + i), mv), iv),
                                                                _mm256_loadu_ps(gamma + i)),
                                                  _mm256_loadu_ps(beta + i)));
#endif
        for (; i < n; i++) o[i] = (o[i] - mean) * inv * gamma[i] + beta[i];
    }
}

/* out = float(y) + bias per row of n: a linear's bfloat16 product and its float32 bias, in float32. */
void metrale_encoder_add_bias(const uint16_t *y, const float *bias, float *out, long rows, long n, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(guided)
    for (long r = 0; r < rows; r++) {
        long i = 0;
#if defined(METRALE_AVX512)
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(out + r * n + i, _mm512_add_ps(bf16x16_f32(y + r * n + i), _mm512_loadu_ps(bias + i)));
#endif
        for (; i < n; i++) out[r * n + i] = bf16_to_float(y[r * n + i]) + bias[i];
    }
}

/* The encoder's linears, batch-invariant: out[T][N] = x[T][K] · W^T, each output element one chain of
 * products added in K's order, whatever T, whichever rows share the call and however the threads split it
 * (vLLM's batch-invariant kernels' rule: a fixed reduction order per row whatever M). A text's embedding
 * is then bitwise the same alone or inside a pass of 64 (oneDNN picks its kernel, and its split of K over
 * threads, by the row count).
 *
 * Weights are packed once, 16 output columns a group: float32 [N/16][K][16] (one FMA chain per lane), and
 * bfloat16 [N/16][K/2][16][2] (VDPBF16PS's pairs: each lane adds x[2i+1] w[2i+1], then x[2i] w[2i], each
 * product exact in float32). A task is RB rows by CB groups (RB x CB accumulators in registers); the rows
 * of a short last block take the same chains. The float32 form's chain is fmaf's, so the AVX-512, AVX2
 * and portable paths give the same bits; the bfloat16 form without AVX-512 BF16 adds each pair's products
 * in the same order in float32 (the same values where no sum is subnormal: VDPBF16PS flushes those). The
 * bfloat16 form's result is rounded to bfloat16 (the next step's input), after the bias and the erf GELU
 * when asked (gelu_erf16 / gelu_erf1: those agree within about 4e-7, exp16_short's error, and a column
 * group always takes the same one). The float32 form adds the bias and applies the erf GELU when asked as it stores each sum, with
 * gelu_erf8 (AVX-512 and AVX2) or gelu_erf1 (portable), whose bits are the same: its results are the same
 * bits on every path, with or without them. */
#if defined(METRALE_AVX2) && !defined(METRALE_AVX512)
/* AVX2 has 16 vector registers: 6 rows by one group (two 8-lane halves) keeps 12 accumulators, the
 * group's two weight vectors and the broadcast row value in them (4 by 4 groups spilled 32 accumulators). */
#define LIN_RB 6
#define LIN_CB 1
#else
#define LIN_RB 4
#define LIN_CB 4
#endif

void metrale_encoder_pack_f32(const float *w, long n, long k, float *packed) {
    for (long g = 0; g < n / 16; g++)
        for (long i = 0; i < k; i++)
            for (int j = 0; j < 16; j++) packed[(g * k + i) * 16 + j] = w[(g * 16 + j) * k + i];
}

void metrale_encoder_pack_bf16(const uint16_t *w, long n, long k, uint16_t *packed) {
    const long k2 = k / 2;
    for (long g = 0; g < n / 16; g++)
        for (long i = 0; i < k2; i++)
            for (int j = 0; j < 16; j++) {
                packed[((g * k2 + i) * 16 + j) * 2] = w[(g * 16 + j) * k + 2 * i];
                packed[((g * k2 + i) * 16 + j) * 2 + 1] = w[(g * 16 + j) * k + 2 * i + 1];
            }
}

/* Rows [r0, r0 + rb) by column groups [g0, g0 + cb) of the float32 form: each sum, + bias[column] when
 * bias is not NULL (one float32 addition), then GELU when gelu (gelu_erf8 on both vector paths, gelu_erf1 in
 * portable C: the same bits), stored. */
static inline __attribute__((always_inline)) void lin_f32_task(const float *x, long ldx, const float *wp,
                                                               const float *bias, int gelu, float *out, long ldo,
                                                               long k, long r0, int rb, long g0, int cb) {
#if defined(METRALE_AVX512)
    __m512 acc[LIN_RB][LIN_CB];
    for (int r = 0; r < LIN_RB; r++)
        for (int c = 0; c < LIN_CB; c++) acc[r][c] = _mm512_setzero_ps();
    for (long i = 0; i < k; i++) {
        __m512 w[LIN_CB];
        for (int c = 0; c < cb; c++) w[c] = _mm512_loadu_ps(wp + ((g0 + c) * k + i) * 16);
        for (int r = 0; r < rb; r++) {
            const __m512 xv = _mm512_set1_ps(x[(r0 + r) * ldx + i]);
            for (int c = 0; c < cb; c++) acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]);
        }
    }
    for (int r = 0; r < rb; r++)
        for (int c = 0; c < cb; c++) {
            __m512 v = acc[r][c];
            if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + (g0 + c) * 16));
            float *o = out + (r0 + r) * ldo + (g0 + c) * 16;
            if (gelu) { /* the two halves through gelu_erf8, as on the AVX2 path */
                const __m256 lo = _mm512_castps512_ps256(v), hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
                _mm256_storeu_ps(o, gelu_erf8(lo));
                _mm256_storeu_ps(o + 8, gelu_erf8(hi));
            } else {
                _mm512_storeu_ps(o, v);
            }
        }
#elif defined(METRALE_AVX2)
    __m256 acc[LIN_RB][2 * LIN_CB];
    for (int r = 0; r < LIN_RB; r++)
        for (int c = 0; c < 2 * LIN_CB; c++) acc[r][c] = _mm256_setzero_ps();
    for (long i = 0; i < k; i++) {
        __m256 w[2 * LIN_CB];
        for (int c = 0; c < 2 * cb; c++) w[c] = _mm256_loadu_ps(wp + ((g0 + c / 2) * k + i) * 16 + (c & 1) * 8);
        for (int r = 0; r < rb; r++) {
            const __m256 xv = _mm256_set1_ps(x[(r0 + r) * ldx + i]);
            for (int c = 0; c < 2 * cb; c++) acc[r][c] = _mm256_fmadd_ps(xv, w[c], acc[r][c]);
        }
    }
    for (int r = 0; r < rb; r++)
        for (int c = 0; c < 2 * cb; c++) {
            const long col = (g0 + c / 2) * 16 + (c & 1) * 8;
            __m256 v = acc[r][c];
            if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + col));
            if (gelu) v = gelu_erf8(v);
            _mm256_storeu_ps(out + (r0 + r) * ldo + col, v);
        }
#else
    for (int r = 0; r < rb; r++)
        for (int c = 0; c < cb; c++)
            for (int j = 0; j < 16; j++) {
                float s = 0.f;
                for (long i = 0; i < k; i++) s = fmaf(x[(r0 + r) * ldx + i], wp[((g0 + c) * k + i) * 16 + j], s);
                if (bias) s += bias[(g0 + c) * 16 + j];
                out[(r0 + r) * ldo + (g0 + c) * 16 + j] = gelu ? gelu_erf1(s) : s;
            }
#endif
}

/* One 16-column group's float32 sums `s` of one row -> bfloat16, after the bias and GELU when given. */
static inline void lin_bf16_store1(const float *s, const float *bias, int gelu, uint16_t *o) {
    for (int j = 0; j < 16; j++) {
        float v = s[j] + (bias ? bias[j] : 0.f);
        o[j] = float_to_bf16(gelu ? gelu_erf1(v) : v);
    }
}

static inline __attribute__((always_inline)) void lin_bf16_task(const uint16_t *x, long ldx, const uint16_t *wp,
                                                                const float *bias, int gelu, uint16_t *out,
                                                                long ldo, long k, long r0, int rb, long g0,
                                                                int cb) {
    const long k2 = k / 2;
#if defined(METRALE_AVX512) && defined(__AVX512BF16__)
    __m512 acc[LIN_RB][LIN_CB];
    for (int r = 0; r < LIN_RB; r++)
        for (int c = 0; c < LIN_CB; c++) acc[r][c] = _mm512_setzero_ps();
    for (long i = 0; i < k2; i++) {
        __m512i w[LIN_CB];
        for (int c = 0; c < cb; c++) w[c] = _mm512_loadu_si512(wp + ((g0 + c) * k2 + i) * 32);
        for (int r = 0; r < rb; r++) {
            int32_t pair;
            memcpy(&pair, x + (r0 + r) * ldx + 2 * i, sizeof pair);
            const __m512i xv = _mm512_set1_epi32(pair);
            for (int c = 0; c < cb; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)xv, (__m512bh)w[c]);
        }
    }
    for (int r = 0; r < rb; r++)
        for (int c = 0; c < cb; c++) {
            __m512 v = acc[r][c];
            if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + (g0 + c) * 16));
            if (gelu) v = gelu_erf16(v);
            f32x16_bf16(v, out + (r0 + r) * ldo + (g0 + c) * 16);
        }
#else
    for (int r = 0; r < rb; r++)
        for (int c = 0; c < cb; c++) {
            float s[16] = {0};
            for (long i = 0; i < k2; i++)
                for (int j = 0; j < 16; j++) {
                    const uint16_t *wq = wp + (((g0 + c) * k2 + i) * 16 + j) * 2;
                    const uint16_t *xq = x + (r0 + r) * ldx + 2 * i;
                    s[j] += bf16_to_float(xq[1]) * bf16_to_float(wq[1]);
                    s[j] += bf16_to_float(xq[0]) * bf16_to_float(wq[0]);
                }
            lin_bf16_store1(s, bias ? bias + (g0 + c) * 16 : NULL, gelu, out + (r0 + r) * ldo + (g0 + c) * 16);
        }
#endif
}

/* Tasks: column blocks of LIN_CB groups (outer: a thread keeps its weights' panel) by row blocks of LIN_RB,
 * handed out in runs of about 1/LIN_RUNS of a thread's share as threads come for them: a thread that
 * another (the event loop's, a neighbour's) holds off its core leaves the rest of its share to the team
 * rather than the whole region waiting for it. Which thread computes a task never changes its bits. */
#define LIN_RUNS 32
#define LIN_TASKS(call)                                                                                  \
    const long groups = n / 16, cblocks = (groups + LIN_CB - 1) / LIN_CB, rblocks = (rows + LIN_RB - 1) / LIN_RB; \
    const long run = cblocks * rblocks / ((long)nthreads * LIN_RUNS) + 1;                                \
    _Pragma("omp parallel for num_threads(nthreads) schedule(dynamic, run) collapse(2)")                 \
    for (long cbk = 0; cbk < cblocks; cbk++)                                                            \
        for (long rbk = 0; rbk < rblocks; rbk++) {                                                       \
            const long r0 = rbk * LIN_RB, g0 = cbk * LIN_CB;                                             \
            const int rb = (int)(rows - r0 < LIN_RB ? rows - r0 : LIN_RB);                               \
            const int cb = (int)(groups - g0 < LIN_CB ? groups - g0 : LIN_CB);                           \
            if (rb == LIN_RB && cb == LIN_CB) call(LIN_RB, LIN_CB);                                      \
            else call(rb, cb);                                                                           \
        }

/* float32: x [rows][k] (ldx apart), packed weight (metrale_encoder_pack_f32 of [n][k]), out [rows][n] (ldo
 * apart) = x · W^T (+ bias) (then GELU when gelu); bias float32 [n] or NULL; n a multiple of 16. The bias and
 * the erf GELU are applied to each sum as it is stored (lin_f32_task), the same steps on every path. */
void metrale_encoder_linear_f32(const float *x, long ldx, const float *wp, const float *bias, int gelu, float *out,
                                long ldo, long rows, long n, long k, int nthreads) {
#define LIN_F32(RB, CB) lin_f32_task(x, ldx, wp, bias, gelu, out, ldo, k, r0, RB, g0, CB)
    LIN_TASKS(LIN_F32)
#undef LIN_F32
}

#if defined(ENCODER_AMX)
/* The bfloat16 form on the tile unit, for k a multiple of 32 wherever metrale_amx_ready: every row of every
 * call goes through it (one row as well as 64), so the rule is still one per machine and a row's bits never
 * depend on the rows beside it. Each output element's sum is TDPBF16PS's over K's blocks of 32 in order,
 * into one float32 accumulator tile: an element's sum reads only its own row of A, whatever the tile's other
 * rows hold. A task is 16 rows (a short last block copied into zeroed rows, which are computed and never
 * stored) by AMX_CB groups of 16 columns (one accumulator tile each, tiles 0-3); tile 4 holds the rows' block of
 * 32 of K, tiles 5 and 6 a group's weights: metrale_encoder_pack_bf16's [K/2][16][2] panel of a group is
 * exactly a weight tile's pairs layout, 16 pairs of rows a block. The epilogue (bias, GELU, rounding) is the
 * vector path's. */
#define AMX_CB 4

static inline void lin_amx_store(const float *sums, const float *bias, int gelu, uint16_t *out, long ldo,
                                 long r0, int rb, long g) {
    for (int r = 0; r < rb; r++) {
        __m512 v = _mm512_loadu_ps(sums + r * 16);
        if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + g * 16));
        if (gelu) v = gelu_erf16(v);
        f32x16_bf16(v, out + (r0 + r) * ldo + g * 16);
    }
}

/* The 16 rows a task's row tile reads from r0: x's own rows (ldx apart) for a whole block, else the short last
 * block's rb rows copied into `pad` ([16][k]) with zeros after them. Returns them; *lda: their stride. */
static inline const uint16_t *lin_amx_rows(const uint16_t *x, long ldx, long k, long r0, int rb, uint16_t *pad,
                                           long *lda) {
    if (rb == 16) {
        *lda = ldx;
        return x + r0 * ldx;
    }
    memset(pad, 0, (size_t)16 * k * sizeof *pad);
    for (int r = 0; r < rb; r++) memcpy(pad + (long)r * k, x + (r0 + r) * ldx, (size_t)k * sizeof *pad);
    *lda = k;
    return pad;
}

/* A pending epilogue: a task's float32 sums (AMX_CB tiles of 16 x 16) and where they go; `done` of its
 * AMX_CB x rb row vectors stored so far. */
typedef struct {
    float sums[AMX_CB * 256] __attribute__((aligned(64)));
    long r0, g0;
    int rb, done;
} lin_amx_pending;

/* Store up to `count` more of the pending task's row vectors (group-major, row-minor). */
static inline void lin_amx_drain(lin_amx_pending *p, int count, const float *bias, int gelu, uint16_t *out,
                                 long ldo) {
    const int total = AMX_CB * p->rb;
    for (int end = p->done + count < total ? p->done + count : total; p->done < end; p->done++) {
        const int c = p->done / p->rb, r = p->done % p->rb;
        lin_amx_store(p->sums + c * 256 + r * 16, bias, gelu, out, ldo, p->r0 + r, 1, p->g0 + c);
    }
}

/* Rows [r0, r0 + rb) by AMX_CB groups from g0: the tile products, block by block, with the previous task's
 * epilogue (`prev`, when it has rows left) stored a few row vectors after each block's products, so the vector
 * units turn the last sums into bfloat16 while the tile unit computes these (the bits are the same as
 * storing them after: each element's sum and epilogue are its own). Leaves this task's sums in `cur`. */
static void lin_amx_task(const uint16_t *x, long ldx, const uint16_t *wp, const float *bias, int gelu,
                         uint16_t *out, long ldo, long k, long r0, int rb, long g0, uint16_t *pad,
                         lin_amx_pending *prev, lin_amx_pending *cur) {
    const long k2 = k / 2, blocks = k / 32;
    long lda;
    const uint16_t *a = lin_amx_rows(x, ldx, k, r0, rb, pad, &lda);
    const int left = prev->rb ? AMX_CB * prev->rb - prev->done : 0;
    const int per_block = (int)((left + blocks - 1) / blocks);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long b = 0; b < blocks; b++) {
        _tile_loadd(4, a + b * 32, lda * 2);
        _tile_loadd(5, wp + ((g0 + 0) * k2 + b * 16) * 32, 64);
        _tile_loadd(6, wp + ((g0 + 1) * k2 + b * 16) * 32, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, wp + ((g0 + 2) * k2 + b * 16) * 32, 64);
        _tile_loadd(6, wp + ((g0 + 3) * k2 + b * 16) * 32, 64);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 6);
        if (per_block) lin_amx_drain(prev, per_block, bias, gelu, out, ldo);
    }
    if (prev->rb) lin_amx_drain(prev, AMX_CB * prev->rb, bias, gelu, out, ldo);
    _tile_stored(0, cur->sums, 64);
    _tile_stored(1, cur->sums + 256, 64);
    _tile_stored(2, cur->sums + 512, 64);
    _tile_stored(3, cur->sums + 768, 64);
    cur->r0 = r0, cur->g0 = g0, cur->rb = rb, cur->done = 0;
}

/* The last groups (fewer than AMX_CB), one at a time, with nothing pending: the same sums, block by block. */
static void lin_amx_tail(const uint16_t *x, long ldx, const uint16_t *wp, const float *bias, int gelu,
                         uint16_t *out, long ldo, long k, long r0, int rb, long g0, int cb, uint16_t *pad) {
    const long k2 = k / 2, blocks = k / 32;
    long lda;
    const uint16_t *a = lin_amx_rows(x, ldx, k, r0, rb, pad, &lda);
    float sums[16 * 16] __attribute__((aligned(64)));
    for (int c = 0; c < cb; c++) {
        _tile_zero(0);
        for (long b = 0; b < blocks; b++) {
            _tile_loadd(4, a + b * 32, lda * 2);
            _tile_loadd(5, wp + ((g0 + c) * k2 + b * 16) * 32, 64);
            _tile_dpbf16ps(0, 4, 5);
        }
        _tile_stored(0, sums, 64);
        lin_amx_store(sums, bias, gelu, out, ldo, r0, rb, g0 + c);
    }
}

/* Column blocks of AMX_CB groups (outer) by row blocks of 16, each thread with the tile configuration loaded
 * and a zeroed-rows buffer for a short last row block. Returns 0 where it cannot run (no buffer). */
static int lin_amx(const uint16_t *x, long ldx, const uint16_t *wp, const float *bias, int gelu, uint16_t *out,
                   long ldo, long rows, long n, long k, int nthreads) {
    const long groups = n / 16, cblocks = (groups + AMX_CB - 1) / AMX_CB, rblocks = (rows + 15) / 16;
    const long tasks = cblocks * rblocks;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        uint16_t *pad = aligned_alloc(64, (size_t)((16 * k * sizeof(uint16_t) + 63) & ~63L));
        lin_amx_pending *ring = aligned_alloc(64, 2 * sizeof(lin_amx_pending));
        if (!pad || !ring) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
            metrale_amx_begin_bf16();
            /* the static split of the tasks (column blocks outer, row blocks inner), a contiguous run a thread */
            const long nt = omp_get_num_threads(), tid = omp_get_thread_num(), per = (tasks + nt - 1) / nt;
            const long first = tid * per, last = first + per < tasks ? first + per : tasks;
            lin_amx_pending *prev = &ring[0], *cur = &ring[1];
            prev->rb = 0;
            for (long t = first; t < last; t++) {
                const long cbk = t / rblocks, rbk = t % rblocks, r0 = rbk * 16, g0 = cbk * AMX_CB;
                const int rb = (int)(rows - r0 < 16 ? rows - r0 : 16);
                const int cb = (int)(groups - g0 < AMX_CB ? groups - g0 : AMX_CB);
                if (cb == AMX_CB) {
                    lin_amx_task(x, ldx, wp, bias, gelu, out, ldo, k, r0, rb, g0, pad, prev, cur);
                    lin_amx_pending *swap = prev;
                    prev = cur, cur = swap;
                } else {
                    if (prev->rb) lin_amx_drain(prev, AMX_CB * prev->rb, bias, gelu, out, ldo);
                    prev->rb = 0;
                    lin_amx_tail(x, ldx, wp, bias, gelu, out, ldo, k, r0, rb, g0, cb, pad);
                }
            }
            if (prev->rb) lin_amx_drain(prev, AMX_CB * prev->rb, bias, gelu, out, ldo);
            metrale_amx_end();
        }
        free(pad);
        free(ring);
    }
    return !failed;
}
#endif

/* bfloat16: x [rows][k] (ldx apart), packed weight (metrale_encoder_pack_bf16 of [n][k]), out [rows][n] (ldo
 * apart) = bfloat16(x · W^T (+ bias) (then GELU when gelu)); bias float32 [n] or NULL; n a multiple of 16,
 * k even. On the tile unit where it is granted and k is a multiple of 32 (lin_amx), else on the vector
 * units. */
void metrale_encoder_linear_bf16(const uint16_t *x, long ldx, const uint16_t *wp, const float *bias, int gelu,
                                 uint16_t *out, long ldo, long rows, long n, long k, int nthreads) {
#if defined(ENCODER_AMX)
    if (k % 32 == 0 && metrale_amx_ready() && lin_amx(x, ldx, wp, bias, gelu, out, ldo, rows, n, k, nthreads)) return;
#endif
#define LIN_BF16(RB, CB) lin_bf16_task(x, ldx, wp, bias, gelu, out, ldo, k, r0, RB, g0, CB)
    LIN_TASKS(LIN_BF16)
#undef LIN_BF16
}

/* The feed-forward half of a post-LayerNorm BERT layer over `rows` rows in one call, the steps models/bert.py
 * would make one kernel call each, with the same kernels in the same order (so the same bits):
 *   a = LayerNorm(W_o ctx + b_o + h), g = GELU(W_up a + b_up), h = LayerNorm(W_down g + b_down + a).
 * bfloat16 form: ctx float32 (rounded to bfloat16 first, by float_to_bf16: torch's rounding) or bfloat16 when
 * ctx_bf16, [rows][hidden] ldctx apart; a16 (a's bfloat16 copy, the up projection's input; first the rounded
 * ctx) and h16 (h's, the next layer's input); y [rows][hidden] and g [rows][inter] bfloat16 scratch.
 * float32 form: ctx float32, a and g float32; h is the down projection's output before its LayerNorm (dead
 * once a holds the first sum). Weights packed (metrale_encoder_pack_*), each bias and norm float32. */
void metrale_encoder_ffn_bf16(const void *ctx, int ctx_bf16, long ldctx, long rows, long hidden, long inter,
                              const uint16_t *wo, const float *bo, const float *gamma1, const float *beta1,
                              const uint16_t *wu, const float *bu, const uint16_t *wd, const float *bd,
                              const float *gamma2, const float *beta2, float eps, float *h, uint16_t *h16, float *a,
                              uint16_t *a16, uint16_t *y, uint16_t *g, int nthreads) {
    const uint16_t *x = (const uint16_t *)ctx;
    long ldx = ldctx;
    if (!ctx_bf16) {
        const float *c = (const float *)ctx;
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (long r = 0; r < rows; r++)
            for (long j = 0; j < hidden; j++) a16[r * hidden + j] = float_to_bf16(c[r * ldctx + j]);
        x = a16;
        ldx = hidden;
    }
    metrale_encoder_linear_bf16(x, ldx, wo, NULL, 0, y, hidden, rows, hidden, hidden, nthreads);
    metrale_encoder_add_norm(y, bo, h, gamma1, beta1, eps, a, a16, rows, hidden, nthreads);
    metrale_encoder_linear_bf16(a16, hidden, wu, bu, 1, g, inter, rows, inter, hidden, nthreads);
    metrale_encoder_linear_bf16(g, inter, wd, NULL, 0, y, hidden, rows, hidden, inter, nthreads);
    metrale_encoder_add_norm(y, bd, a, gamma2, beta2, eps, h, h16, rows, hidden, nthreads);
}

void metrale_encoder_ffn_f32(const float *ctx, long ldctx, long rows, long hidden, long inter, const float *wo,
                             const float *bo, const float *gamma1, const float *beta1, const float *wu,
                             const float *bu, const float *wd, const float *bd, const float *gamma2,
                             const float *beta2, float eps, float *h, float *a, float *g, int nthreads) {
    metrale_encoder_linear_f32(ctx, ldctx, wo, NULL, 0, a, hidden, rows, hidden, hidden, nthreads);
    metrale_encoder_add_norm_f32(a, bo, h, gamma1, beta1, eps, a, rows, hidden, nthreads);
    metrale_encoder_linear_f32(a, hidden, wu, bu, 1, g, inter, rows, inter, hidden, nthreads);
    metrale_encoder_linear_f32(g, inter, wd, NULL, 0, h, hidden, rows, hidden, inter, nthreads);
    metrale_encoder_add_norm_f32(h, bd, a, gamma2, beta2, eps, h, rows, hidden, nthreads);
}

/* A whole post-LayerNorm BERT layer over `rows` rows that are whole sequences (starts relative to the first
 * row, lens), in one call: the steps models/bert.py would make one call each, with the same kernels in the
 * same order (so the same bits, and each sequence's rows still its own):
 *   qkv = W_qkv h (+ b_qkv), ctx = attention(qkv) per sequence and head, then metrale_encoder_ffn_*.
 * bfloat16 form (metrale_encoder_bf16_attention must name a unit): h16 the layer's bfloat16 input, qkv
 * [rows][3 hidden] its bfloat16 product without the bias (the attention adds it), ctx [rows][hidden]
 * bfloat16; float32 form: h the input, qkv and ctx float32, the bias added as the product is stored.
 * Returns 1, or what metrale_encoder_attention_bf16 returned when it did not run (0: no unit, -1: out of
 * memory; h and h16 are then unchanged). */
int metrale_encoder_layer_bf16(const uint16_t *wqkv, const float *bqkv, const int64_t *starts, const int64_t *lens,
                               long n_seqs, int n_heads, float scale, uint16_t *qkv, uint16_t *ctx, long rows,
                               long hidden, long inter, const uint16_t *wo, const float *bo, const float *gamma1,
                               const float *beta1, const uint16_t *wu, const float *bu, const uint16_t *wd,
                               const float *bd, const float *gamma2, const float *beta2, float eps, float *h,
                               uint16_t *h16, float *a, uint16_t *a16, uint16_t *y, uint16_t *g, int nthreads) {
    metrale_encoder_linear_bf16(h16, hidden, wqkv, NULL, 0, qkv, 3 * hidden, rows, 3 * hidden, hidden, nthreads);
    const int done = metrale_encoder_attention_bf16(qkv, 3 * hidden, bqkv, starts, lens, n_seqs, n_heads,
                                                    (int)(hidden / n_heads), scale, ctx, hidden, nthreads);
    if (done != 1) return done;
    metrale_encoder_ffn_bf16(ctx, 1, hidden, rows, hidden, inter, wo, bo, gamma1, beta1, wu, bu, wd, bd, gamma2, beta2,
                             eps, h, h16, a, a16, y, g, nthreads);
    return 1;
}

int metrale_encoder_layer_f32(const float *wqkv, const float *bqkv, const int64_t *starts, const int64_t *lens,
                              long n_seqs, int n_heads, float scale, float *qkv, float *ctx, long rows, long hidden,
                              long inter, const float *wo, const float *bo, const float *gamma1, const float *beta1,
                              const float *wu, const float *bu, const float *wd, const float *bd, const float *gamma2,
                              const float *beta2, float eps, float *h, float *a, float *g, int nthreads) {
    metrale_encoder_linear_f32(h, hidden, wqkv, bqkv, 0, qkv, 3 * hidden, rows, 3 * hidden, hidden, nthreads);
    metrale_encoder_attention(qkv, 3 * hidden, starts, lens, n_seqs, n_heads, (int)(hidden / n_heads), scale, ctx,
                              hidden, nthreads);
    metrale_encoder_ffn_f32(ctx, hidden, rows, hidden, inter, wo, bo, gamma1, beta1, wu, bu, wd, bd, gamma2, beta2, eps,
                            h, a, g, nthreads);
    return 1;
}
