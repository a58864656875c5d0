/* Declarations shared by the kernel sources (cpu_kernels.c, int8_gemm.c, block_gemm.c, kquant_gemm.c, amx_gemm.c,
 * decode_layer.c, encoder.c). */
#ifndef METRALE_KERNELS_H
#define METRALE_KERNELS_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* bfloat16 bits -> float32 (exact), and float32 -> bfloat16 rounded to nearest even (torch's rule; a NaN
 * stays a NaN, subnormals are kept): the KV cache's and the encoder's conversions. */
static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = ((uint32_t)h) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN stays NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);                                           /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

/* float16 bits -> float32 (exact; subnormals, inf and NaN included): the GGUF blocks' scales (block_gemm.c,
 * kquant_gemm.c). */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            uint32_t m = man;
            do { e++; m <<= 1; } while (!(m & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Bytes ahead of the weights in use that the GEMM micro-kernels prefetch (one page: the hardware
 * prefetchers stop at page boundaries, and a step streams the weights from the last-level cache or
 * memory). */
#define METRALE_PF_BYTES 4096

/* exp(x) for one float by the steps exp8 and exp16 take per lane (fmaf where they fuse), so the
 * same value as theirs: a scalar tail or a portable build agrees with the vector paths. */
static inline float exp1(float x) {
    x = fminf(x, 88.3762626647949f);
    x = fmaxf(x, -87.0f);
    float fx = floorf(fmaf(x, 1.44269504088896341f, 0.5f));
    x = fmaf(-fx, 0.693359375f, x);
    x = fmaf(-fx, -2.12194440e-4f, x);
    const float z = x * x;
    float y = 1.9875691500E-4f;
    y = fmaf(y, x, 1.3981999507E-3f);
    y = fmaf(y, x, 8.3334519073E-3f);
    y = fmaf(y, x, 4.1665795894E-2f);
    y = fmaf(y, x, 1.6666665459E-1f);
    y = fmaf(y, x, 5.0000001201E-1f);
    y = fmaf(y, z, x + 1.f);
    const int32_t bits = ((int32_t)fx + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define METRALE_AVX2 1

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
#if defined(__AVX512F__)
#define METRALE_AVX512 1

/* exp8's steps on 16 lanes (the same operations per lane, so the same values). */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
    fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    const __m512 z = _mm512_mul_ps(x, x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, z, _mm512_add_ps(x, _mm512_set1_ps(1.f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
#endif
#endif

void metrale_paged_decode_attention_strided(const float *q, long q_stride, const void *k_cache, const void *v_cache,
                                            const int64_t *block_tables, const int64_t *seq_lens,
                                            const int64_t *seq_starts, float *out, long D, int n_heads, int n_kv,
                                            int head_dim, int block_size, long width, float scale, int kv_dtype,
                                            int nthreads);
void metrale_int8_linear(const float *x, const int8_t *packed, const float *scale, float *y, long M, long N, long K,
                         int nthreads);

/* Weight formats of metrale_weight (block_gemm.c): per-channel int8 (int8_gemm.c), GGUF blocks. */
#define METRALE_W_INT8 0
#define METRALE_W_Q4_0 1
#define METRALE_W_Q4_1 2
#define METRALE_W_Q8_0 3
#define METRALE_W_Q4_K 4
#define METRALE_W_Q5_K 5
#define METRALE_W_Q6_K 6
#define METRALE_W_Q5_0 7
#define METRALE_W_Q5_1 8

/* One linear's weight as the kernels read it. INT8: qs = metrale_int8_pack output, d = float32
 * scales [N]. Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0: qs = packed codes, d (and m, Q4_1 / Q5_1) = float16 bits
 * [tiles, K / 32, 16] (block_gemm.c). Q4_K / Q5_K / Q6_K: qs = the packed super-blocks, d and m
 * unused (kquant_gemm.c). exact: 1 = float32 activations against the dequantised
 * blocks (the reference path), 0 = int8 activation blocks and exact integer sums. */
typedef struct metrale_weight {
    int format, exact;
    const void *qs, *d, *m;
    /* A stack of parts along the output channels (a fused q/k/v whose parts ship in different
     * formats): `next` the following part (NULL: this is the last, holding the channels left), `rows`
     * this part's channels where there is a next. The parts read the same quantised rows: all
     * K-quants, or all of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0. */
    long rows;
    const struct metrale_weight *next;
} metrale_weight;

void metrale_weight_linear(const metrale_weight *W, const float *x, float *y, long M, long N, long K, int nthreads);

/* The team forms of the linears and the decode attention: every thread of the enclosing OpenMP
 * team calls one (outside a parallel region, one thread does all its work); the work is shared
 * by orphaned worksharing loops, so a caller runs many of them in one parallel region (a
 * decode step) instead of opening one each. scratch: metrale_weight_scratch_bytes(M, K) bytes
 * shared by the team (the activations' quantised rows). */
long metrale_int8_scratch_bytes(long M, long K);
void metrale_int8_linear_team(const float *x, const int8_t *packed, const float *scale, float *y, long M, long N,
                              long K, void *scratch);
long metrale_weight_scratch_bytes(long M, long K);
void metrale_weight_linear_team(const metrale_weight *W, const float *x, float *y, long M, long N, long K,
                                void *scratch);
/* The two halves of metrale_weight_linear_team, for a team whose every thread holds the input rows
 * itself: metrale_weight_quantize by one thread into its own scratch (nothing on the reference
 * path), then metrale_weight_tiles_team shares the tiles, each thread reading its own copy (the
 * copies equal, so the tiles are the same whichever thread computes them). */
void metrale_int8_quantize(const float *x, long M, long K, void *scratch);
void metrale_int8_tiles_team(const int8_t *packed, const float *scale, float *y, long M, long N, long K,
                             const void *scratch);
void metrale_weight_quantize(const metrale_weight *W, const float *x, long M, long K, void *scratch);
void metrale_weight_tiles_team(const metrale_weight *W, const float *x, float *y, long M, long N, long K,
                               void *scratch);
/* The K-quant formats' halves (kquant_gemm.c), called through the metrale_weight entry points. */
int metrale_is_kquant(int format);
long metrale_kq_scratch_bytes(long M, long K);
void metrale_kq_quantize(const float *x, long M, long K, void *scratch);
void metrale_kq_quantize_team(const float *x, long M, long K, void *scratch);
/* Tile t of W's n output channels for rows [m0, m1) into y (ldy floats a row); amx: whole groups of 16
 * rows on the tile unit (the thread has called metrale_amx_begin). */
void metrale_kq_tile(const metrale_weight *W, long t, const float *x, void *scratch, long M, long K, long m0, long m1,
                     float *y, long n, long ldy, int amx);
/* Intel AMX (amx_gemm.c). metrale_amx_ready: 1 where this build has the AMX paths and Linux granted the
 * process the tile registers (asked once), else 0. metrale_amx_begin / _end: a thread's tile
 * configuration loaded / released around the calls below (metrale_amx_begin_bf16: every tile 16 rows of
 * 64 bytes, the encoder's bfloat16 attention). metrale_amx_block_rows (the Q4_0 / Q4_1 /
 * Q5_0 / Q5_1 / Q8_0 tile at qs, block_gemm.c's layout and quantised rows) and metrale_amx_kq_rows (the
 * K-quant tile at p, kquant_gemm.c's) compute the whole groups of 16 of `rows` rows into y (ldy floats a
 * row, nc channels) and return how many rows they computed (a multiple of 16; 0 where they cannot). */
int metrale_amx_ready(void);
void metrale_amx_begin(void);
void metrale_amx_begin_bf16(void);
void metrale_amx_end(void);
long metrale_amx_block_rows(int format, const uint8_t *qs, long cb, const uint16_t *dh, const uint16_t *mh, long KB,
                            const int8_t *a, long K, const float *dx, const float *sa, long rows, float *y, long ldy,
                            int nc);
long metrale_amx_kq_rows(int format, const uint8_t *p, long stride, long KS, const int8_t *a, long K, const float *dx,
                         const int16_t *bs32, long rows, float *y, long ldy, int nc);
void metrale_kq_rows(const metrale_weight *W, long K, const int64_t *ids, long n, float *out);
void metrale_paged_decode_attention_team(const float *q, long q_stride, const void *k_cache, const void *v_cache,
                                         const int64_t *block_tables, const int64_t *seq_lens,
                                         const int64_t *seq_starts, float *out, long D, int n_heads, int n_kv,
                                         int head_dim, int block_size, long width, float scale, int kv_dtype);

/* The entry points bound through ctypes (kernels/__init__.py, layers/fused_decode.py; decode_layer.h declares the
 * decode step's): every one is declared here, so each definition is checked against its declaration when its
 * source compiles, and the argtypes in Python are written from these lines. */
void metrale_paged_decode_attention(const float *q, const void *k_cache, const void *v_cache,
                                    const int64_t *block_tables, const int64_t *seq_lens, float *out,
                                    long D, int n_heads, int n_kv, int head_dim, int block_size, long width,
                                    float scale, int kv_dtype, int nthreads);
const char *metrale_kernels_isa(void);
void metrale_int8_pack(const int8_t *w, int8_t *packed, long N, long K);
const char *metrale_block_isa(void);
void metrale_block_rows(const metrale_weight *W0, long K, const int64_t *ids, long n, float *out);
long metrale_kq_stride(int format);
void metrale_sample(const float *logits, long B, long V, const float *temperature, const int32_t *top_k,
                    const float *top_p, const float *min_p, const double *u, float *processed,
                    const uint8_t *want, int64_t *tokens, int nthreads);
void metrale_encoder_attention(const float *qkv, long ld, const int64_t *starts, const int64_t *lens, long n_seqs,
                               int n_heads, int head_dim, float scale, float *out, long ldo, int nthreads);
int metrale_encoder_attention_bf16(const uint16_t *qkv, long ld, const float *bias, const int64_t *starts,
                                   const int64_t *lens, long n_seqs, int n_heads, int head_dim, float scale,
                                   uint16_t *out, long ldo, int nthreads);
void metrale_encoder_bias_gelu(const uint16_t *y, const float *bias, uint16_t *out, long rows, long n, int nthreads);
void metrale_encoder_add_norm(const uint16_t *y, const float *bias, const float *residual, const float *gamma,
                              const float *beta, float eps, float *out, uint16_t *out16, long rows, long n,
                              int nthreads);
void metrale_encoder_add_bias(const uint16_t *y, const float *bias, float *out, long rows, long n, int nthreads);
void metrale_encoder_add_norm_f32(const float *y, const float *bias, const float *residual, const float *gamma,
                                  const float *beta, float eps, float *out, long rows, long n, int nthreads);
int metrale_encoder_bf16_attention(int head_dim);
/* The encoder's batch-invariant linears: weights packed in groups of 16 output channels, each output element
 * one chain of sums in K's order whatever the row count or the thread split. */
void metrale_encoder_pack_f32(const float *w, long n, long k, float *packed);
void metrale_encoder_pack_bf16(const uint16_t *w, long n, long k, uint16_t *packed);
void metrale_encoder_linear_f32(const float *x, long ldx, const float *wp, const float *bias, int gelu, float *out,
                                long ldo, long rows, long n, long k, int nthreads);
void metrale_encoder_linear_bf16(const uint16_t *x, long ldx, const uint16_t *wp, const float *bias, int gelu,
                                 uint16_t *out, long ldo, long rows, long n, long k, int nthreads);
/* A BERT layer's feed-forward half (attention output, LayerNorm, up + GELU, down, LayerNorm) in one call. */
void metrale_encoder_ffn_bf16(const void *ctx, int ctx_bf16, long ldctx, long rows, long hidden, long inter,
                              const uint16_t *wo, const float *bo, const float *gamma1, const float *beta1,
                              const uint16_t *wu, const float *bu, const uint16_t *wd, const float *bd,
                              const float *gamma2, const float *beta2, float eps, float *h, uint16_t *h16, float *a,
                              uint16_t *a16, uint16_t *y, uint16_t *g, int nthreads);
void metrale_encoder_ffn_f32(const float *ctx, long ldctx, long rows, long hidden, long inter, const float *wo,
                             const float *bo, const float *gamma1, const float *beta1, const float *wu,
                             const float *bu, const float *wd, const float *bd, const float *gamma2,
                             const float *beta2, float eps, float *h, float *a, float *g, int nthreads);
/* A whole BERT layer (q/k/v, attention per sequence, the feed-forward half) over whole sequences in one call. */
int metrale_encoder_layer_bf16(const uint16_t *wqkv, const float *bqkv, const int64_t *starts, const int64_t *lens,
                               long n_seqs, int n_heads, float scale, uint16_t *qkv, uint16_t *ctx, long rows,
                               long hidden, long inter, const uint16_t *wo, const float *bo, const float *gamma1,
                               const float *beta1, const uint16_t *wu, const float *bu, const uint16_t *wd,
                               const float *bd, const float *gamma2, const float *beta2, float eps, float *h,
                               uint16_t *h16, float *a, uint16_t *a16, uint16_t *y, uint16_t *g, int nthreads);
int metrale_encoder_layer_f32(const float *wqkv, const float *bqkv, const int64_t *starts, const int64_t *lens,
                              long n_seqs, int n_heads, float scale, float *qkv, float *ctx, long rows, long hidden,
                              long inter, const float *wo, const float *bo, const float *gamma1, const float *beta1,
                              const float *wu, const float *bu, const float *wd, const float *bd, const float *gamma2,
                              const float *beta2, float eps, float *h, float *a, float *g, int nthreads);

/* The layout of a struct Python passes by value or pointer (layout.c): for `type` (metrale_weight, metrale_layer,
 * metrale_view, metrale_step, metrale_lora_part, metrale_lora_layer) and `field` NULL, its size and alignment;
 * for a field, its offset and size (alignment 0). Returns 1, or 0 for a type or field it does not know.
 * metrale_struct_field: the name of the type's field `index` in declaration order, NULL past the last. */
int metrale_struct_layout(const char *type, const char *field, long *offset, long *size, long *align);
const char *metrale_struct_field(const char *type, long index);
#endif
