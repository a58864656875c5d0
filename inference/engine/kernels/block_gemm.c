/* Linear layers on GGUF-style weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: 32 weights per block with
 * float16 scales) and the one entry point every decode-layer GEMM goes through
 * (metrale_weight_linear, which also runs the per-channel int8 format of int8_gemm.c and the
 * K-quant super-blocks of kquant_gemm.c).
 *
 * Values (ggml's rules, gguf-py's dequantize): Q4_0 w = d * (q - 8), q in 0..15;
 * Q4_1 w = d * q + m; Q5_0 w = d * (q - 16), Q5_1 w = d * q + m, q in 0..31; Q8_0 w = q * d,
 * q in -128..127. d and m are float16 per block.
 *
 * Fast path (exact = 0): each activation row is quantised per block of 32 to int8 with
 * its own scale dx = amax / 127 (llama.cpp's Q8 activations; round half to even), and
 * each (row, channel, block) integer dot product is summed exactly in int32 (AVX-512
 * VNNI vpdpbusd, AVX2 vpmaddubsw + vpmaddwd, or scalar: no path can overflow or
 * saturate), then y = sum over blocks in order of float(isum) * (d * dx), plus
 * m * (dx * float(sum of the block's activations)) for Q4_1 and Q5_1. The float steps are the
 * same operations per output channel in every path, so every instruction-set path
 * gives bitwise the same y, and a row's result never depends on the other rows.
 *
 * Reference path (exact = 1): the blocks dequantised inside the kernel exactly as
 * gguf-py does (float32), dot products with float32 activations summed in k order:
 * transformers' logits on the dequantised weights up to float32 summation order.
 *
 * Packed layout (kernels/__init__.py block_pack): output channels in tiles of 16
 * (zero past N), K a multiple of 32, KB = K / 32 blocks.
 *   Q4: qs uint8 [tiles, KB, 4, 64]: group g holds k = 8g .. 8g + 7 of the block;
 *       byte 4 j + i = q[j][8g + i] | q[j][8g + 4 + i] << 4 (j: channel in the tile).
 *   Q5: qs uint8 [tiles, KB, 5, 64]: the Q4 layout of the low 4 bits, then the fifth bits: byte
 *       4 j + i, bit 2g = bit 4 of q[j][8g + i], bit 2g + 1 = bit 4 of q[j][8g + 4 + i].
 *   Q8: qs int8 [tiles, KB, 8, 64]: group g holds k = 4g .. 4g + 3: byte 4 j + i = q[j][4g + i].
 *   d (and m for Q4_1, Q5_1): float16 [tiles, KB, 16].
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "kernels.h"
#include "codes512.h"
#if defined(__AVX2__) && defined(__F16C__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define BLK_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define BLK_VNNI512 1
#endif
#endif

#define BT 16  /* output channels per tile */
#define BR 8   /* rows per micro-kernel */
#define BMC 64 /* rows per cache block: the weights are read once per BMC rows */

/* The packed bytes of one (tile, block): codes and the float16 scales. */
static long codes_per_tile_block(int format) {
    return format == METRALE_W_Q8_0 ? 512 : (format == METRALE_W_Q5_0 || format == METRALE_W_Q5_1) ? 320 : 256;
}

static inline int is_q5(int format) { return format == METRALE_W_Q5_0 || format == METRALE_W_Q5_1; }

/* The code of weight 8g + 4 upper + i of channel j in a Q4 / Q5 tile-block (0..15, Q5: 0..31). */
static inline int q4_code(int format, const uint8_t *qs, int j, int g, int upper, int i) {
    const uint8_t byte = qs[64 * g + 4 * j + i];
    int q = upper ? byte >> 4 : byte & 0x0f;
    if (is_q5(format)) q |= ((qs[256 + 4 * j + i] >> (2 * g + upper)) & 1) << 4;
    return q;
}

const char *metrale_block_isa(void) {
#if defined(BLK_VNNI512)
    return "avx512-vnni";
#elif defined(BLK_AVX2)
    return "avx2";
#else
    return "portable";
#endif
}

static inline void halves_to_floats(const uint16_t *h, float *f) {
    for (int j = 0; j < BT; j++) f[j] = half_to_float(h[j]);
}

/* One row of activations as int8 blocks: a [K], dx [KB] (amax / 127), asum [KB] (the sum of
 * the block's int8 values) and sa [KB] = dx * float(asum). A block holding inf or NaN gets
 * dx = NaN (so every output it feeds is NaN); an all-zero block dx = 0. Each value is
 * x * (127 / amax) rounded half to even (the default rounding mode: lrintf, cvtps2dq) and
 * clamped to [-127, 127]; the vector path takes the same steps, so the same bytes. */
