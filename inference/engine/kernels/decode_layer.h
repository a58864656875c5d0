/* The decode step's structs and entry points (decode_layer.c), passed from layers/fused_decode.py: _Layer is
 * metrale_layer, _View metrale_view, _Step metrale_step. Their layouts are checked at load against layout.c's
 * report (kernels/layout.py): a field changed here must be changed there and in Python. */
#ifndef METRALE_DECODE_LAYER_H
#define METRALE_DECODE_LAYER_H
#include <stdint.h>
#include "kernels.h"
#include "lora.h"

typedef struct {
    const float *ln1, *ln2;                     /* [hidden] RMSNorm weights */
    metrale_weight qkv, o, gate_up, down;       /* the linears (kernels.h) */
    const float *qkv_bias;                      /* [q + 2 kv] or NULL */
    const float *q_norm, *k_norm;               /* [head_dim] or NULL */
    void *k_cache, *v_cache;                    /* [num_blocks, block_size, n_kv, head_dim] (int8: head_dim + 4 bytes) */
    const metrale_lora_layer *lora;             /* resident LoRA adapters, or NULL */
    const float *post_attn_norm, *post_ff_norm; /* [hidden] or NULL: norms of the attention's and MLP's outputs */
    int sliding;                                /* 1: attends through the step's window view */
} metrale_layer;

/* What a layer attends through: the full layers' view, or the sliding-window layers' (their RoPE
 * tables, and in a pool of their own their slots and block tables, each cut to the blocks the
 * window reaches). */
typedef struct {
    const float *cos, *sin;                     /* [max_positions, head_dim]: RoPE's tables */
    const int64_t *slots;                       /* [M] flat KV slot of each row's new token */
    const int64_t *block_tables;                /* [M, width] */
    const int64_t *seq_lens;                    /* [M] keys of the table each row attends up to */
    const int64_t *seq_starts;                  /* [M] its first key in the table, or NULL (0) */
    long width;
} metrale_view;

#define ACT_SILU 0
#define ACT_GELU_TANH 1

typedef struct {
    long M;
    int hidden, n_heads, n_kv, head_dim, inter, block_size, kv_dtype, nthreads, act;
    float eps, scale;
    metrale_view full, window;
    const int64_t *positions;                   /* [M] each row's position (its row of cos and sin) */
    float *scratch;                             /* metrale_decode_scratch_floats(S) floats */
    const int64_t *lora_slots;                  /* [M] each row's adapter slot (-1: none), or NULL */
    /* After the layers: x <- final_norm(x) when final_norm is not NULL, then, when head is not NULL,
     * logits [R, vocab] = x[logit_rows] head^T for the R = n_logit_rows rows listed. */
    const float *final_norm;                    /* [hidden] or NULL */
    const metrale_weight *head;                 /* [vocab, hidden] or NULL */
    const int64_t *logit_rows;                  /* [R] */
    long n_logit_rows, vocab;
    float *logits;                              /* [R, vocab] */
} metrale_step;

/* The scratch floats a step needs (S->scratch), and the step itself: x [M, hidden] through n_layers layers L in
 * place, then the final norm and the logits rows (metrale_step's comments). */
long metrale_decode_scratch_floats(const metrale_step *S);
void metrale_decode_layers(const metrale_layer *L, long n_layers, const metrale_step *S, float *x);
#endif
