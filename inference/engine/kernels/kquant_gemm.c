/* Linear layers on GGUF K-quant super-blocks (Q4_K, Q5_K, Q6_K: 256 weights of one output channel),
 * computed on the blocks themselves with int8 activations (block_gemm.c dispatches here).
 *
 * Values (ggml's k-quants, gguf-py's dequantizers): Q4_K / Q5_K w = (d * sc) * q - dmin * m with 8
 * sub-blocks of 32, sc and m in 0..63, q in 0..15 (Q5_K 0..31); Q6_K w = (d * sc) * (q - 32) with 16
 * sub-blocks of 16, sc an int8, q in 0..63. d and dmin are float16 per super-block.
 *
 * Fast path (exact = 0): each activation row is quantised per super-block of 256 to int8 with its
 * own scale dx = amax / 127 (llama.cpp's Q8_K activations; x * (127 / amax), round half to even,
 * clamped to [-127, 127]) and the sums of each 16 (bs16) and 32 (bs32) of its int8 values. For each
 * (row, channel, super-block) the integer sums are exact in int32 (no path can overflow or
 * saturate: at most 8 * 63 * 32 * 31 * 127 < 2^31):
 *   Q4_K / Q5_K: isum = sum_s sc[s] * dot(q, a)[s],  msum = sum_s m[s] * bs32[s];
 *   Q6_K:        isum = sum_s sc[s] * (dot(q, a)[s] - 32 * bs16[s]);
 * then, super-block by super-block in order, acc = acc + float(isum) * (d * dx), and for Q4_K /
 * Q5_K acc = acc - float(msum) * (dmin * dx). The float steps are the same operations per output
 * channel in every path (AVX-512 VNNI vpdpbusd, AVX2 vpmaddubsw + vpmaddwd, portable C), so every
 * instruction-set path gives bitwise the same y, and a row's result never depends on the other rows.
 *
 * Reference path (exact = 1): the super-blocks dequantised inside the kernel exactly as gguf-py does
 * (float32), dot products with float32 activations summed in k order.
 *
 * Packed layout (kernels/__init__.py KernelWeight.from_blocks): output channels in tiles of 16 (zero
 * past N), K a multiple of 256, KS = K / 256; one stream [tiles, KS, stride] of 64-byte aligned parts
 * per (tile, super-block), j the channel in the tile:
 *   codes, 8 sub-blocks s of 32 (k = 32 s + ...), each [4 groups g][64]: byte 4 j + i = low 4 bits of
 *     q[j][8g + i] | low 4 bits of q[j][8g + 4 + i] << 4 (block_gemm.c's Q4 layout);
 *   Q5_K then high bits [8 s][64]: byte 4 j + i, bit 2g = bit 4 of q[j][8g + i], bit 2g + 1 = bit 4
 *     of q[j][8g + 4 + i];
 *   Q6_K then high bits [8 s][2 v][64]: byte 4 j + i of v, bits 4e..4e+1 = bits 4..5 of q[j][8(2v+e) + i],
 *     bits 4e+2..4e+3 = bits 4..5 of q[j][8(2v+e) + 4 + i] (e = 0, 1);
 *   scales (256 bytes): Q4_K / Q5_K uint8 sc [8 s][16 j], then uint8 m [4 p][16 j][2] (m[2p], m[2p+1]);
 *     Q6_K int8 sc [8 p][16 j][2] (sub-blocks of 16: sc[2p], sc[2p+1]);
 *   float16 d [16] (Q4_K / Q5_K: then dmin [16]), padded to 64 bytes.
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
#define KQ_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define KQ_VNNI512 1
#endif
#endif

#define KT 16   /* output channels per tile */
#define QK 256  /* weights per super-block */
#define KBR 8   /* rows per micro-kernel */
#define KBMC 64 /* rows per cache block */

static long code_bytes(int format) { return format == METRALE_W_Q4_K ? 2048 : format == METRALE_W_Q5_K ? 2560 : 3072; }

long metrale_kq_stride(int format) { return code_bytes(format) + 256 + 64; }

int metrale_is_kquant(int format) {
    return format == METRALE_W_Q4_K || format == METRALE_W_Q5_K || format == METRALE_W_Q6_K;
}