static void quantize_row_blocks(const float *x, long K, int8_t *a, float *dx, int32_t *asum, float *sa) {
    const long KB = K / 32;
    for (long b = 0; b < KB; b++) {
        const float *xb = x + b * 32;
        int8_t *ab = a + b * 32;
#if defined(BLK_AVX2)
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
        __m256 v[4], mx = _mm256_setzero_ps(), badv = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            const __m256 av = _mm256_and_ps(v[i], absmask);
            badv = _mm256_or_ps(badv, _mm256_cmp_ps(av, inf, _CMP_NLT_UQ)); /* inf, or NaN (unordered) */
            mx = _mm256_max_ps(mx, av);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float amax = _mm_cvtss_f32(m4);
        const int bad = _mm256_movemask_ps(badv) != 0;
#else
        float amax = 0.f;
        int bad = 0;
        for (int i = 0; i < 32; i++) {
            amax = fmaxf(amax, fabsf(xb[i]));
            bad |= !isfinite(xb[i]);
        }
#endif
        if (bad || amax == 0.f) {
            memset(ab, 0, 32);
            dx[b] = bad ? NAN : 0.f;
            asum[b] = 0;
            sa[b] = bad ? NAN : 0.f;
            continue;
        }
        const float inv = 127.f / amax;
        int32_t s = 0;
#if defined(BLK_AVX2)
        const __m256 iv = _mm256_set1_ps(inv);
        const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
        __m256i q[4], sum = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            q[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], iv)), lo), hi);
            sum = _mm256_add_epi32(sum, q[i]);
        }
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)ab, _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        s = _mm_cvtsi128_si32(s4);
#else
        for (int i = 0; i < 32; i++) {
            long v = lrintf(xb[i] * inv); /* round half to even (the default rounding mode) */
            v = v > 127 ? 127 : (v < -127 ? -127 : v);
            ab[i] = (int8_t)v;
            s += (int32_t)v;
        }
#endif
        dx[b] = amax / 127.f;
        asum[b] = s;
        sa[b] = dx[b] * (float)s;
    }
}

/* The portable path's exact int32 sums of `rows` activation rows (a, lda int8 apart; block b) against one
 * tile-block's codes: isum[r][j] = sum_k w_code[j][k] * a[r][k] with the format's offset
 * removed (Q4_0: q - 8; Q8_0: signed q), i.e. the dot product of the block's integer values. */
static inline __attribute__((always_inline)) void block_sums(int format, const uint8_t *qs, const int8_t *a,
                                                             long lda, const int32_t *asum, long ldsum, int rows,
                                                             int32_t *isum) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < BT; j++) {
            const int8_t *ar = a + r * lda;
            int32_t s = 0;
            if (format == METRALE_W_Q8_0) {
                for (int g = 0; g < 8; g++)
                    for (int i = 0; i < 4; i++) s += (int32_t)((const int8_t *)qs)[64 * g + 4 * j + i] * ar[4 * g + i];
            } else {
                for (int g = 0; g < 4; g++)
                    for (int i = 0; i < 4; i++)
                        s += (int32_t)q4_code(format, qs, j, g, 0, i) * ar[8 * g + i] +
                             (int32_t)q4_code(format, qs, j, g, 1, i) * ar[8 * g + 4 + i];
                if (format == METRALE_W_Q4_0) s -= 8 * asum[r * ldsum];
                if (format == METRALE_W_Q5_0) s -= 16 * asum[r * ldsum];
            }
            isum[r * BT + j] = s;
        }
}

/* acc[r][j] += float(isum[r][j]) * (d[j] * dx[r]) (+ m[j] * sa[r]): the same steps per lane everywhere. */
static inline __attribute__((always_inline)) void block_finish(const int32_t *isum, const float *d, const float *m,
                                                               const float *dx, const float *sa, long ldq, int rows,
                                                               float *acc) {
    for (int r = 0; r < rows; r++) {
        const float x = dx[r * ldq];
#pragma GCC ivdep
        for (int j = 0; j < BT; j++) acc[r * BT + j] = acc[r * BT + j] + (float)isum[r * BT + j] * (d[j] * x);
        if (m) {
            const float s = sa[r * ldq];
#pragma GCC ivdep
            for (int j = 0; j < BT; j++) acc[r * BT + j] = acc[r * BT + j] + m[j] * s;
        }
    }
}

/* The 16 x 32 dequantised weights of one tile-block, w[kk][j] (k-major so that a row's dot
 * product runs over channels in the vector lanes), exactly as gguf-py computes them. */
