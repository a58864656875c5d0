/* The LoRA update of one fused linear for rows of several adapters at once (Punica / S-LoRA's
 * gathered update, one row at a time): y_m += (x_m A_s^T) Bt_s for the slot s of row m, skipped
 * for rows without an adapter (slot < 0). Each row is computed from its own values only, so a
 * row's result does not depend on the other rows of the batch (batch invariance). Float32
 * throughout: the low-rank factors are small next to the int8 base weights. */
#include <stdint.h>
#include "lora.h"

/* t = A x (rank values), then y += t Bt: two passes over the slot's factors. */
static void lora_row(const metrale_lora_part *P, int64_t s, const float *x, float *y) {
    const long R = (long)P->rank[s], K = P->K, N = P->N;
    if (R <= 0) return;
    const float *A = (const float *)(intptr_t)P->A[s], *Bt = (const float *)(intptr_t)P->Bt[s];
    float t[R];
    for (long r = 0; r < R; r++) {
        const float *a = A + r * K;
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (long k = 0; k < K; k++) acc += a[k] * x[k];
        t[r] = acc;
    }
    float *out = y + P->offset;
    for (long r = 0; r < R; r++) {
        const float *b = Bt + r * N, tr = t[r];
#pragma omp simd
        for (long n = 0; n < N; n++) out[n] += tr * b[n];
    }
}

/* x: float32 [M, K] (K of the linear's parts), y: float32 [M, y_stride]; slots: int64 [M]. The
 * work of every thread of the enclosing OpenMP team (each calls it; outside a parallel region one
 * thread does it all). */
void metrale_lora_add_team(const metrale_lora_layer *L, int linear, const int64_t *slots, const float *x, float *y,
                           long M) {
    const int np = L->num_parts[linear];
    const metrale_lora_part *parts = L->part[linear];
    if (np == 0) return;
#pragma omp for schedule(guided)
    for (long m = 0; m < M; m++) {
        const int64_t s = slots[m];
        if (s < 0) continue;
        for (int p = 0; p < np; p++)
            lora_row(&parts[p], s, x + m * parts[p].K, y + m * parts[p].y_stride);
    }
}
