/* The block formats' and K-quants' integer sums on Intel AMX (the tile matrix unit of Xeons from
 * Sapphire Rapids on), for groups of 16 activation rows: block_gemm.c's tile_fast and kquant_gemm.c's
 * kq_tile_fast hand every whole group of 16 rows here where the CPU and the kernel allow AMX, and
 * the rows left over to their vector paths.
 *
 * The integers are the vector paths' integers, exactly: TDPBSSD / TDPBSUD sum the products of int8
 * activations and the weights' codes in int32 (no rounding, no saturation: at most 32 * 127 * 127 a
 * block of 32, and the K-quants' sub-block sums then multiplied by their scales as kquant_gemm.c
 * does), one 16 x 16 tile of sums per block (or sub-block) of K. The float steps that follow are the
 * vector paths' operations per output channel in the same order, so every row's output is bitwise
 * what block_gemm.c / kquant_gemm.c give it on any other path, and still independent of the other
 * rows.
 *
 * What the unit does: each 16 x 16 tile of sums costs one TDP instruction (16 rows x 16 channels x
 * 32 products) instead of 8 x 16 VPDPBUSD; what is left is turning each block's sums into floats
 * (16 rows of 16 lanes: convert, two multiplies, an add), which the AVX-512 ports do while the tile
 * unit computes the next block (two accumulator tiles in turn).
 *
 * Tile layout (one configuration for every kernel here, loaded by metrale_amx_begin per thread and
 * call; metrale_amx_begin_bf16 loads encoder.c's, every tile 16 rows of 64 bytes): 0 and 4 the
 * activations of a block of 32 (16 rows x 32 bytes), 1 and 5 the weights of a
 * block of 32 (8 rows of 4 k x 16 channels: block_gemm.c's Q8 packing is exactly this layout, the
 * Q4 / Q5 and K-quant codes are unpacked into it), 2 and 3 the int32 sums (16 x 16).
 *
 * Linux hands a process the tile registers only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM);
 * metrale_amx_ready asks once and answers 0 where the kernel or the CPU says no (or METRALE_AMX=0),
 * and the callers then keep their vector paths.
 */
#define _GNU_SOURCE /* syscall */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "codes512.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_PATHS 1
#endif

#ifdef AMX_PATHS
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

