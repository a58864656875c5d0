/* Declarations shared by the kernel sources (cpu_kernels.c, int8_gemm.c, decode_layer.c). */
#ifndef METRALE_KERNELS_H
#define METRALE_KERNELS_H
#include <stdint.h>

void metrale_paged_decode_attention_strided(const float *q, long q_stride, const void *k_cache, const void *v_cache,
                                            const int64_t *block_tables, const int64_t *seq_lens, float *out,
                                            long D, int n_heads, int n_kv, int head_dim, int block_size, long width,
                                            float scale, int kv_dtype, int nthreads);
void metrale_int8_linear(const float *x, const int8_t *packed, const float *scale, float *y, long M, long N, long K,
                         int nthreads);
#endif