static void dequant_tile_block(int format, const uint8_t *qs, const float *d, const float *m, float *w) {
    for (int j = 0; j < BT; j++) {
        if (format == METRALE_W_Q8_0) {
            for (int g = 0; g < 8; g++)
                for (int i = 0; i < 4; i++) w[(4 * g + i) * BT + j] = (float)((const int8_t *)qs)[64 * g + 4 * j + i] * d[j];
            continue;
        }
        for (int g = 0; g < 4; g++)
            for (int i = 0; i < 4; i++) {
                const int q0 = q4_code(format, qs, j, g, 0, i), q1 = q4_code(format, qs, j, g, 1, i);
                if (format == METRALE_W_Q4_0 || format == METRALE_W_Q5_0) {
                    const int off = format == METRALE_W_Q4_0 ? 8 : 16;
                    w[(8 * g + i) * BT + j] = d[j] * (float)(q0 - off);
                    w[(8 * g + 4 + i) * BT + j] = d[j] * (float)(q1 - off);
                } else {
                    w[(8 * g + i) * BT + j] = d[j] * (float)q0 + m[j];
                    w[(8 * g + 4 + i) * BT + j] = d[j] * (float)q1 + m[j];
                }
            }
    }
}

#if defined(BLK_VNNI512)
/* tile_fast's loop over the blocks for R rows with the float sums and the integer ones in
 * registers (the same operations per lane as block_sums + block_finish, so the same bits).
 * Up to 6 rows keep two integer accumulators a row (two dependency chains of vpdpbusd: 5
 * rows with one chain each wait on vpdpbusd's latency, 13% slower on a Xeon); 7 and 8 rows
 * are enough independent chains with one each, which leaves room for 8 rows' float and
 * integer sums in the 32 vector registers (the codes unpacked once for all 8). */
static inline __attribute__((always_inline)) void tile_rows_vnni(int format, const uint8_t *qs, long cb,
                                                                  const uint16_t *dh, const uint16_t *mh, long KB,
                                                                  const int8_t *a, long K, const float *dx,
                                                                  const int32_t *asum, const float *sa, float *acc,
                                                                  const int R) {
    const int two = R <= 6;
    __m512 c[BR];
    for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (long b = 0; b < KB; b++, qs += cb) {
        for (long l = 0; l < cb; l += 64) _mm_prefetch((const char *)qs + METRALE_PF_BYTES + l, _MM_HINT_T0);
        if (!(b & 1)) {
            _mm_prefetch((const char *)(dh + b * BT) + METRALE_PF_BYTES / 8, _MM_HINT_T0);
            if (mh) _mm_prefetch((const char *)(mh + b * BT) + METRALE_PF_BYTES / 8, _MM_HINT_T0);
        }
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dh + b * BT)));
        __m512i s[BR], s1[BR];
        for (int r = 0; r < R; r++) s[r] = s1[r] = _mm512_setzero_si512();
        const int8_t *ab = a + b * 32;
        if (format == METRALE_W_Q8_0) {
            for (int g = 0; g < 8; g += 2) {
                const __m512i w0 = _mm512_xor_si512(_mm512_loadu_si512((const void *)(qs + 64 * g)), flip);
                const __m512i w1 = _mm512_xor_si512(_mm512_loadu_si512((const void *)(qs + 64 * g + 64)), flip);
                for (int r = 0; r < R; r++) {
                    int32_t p0, p1;
                    memcpy(&p0, ab + r * K + 4 * g, 4);
                    memcpy(&p1, ab + r * K + 4 * g + 4, 4);
                    s[r] = _mm512_dpbusd_epi32(s[r], w0, _mm512_set1_epi32(p0));
                    if (two) s1[r] = _mm512_dpbusd_epi32(s1[r], w1, _mm512_set1_epi32(p1));
                    else s[r] = _mm512_dpbusd_epi32(s[r], w1, _mm512_set1_epi32(p1));
                }
            }
            for (int r = 0; r < R; r++) {
                if (two) s[r] = _mm512_add_epi32(s[r], s1[r]);
                s[r] = _mm512_sub_epi32(s[r], _mm512_set1_epi32(128 * asum[r * KB + b]));
            }
        } else {
            __m512i hs = is_q5(format) ? _mm512_loadu_si512((const void *)(qs + 256)) : _mm512_setzero_si512();
            for (int g = 0; g < 4; g++) {
                __m512i lo, hi;
                q4_group_codes(qs, g, is_q5(format), &hs, &lo, &hi);
                for (int r = 0; r < R; r++) {
                    int32_t p0, p1;
                    memcpy(&p0, ab + r * K + 8 * g, 4);
                    memcpy(&p1, ab + r * K + 8 * g + 4, 4);
                    s[r] = _mm512_dpbusd_epi32(s[r], lo, _mm512_set1_epi32(p0));
                    if (two) s1[r] = _mm512_dpbusd_epi32(s1[r], hi, _mm512_set1_epi32(p1));
                    else s[r] = _mm512_dpbusd_epi32(s[r], hi, _mm512_set1_epi32(p1));
                }
            }
            for (int r = 0; r < R; r++) {
                if (two) s[r] = _mm512_add_epi32(s[r], s1[r]);
                if (format == METRALE_W_Q4_0) s[r] = _mm512_sub_epi32(s[r], _mm512_set1_epi32(8 * asum[r * KB + b]));
                if (format == METRALE_W_Q5_0) s[r] = _mm512_sub_epi32(s[r], _mm512_set1_epi32(16 * asum[r * KB + b]));
            }
        }
        for (int r = 0; r < R; r++)
            c[r] = _mm512_add_ps(c[r], _mm512_mul_ps(_mm512_cvtepi32_ps(s[r]),
                                                     _mm512_mul_ps(dv, _mm512_set1_ps(dx[r * KB + b]))));
        if (mh) {
            const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mh + b * BT)));
            for (int r = 0; r < R; r++) c[r] = _mm512_add_ps(c[r], _mm512_mul_ps(mv, _mm512_set1_ps(sa[r * KB + b])));
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(acc + r * BT, c[r]);
}
#endif

