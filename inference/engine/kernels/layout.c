/* The layouts of the structs Python passes to the kernels, reported by the compiler that built them: each type's
 * size and alignment, and each field's name, offset and size in declaration order. kernels/layout.py compares
 * them with the ctypes Structures at every load and refuses the library on any difference (a field added, moved,
 * retyped or renamed on one side), instead of letting a step read the wrong bytes. A field added to one of these
 * structs is added to its list below and to its ctypes class. */
#include <stddef.h>
#include <string.h>
#include "kernels.h"
#include "lora.h"
#include "decode_layer.h"

typedef struct {
    const char *type, *field; /* field NULL: the type itself */
    long offset, size, align;
} layout_entry;

#define TYPE(T) {#T, NULL, 0, (long)sizeof(T), (long)_Alignof(T)}
#define FIELD(T, f) {#T, #f, (long)offsetof(T, f), (long)sizeof(((T *)0)->f), 0}

static const layout_entry LAYOUT[] = {
    TYPE(metrale_weight),
    FIELD(metrale_weight, format), FIELD(metrale_weight, exact), FIELD(metrale_weight, qs),
    FIELD(metrale_weight, d), FIELD(metrale_weight, m), FIELD(metrale_weight, rows), FIELD(metrale_weight, next),

    TYPE(metrale_layer),
    FIELD(metrale_layer, ln1), FIELD(metrale_layer, ln2), FIELD(metrale_layer, qkv), FIELD(metrale_layer, o),
    FIELD(metrale_layer, gate_up), FIELD(metrale_layer, down), FIELD(metrale_layer, qkv_bias),
    FIELD(metrale_layer, q_norm), FIELD(metrale_layer, k_norm), FIELD(metrale_layer, k_cache),
    FIELD(metrale_layer, v_cache), FIELD(metrale_layer, lora), FIELD(metrale_layer, post_attn_norm),
    FIELD(metrale_layer, post_ff_norm), FIELD(metrale_layer, sliding),

    TYPE(metrale_view),
    FIELD(metrale_view, cos), FIELD(metrale_view, sin), FIELD(metrale_view, slots), FIELD(metrale_view, block_tables),
    FIELD(metrale_view, seq_lens), FIELD(metrale_view, seq_starts), FIELD(metrale_view, width),

    TYPE(metrale_step),
    FIELD(metrale_step, M), FIELD(metrale_step, hidden), FIELD(metrale_step, n_heads), FIELD(metrale_step, n_kv),
    FIELD(metrale_step, head_dim), FIELD(metrale_step, inter), FIELD(metrale_step, block_size),
    FIELD(metrale_step, kv_dtype), FIELD(metrale_step, nthreads), FIELD(metrale_step, act), FIELD(metrale_step, eps),
    FIELD(metrale_step, scale), FIELD(metrale_step, full), FIELD(metrale_step, window), FIELD(metrale_step, positions),
    FIELD(metrale_step, scratch), FIELD(metrale_step, lora_slots), FIELD(metrale_step, final_norm),
    FIELD(metrale_step, head), FIELD(metrale_step, logit_rows), FIELD(metrale_step, n_logit_rows),
    FIELD(metrale_step, vocab), FIELD(metrale_step, logits),

    TYPE(metrale_lora_part),
    FIELD(metrale_lora_part, K), FIELD(metrale_lora_part, N), FIELD(metrale_lora_part, offset),
    FIELD(metrale_lora_part, y_stride), FIELD(metrale_lora_part, rank), FIELD(metrale_lora_part, A),
    FIELD(metrale_lora_part, Bt),

    TYPE(metrale_lora_layer),
    FIELD(metrale_lora_layer, num_parts), FIELD(metrale_lora_layer, part),
};

#define N_LAYOUT ((long)(sizeof LAYOUT / sizeof LAYOUT[0]))

int metrale_struct_layout(const char *type, const char *field, long *offset, long *size, long *align) {
    for (long i = 0; i < N_LAYOUT; i++) {
        const layout_entry *e = &LAYOUT[i];
        if (strcmp(e->type, type) != 0) continue;
        if (field == NULL ? e->field != NULL : e->field == NULL || strcmp(e->field, field) != 0) continue;
        *offset = e->offset;
        *size = e->size;
        *align = e->align;
        return 1;
    }
    return 0;
}

const char *metrale_struct_field(const char *type, long index) {
    for (long i = 0, seen = 0; i < N_LAYOUT; i++) {
        if (LAYOUT[i].field == NULL || strcmp(LAYOUT[i].type, type) != 0) continue;
        if (seen++ == index) return LAYOUT[i].field;
    }
    return NULL;
}