/* Scratch of M rows of K values: int8 a [M, K], dx float [M, K / 256], bs16 int16 [M, K / 16],
 * bs32 int16 [M, K / 32] (64-byte aligned parts). */
typedef struct {
    int8_t *a;
    float *dx;
    int16_t *bs16, *bs32;
} kq_rows;

static long al64(long n) { return (n + 63) & ~63L; }

long metrale_kq_scratch_bytes(long M, long K) {
    return al64(M * K) + al64(4 * M * (K / QK)) + al64(2 * M * (K / 16)) + al64(2 * M * (K / 32));
}

static kq_rows kq_parts(void *scratch, long M, long K) {
    kq_rows r;
    r.a = (int8_t *)scratch;
    r.dx = (float *)((char *)scratch + al64(M * K));
    r.bs16 = (int16_t *)((char *)r.dx + al64(4 * M * (K / QK)));
    r.bs32 = (int16_t *)((char *)r.bs16 + al64(2 * M * (K / 16)));
    return r;
}

/* One row as Q8_K-style super-blocks (the module comment's rule). A super-block holding inf or NaN
 * gets dx = NaN (every output it feeds is NaN), an all-zero one dx = 0. The vector path takes the
 * scalar path's steps (max, one division, one multiplication, round half to even), so the same bytes. */
static void quantize_row_kq(const float *x, long K, int8_t *a, float *dx, int16_t *bs16, int16_t *bs32) {
    for (long b = 0; b < K / QK; b++) {
        const float *xb = x + b * QK;
        int8_t *ab = a + b * QK;
        float amax = 0.f;
        int bad = 0;
#if defined(KQ_AVX2)
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
        __m256 mx = _mm256_setzero_ps(), badv = _mm256_setzero_ps();
        for (int i = 0; i < QK; i += 8) {
            const __m256 av = _mm256_and_ps(_mm256_loadu_ps(xb + i), absmask);
            badv = _mm256_or_ps(badv, _mm256_cmp_ps(av, inf, _CMP_NLT_UQ));
            mx = _mm256_max_ps(mx, av);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        amax = _mm_cvtss_f32(m4);
        bad = _mm256_movemask_ps(badv) != 0;
#else
        for (int i = 0; i < QK; i++) {
            amax = fmaxf(amax, fabsf(xb[i]));
            bad |= !isfinite(xb[i]);
        }
#endif
        if (bad || amax == 0.f) {
            memset(ab, 0, QK);
            dx[b] = bad ? NAN : 0.f;
            for (int i = 0; i < QK / 16; i++) bs16[b * 16 + i] = 0;
            for (int i = 0; i < QK / 32; i++) bs32[b * 8 + i] = 0;
            continue;
        }
        const float inv = 127.f / amax;
#if defined(KQ_AVX2)
        const __m256 iv = _mm256_set1_ps(inv);
        const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
        for (int c = 0; c < QK; c += 32) {
            __m256i q[4];
            for (int i = 0; i < 4; i++)
                q[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + c + 8 * i), iv)), lo), hi);
            const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(ab + c), _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            for (int h = 0; h < 2; h++) {
                const __m256i s8 = _mm256_add_epi32(q[2 * h], q[2 * h + 1]);
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
                bs16[b * 16 + c / 16 + h] = (int16_t)_mm_cvtsi128_si32(s4);
            }
        }
#else
        for (int i = 0; i < QK; i++) {
            long v = lrintf(xb[i] * inv); /* round half to even (the default rounding mode) */
            ab[i] = (int8_t)(v > 127 ? 127 : (v < -127 ? -127 : v));
        }
        for (int i = 0; i < QK / 16; i++) {
            int s = 0;
            for (int e = 0; e < 16; e++) s += ab[16 * i + e];
            bs16[b * 16 + i] = (int16_t)s;
        }
#endif
        for (int i = 0; i < QK / 32; i++) bs32[b * 8 + i] = (int16_t)(bs16[b * 16 + 2 * i] + bs16[b * 16 + 2 * i + 1]);
        dx[b] = amax / 127.f;
    }
}