#if defined(BLK_AVX2) && !defined(BLK_VNNI512)
/* The 4 bytes at p in every 32-bit lane (one vbroadcastss load; the bits are only moved). */
static inline __m256i bcast4(const int8_t *p) { return _mm256_castps_si256(_mm256_broadcast_ss((const float *)p)); }

#define BR2 2 /* rows per AVX2 micro-kernel: 16 ymm registers hold 2 rows' float and integer sums of a tile */

/* tile_fast's loop over the blocks for R <= 2 rows with both halves of the tile (16 channels) at
 * once and the float and integer sums in registers: the same operations per lane as
 * block_sums + block_finish (int16 pair sums of vpmaddubsw, exact; vpmaddwd to int32; then
 * c + float(isum) * (d * dx), c + m * sa), so the same bits. Each activation broadcast
 * serves the 16 channels. */
static inline __attribute__((always_inline)) void tile_rows_avx2(int format, const uint8_t *qs, long cb,
                                                                  const uint16_t *dh, const uint16_t *mh, long KB,
                                                                  const int8_t *a, long K, const float *dx,
                                                                  const int32_t *asum, const float *sa, float *acc,
                                                                  const int R) {
    __m256 c[BR2][2];
    for (int r = 0; r < R; r++) c[r][0] = c[r][1] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), bit4 = _mm256_set1_epi8(0x10);
    for (long b = 0; b < KB; b++, qs += cb) {
        for (long l = 0; l < cb; l += 64) _mm_prefetch((const char *)qs + METRALE_PF_BYTES + l, _MM_HINT_T0);
        if (!(b & 1)) {
            _mm_prefetch((const char *)(dh + b * BT) + METRALE_PF_BYTES / 8, _MM_HINT_T0);
            if (mh) _mm_prefetch((const char *)(mh + b * BT) + METRALE_PF_BYTES / 8, _MM_HINT_T0);
        }
        __m256i s[BR2][2];
        for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm256_setzero_si256();
        const int8_t *ab = a + b * 32;
        if (format == METRALE_W_Q8_0) {
            for (int g = 0; g < 8; g++) {
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(qs + 64 * g));
                const __m256i w1 = _mm256_loadu_si256((const __m256i *)(qs + 64 * g + 32));
                const __m256i aw0 = _mm256_abs_epi8(w0), aw1 = _mm256_abs_epi8(w1);
                for (int r = 0; r < R; r++) {
                    const __m256i p = bcast4(ab + r * K + 4 * g);
                    s[r][0] = _mm256_add_epi32(s[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(aw0, _mm256_sign_epi8(p, w0)), ones));
                    s[r][1] = _mm256_add_epi32(s[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(aw1, _mm256_sign_epi8(p, w1)), ones));
                }
            }
        } else if (is_q5(format)) {
            /* int16 pair sums of at most 2 * 31 * 127: two groups' (4 of them) fit int16, then vpmaddwd */
            __m256i h0 = _mm256_loadu_si256((const __m256i *)(qs + 256)), h1 = _mm256_loadu_si256((const __m256i *)(qs + 288));
            __m256i t[BR2][2];
            for (int g = 0; g < 4; g++) {
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(qs + 64 * g));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(qs + 64 * g + 32));
                const __m256i lo0 = _mm256_or_si256(_mm256_and_si256(v0, low), _mm256_and_si256(_mm256_slli_epi16(h0, 4), bit4));
                const __m256i hi0 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), low), _mm256_and_si256(_mm256_slli_epi16(h0, 3), bit4));
                const __m256i lo1 = _mm256_or_si256(_mm256_and_si256(v1, low), _mm256_and_si256(_mm256_slli_epi16(h1, 4), bit4));
                const __m256i hi1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), low), _mm256_and_si256(_mm256_slli_epi16(h1, 3), bit4));
                h0 = _mm256_srli_epi16(h0, 2);
                h1 = _mm256_srli_epi16(h1, 2);
                for (int r = 0; r < R; r++) {
                    const __m256i p0 = bcast4(ab + r * K + 8 * g), p1 = bcast4(ab + r * K + 8 * g + 4);
                    const __m256i u0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo0, p0), _mm256_maddubs_epi16(hi0, p1));
                    const __m256i u1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo1, p0), _mm256_maddubs_epi16(hi1, p1));
                    if (!(g & 1)) {
                        t[r][0] = u0;
                        t[r][1] = u1;
                    } else {
                        s[r][0] = _mm256_add_epi32(s[r][0], _mm256_madd_epi16(_mm256_add_epi16(t[r][0], u0), ones));
                        s[r][1] = _mm256_add_epi32(s[r][1], _mm256_madd_epi16(_mm256_add_epi16(t[r][1], u1), ones));
                    }
                }
            }
            if (format == METRALE_W_Q5_0)
                for (int r = 0; r < R; r++)
                    for (int h = 0; h < 2; h++) s[r][h] = _mm256_sub_epi32(s[r][h], _mm256_set1_epi32(16 * asum[r * KB + b]));
        } else {
            for (int g = 0; g < 4; g++) {
                const __m256i v0 = _mm256_loadu_si256((const __m256i *)(qs + 64 * g));
                const __m256i v1 = _mm256_loadu_si256((const __m256i *)(qs + 64 * g + 32));
                const __m256i lo0 = _mm256_and_si256(v0, low), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low);
                const __m256i lo1 = _mm256_and_si256(v1, low), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low);
                for (int r = 0; r < R; r++) {
                    const __m256i p0 = bcast4(ab + r * K + 8 * g), p1 = bcast4(ab + r * K + 8 * g + 4);
                    s[r][0] = _mm256_add_epi16(s[r][0], _mm256_maddubs_epi16(lo0, p0));
                    s[r][1] = _mm256_add_epi16(s[r][1], _mm256_maddubs_epi16(lo1, p0));
                    s[r][0] = _mm256_add_epi16(s[r][0], _mm256_maddubs_epi16(hi0, p1));
                    s[r][1] = _mm256_add_epi16(s[r][1], _mm256_maddubs_epi16(hi1, p1));
                }
            }
            for (int r = 0; r < R; r++)
                for (int h = 0; h < 2; h++) {
                    s[r][h] = _mm256_madd_epi16(s[r][h], ones);
                    if (format == METRALE_W_Q4_0) s[r][h] = _mm256_sub_epi32(s[r][h], _mm256_set1_epi32(8 * asum[r * KB + b]));
                }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dh + b * BT + 8 * h)));
            for (int r = 0; r < R; r++)
                c[r][h] = _mm256_add_ps(c[r][h], _mm256_mul_ps(_mm256_cvtepi32_ps(s[r][h]),
                                                               _mm256_mul_ps(dv, _mm256_set1_ps(dx[r * KB + b]))));
        }
        if (mh)
            for (int h = 0; h < 2; h++) {
                const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mh + b * BT + 8 * h)));
                for (int r = 0; r < R; r++) c[r][h] = _mm256_add_ps(c[r][h], _mm256_mul_ps(mv, _mm256_set1_ps(sa[r * KB + b])));
            }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(acc + r * BT, c[r][0]);
        _mm256_storeu_ps(acc + r * BT + 8, c[r][1]);
    }
}