int metrale_amx_ready(void) {
    static int state = -1; /* -1 not asked yet, 0 refused, 1 granted (the permission is the process's) */
    if (state < 0) {
        const char *off = getenv("METRALE_AMX"); /* "0": keep the vector paths (comparisons, a suspect unit) */
        const int granted = !(off && strcmp(off, "0") == 0) &&
                            syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
        __atomic_store_n(&state, granted, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&state, __ATOMIC_ACQUIRE);
}

void metrale_amx_begin(void) {
    static const tile_config cfg = {
        .palette_id = 1,
        .colsb = {32, 64, 64, 64, 32, 64},
        .rows = {16, 8, 16, 16, 16, 8},
    };
    _tile_loadconfig(&cfg);
}

void metrale_amx_begin_bf16(void) {
    static const tile_config cfg = {
        .palette_id = 1,
        .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
        .rows = {16, 16, 16, 16, 16, 16, 16, 16},
    };
    _tile_loadconfig(&cfg);
}

void metrale_amx_end(void) { _tile_release(); }

/* A thread's buffer of unpacked weight codes (grown as needed, kept for the thread's life: the
 * team's threads live as long as the process). */
static uint8_t *unpack_buffer(long bytes) {
    static __thread uint8_t *buf;
    static __thread long cap;
    if (bytes > cap) {
        free(buf);
        buf = aligned_alloc(64, (size_t)((bytes + 63) & ~63L));
        cap = buf ? bytes : 0;
    }
    return buf;
}

/* The next tile's packed bytes, fetched into L2 a few lines at a time while this tile computes (the
 * threads take runs of consecutive tiles, which lie one after another): the tile unit's loads do not
 * train the hardware prefetchers, and without this a step streaming its weights from memory waits
 * for them block by block instead of computing meanwhile. */
typedef struct {
    const char *p;
    long left;
    long per_step;
} ahead;

static inline ahead ahead_of(const void *p, long bytes, long steps) {
    const long lines = (bytes + 63) / 64;
    ahead a = {(const char *)p, lines, (lines + steps - 1) / steps};
    return a;
}

static inline void ahead_step(ahead *a) {
    for (long i = 0; i < a->per_step && a->left > 0; i++, a->left--, a->p += 64) _mm_prefetch(a->p, _MM_HINT_T1);
}

/* The output lines of the next tile (the next 16 channels) of 16 rows, y's row stride ldy apart, fetched
 * for writing while this tile computes: the threads take runs of consecutive tiles, and a row's
 * line written cold (an RFO from the next cache level) stalls the stores, often: the rows of a wide
 * output lie 4 KiB-multiples apart, all in one L1 set. (A prefetch past the array's end never faults.) */
static inline void prefetch_next_tile(const float *y, long ldy) {
    for (int r = 0; r < 16; r++) _mm_prefetch((const char *)(y + r * ldy + 16), _MM_HINT_ET0);
}

/* One block (Q4 layout, block_gemm.c; Q5: its fifth bits at qs + 256) as a weight tile: 8 rows of 64
 * bytes, row 2g the low nibbles of group g (k = 8g .. 8g + 3), row 2g + 1 the high ones (8g + 4 ..
 * 8g + 7); the fifth bits as block_gemm.c's tile_rows_vnni adds them; off (Q4_0's 8, Q5_0's 16)
 * subtracted, so that the codes are the block's signed integers and the sums need no correction
 * (sum (q - off) a = sum q a - off * asum, the vector paths' integer). */
static inline __attribute__((always_inline)) void unpack_q4_block(const uint8_t *qs, int q5, int off, uint8_t *out) {
    const __m512i offv = _mm512_set1_epi8((char)off);
    __m512i hs = q5 ? _mm512_loadu_si512((const void *)(qs + 256)) : _mm512_setzero_si512();
    for (int g = 0; g < 4; g++) {
        __m512i lo, hi;
        q4_group_codes(qs, g, q5, &hs, &lo, &hi);
        if (off) {
            lo = _mm512_sub_epi8(lo, offv);
            hi = _mm512_sub_epi8(hi, offv);
        }
        _mm512_store_si512((void *)(out + 128 * g), lo);
        _mm512_store_si512((void *)(out + 128 * g + 64), hi);
    }
}

/* The sums of one block into accumulator tile C from activation tile A and weight tile B (A: 16 rows
 * of 32 bytes at a, K apart; B: 8 rows of 64 bytes at w). Q8_0 codes are signed, the others unsigned. */
#define BLOCK_DP(signed_codes, C, A, B, a, K, w)      \
    do {                                              \
        _tile_loadd(A, (a), (K));                     \
        _tile_loadd(B, (w), 64);                      \
        _tile_zero(C);                                \
        if (signed_codes) _tile_dpbssd(C, A, B);      \
        else _tile_dpbsud(C, A, B);                   \
    } while (0)

/* c[r] += float(isum[r]) * (d * dx[r]) (+ m * sa[r]): block_gemm.c tile_rows_vnni's steps. */
static inline __attribute__((always_inline)) void block_finish16(const int32_t *isum, const uint16_t *dh,
                                                                 const uint16_t *mh, const float *dx, const float *sa,
                                                                 long KB, __m512 *c) {
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
    for (int r = 0; r < 16; r++) {
        const __m512i s = _mm512_load_si512((const void *)(isum + 16 * r));
        c[r] = _mm512_add_ps(c[r], _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dv, _mm512_set1_ps(dx[r * KB]))));
    }
    if (mh) {
        const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)mh));
        for (int r = 0; r < 16; r++) c[r] = _mm512_add_ps(c[r], _mm512_mul_ps(mv, _mm512_set1_ps(sa[r * KB])));
    }
}

/* 16 rows of one tile: every block's sums on the tile unit. Two accumulator tiles take the blocks in
 * turn, and a block's sums are stored one block before its floats are finished: the tile unit
 * computes block j + 1 while block j's sums reach memory and block j - 1's floats are finished (a
 * vector load waits for a tile store to complete; it is not forwarded). w: the weight tiles, 512
 * bytes a block. */