void metrale_kq_quantize(const float *x, long M, long K, void *scratch) {
    const kq_rows r = kq_parts(scratch, M, K);
    for (long m = 0; m < M; m++)
        quantize_row_kq(x + m * K, K, r.a + m * K, r.dx + m * (K / QK), r.bs16 + m * (K / 16), r.bs32 + m * (K / 32));
}

/* q[j][k] (the unsigned code, before Q6_K's - 32) of channel j, weight k of one packed super-block. */
static inline int kq_code(int format, const uint8_t *p, int j, int k) {
    const int s = k >> 5, w = k & 31, g = w >> 3, i = w & 3, upper = (w >> 2) & 1;
    const uint8_t byte = p[256 * s + 64 * g + 4 * j + i];
    int q = upper ? byte >> 4 : byte & 0x0f;
    if (format == METRALE_W_Q5_K) {
        q |= ((p[2048 + 64 * s + 4 * j + i] >> (2 * g + upper)) & 1) << 4;
    } else if (format == METRALE_W_Q6_K) {
        const uint8_t h = p[2048 + 128 * s + 64 * (g >> 1) + 4 * j + i];
        q |= ((h >> (4 * (g & 1) + 2 * upper)) & 3) << 4;
    }
    return q;
}

/* The 256 weights of channel j of one packed super-block, exactly as gguf-py computes them. */
static void kq_dequant(int format, const uint8_t *p, int j, float *w) {
    const uint8_t *sc = p + code_bytes(format);
    const uint16_t *dh = (const uint16_t *)(sc + 256);
    const float d = half_to_float(dh[j]);
    if (format == METRALE_W_Q6_K) {
        for (int k = 0; k < QK; k++) {
            const int s = k >> 4;
            const float ds = d * (float)((const int8_t *)sc)[32 * (s >> 1) + 2 * j + (s & 1)];
            w[k] = ds * (float)(kq_code(format, p, j, k) - 32);
        }
        return;
    }
    const float dmin = half_to_float(dh[KT + j]);
    for (int k = 0; k < QK; k++) {
        const int s = k >> 5;
        const float ds = d * (float)sc[16 * s + j], dm = dmin * (float)sc[128 + 32 * (s >> 1) + 2 * j + (s & 1)];
        w[k] = ds * (float)kq_code(format, p, j, k) - dm;
    }
}

#if !defined(KQ_AVX2)
/* The portable path's integer sums of one super-block for `rows` rows: isum[r][j], msum[r][j]. */
static void kq_sums(int format, const uint8_t *p, const int8_t *a, long K, const int16_t *bs16, const int16_t *bs32,
                    long KS, int rows, int32_t *isum, int32_t *msum) {
    const uint8_t *sc = p + code_bytes(format);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < KT; j++) {
            const int8_t *ar = a + r * K;
            int32_t is = 0, ms = 0;
            if (format == METRALE_W_Q6_K) {
                for (int s = 0; s < 16; s++) {
                    int32_t dot = 0;
                    for (int e = 0; e < 16; e++) dot += kq_code(format, p, j, 16 * s + e) * ar[16 * s + e];
                    const int scv = ((const int8_t *)sc)[32 * (s >> 1) + 2 * j + (s & 1)];
                    is += scv * (dot - 32 * bs16[r * (KS * 16) + s]);
                }
            } else {
                for (int s = 0; s < 8; s++) {
                    int32_t dot = 0;
                    for (int e = 0; e < 32; e++) dot += kq_code(format, p, j, 32 * s + e) * ar[32 * s + e];
                    is += (int32_t)sc[16 * s + j] * dot;
                    ms += (int32_t)sc[128 + 32 * (s >> 1) + 2 * j + (s & 1)] * bs32[r * (KS * 8) + s];
                }
            }
            isum[r * KT + j] = is;
            msum[r * KT + j] = ms;
        }
}
#endif

