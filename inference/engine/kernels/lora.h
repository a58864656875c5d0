/* The LoRA update of decode rows inside the compiled decoder layer (lora.c), one struct per layer. */
#ifndef METRALE_LORA_H
#define METRALE_LORA_H
#include <stdint.h>

/* One targeted projection within a fused linear: y[:, offset : offset + N] += (x A^T) Bt for the
 * rows whose slot has rank > 0. A and Bt are float32 [rank, K] and [rank, N] (Bt = scaling * B^T). */
typedef struct {
    long K, N, offset, y_stride;
    const int64_t *rank;    /* [slots]: the slot's rank for this projection (0: not targeted / empty) */
    const int64_t *A;       /* [slots]: address of the slot's A */
    const int64_t *Bt;      /* [slots]: address of the slot's Bt */
} metrale_lora_part;

enum { METRALE_LORA_QKV, METRALE_LORA_O, METRALE_LORA_GATE_UP, METRALE_LORA_DOWN, METRALE_LORA_LINEARS };

typedef struct {
    int num_parts[METRALE_LORA_LINEARS];
    metrale_lora_part part[METRALE_LORA_LINEARS][3];
} metrale_lora_layer;

void metrale_lora_add_team(const metrale_lora_layer *L, int linear, const int64_t *slots, const float *x, float *y,
                           long M);
#endif