static inline __attribute__((always_inline)) void block_rows16(int signed_codes, const uint8_t *w,
                                                               const uint16_t *dh, const uint16_t *mh, long KB,
                                                               const int8_t *a, long K, const float *dx,
                                                               const float *sa, ahead *codes, ahead *scales,
                                                               float *acc) {
    int32_t buf0[256] __attribute__((aligned(64))), buf1[256] __attribute__((aligned(64)));
    __m512 c[16];
    for (int r = 0; r < 16; r++) c[r] = _mm512_setzero_ps();
#define DP(C, A, B, j) BLOCK_DP(signed_codes, C, A, B, a + 32 * (j), K, w + 512 * (j))
#define FIN(j, buf) block_finish16(buf, dh + 16 * (j), mh ? mh + 16 * (j) : NULL, dx + (j), sa + (j), KB, c)
    DP(2, 0, 1, 0);
    if (KB > 1) DP(3, 4, 5, 1);
    _tile_stored(2, buf0, 64);
    for (long j = 1; j < KB; j++) {
        ahead_step(codes);
        ahead_step(scales);
        if (j & 1) {
            if (j + 1 < KB) DP(2, 0, 1, j + 1);
            _tile_stored(3, buf1, 64);
            FIN(j - 1, buf0);
        } else {
            if (j + 1 < KB) DP(3, 4, 5, j + 1);
            _tile_stored(2, buf0, 64);
            FIN(j - 1, buf1);
        }
    }
    FIN(KB - 1, ((KB - 1) & 1) ? buf1 : buf0);
#undef DP
#undef FIN
    for (int r = 0; r < 16; r++) _mm512_store_ps(acc + 16 * r, c[r]);
}

long metrale_amx_block_rows(int format, const uint8_t *qs, long cb, const uint16_t *dh, const uint16_t *mh, long KB,
                            const int8_t *a, long K, const float *dx, const float *sa, long rows,
                            float *y, long ldy, int nc) {
    const long groups = rows / 16;
    if (!groups) return 0;
    const uint8_t *w = qs;
    if (format != METRALE_W_Q8_0) { /* the codes as weight tiles, once for every group of rows */
        uint8_t *u = unpack_buffer(512 * KB);
        if (!u) return 0;
        const int q5 = format == METRALE_W_Q5_0 || format == METRALE_W_Q5_1;
        const int off = format == METRALE_W_Q4_0 ? 8 : format == METRALE_W_Q5_0 ? 16 : 0;
        for (long b = 0; b < KB; b++) {
            for (long l = 0; l < cb; l += 64) _mm_prefetch((const char *)qs + b * cb + METRALE_PF_BYTES + l, _MM_HINT_T0);
            _mm_prefetch((const char *)(dh + 16 * b) + METRALE_PF_BYTES / 8, _MM_HINT_T0);
            unpack_q4_block(qs + b * cb, q5, off, u + 512 * b);
        }
        w = u;
    }
    float acc[256] __attribute__((aligned(64)));
    ahead codes = ahead_of(qs + KB * cb, KB * cb, groups * KB), scales = ahead_of(dh + 16 * KB, 32 * KB, groups * KB);
    for (long g = 0; g < groups; g++) {
        const long m = 16 * g;
        prefetch_next_tile(y + m * ldy, ldy);
        const int8_t *ar = a + m * K;
        const float *dr = dx + m * KB, *sr = sa + m * KB;
        switch (format) { /* signed codes: Q8_0's, and Q4_0's and Q5_0's as unpacked */
            case METRALE_W_Q8_0: case METRALE_W_Q4_0: case METRALE_W_Q5_0:
                block_rows16(1, w, dh, NULL, KB, ar, K, dr, sr, &codes, &scales, acc);
                break;
            default: block_rows16(0, w, dh, mh, KB, ar, K, dr, sr, &codes, &scales, acc); break; /* Q4_1, Q5_1 */
        }
        for (int r = 0; r < 16; r++) memcpy(y + (m + r) * ldy, acc + 16 * r, sizeof(float) * (size_t)nc);
    }
    return 16 * groups;
}

/* One K-quant super-block's codes (kquant_gemm.c's layout at p) as weight tiles of 8 rows of 64 bytes,
 * with Q5_K's fifth and Q6_K's fifth and sixth bits as kq_rows_vnni adds them. Q4_K / Q5_K: tile s
 * (sub-block s of 32), row 2g the low nibbles of group g, row 2g + 1 the high ones (4096 bytes).
 * Q6_K: two tiles per 32 k (8192 bytes): the first with groups 0 and 1 (the sub-block of 16 at 32 s)
 * in rows 0..3 and zeros in rows 4..7, the second the other way round (groups 2 and 3), the codes
 * less 32 (signed: sum (q - 32) a = dot - 32 * bs16, kq_rows_vnni's integer). */