#if defined(KQ_VNNI512)
static inline __m512i pair16(const int16_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* The super-blocks of one tile for R rows, the sums in registers: the same integers and float steps
 * per lane as kq_sums + the portable finish, so the same bits. */
static inline __attribute__((always_inline)) void kq_rows_vnni(int format, const uint8_t *p, long stride, long KS,
                                                                const int8_t *a, long K, const float *dx,
                                                                const int16_t *bs16, const int16_t *bs32, float *acc,
                                                                const int R) {
    const int two = R <= 4;
    const long cbytes = code_bytes(format);
    __m512 c[KBR];
    for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();
    for (long b = 0; b < KS; b++, p += stride) {
        for (long l = 0; l < stride; l += 64) _mm_prefetch((const char *)p + METRALE_PF_BYTES + l, _MM_HINT_T0);
        const uint8_t *sc = p + cbytes;
        const uint16_t *dh = (const uint16_t *)(sc + 256);
        const int8_t *ab = a + b * QK;
        __m512i is[KBR];
        for (int r = 0; r < R; r++) is[r] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {
            __m512i d0[KBR], d1[KBR];
            for (int r = 0; r < R; r++) d0[r] = d1[r] = _mm512_setzero_si512();
            __m512i hs = kq_high(format, p, s);
            for (int g = 0; g < 4; g++) {
                __m512i lo, hi;
                kq_group_codes(format, p, s, g, &hs, &lo, &hi);
                for (int r = 0; r < R; r++) {
                    int32_t p0, p1;
                    memcpy(&p0, ab + r * K + 32 * s + 8 * g, 4);
                    memcpy(&p1, ab + r * K + 32 * s + 8 * g + 4, 4);
                    if (format == METRALE_W_Q6_K) { /* groups 0, 1: the first sub-block of 16; 2, 3: the second */
                        if (g < 2) {
                            d0[r] = _mm512_dpbusd_epi32(d0[r], lo, _mm512_set1_epi32(p0));
                            d0[r] = _mm512_dpbusd_epi32(d0[r], hi, _mm512_set1_epi32(p1));
                        } else {
                            d1[r] = _mm512_dpbusd_epi32(d1[r], lo, _mm512_set1_epi32(p0));
                            d1[r] = _mm512_dpbusd_epi32(d1[r], hi, _mm512_set1_epi32(p1));
                        }
                    } else {
                        d0[r] = _mm512_dpbusd_epi32(d0[r], lo, _mm512_set1_epi32(p0));
                        if (two) d1[r] = _mm512_dpbusd_epi32(d1[r], hi, _mm512_set1_epi32(p1));
                        else d0[r] = _mm512_dpbusd_epi32(d0[r], hi, _mm512_set1_epi32(p1));
                    }
                }
            }
            if (format == METRALE_W_Q6_K) {
                const __m512i pr = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(sc + 32 * s)));
                const __m512i sa = _mm512_srai_epi32(_mm512_slli_epi32(pr, 16), 16), sb = _mm512_srai_epi32(pr, 16);
                for (int r = 0; r < R; r++) {
                    const __m512i corr = _mm512_madd_epi16(pr, pair16(bs16 + r * (KS * 16) + b * 16 + 2 * s));
                    is[r] = _mm512_add_epi32(is[r], _mm512_add_epi32(_mm512_mullo_epi32(d0[r], sa), _mm512_mullo_epi32(d1[r], sb)));
                    is[r] = _mm512_sub_epi32(is[r], _mm512_slli_epi32(corr, 5));
                }
            } else {
                const __m512i scv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * s)));
                for (int r = 0; r < R; r++) {
                    const __m512i dot = two ? _mm512_add_epi32(d0[r], d1[r]) : d0[r];
                    is[r] = _mm512_add_epi32(is[r], _mm512_mullo_epi32(dot, scv));
                }
            }
        }
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
        for (int r = 0; r < R; r++)
            c[r] = _mm512_add_ps(c[r], _mm512_mul_ps(_mm512_cvtepi32_ps(is[r]), _mm512_mul_ps(dv, _mm512_set1_ps(dx[r * KS + b]))));
        if (format != METRALE_W_Q6_K) {
            const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dh + KT)));
            __m512i mp[4];
            for (int q = 0; q < 4; q++) mp[q] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(sc + 128 + 32 * q)));
            for (int r = 0; r < R; r++) {
                const int16_t *bq = bs32 + r * (KS * 8) + b * 8;
                __m512i ms = _mm512_madd_epi16(mp[0], pair16(bq));
                for (int q = 1; q < 4; q++) ms = _mm512_add_epi32(ms, _mm512_madd_epi16(mp[q], pair16(bq + 2 * q)));
                c[r] = _mm512_sub_ps(c[r], _mm512_mul_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(mv, _mm512_set1_ps(dx[r * KS + b]))));
            }
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(acc + r * KT, c[r]);
}
#endif