#endif

/* Output channels of one tile for rows [m0, m1): the fast path. With amx (metrale_amx_begin called by
 * this thread), whole groups of 16 rows on the tile unit (amx_gemm.c: the same bits), the rest here. */
static void tile_fast(const metrale_weight *W, long t, long KB, const int8_t *a, const float *dx, const int32_t *asum,
                      const float *sa, long m0, long m1, float *y, long N, long ldy, int amx) {
    const long cb = codes_per_tile_block(W->format);
    const uint8_t *qs = (const uint8_t *)W->qs + t * KB * cb;
    const uint16_t *dh = (const uint16_t *)W->d + t * KB * BT;
    const uint16_t *mh = W->m ? (const uint16_t *)W->m + t * KB * BT : NULL;
    const long K = KB * 32, n0 = t * BT;
    const int nc = (int)(N - n0 < BT ? N - n0 : BT);
    if (amx)
        m0 += metrale_amx_block_rows(W->format, qs, cb, dh, mh, KB, a + m0 * K, K, dx + m0 * KB, sa + m0 * KB, m1 - m0,
                                     y + m0 * ldy + n0, ldy, nc);
    for (long m = m0; m < m1; m += BR) {
        const int rows = (int)(m1 - m < BR ? m1 - m : BR);
        float acc[BR * BT] __attribute__((aligned(64)));
#if defined(BLK_VNNI512)
        const int8_t *ar = a + m * K;
        const float *dr = dx + m * KB, *sr = sa + m * KB;
        const int32_t *qr = asum + m * KB;
        switch (rows) {
#define ROWS(n) case n: tile_rows_vnni(W->format, qs, cb, dh, mh, KB, ar, K, dr, qr, sr, acc, n); break;
            ROWS(8) ROWS(7) ROWS(6) ROWS(5) ROWS(4) ROWS(3) ROWS(2)
#undef ROWS
            default: tile_rows_vnni(W->format, qs, cb, dh, mh, KB, ar, K, dr, qr, sr, acc, 1); break;
        }
#elif defined(BLK_AVX2)
        for (int r0 = 0; r0 < rows; r0 += BR2) {
            const int n = rows - r0 < BR2 ? rows - r0 : BR2;
            const int8_t *ar = a + (m + r0) * K;
            const float *dr = dx + (m + r0) * KB, *sr = sa + (m + r0) * KB;
            const int32_t *qr = asum + (m + r0) * KB;
            float *ac = acc + r0 * BT;
            if (n == 2) tile_rows_avx2(W->format, qs, cb, dh, mh, KB, ar, K, dr, qr, sr, ac, 2);
            else tile_rows_avx2(W->format, qs, cb, dh, mh, KB, ar, K, dr, qr, sr, ac, 1);
        }
#else
        int32_t isum[BR * BT] __attribute__((aligned(64)));
        memset(acc, 0, sizeof acc);
        for (long b = 0; b < KB; b++) {
            float d[BT], mv[BT];
            halves_to_floats(dh + b * BT, d);
            if (mh) halves_to_floats(mh + b * BT, mv);
            block_sums(W->format, qs + b * cb, a + m * K + b * 32, K, asum + m * KB + b, KB, rows, isum);
            block_finish(isum, d, mh ? mv : NULL, dx + m * KB + b, sa + m * KB + b, KB, rows, acc);
        }
#endif
        for (int r = 0; r < rows; r++) memcpy(y + (m + r) * ldy + n0, acc + r * BT, sizeof(float) * (size_t)nc);
    }
}

