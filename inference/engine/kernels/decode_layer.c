/* The Llama-family and Gemma 3 decoder layers for decode rows (and short prompts' rows), a whole
 * step in one call:
 *   h = RMSNorm(x) ; qkv = h W_qkv (+ bias) ; (q, k per-head RMSNorm) ; RoPE ;
 *   K/V written at the rows' slots ; attention through the block tables ;
 *   x += (RMSNorm of) attn W_o ; h = RMSNorm(x) ; x += (RMSNorm of) (act(h W_gate) * h W_up) W_down
 * for every layer, with each linear in its weight format (metrale_weight_linear_team: per-channel
 * int8 or GGUF blocks, block_gemm.c) and float32 activations between the GEMMs (each GEMM
 * quantises its input rows itself). One call replaces the ~40 small torch ops a layer costs at
 * batch sizes where each takes longer to dispatch than to compute, and one parallel region the
 * ~6 a layer's kernels would open each. Every row is computed independently of the others (batch
 * invariance). Rules: transformers' modeling_llama.py (RMSNorm statistics in float32,
 * rotate-half RoPE, SwiGLU), Qwen2 qkv bias, Qwen3 q/k norm; modeling_gemma3.py (the norms of the
 * attention's and the MLP's outputs before their residual adds, GELU-tanh, sliding-window layers
 * with their own RoPE tables and KV pool: the step's `window` view). Gemma's (1 + weight) norm
 * scales come precomputed (layers/fused_decode.py), so every norm here is weight * x / rms.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "kernels.h"
#include "lora.h"
#include "decode_layer.h"

/* The activations' floats of a step's rows (h, qkv, attn, gu, act, proj below). */
static long activation_floats(const metrale_step *S) {
    const long qkv = (long)(S->n_heads + 2 * S->n_kv) * S->head_dim;
    return S->M * (S->hidden + qkv + (long)S->n_heads * S->head_dim + 3L * S->inter + S->hidden);
}

/* The widest input of the layer's linears (hidden, the attention's output, or the MLP's). */
static long widest_input(const metrale_step *S) {
    long k = S->hidden > S->inter ? S->hidden : S->inter;
    return (long)S->n_heads * S->head_dim > k ? (long)S->n_heads * S->head_dim : k;
}

long metrale_decode_scratch_floats(const metrale_step *S) {
    return activation_floats(S) + (metrale_weight_scratch_bytes(S->M, widest_input(S)) + 3) / 4 + 16;
}

/* The rows the LM head reads: after the layers' scratch (its activations are no longer needed). */
static float *head_input(const metrale_step *S) { return S->scratch; }