#if defined(KQ_AVX2) && !defined(KQ_VNNI512)
static inline __m256i kq_bcast4(const int8_t *p) { return _mm256_castps_si256(_mm256_broadcast_ss((const float *)p)); }

static inline __m256i pair16_256(const int16_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

#define KBR2 2

/* kq_rows_vnni's sums for R <= 2 rows with vpmaddubsw (int16 pair sums: at most 2 * 63 * 127, and
 * at most two of them added before vpmaddwd takes them to int32 times the sub-block scale: exact). */
static inline __attribute__((always_inline)) void kq_rows_avx2(int format, const uint8_t *p, long stride, long KS,
                                                                const int8_t *a, long K, const float *dx,
                                                                const int16_t *bs16, const int16_t *bs32, float *acc,
                                                                const int R) {
    const long cbytes = code_bytes(format);
    __m256 c[KBR2][2];
    for (int r = 0; r < R; r++) c[r][0] = c[r][1] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10), bits45 = _mm256_set1_epi8(0x30);
    for (long b = 0; b < KS; b++, p += stride) {
        for (long l = 0; l < stride; l += 64) _mm_prefetch((const char *)p + METRALE_PF_BYTES + l, _MM_HINT_T0);
        const uint8_t *sc = p + cbytes;
        const uint16_t *dh = (const uint16_t *)(sc + 256);
        const int8_t *ab = a + b * QK;
        __m256i is[KBR2][2];
        for (int r = 0; r < R; r++) is[r][0] = is[r][1] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            const uint8_t *qs = p + 256 * s;
            for (int h = 0; h < 2; h++) {
                __m256i sdA, sdB, pr = _mm256_setzero_si256();
                if (format == METRALE_W_Q6_K) {
                    pr = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(sc + 32 * s + 16 * h)));
                    sdA = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(pr, 0xA0), 0xA0);
                    sdB = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(pr, 0xF5), 0xF5);
                } else {
                    const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * s + 8 * h)));
                    sdA = sdB = _mm256_or_si256(x, _mm256_slli_epi32(x, 16));
                }
                __m256i hs = _mm256_setzero_si256();
                if (format == METRALE_W_Q5_K) hs = _mm256_loadu_si256((const __m256i *)(p + 2048 + 64 * s + 32 * h));
                __m256i t16[KBR2];
                for (int r = 0; r < R; r++) t16[r] = _mm256_setzero_si256();
                for (int g = 0; g < 4; g++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * g + 32 * h));
                    __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                    if (format == METRALE_W_Q5_K) {
                        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hs, 4), bit4));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hs, 3), bit4));
                        hs = _mm256_srli_epi16(hs, 2);
                    } else if (format == METRALE_W_Q6_K) {
                        if (!(g & 1)) hs = _mm256_loadu_si256((const __m256i *)(p + 2048 + 128 * s + 64 * (g >> 1) + 32 * h));
                        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hs, 4), bits45));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hs, 2), bits45));
                        hs = _mm256_srli_epi16(hs, 4);
                    }
                    for (int r = 0; r < R; r++) {
                        const __m256i p0 = kq_bcast4(ab + r * K + 32 * s + 8 * g), p1 = kq_bcast4(ab + r * K + 32 * s + 8 * g + 4);
                        const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(lo, p0), _mm256_maddubs_epi16(hi, p1));
                        if (format == METRALE_W_Q6_K) {
                            is[r][h] = _mm256_add_epi32(is[r][h], _mm256_madd_epi16(t, g < 2 ? sdA : sdB));
                        } else if (g & 1) {
                            is[r][h] = _mm256_add_epi32(is[r][h], _mm256_madd_epi16(_mm256_add_epi16(t16[r], t), sdA));
                        } else {
                            t16[r] = t;
                        }
                    }
                }
                if (format == METRALE_W_Q6_K)
                    for (int r = 0; r < R; r++) {
                        const __m256i corr = _mm256_madd_epi16(pr, pair16_256(bs16 + r * (KS * 16) + b * 16 + 2 * s));
                        is[r][h] = _mm256_sub_epi32(is[r][h], _mm256_slli_epi32(corr, 5));
                    }
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dh + 8 * h)));
            for (int r = 0; r < R; r++)
                c[r][h] = _mm256_add_ps(c[r][h], _mm256_mul_ps(_mm256_cvtepi32_ps(is[r][h]),
                                                               _mm256_mul_ps(dv, _mm256_set1_ps(dx[r * KS + b]))));
            if (format != METRALE_W_Q6_K) {
                const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dh + KT + 8 * h)));
                for (int r = 0; r < R; r++) {
                    const int16_t *bq = bs32 + r * (KS * 8) + b * 8;
                    __m256i ms = _mm256_setzero_si256();
                    for (int q = 0; q < 4; q++)
                        ms = _mm256_add_epi32(ms, _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(sc + 128 + 32 * q + 16 * h))),
                                                                    pair16_256(bq + 2 * q)));
                    c[r][h] = _mm256_sub_ps(c[r][h], _mm256_mul_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(mv, _mm256_set1_ps(dx[r * KS + b]))));
                }
            }
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(acc + r * KT, c[r][0]);
        _mm256_storeu_ps(acc + r * KT + 8, c[r][1]);
    }
}
#endif