/* Output channels of one tile for rows [m0, m1): the reference path (float32 activations). */
static void tile_exact(const metrale_weight *W, long t, long KB, const float *x, long m0, long m1, float *y, long N,
                       long ldy) {
    const long cb = codes_per_tile_block(W->format);
    const uint8_t *qs = (const uint8_t *)W->qs + t * KB * cb;
    const uint16_t *dh = (const uint16_t *)W->d + t * KB * BT;
    const uint16_t *mh = W->m ? (const uint16_t *)W->m + t * KB * BT : NULL;
    const long K = KB * 32, n0 = t * BT;
    const int nc = (int)(N - n0 < BT ? N - n0 : BT);
    for (long m = m0; m < m1; m += BR) {
        const int rows = (int)(m1 - m < BR ? m1 - m : BR);
        float acc[BR * BT];
        memset(acc, 0, sizeof acc);
        for (long b = 0; b < KB; b++) {
            float d[BT], mv[BT], w[32 * BT];
            for (int j = 0; j < BT; j++) d[j] = half_to_float(dh[b * BT + j]);
            if (mh)
                for (int j = 0; j < BT; j++) mv[j] = half_to_float(mh[b * BT + j]);
            dequant_tile_block(W->format, qs + b * cb, d, mv, w);
            for (int r = 0; r < rows; r++) {
                const float *xr = x + (m + r) * K + b * 32;
                float *c = acc + r * BT;
                for (int kk = 0; kk < 32; kk++) {
                    const float xv = xr[kk];
#pragma GCC ivdep
                    for (int j = 0; j < BT; j++) c[j] = c[j] + w[kk * BT + j] * xv;
                }
            }
        }
        for (int r = 0; r < rows; r++) memcpy(y + (m + r) * ldy + n0, acc + r * BT, sizeof(float) * (size_t)nc);
    }
}