static inline __attribute__((always_inline)) void unpack_kq_block(int format, const uint8_t *p, uint8_t *out) {
    const __m512i zero = _mm512_setzero_si512();
    for (int s = 0; s < 8; s++) {
        __m512i hs = kq_high(format, p, s);
        for (int g = 0; g < 4; g++) {
            __m512i lo, hi;
            kq_group_codes(format, p, s, g, &hs, &lo, &hi);
            if (format == METRALE_W_Q6_K) { /* q - 32: the signed integers, no correction after the sums */
                lo = _mm512_sub_epi8(lo, _mm512_set1_epi8(32));
                hi = _mm512_sub_epi8(hi, _mm512_set1_epi8(32));
                uint8_t *t = out + 1024 * s, *other = t + (g < 2 ? 512 : 0);
                t += g < 2 ? 0 : 512;
                _mm512_store_si512((void *)(t + 128 * g), lo);
                _mm512_store_si512((void *)(t + 128 * g + 64), hi);
                _mm512_store_si512((void *)(other + 128 * g), zero);
                _mm512_store_si512((void *)(other + 128 * g + 64), zero);
            } else {
                _mm512_store_si512((void *)(out + 512 * s + 128 * g), lo);
                _mm512_store_si512((void *)(out + 512 * s + 128 * g + 64), hi);
            }
        }
    }
}

/* Bytes of one super-block's unpacked codes (unpack_kq_block). */
static long kq_unpacked_bytes(int format) { return format == METRALE_W_Q6_K ? 8192 : 4096; }

static inline __m512i pair16(const int16_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* is[r] += sums[r] * scale (the sub-block's int32 sums times its per-channel scales: exact). */
static inline __attribute__((always_inline)) void scale_add16(const int32_t *sums, __m512i scale, __m512i *is) {
    for (int r = 0; r < 16; r++)
        is[r] = _mm512_add_epi32(is[r], _mm512_mullo_epi32(_mm512_load_si512((const void *)(sums + 16 * r)), scale));
}

/* The sums of a sub-block of 32 (tiles C, A, B as BLOCK_DP; unsigned codes). */
#define SUB32_DP(C, A, B, a, K, w) BLOCK_DP(0, C, A, B, a, K, w)

/* 16 rows of one K-quant tile: kq_rows_vnni's integers and float steps, the sub-blocks' dot products
 * on the tile unit. u: the tile's unpacked codes (unpack_kq_block). */
static inline __attribute__((always_inline)) void kq_rows16(int format, const uint8_t *p, long stride,
                                                            const uint8_t *u, long KS, const int8_t *a, long K,
                                                            const float *dx, const int16_t *bs32, ahead *next,
                                                            float *acc) {
    const long cbytes = format == METRALE_W_Q4_K ? 2048 : format == METRALE_W_Q5_K ? 2560 : 3072;
    int32_t sums[256] __attribute__((aligned(64)));
    for (int i = 0; i < 256; i++) acc[i] = 0.f;
    for (long b = 0; b < KS; b++, p += stride, u += kq_unpacked_bytes(format)) {
        const uint8_t *sc = p + cbytes;
        const uint16_t *dh = (const uint16_t *)(sc + 256);
        const int8_t *ab = a + b * 256;
        ahead_step(next);
        __m512i is[16];
        for (int r = 0; r < 16; r++) is[r] = _mm512_setzero_si512();
        if (format == METRALE_W_Q6_K) {
            /* 16 sub-blocks of 16, taken as 8 pairs: pair q's activations (32 bytes a row) against two
             * weight tiles, each holding one sub-block's codes and zeros in the other's rows, so one
             * accumulator tile per sub-block. Sub-block 2q + e's scale of channel j is sc[32 q + 2 j + e].
             * Each pair's sums are stored before the next pair's TDPs are issued, whose work then
             * overlaps this pair's vector steps. */
            BLOCK_DP(1, 2, 0, 1, ab, K, u);
            _tile_loadd(5, u + 512, 64);
            _tile_zero(3);
            _tile_dpbssd(3, 0, 5);
            for (int q = 0; q < 8; q++) {
                int32_t sums2[256] __attribute__((aligned(64)));
                _tile_stored(2, sums, 64);
                _tile_stored(3, sums2, 64);
                if (q + 1 < 8) {
                    BLOCK_DP(1, 2, 0, 1, ab + 32 * (q + 1), K, u + 1024 * (q + 1));
                    _tile_loadd(5, u + 1024 * (q + 1) + 512, 64);
                    _tile_zero(3);
                    _tile_dpbssd(3, 0, 5);
                }
                const __m512i pr = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(sc + 32 * q)));
                scale_add16(sums, _mm512_srai_epi32(_mm512_slli_epi32(pr, 16), 16), is);
                scale_add16(sums2, _mm512_srai_epi32(pr, 16), is);
            }
        } else {
            SUB32_DP(2, 0, 1, ab, K, u);
            for (int s = 0; s < 8; s += 2) {
                SUB32_DP(3, 4, 5, ab + 32 * (s + 1), K, u + 512 * (s + 1));
                _tile_stored(2, sums, 64);
                scale_add16(sums, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * s))), is);
                if (s + 2 < 8) SUB32_DP(2, 0, 1, ab + 32 * (s + 2), K, u + 512 * (s + 2));
                _tile_stored(3, sums, 64);
                scale_add16(sums, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * (s + 1)))), is);
            }
        }
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
        for (int r = 0; r < 16; r++) {
            const __m512 c = _mm512_load_ps(acc + 16 * r);
            _mm512_store_ps(acc + 16 * r, _mm512_add_ps(c, _mm512_mul_ps(_mm512_cvtepi32_ps(is[r]),
                                                                         _mm512_mul_ps(dv, _mm512_set1_ps(dx[r * KS + b])))));
        }
        if (format != METRALE_W_Q6_K) {
            const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dh + 16)));
            __m512i mp[4];
            for (int q = 0; q < 4; q++) mp[q] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(sc + 128 + 32 * q)));
            for (int r = 0; r < 16; r++) {
                const int16_t *bq = bs32 + r * (KS * 8) + b * 8;
                __m512i ms = _mm512_madd_epi16(mp[0], pair16(bq));
                for (int q = 1; q < 4; q++) ms = _mm512_add_epi32(ms, _mm512_madd_epi16(mp[q], pair16(bq + 2 * q)));
                const __m512 c = _mm512_load_ps(acc + 16 * r);
                _mm512_store_ps(acc + 16 * r, _mm512_sub_ps(c, _mm512_mul_ps(_mm512_cvtepi32_ps(ms),
                                                                             _mm512_mul_ps(mv, _mm512_set1_ps(dx[r * KS + b])))));
            }
        }
    }
}