/* Output channels of tile t for rows [m0, m1): the fast path. */
static void kq_tile_fast(const metrale_weight *W, long t, long KS, const kq_rows *q, long m0, long m1, float *y,
                         long N, long ldy, int amx) {
    const long stride = metrale_kq_stride(W->format), K = KS * QK, n0 = t * KT;
    const uint8_t *p = (const uint8_t *)W->qs + t * KS * stride;
    const int nc = (int)(N - n0 < KT ? N - n0 : KT);
    if (amx) /* whole groups of 16 rows on the tile unit (amx_gemm.c: the same bits) */
        m0 += metrale_amx_kq_rows(W->format, p, stride, KS, q->a + m0 * K, K, q->dx + m0 * KS, q->bs32 + m0 * KS * 8,
                                  m1 - m0, y + m0 * ldy + n0, ldy, nc);
    for (long m = m0; m < m1; m += KBR) {
        const int rows = (int)(m1 - m < KBR ? m1 - m : KBR);
        float acc[KBR * KT] __attribute__((aligned(64)));
#if defined(KQ_VNNI512)
        const int8_t *ar = q->a + m * K;
        const float *dr = q->dx + m * KS;
        const int16_t *b16 = q->bs16 + m * KS * 16, *b32 = q->bs32 + m * KS * 8;
        switch (rows) {
#define ROWS(n) case n: kq_rows_vnni(W->format, p, stride, KS, ar, K, dr, b16, b32, acc, n); break;
            ROWS(8) ROWS(7) ROWS(6) ROWS(5) ROWS(4) ROWS(3) ROWS(2)
#undef ROWS
            default: kq_rows_vnni(W->format, p, stride, KS, ar, K, dr, b16, b32, acc, 1); break;
        }
#elif defined(KQ_AVX2)
        for (int r0 = 0; r0 < rows; r0 += KBR2) {
            const int n = rows - r0 < KBR2 ? rows - r0 : KBR2;
            const long mr = m + r0;
            const int8_t *ar = q->a + mr * K;
            const float *dr = q->dx + mr * KS;
            const int16_t *b16 = q->bs16 + mr * KS * 16, *b32 = q->bs32 + mr * KS * 8;
            if (n == 2) kq_rows_avx2(W->format, p, stride, KS, ar, K, dr, b16, b32, acc + r0 * KT, 2);
            else kq_rows_avx2(W->format, p, stride, KS, ar, K, dr, b16, b32, acc + r0 * KT, 1);
        }
#else
        int32_t isum[KBR * KT], msum[KBR * KT];
        memset(acc, 0, sizeof acc);
        for (long b = 0; b < KS; b++) {
            const uint8_t *pb = p + b * stride;
            const uint16_t *dh = (const uint16_t *)(pb + code_bytes(W->format) + 256);
            kq_sums(W->format, pb, q->a + m * K + b * QK, K, q->bs16 + m * KS * 16 + b * 16, q->bs32 + m * KS * 8 + b * 8,
                    KS, rows, isum, msum);
            for (int r = 0; r < rows; r++) {
                const float x = q->dx[(m + r) * KS + b];
                for (int j = 0; j < KT; j++) {
                    float v = acc[r * KT + j] + (float)isum[r * KT + j] * (half_to_float(dh[j]) * x);
                    if (W->format != METRALE_W_Q6_K) v = v - (float)msum[r * KT + j] * (half_to_float(dh[KT + j]) * x);
                    acc[r * KT + j] = v;
                }
            }
        }
#endif
        for (int r = 0; r < rows; r++) memcpy(y + (m + r) * ldy + n0, acc + r * KT, sizeof(float) * (size_t)nc);
    }
}