/* Bytes of a block linear's scratch for M rows of K values (block_parts): their int8 blocks and each
 * block's dx, asum and sa (64-byte aligned parts). */
static long block_scratch_bytes(long M, long K) {
    const long KB = K / 32;
    return ((M * K + 63) & ~63L) + 3 * ((4 * M * KB + 63) & ~63L);
}

/* The parts of a block linear's scratch (block_scratch_bytes): x's int8 blocks and each block's
 * dx, sa and asum. */
typedef struct {
    int8_t *a;
    float *dx, *sa;
    int32_t *asum;
} block_rows;

static block_rows block_parts(void *scratch, long M, long K) {
    const long KB = K / 32;
    block_rows r;
    r.a = (int8_t *)scratch;
    r.dx = (float *)((char *)scratch + ((M * K + 63) & ~63L));
    r.sa = (float *)((char *)r.dx + ((4 * M * KB + 63) & ~63L));
    r.asum = (int32_t *)((char *)r.sa + ((4 * M * KB + 63) & ~63L));
    return r;
}

/* The parts of a stacked weight (kernels.h: `rows` and `next`): each part's weight, first output
 * channel, channels and first tile; tile0[count] = all the tiles. */
#define MAX_PARTS 8
typedef struct {
    int count;
    const metrale_weight *w[MAX_PARTS];
    long col[MAX_PARTS], n[MAX_PARTS], tile0[MAX_PARTS + 1];
} weight_parts;

static weight_parts parts_of(const metrale_weight *W, long N) {
    weight_parts p;
    long at = 0, tiles = 0;
    p.count = 0;
    for (const metrale_weight *w = W; w && p.count < MAX_PARTS; w = w->next) {
        const int c = p.count++;
        p.w[c] = w;
        p.col[c] = at;
        p.n[c] = w->next ? w->rows : N - at;
        p.tile0[c] = tiles;
        tiles += (p.n[c] + BT - 1) / BT;
        at += p.n[c];
    }
    p.tile0[p.count] = tiles;
    return p;
}

/* The tiles of y = x · wᵀ (W a block-format weight of N output channels, or a stack of parts of
 * formats that read the same quantised rows; K a multiple of 32, 256 for the K-quants; y float32
 * [M, N]) from x's rows as scratch holds them (block_parts, kquant_gemm.c's; x itself on the
 * reference path), shared by the threads of the enclosing team. Tiles (of every part) are handed
 * out in shrinking contiguous runs (guided: each thread streams long runs of the weights, and one
 * that falls behind, descheduled by another process, holds up only its last run); each is read
 * once per BMC rows. */
static void block_tiles_team(const metrale_weight *W, const float *x, float *y, long M, long N, long K,
                             void *scratch) {
    const long KB = K / 32;
    const block_rows r = block_parts(scratch, M, K);
    const weight_parts p = parts_of(W, N);
    int amx = M >= 16 && metrale_amx_ready();
    for (int c = 0; c < p.count; c++) amx &= !p.w[c]->exact;
    if (amx) metrale_amx_begin();
    for (long m0 = 0; m0 < M; m0 += BMC) {
        const long m1 = m0 + BMC < M ? m0 + BMC : M;
#pragma omp for schedule(guided)
        for (long t = 0; t < p.tile0[p.count]; t++) {
            int c = 0;
            while (t >= p.tile0[c + 1]) c++;
            const metrale_weight *P = p.w[c];
            float *yc = y + p.col[c];
            const long tc = t - p.tile0[c];
            if (metrale_is_kquant(P->format)) metrale_kq_tile(P, tc, x, scratch, M, K, m0, m1, yc, p.n[c], N, amx);
            else if (P->exact) tile_exact(P, tc, KB, x, m0, m1, yc, p.n[c], N);
            else tile_fast(P, tc, KB, r.a, r.dx, r.asum, r.sa, m0, m1, yc, p.n[c], N, amx);
        }
    }
    if (amx) metrale_amx_end();
}

long metrale_weight_scratch_bytes(long M, long K) {
    const long i8 = metrale_int8_scratch_bytes(M, K), blk = block_scratch_bytes(M, K), kq = metrale_kq_scratch_bytes(M, K);
    const long most = i8 > blk ? i8 : blk;
    return most > kq ? most : kq;
}

