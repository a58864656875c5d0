/* One group of a packed weight block's codes as bytes, on AVX-512 (shared by block_gemm.c's and
 * kquant_gemm.c's VNNI micro-kernels and amx_gemm.c's unpacking, so the layouts' rules live once).
 *
 * A group is 64 bytes: byte 4 j + i holds two 4-bit codes of channel j (low nibble: k = 8g + i, high
 * nibble: k = 8g + 4 + i). `lo` and `hi` get them as bytes 0..15 (plus their high bits: Q5_0 / Q5_1 /
 * Q5_K's fifth bit, Q6_K's fifth and sixth), unsigned. `hs` carries the high bits from group to group:
 * load it before group 0 (qs + 256 for Q5_0 / Q5_1; kq_high for the K-quants) and pass it to each
 * group in order. */
#ifndef METRALE_CODES512_H
#define METRALE_CODES512_H
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#include <stdint.h>
#include "kernels.h"

/* Group g's codes of block_gemm.c's Q4 layout, with the fifth bits of Q5_0 / Q5_1 (q5) from hs. */
static inline __attribute__((always_inline)) void q4_group_codes(const uint8_t *qs, int g, int q5, __m512i *hs,
                                                                 __m512i *lo, __m512i *hi) {
    const __m512i low = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
    const __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * g));
    *lo = _mm512_and_si512(v, low);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    if (q5) { /* the fifth bits: 2g and 2g + 1 of the high-bit byte */
        *lo = _mm512_or_si512(*lo, _mm512_and_si512(_mm512_slli_epi16(*hs, 4), bit4));
        *hi = _mm512_or_si512(*hi, _mm512_and_si512(_mm512_slli_epi16(*hs, 3), bit4));
        *hs = _mm512_srli_epi16(*hs, 2);
    }
}

/* Before sub-block s of a packed K-quant super-block at p (kquant_gemm.c's layout): Q5_K's fifth bits
 * of the sub-block (Q6_K loads its own in kq_group_codes; Q4_K has none). */
static inline __m512i kq_high(int format, const uint8_t *p, int s) {
    return format == METRALE_W_Q5_K ? _mm512_loadu_si512((const void *)(p + 2048 + 64 * s)) : _mm512_setzero_si512();
}

/* Group g of sub-block s of a packed K-quant super-block at p: Q4_K / Q5_K codes 0..31, Q6_K 0..63
 * (before its - 32). */
static inline __attribute__((always_inline)) void kq_group_codes(int format, const uint8_t *p, int s, int g,
                                                                 __m512i *hs, __m512i *lo, __m512i *hi) {
    if (format != METRALE_W_Q6_K) {
        q4_group_codes(p + 256 * s, g, format == METRALE_W_Q5_K, hs, lo, hi);
        return;
    }
    const __m512i low = _mm512_set1_epi8(0x0f), bits45 = _mm512_set1_epi8(0x30);
    const __m512i v = _mm512_loadu_si512((const void *)(p + 256 * s + 64 * g));
    if (!(g & 1)) *hs = _mm512_loadu_si512((const void *)(p + 2048 + 128 * s + 64 * (g >> 1)));
    *lo = _mm512_or_si512(_mm512_and_si512(v, low), _mm512_and_si512(_mm512_slli_epi16(*hs, 4), bits45));
    *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), _mm512_and_si512(_mm512_slli_epi16(*hs, 2), bits45));
    *hs = _mm512_srli_epi16(*hs, 4);
}
#endif
#endif