long metrale_amx_kq_rows(int format, const uint8_t *p, long stride, long KS, const int8_t *a, long K, const float *dx,
                         const int16_t *bs32, long rows, float *y, long ldy, int nc) {
    const long groups = rows / 16;
    if (!groups) return 0;
    const long ub = kq_unpacked_bytes(format);
    uint8_t *u = unpack_buffer(ub * KS);
    if (!u) return 0;
    for (long b = 0; b < KS; b++) {
        for (long l = 0; l < stride; l += 64) _mm_prefetch((const char *)p + b * stride + METRALE_PF_BYTES + l, _MM_HINT_T0);
        unpack_kq_block(format, p + b * stride, u + ub * b);
    }
    float acc[256] __attribute__((aligned(64)));
    ahead next = ahead_of(p + KS * stride, KS * stride, groups * KS);
    for (long g = 0; g < groups; g++) {
        const long m = 16 * g;
        prefetch_next_tile(y + m * ldy, ldy);
        const int8_t *ar = a + m * K;
        const float *dr = dx + m * KS;
        const int16_t *b32 = bs32 + m * KS * 8;
        switch (format) {
            case METRALE_W_Q4_K: kq_rows16(METRALE_W_Q4_K, p, stride, u, KS, ar, K, dr, b32, &next, acc); break;
            case METRALE_W_Q5_K: kq_rows16(METRALE_W_Q5_K, p, stride, u, KS, ar, K, dr, b32, &next, acc); break;
            default: kq_rows16(METRALE_W_Q6_K, p, stride, u, KS, ar, K, dr, b32, &next, acc); break;
        }
        for (int r = 0; r < 16; r++) memcpy(y + (m + r) * ldy, acc + 16 * r, sizeof(float) * (size_t)nc);
    }
    return 16 * groups;
}

#else /* no AMX in this build: the callers keep their vector paths */
int metrale_amx_ready(void) { return 0; }
void metrale_amx_begin(void) {}
void metrale_amx_begin_bf16(void) {}
void metrale_amx_end(void) {}
long metrale_amx_block_rows(int format, const uint8_t *qs, long cb, const uint16_t *dh, const uint16_t *mh, long KB,
                            const int8_t *a, long K, const float *dx, const float *sa, long rows,
                            float *y, long ldy, int nc) {
    (void)format, (void)qs, (void)cb, (void)dh, (void)mh, (void)KB, (void)a, (void)K, (void)dx, (void)sa;
    (void)rows, (void)y, (void)ldy, (void)nc;
    return 0;
}
long metrale_amx_kq_rows(int format, const uint8_t *p, long stride, long KS, const int8_t *a, long K, const float *dx,
                         const int16_t *bs32, long rows, float *y, long ldy, int nc) {
    (void)format, (void)p, (void)stride, (void)KS, (void)a, (void)K, (void)dx, (void)bs32, (void)rows;
    (void)y, (void)ldy, (void)nc;
    return 0;
}
#endif