void metrale_weight_quantize(const metrale_weight *W, const float *x, long M, long K, void *scratch) {
    if (W->format == METRALE_W_INT8) {
        metrale_int8_quantize(x, M, K, scratch);
    } else if (metrale_is_kquant(W->format)) {
        if (!W->exact) metrale_kq_quantize(x, M, K, scratch);
    } else if (!W->exact) {
        const block_rows r = block_parts(scratch, M, K);
        const long KB = K / 32;
        for (long m = 0; m < M; m++)
            quantize_row_blocks(x + m * K, K, r.a + m * K, r.dx + m * KB, r.asum + m * KB, r.sa + m * KB);
    }
}

void metrale_weight_tiles_team(const metrale_weight *W, const float *x, float *y, long M, long N, long K,
                               void *scratch) {
    if (W->format == METRALE_W_INT8) metrale_int8_tiles_team((const int8_t *)W->qs, (const float *)W->d, y, M, N, K, scratch);
    else block_tiles_team(W, x, y, M, N, K, scratch);
}

void metrale_weight_linear_team(const metrale_weight *W, const float *x, float *y, long M, long N, long K,
                                void *scratch) {
    if (W->format == METRALE_W_INT8) {
        metrale_int8_linear_team(x, (const int8_t *)W->qs, (const float *)W->d, y, M, N, K, scratch);
        return;
    }
    if (metrale_is_kquant(W->format)) {
        if (!W->exact) metrale_kq_quantize_team(x, M, K, scratch);
        block_tiles_team(W, x, y, M, N, K, scratch);
        return;
    }
    if (!W->exact) {
        const block_rows r = block_parts(scratch, M, K);
        const long KB = K / 32;
#pragma omp for schedule(guided)
        for (long m = 0; m < M; m++)
            quantize_row_blocks(x + m * K, K, r.a + m * K, r.dx + m * KB, r.asum + m * KB, r.sa + m * KB);
    }
    block_tiles_team(W, x, y, M, N, K, scratch);
}

void metrale_weight_linear(const metrale_weight *W, const float *x, float *y, long M, long N, long K, int nthreads) {
    void *scratch = malloc((size_t)metrale_weight_scratch_bytes(M, K));
    if (!scratch) {
        for (long i = 0; i < M * N; i++) y[i] = NAN; /* out of memory: never silently zeros */
        return;
    }
#pragma omp parallel num_threads(nthreads)
    metrale_weight_linear_team(W, x, y, M, N, K, scratch);
    free(scratch);
}

/* Rows `ids` of a block-format weight, dequantised to float32 (out [n, K]), e.g. embedding
 * rows read from their Q8_0 blocks; the values are gguf-py's dequantize's. */
void metrale_block_rows(const metrale_weight *W0, long K, const int64_t *ids, long n, float *out) {
    for (long r = 0; r < n; r++) {
        const metrale_weight *W = W0;
        long row = ids[r];
        while (W->next && row >= W->rows) { /* the part holding the row */
            row -= W->rows;
            W = W->next;
        }
        if (metrale_is_kquant(W->format)) {
            metrale_kq_rows(W, K, &row, 1, out + r * K);
            continue;
        }
        const long KB = K / 32, cb = codes_per_tile_block(W->format), t = row / BT;
        const int j = (int)(row % BT);
        for (long b = 0; b < KB; b++) {
            const uint8_t *qs = (const uint8_t *)W->qs + (t * KB + b) * cb;
            const float d = half_to_float(((const uint16_t *)W->d)[(t * KB + b) * BT + j]);
            const float m = W->m ? half_to_float(((const uint16_t *)W->m)[(t * KB + b) * BT + j]) : 0.f;
            float *o = out + r * K + b * 32;
            if (W->format == METRALE_W_Q8_0) {
                for (int g = 0; g < 8; g++)
                    for (int i = 0; i < 4; i++) o[4 * g + i] = (float)((const int8_t *)qs)[64 * g + 4 * j + i] * d;
                continue;
            }
            for (int g = 0; g < 4; g++)
                for (int i = 0; i < 4; i++) {
                    const int q0 = q4_code(W->format, qs, j, g, 0, i), q1 = q4_code(W->format, qs, j, g, 1, i);
                    if (W->format == METRALE_W_Q4_0 || W->format == METRALE_W_Q5_0) {
                        const int off = W->format == METRALE_W_Q4_0 ? 8 : 16;
                        o[8 * g + i] = d * (float)(q0 - off);
                        o[8 * g + 4 + i] = d * (float)(q1 - off);
                    } else {
                        o[8 * g + i] = d * (float)q0 + m;
                        o[8 * g + 4 + i] = d * (float)q1 + m;
                    }
                }
        }
    }
}