/* y = weight * x / sqrt(mean(x^2) + eps), statistics in float32 (transformers' LlamaRMSNorm). */
static void rms_norm(const float *x, const float *w, float *y, long n, float eps) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (long i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.f / sqrtf(ss / (float)n + eps);
    for (long i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

/* Rotate-half RoPE on one head in place: x' = x * cos + rotate_half(x) * sin. */
static void rope(float *x, const float *cos, const float *sin, int head_dim) {
    const int half = head_dim / 2;
    float tmp[512];
    for (int i = 0; i < half; i++) {
        tmp[i] = x[i] * cos[i] - x[i + half] * sin[i];
        tmp[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
    }
    memcpy(x, tmp, sizeof(float) * (size_t)head_dim);
}

/* One token's K or V (n_kv heads of head_dim floats at src) into its cache slot. int8 (kv_dtype 2):
 * per head, scale = amax / 127 and q = round-half-even(x * (127 / amax)) (0 where amax is 0), the
 * head_dim int8 values followed by the float32 scale (layers/kv_quant.py's rule, the same steps). */
static void write_kv(void *cache, long slot, const float *src, int n_kv, int head_dim, int kv_dtype) {
    const long n = (long)n_kv * head_dim;
    if (kv_dtype == 0) {
        memcpy((float *)cache + slot * n, src, sizeof(float) * (size_t)n);
        return;
    }
    if (kv_dtype == 1) {
        uint16_t *dst = (uint16_t *)cache + slot * n;
        for (long i = 0; i < n; i++) dst[i] = float_to_bf16(src[i]);
        return;
    }
    const long hb = (long)head_dim + 4;
    for (int h = 0; h < n_kv; h++) {
        const float *x = src + (long)h * head_dim;
        int8_t *dst = (int8_t *)cache + (slot * n_kv + h) * hb;
        float amax = 0.f;
        for (int i = 0; i < head_dim; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float inv = amax > 0.f ? 127.f / amax : 0.f, scale = amax / 127.f;
        for (int i = 0; i < head_dim; i++) {
            float q = nearbyintf(x[i] * inv);
            dst[i] = (int8_t)(q > 127.f ? 127.f : q < -127.f ? -127.f : q);
        }
        memcpy(dst + head_dim, &scale, sizeof scale);
    }
}

/* silu(g) * u for n values: g / (1 + exp(-g)) * u. */
static void swiglu(const float *g, const float *u, float *a, long n) {
    long i = 0;
#ifdef METRALE_AVX2
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_sub_ps(zero, gv));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) a[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}

/* gelu_tanh(g) * u for n values: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) u (torch's
 * gelu(approximate="tanh"), transformers' gelu_pytorch_tanh), computed as g / (1 + exp(-2 z)) * u with
 * z = sqrt(2 / pi) (g + 0.044715 g^3), since 0.5 (1 + tanh(z)) = 1 / (1 + exp(-2 z)). exp16, exp8 and
 * exp1 take the same steps per lane, and so does the rest, so every path gives the same value (within
 * a few float32 ulps of torch's tanh form). */
static inline float gelu_tanh1(float x) {
    float t = x * x;
    t = t * x;
    t = t * 0.044715f;
    t = x + t;
    return x / (1.f + exp1(t * -1.5957691216057308f));
}

static void geglu(const float *g, const float *u, float *a, long n) {
    long i = 0;
#ifdef METRALE_AVX512
    const __m512 k3 = _mm512_set1_ps(0.044715f), m2c = _mm512_set1_ps(-1.5957691216057308f), one = _mm512_set1_ps(1.f);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        __m512 t = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        t = _mm512_add_ps(x, _mm512_mul_ps(t, k3));
        const __m512 e = exp16(_mm512_mul_ps(t, m2c));
        _mm512_storeu_ps(a + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
    }
#elif defined(METRALE_AVX2)
    const __m256 k3 = _mm256_set1_ps(0.044715f), m2c = _mm256_set1_ps(-1.5957691216057308f), one = _mm256_set1_ps(1.f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        __m256 t = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        t = _mm256_add_ps(x, _mm256_mul_ps(t, k3));
        const __m256 e = exp8(_mm256_mul_ps(t, m2c));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) a[i] = gelu_tanh1(g[i]) * u[i];
}

/* The gated MLP's activation of one row: act(gate) * up, gate and up the halves of gu ([2n]). */
static void gated(const metrale_step *S, const float *gu, float *a, long n) {
    if (S->act == ACT_GELU_TANH) geglu(gu, gu + n, a, n);
    else swiglu(gu, gu + n, a, n);
}

/* x += y, or x += RMSNorm(y) where the layer normalises its sublayer's output (norm not NULL; tmp:
 * n floats, which may be y itself). */
static void add_output(float *x, const float *y, const float *norm, float *tmp, long n, float eps) {
    if (norm) {
        rms_norm(y, norm, tmp, n, eps);
        y = tmp;
    }
    for (long i = 0; i < n; i++) x[i] += y[i];
}

/* The view a layer attends through. */
static const metrale_view *view_of(const metrale_layer *L, const metrale_step *S) {
    return L->sliding ? &S->window : &S->full;
}

/* The rows' adapter updates after a GEMM (lora.c). */
#define LORA_ADD(which, in, out) \
    if (L->lora && S->lora_slots) metrale_lora_add_team(L->lora, which, S->lora_slots, in, out, M)

/* Row m's qkv (the linear's output, in place): the bias, q/k norms and RoPE, then its K and V
 * written at its slot. */
static void rope_and_write(const metrale_layer *L, const metrale_step *S, float *row, long m) {
    const int hd = S->head_dim, nh = S->n_heads, nkv = S->n_kv;
    const long qs = (long)nh * hd, kvs = (long)nkv * hd, qkvs = qs + 2 * kvs;
    const metrale_view *V = view_of(L, S);
    if (L->qkv_bias)
        for (long i = 0; i < qkvs; i++) row[i] += L->qkv_bias[i];
    const float *c = V->cos + S->positions[m] * hd, *s = V->sin + S->positions[m] * hd;
    for (int j = 0; j < nh; j++) {
        float *qh = row + (long)j * hd;
        if (L->q_norm) rms_norm(qh, L->q_norm, qh, hd, S->eps);
        rope(qh, c, s, hd);
    }
    for (int j = 0; j < nkv; j++) {
        float *kh = row + qs + (long)j * hd;
        if (L->k_norm) rms_norm(kh, L->k_norm, kh, hd, S->eps);
        rope(kh, c, s, hd);
    }
    write_kv(L->k_cache, V->slots[m], row + qs, nkv, hd, S->kv_dtype);
    write_kv(L->v_cache, V->slots[m], row + qs + kvs, nkv, hd, S->kv_dtype);
}

/* The layer's attention of every row (its qkv rows) into attn [M, n_heads * head_dim]. */
static void attend_rows(const metrale_layer *L, const metrale_step *S, const float *qkv, float *attn) {
    const metrale_view *V = view_of(L, S);
    const long qkvs = (long)(S->n_heads + 2 * S->n_kv) * S->head_dim;
    metrale_paged_decode_attention_team(qkv, qkvs, L->k_cache, L->v_cache, V->block_tables, V->seq_lens, V->seq_starts,
                                        attn, S->M, S->n_heads, S->n_kv, S->head_dim, S->block_size, V->width, S->scale,
                                        S->kv_dtype);
}

/* One layer for S->M rows, the work of every thread of the step's team; x: float32 [M, hidden],
 * updated in place. Row-wise steps are shared by rows (a lone row: one thread, while the others
 * wait at the loop's end), the GEMMs by tiles and the attention by its tasks; each loop ends at a
 * barrier, so every step reads what the one before it wrote. Each row's K/V is written before
 * any row attends, so prompt rows of one sequence (each with its own seq_len, position + 1) see
 * each other causally. */
static void decode_layer_team(const metrale_layer *L, const metrale_step *S, float *x) {
    const long M = S->M, H = S->hidden, I = S->inter;
    const int hd = S->head_dim, nh = S->n_heads, nkv = S->n_kv;
    const long qs = (long)nh * hd, kvs = (long)nkv * hd, qkvs = qs + 2 * kvs;
    float *h = S->scratch;          /* [M, H] */
    float *qkv = h + M * H;         /* [M, qkv] */
    float *attn = qkv + M * qkvs;   /* [M, q] */
    float *gu = attn + M * qs;      /* [M, 2I] */
    float *act = gu + M * 2 * I;    /* [M, I] */
    float *proj = act + M * I;      /* [M, H] */
    void *gemm = (void *)(((uintptr_t)(S->scratch + activation_floats(S)) + 63) & ~(uintptr_t)63);

#pragma omp for schedule(guided)
    for (long m = 0; m < M; m++) rms_norm(x + m * H, L->ln1, h + m * H, H, S->eps);
    metrale_weight_linear_team(&L->qkv, h, qkv, M, qkvs, H, gemm);
    LORA_ADD(METRALE_LORA_QKV, h, qkv);
#pragma omp for schedule(guided)
    for (long m = 0; m < M; m++) rope_and_write(L, S, qkv + m * qkvs, m);
    attend_rows(L, S, qkv, attn);
    metrale_weight_linear_team(&L->o, attn, proj, M, H, qs, gemm);
    LORA_ADD(METRALE_LORA_O, attn, proj);
#pragma omp for schedule(guided)
    for (long m = 0; m < M; m++) {
        add_output(x + m * H, proj + m * H, L->post_attn_norm, proj + m * H, H, S->eps);
        rms_norm(x + m * H, L->ln2, h + m * H, H, S->eps);
    }
    metrale_weight_linear_team(&L->gate_up, h, gu, M, 2 * I, H, gemm);
    LORA_ADD(METRALE_LORA_GATE_UP, h, gu);
#pragma omp for schedule(guided)
    for (long m = 0; m < M; m++) gated(S, gu + m * 2 * I, act + m * I, I);
    metrale_weight_linear_team(&L->down, act, proj, M, H, I, gemm);
    LORA_ADD(METRALE_LORA_DOWN, act, proj);
#pragma omp for schedule(guided)
    for (long m = 0; m < M; m++) add_output(x + m * H, proj + m * H, L->post_ff_norm, proj + m * H, H, S->eps);
}

/* Steps of at most LEAN_ROWS rows without adapters take decode_layer_lean. */
#define LEAN_ROWS 4

/* A thread's own copies in the lean form: the rows (x), the norms' output (h), the MLP's activation
 * (act), and the GEMM inputs' quantised rows (q: metrale_weight_scratch_bytes of M rows). */
typedef struct {
    float *x, *h, *act;
    void *q;
} lean_rows;

static long lean_floats(const metrale_step *S) {
    return S->M * (2L * S->hidden + widest_input(S)) + (metrale_weight_scratch_bytes(S->M, widest_input(S)) + 3) / 4 + 32;
}

/* decode_layer_team's layer for a few rows (M <= LEAN_ROWS) with six barriers instead of thirteen:
 * every thread keeps its own copy of the rows and computes the row-wise steps (norms, residuals,
 * SwiGLU, each GEMM input's quantisation) itself, the same operations on the same values as
 * decode_layer_team's one thread does, so every copy and every result is the same; the team
 * shares only the GEMM tiles and the attention tasks, and one thread applies RoPE and writes
 * the K/V. Fewer meetings of the threads: a thread that another process delays holds the others
 * up fewer times a step. */
static void decode_layer_lean(const metrale_layer *L, const metrale_step *S, lean_rows *own) {
    const long M = S->M, H = S->hidden, I = S->inter;
    const int hd = S->head_dim, nh = S->n_heads, nkv = S->n_kv;
    const long qs = (long)nh * hd, kvs = (long)nkv * hd, qkvs = qs + 2 * kvs;
    float *qkv = S->scratch + M * H; /* decode_layer_team's layout: the team's shared outputs */
    float *attn = qkv + M * qkvs;
    float *gu = attn + M * qs;
    float *proj = gu + M * 2 * I + M * I;
    float *x = own->x, *h = own->h, *act = own->act;

    for (long m = 0; m < M; m++) rms_norm(x + m * H, L->ln1, h + m * H, H, S->eps);
    metrale_weight_quantize(&L->qkv, h, M, H, own->q);
    metrale_weight_tiles_team(&L->qkv, h, qkv, M, qkvs, H, own->q);
#pragma omp single
    for (long m = 0; m < M; m++) rope_and_write(L, S, qkv + m * qkvs, m);
    attend_rows(L, S, qkv, attn);
    metrale_weight_quantize(&L->o, attn, M, qs, own->q);
    metrale_weight_tiles_team(&L->o, attn, proj, M, H, qs, own->q);
    /* proj is the team's: each thread normalises its own copy (act and h are free here). */
    for (long m = 0; m < M; m++) {
        add_output(x + m * H, proj + m * H, L->post_attn_norm, act, H, S->eps);
        rms_norm(x + m * H, L->ln2, h + m * H, H, S->eps);
    }
    metrale_weight_quantize(&L->gate_up, h, M, H, own->q);
    metrale_weight_tiles_team(&L->gate_up, h, gu, M, 2 * I, H, own->q);
    for (long m = 0; m < M; m++) gated(S, gu + m * 2 * I, act + m * I, I);
    metrale_weight_quantize(&L->down, act, M, I, own->q);
    metrale_weight_tiles_team(&L->down, act, proj, M, H, I, own->q);
    for (long m = 0; m < M; m++) add_output(x + m * H, proj + m * H, L->post_ff_norm, h, H, S->eps);
}

/* Runs S->M rows through n_layers layers (L: [n_layers]) in one parallel region of S->nthreads
 * threads; x: float32 [M, hidden], updated in place; then the final norm and the LM head's logits
 * of the rows that sample (S->final_norm, S->head). One region for the whole step: the threads
 * meet at the barriers of its loops instead of a new team for every GEMM and attention. */
void metrale_decode_layers(const metrale_layer *L, long n_layers, const metrale_step *S, float *x) {
    const long M = S->M, H = S->hidden, R = S->n_logit_rows;
    const int lean = M <= LEAN_ROWS && !S->lora_slots;
    int short_of_memory = 0; /* threads whose copy could not be allocated: then decode_layer_team for all */
#pragma omp parallel num_threads(S->nthreads)
    {
        float *mine = lean ? (float *)malloc(sizeof(float) * (size_t)lean_floats(S)) : NULL;
        if (lean && !mine) {
#pragma omp atomic update
            short_of_memory++;
        }
#pragma omp barrier
        if (lean && !short_of_memory) {
            lean_rows own = {mine, mine + M * H, mine + 2 * M * H, NULL};
            own.q = (void *)(((uintptr_t)(own.act + M * widest_input(S)) + 63) & ~(uintptr_t)63);
            memcpy(own.x, x, sizeof(float) * (size_t)(M * H));
            for (long l = 0; l < n_layers; l++) decode_layer_lean(L + l, S, &own);
            if (S->final_norm)
                for (long m = 0; m < M; m++) rms_norm(own.x + m * H, S->final_norm, own.x + m * H, H, S->eps);
#pragma omp master
            memcpy(x, own.x, sizeof(float) * (size_t)(M * H));
            if (S->head && R > 0) {
                for (long r = 0; r < R; r++)
                    memcpy(own.h + r * H, own.x + S->logit_rows[r] * H, sizeof(float) * (size_t)H);
                metrale_weight_quantize(S->head, own.h, R, H, own.q);
                metrale_weight_tiles_team(S->head, own.h, S->logits, R, S->vocab, H, own.q);
            }
        } else {
            for (long l = 0; l < n_layers; l++) decode_layer_team(L + l, S, x);
            if (S->final_norm) {
#pragma omp for schedule(guided)
                for (long m = 0; m < M; m++) rms_norm(x + m * H, S->final_norm, x + m * H, H, S->eps);
            }
        }
        free(mine);
        if (!(lean && !short_of_memory) && S->head && R > 0) {
            float *rows = head_input(S);
            void *gemm = (void *)(((uintptr_t)(S->scratch + R * H) + 63) & ~(uintptr_t)63);
#pragma omp for schedule(guided)
            for (long r = 0; r < R; r++) memcpy(rows + r * H, x + S->logit_rows[r] * H, sizeof(float) * (size_t)H);
            metrale_weight_linear_team(S->head, rows, S->logits, R, S->vocab, H, gemm);
        }
    }
}