/* Output channels of tile t for rows [m0, m1): the reference path (float32 activations). */
static void kq_tile_exact(const metrale_weight *W, long t, long KS, const float *x, long m0, long m1, float *y, long N,
                          long ldy) {
    const long stride = metrale_kq_stride(W->format), K = KS * QK, n0 = t * KT;
    const uint8_t *p = (const uint8_t *)W->qs + t * KS * stride;
    const int nc = (int)(N - n0 < KT ? N - n0 : KT);
    float *w = malloc(sizeof(float) * QK * KT);
    if (!w) {
        for (long m = m0; m < m1; m++)
            for (int j = 0; j < nc; j++) y[m * ldy + n0 + j] = NAN;
        return;
    }
    for (long m = m0; m < m1; m += KBR) {
        const int rows = (int)(m1 - m < KBR ? m1 - m : KBR);
        float acc[KBR * KT];
        memset(acc, 0, sizeof acc);
        for (long b = 0; b < KS; b++) {
            float col[QK];
            for (int j = 0; j < KT; j++) {
                kq_dequant(W->format, p + b * stride, j, col);
                for (int k = 0; k < QK; k++) w[k * KT + j] = col[k];
            }
            for (int r = 0; r < rows; r++) {
                const float *xr = x + (m + r) * K + b * QK;
                float *c = acc + r * KT;
                for (int k = 0; k < QK; k++) {
                    const float xv = xr[k];
#pragma GCC ivdep
                    for (int j = 0; j < KT; j++) c[j] = c[j] + w[k * KT + j] * xv;
                }
            }
        }
        for (int r = 0; r < rows; r++) memcpy(y + (m + r) * ldy + n0, acc + r * KT, sizeof(float) * (size_t)nc);
    }
    free(w);
}

void metrale_kq_tile(const metrale_weight *W, long t, const float *x, void *scratch, long M, long K, long m0, long m1,
                     float *y, long n, long ldy, int amx) {
    const kq_rows q = kq_parts(scratch, M, K);
    if (W->exact) kq_tile_exact(W, t, K / QK, x, m0, m1, y, n, ldy);
    else kq_tile_fast(W, t, K / QK, &q, m0, m1, y, n, ldy, amx);
}

void metrale_kq_quantize_team(const float *x, long M, long K, void *scratch) {
    const kq_rows r = kq_parts(scratch, M, K);
#pragma omp for schedule(guided)
    for (long m = 0; m < M; m++)
        quantize_row_kq(x + m * K, K, r.a + m * K, r.dx + m * (K / QK), r.bs16 + m * (K / 16), r.bs32 + m * (K / 32));
}

void metrale_kq_rows(const metrale_weight *W, long K, const int64_t *ids, long n, float *out) {
    const long KS = K / QK, stride = metrale_kq_stride(W->format);
    for (long r = 0; r < n; r++) {
        const long row = ids[r], t = row / KT;
        for (long b = 0; b < KS; b++)
            kq_dequant(W->format, (const uint8_t *)W->qs + (t * KS + b) * stride, (int)(row % KT), out + r * K + b * QK);
    }
}
