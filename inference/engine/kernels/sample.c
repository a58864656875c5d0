/* The sampler's draw for temperature rows (engine/sampler.py): temperature, top_k, top_p and min_p
 * on one row of logits without sorting the vocabulary, then one token by inverse CDF from one
 * uniform number.
 *
 * Rules (the torch reference in sampler.py, vLLM's order): x / T; top_k keeps the k largest
 * (ties broken by the lower token id, as a stable sort); top_p, over the softmax of what top_k
 * kept, keeps each token whose more likely predecessors hold less than top_p of the mass (the
 * most likely token always); min_p keeps p >= min_p * p_max, i.e. x >= x_max + T ln(min_p). The
 * token is the first id whose running sum of exp((x - x_max) / T), over the kept tokens in id
 * order, exceeds u times their total: the categorical distribution of the kept tokens.
 *
 * Cost: one pass for the maximum, one that writes the weights with their chunk sums, one chunk
 * searched; top_k by a size-k heap over the row; top_p over only the tokens within c of the
 * maximum (c doubled until they hold top_p of the mass: every token outside is less likely than
 * every one inside, so the nucleus is the same as over the sorted vocabulary). Each row is
 * computed alone by the same instructions whatever the batch and the thread count (a seeded
 * row's token does not depend on its companions).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "kernels.h"

#define CHUNK 512 /* weights per partial sum (the draw searches one chunk) */

typedef struct {
    float x;
    int32_t id;
} cand;

/* a before b in the sampler's order: larger logit first, then lower id. */
static inline int before(cand a, cand b) { return a.x > b.x || (a.x == b.x && a.id < b.id); }

static int cmp_cand(const void *pa, const void *pb) {
    const cand a = *(const cand *)pa, b = *(const cand *)pb;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Bit j set where x[j] > lo (ge = 0) or x[j] >= lo (ge = 1), for the 16 values at x. */
static inline unsigned above16(const float *x, float lo, int ge) {
#if defined(METRALE_AVX512)
    const __m512 v = _mm512_loadu_ps(x), l = _mm512_set1_ps(lo);
    return ge ? _mm512_cmp_ps_mask(v, l, _CMP_GE_OQ) : _mm512_cmp_ps_mask(v, l, _CMP_GT_OQ);
#elif defined(METRALE_AVX2)
    const __m256 l = _mm256_set1_ps(lo), v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    const unsigned m0 = (unsigned)_mm256_movemask_ps(ge ? _mm256_cmp_ps(v0, l, _CMP_GE_OQ) : _mm256_cmp_ps(v0, l, _CMP_GT_OQ));
    const unsigned m1 = (unsigned)_mm256_movemask_ps(ge ? _mm256_cmp_ps(v1, l, _CMP_GE_OQ) : _mm256_cmp_ps(v1, l, _CMP_GT_OQ));
    return m0 | m1 << 8;
#else
    unsigned m = 0;
    for (int j = 0; j < 16; j++) m |= (unsigned)(ge ? x[j] >= lo : x[j] > lo) << j;
    return m;
#endif
}

/* The heap's root is its last item in the sampler's order; sift the root down. */
static void sift_down(cand *h, int n, int i) {
    for (;;) {
        int w = i;
        const int l = 2 * i + 1, r = l + 1;
        if (l < n && before(h[w], h[l])) w = l;
        if (r < n && before(h[w], h[r])) w = r;
        if (w == i) return;
        const cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static inline void heap_offer(cand *h, int k, int *n, cand c) {
    if (*n < k) {
        h[(*n)++] = c;
        if (*n == k)
            for (int j = k / 2 - 1; j >= 0; j--) sift_down(h, k, j);
    } else if (before(c, h[0])) {
        h[0] = c;
        sift_down(h, k, 0);
    }
}

/* The k first finite tokens of row x in the sampler's order, sorted, into out; returns how many.
 * Once the heap is full, 16 values at a time are compared with its last item (a later id never
 * comes before an equal value), and only those above it are offered. */
static int top_k_sorted(const float *x, long V, int k, cand *out) {
    int n = 0;
    long i = 0;
    for (; i < V && n < k; i++)
        if (x[i] > -INFINITY) heap_offer(out, k, &n, (cand){x[i], (int32_t)i});
    for (; i < V && (i & 15); i++) heap_offer(out, k, &n, (cand){x[i], (int32_t)i});
    for (; i + 16 <= V; i += 16)
        for (unsigned m = above16(x + i, out[0].x, 0); m; m &= m - 1) {
            const long j = i + __builtin_ctz(m);
            heap_offer(out, k, &n, (cand){x[j], (int32_t)j});
        }
    for (; i < V; i++)
        if (x[i] > -INFINITY) heap_offer(out, k, &n, (cand){x[i], (int32_t)i});
    qsort(out, (size_t)n, sizeof(cand), cmp_cand);
    return n;
}

/* The sum of e[c0..c1) by the lane rule of `weights` (value i into lane (i - c0) mod 16, then the
 * lanes in order in double). */
static double lane_sum(const float *e, long c0, long c1) {
    float lane[16] = {0};
    long i = c0;
#if defined(METRALE_AVX512)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= c1; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(e + i));
    _mm512_storeu_ps(lane, acc);
#elif defined(METRALE_AVX2)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= c1; i += 16) {
        acc0 = _mm256_add_ps(acc0, _mm256_loadu_ps(e + i));
        acc1 = _mm256_add_ps(acc1, _mm256_loadu_ps(e + i + 8));
    }
    _mm256_storeu_ps(lane, acc0);
    _mm256_storeu_ps(lane + 8, acc1);
#endif
    for (; i < c1; i++) lane[(i - c0) & 15] += e[i];
    double s = 0.0;
    for (int j = 0; j < 16; j++) s += lane[j];
    return s;
}

/* exp((x - mx) * inv_t) for every x (0 for -inf), into e; the sum of each CHUNK into sums (lane_sum's
 * rule). exp16, exp8 and exp1 give the same values, so AVX-512, AVX2 and portable builds compute
 * the same weights and sums, and draw the same tokens. */
static void weights(const float *x, long V, float mx, float inv_t, float *e, double *sums) {
    long i = 0;
#if defined(METRALE_AVX512)
    const __m512 m = _mm512_set1_ps(mx), it = _mm512_set1_ps(inv_t), ninf = _mm512_set1_ps(-INFINITY);
    for (; i + 16 <= V; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __mmask16 live = _mm512_cmp_ps_mask(v, ninf, _CMP_GT_OQ);
        _mm512_storeu_ps(e + i, _mm512_maskz_mov_ps(live, exp16(_mm512_mul_ps(_mm512_sub_ps(v, m), it))));
    }
#elif defined(METRALE_AVX2)
    const __m256 m = _mm256_set1_ps(mx), it = _mm256_set1_ps(inv_t), ninf = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(e + i, _mm256_and_ps(_mm256_cmp_ps(v, ninf, _CMP_GT_OQ),
                                              exp8(_mm256_mul_ps(_mm256_sub_ps(v, m), it))));
    }
#endif
    for (; i < V; i++) e[i] = x[i] > -INFINITY ? exp1((x[i] - mx) * inv_t) : 0.f;
    for (long c0 = 0; c0 < V; c0 += CHUNK) sums[c0 / CHUNK] = lane_sum(e, c0, c0 + CHUNK < V ? c0 + CHUNK : V);
}

/* The kept set as a threshold: x > thr, or x == thr for the first `ties` such ids (ties < 0: all). */
typedef struct {
    float thr;
    long ties;
} keep_rule;

/* Of candidates c[0..n) (sorted; weight of c[j] in w[j]), how many the nucleus keeps: c[j] stays
 * while the mass before it, `base` plus its predecessors', is below top_p * total (the first
 * candidate always when base is 0). */
static int nucleus(const double *w, int n, double base, double total, double top_p) {
    double mass = base;
    for (int j = 0; j < n; j++) {
        if ((j > 0 || base > 0.0) && mass >= top_p * total) return j;
        mass += w[j];
    }
    return n;
}

static keep_rule rule_of(const cand *c, int n_keep) {
    keep_rule r = {c[n_keep - 1].x, 0};
    for (int j = n_keep - 1; j >= 0 && c[j].x == r.thr; j--) r.ties++;
    return r;
}

#define BUCKETS 1024

/* The nucleus rule over the n candidates c (unsorted, ids ascending: every finite x >= some bound,
 * the rest of the row less likely than each and holding less than 1 - top_p of the mass), their
 * weights from e, the row's total weight `total`. The candidates are counted into BUCKETS
 * equal-width buckets of x from the top; only the bucket where the running mass reaches top_p is
 * sorted (every bucket above it is kept, every one below removed). w: scratch of n doubles. */
static keep_rule nucleus_rule(cand *c, int n, float mx, const float *e, double total, float top_p, double *w) {
    float lo = mx;
    for (int j = 0; j < n; j++) lo = c[j].x < lo ? c[j].x : lo;
    double before_mass = 0.0;
    int m = n;
    if (n > 256 && mx > lo) {
        double mass[BUCKETS] = {0};
        int count[BUCKETS] = {0};
        const float scale = (float)BUCKETS / (mx - lo);
#define BUCKET_OF(v) ((int)((mx - (v)) * scale) < BUCKETS ? (int)((mx - (v)) * scale) : BUCKETS - 1)
        for (int j = 0; j < n; j++) {
            const int b = BUCKET_OF(c[j].x);
            mass[b] += e[c[j].id];
            count[b]++;
        }
        int crossing = -1;
        for (int b = 0; b < BUCKETS && crossing < 0; b++) {
            if (count[b] && before_mass + mass[b] >= top_p * total) crossing = b;
            else before_mass += mass[b];
        }
        if (crossing < 0) return (keep_rule){lo, -1}; /* rounding: the candidates hold less than top_p */
        m = 0; /* the crossing bucket's candidates, moved to the front */
        for (int j = 0; j < n; j++)
            if (BUCKET_OF(c[j].x) == crossing) c[m++] = c[j];
#undef BUCKET_OF
    }
    qsort(c, (size_t)m, sizeof(cand), cmp_cand);
    for (int j = 0; j < m; j++) w[j] = e[c[j].id];
    const int keep = nucleus(w, m, before_mass, total, top_p);
    return rule_of(c, keep < 1 ? 1 : keep);
}

/* The row's largest value, whether it holds a NaN, and how many values are finite (one vectorised
 * pass; the maximum is exact in any order). */
static float row_stats(const float *x, long V, int *has_nan, long *finite) {
    long i = 0, n = 0;
    float mx = -INFINITY;
    int nan = 0;
#if defined(METRALE_AVX512)
    __m512 m = _mm512_set1_ps(-INFINITY);
    const __m512 inf = _mm512_set1_ps(INFINITY), absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    __mmask16 bad = 0;
    for (; i + 16 <= V; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        n += __builtin_popcount(_mm512_cmp_ps_mask(_mm512_and_ps(v, absmask), inf, _CMP_LT_OQ));
        m = _mm512_max_ps(m, v);
    }
    nan = bad != 0;
    mx = _mm512_reduce_max_ps(m);
#elif defined(METRALE_AVX2)
    __m256 m = _mm256_set1_ps(-INFINITY), bad = _mm256_setzero_ps();
    const __m256 inf = _mm256_set1_ps(INFINITY), absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        n += __builtin_popcount(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, absmask), inf, _CMP_LT_OQ)));
        m = _mm256_max_ps(m, v);
    }
    nan = _mm256_movemask_ps(bad) != 0;
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    for (int j = 0; j < 8; j++) mx = lanes[j] > mx ? lanes[j] : mx;
#endif
    for (; i < V; i++) {
        const float v = x[i];
        nan |= v != v;
        n += fabsf(v) < INFINITY;
        mx = v > mx ? v : mx;
    }
    *has_nan = nan;
    *finite = n;
    return mx;
}

/* argmax_rows' token: the first NaN, else the first largest value. */
static long first_argmax(const float *x, long V) {
    long t = 0;
    for (long i = 0; i < V; i++) {
        if (x[i] != x[i]) return i;
        if (x[i] > x[t]) t = i;
    }
    return t;
}

/* Every finite x >= lo into c (ids ascending), their weights' sum into *mass; returns how many. */
static int candidates(const float *x, long V, float lo, const float *e, cand *c, double *mass) {
    int n = 0;
    double s = 0.0;
    long i = 0;
    for (; i + 16 <= V; i += 16)
        for (unsigned m = above16(x + i, lo, 1); m; m &= m - 1) {
            const long j = i + __builtin_ctz(m);
            c[n++] = (cand){x[j], (int32_t)j};
            s += e[j];
        }
    for (; i < V; i++)
        if (x[i] >= lo && x[i] > -INFINITY) {
            c[n++] = (cand){x[i], (int32_t)i};
            s += e[i];
        }
    *mass = s;
    return n;
}

/* Zeroes the weights of the tokens `rule` removes and updates the chunk sums. */
static void apply_rule(const float *x, long V, keep_rule rule, float *e, double *sums) {
    long seen = 0;
    for (long c0 = 0; c0 < V; c0 += CHUNK) {
        const long c1 = c0 + CHUNK < V ? c0 + CHUNK : V;
        int changed = 0;
        long i = c0;
        if (rule.ties < 0) { /* x >= thr: 16 at a time */
            for (; i + 16 <= c1; i += 16) {
                const unsigned drop = ~above16(x + i, rule.thr, 1) & 0xffffu;
                for (unsigned m = drop; m; m &= m - 1) e[i + __builtin_ctz(m)] = 0.f;
                changed |= drop != 0;
            }
        }
        for (; i < c1; i++) {
            const float v = x[i];
            if (v < rule.thr || (v == rule.thr && rule.ties >= 0 && seen++ >= rule.ties)) {
                changed |= e[i] != 0.f;
                e[i] = 0.f;
            }
        }
        if (changed) sums[c0 / CHUNK] = lane_sum(e, c0, c1);
    }
}

/* One temperature row: the drawn token. x: [V] logits (after the sampler's earlier controls). */
static long sample_row(const float *x, long V, float temperature, int top_k, float top_p, float min_p, double u,
                       float *processed, float *e, double *sums, cand *c, double *w) {
    int has_nan;
    long finite;
    const float mx = row_stats(x, V, &has_nan, &finite);
    /* No distribution to draw from (a NaN, +inf, or nothing finite): the argmax rule (argmax_rows). */
    if (has_nan || mx == INFINITY || finite == 0) {
        const long t = first_argmax(x, V);
        if (processed)
            for (long i = 0; i < V; i++) processed[i] = i == t ? 0.f : -INFINITY;
        return t;
    }
    const float inv_t = 1.f / temperature;
    const long KB = (V + CHUNK - 1) / CHUNK;
    keep_rule rule = {-INFINITY, -1};
    weights(x, V, mx, inv_t, e, sums);
    double total = 0.0;
    for (long b = 0; b < KB; b++) total += sums[b];
    if (top_k > 0 && top_k < finite) {
        const int n = top_k_sorted(x, V, top_k, c);
        int keep = n;
        if (top_p < 1.f) {
            double kept = 0.0;
            for (int j = 0; j < n; j++) kept += w[j] = e[c[j].id];
            keep = nucleus(w, n, 0.0, kept, top_p);
        }
        rule = rule_of(c, keep < n ? keep : n);
    } else if (top_p < 1.f) {
        for (float span = 8.f;; span *= 2.f) {
            const float lo = span > 1e30f ? -INFINITY : mx - span * temperature;
            double mass;
            const int n = candidates(x, V, lo, e, c, &mass);
            if (mass >= top_p * total || n == finite) {
                rule = nucleus_rule(c, n, mx, e, total, top_p, w);
                break;
            }
        }
    }
    if (min_p > 0.f) {
        const float thr = mx + temperature * logf(min_p);
        if (thr > rule.thr) rule = (keep_rule){thr, -1};
    }
    if (rule.thr > -INFINITY) {
        apply_rule(x, V, rule, e, sums);
        total = 0.0;
        for (long b = 0; b < KB; b++) total += sums[b];
    }
    if (processed) /* the same keep rule, written out */
        for (long i = 0, seen = 0; i < V; i++) {
            const float v = x[i];
            const int drop = !(v > -INFINITY) || v < rule.thr ||
                             (v == rule.thr && rule.ties >= 0 && seen++ >= rule.ties);
            processed[i] = drop ? -INFINITY : v / temperature;
        }
    const double target = u * total;
    double acc = 0.0;
    for (long b = 0; b < KB; b++) {
        if (acc + sums[b] <= target && b + 1 < KB) {
            acc += sums[b];
            continue;
        }
        const long c0 = b * CHUNK, c1 = c0 + CHUNK < V ? c0 + CHUNK : V;
        long last = -1;
        for (long i = c0; i < c1; i++) {
            if (e[i] == 0.f) continue;
            last = i;
            acc += e[i];
            if (acc > target) return i;
        }
        if (last >= 0) return last; /* rounding: the chunk's sum reached the target, its weights not */
    }
    return first_argmax(x, V); /* rounding left the target past every weight */
}

/* Draws one token for each of B rows of logits [B, V] (float32, row-major).
 * temperature [B] (> 0), top_k [B] (0: off), top_p [B] (1: off), min_p [B] (0: off), u [B] uniform
 * numbers in [0, 1). processed: NULL, or [B, V] where rows with want[b] != 0 get the processed
 * logits (x / T, -inf where removed; what logprobs are the log-softmax of). tokens: int64 [B].
 * Rows are shared among nthreads threads; each row's result is independent of the others. */
void metrale_sample(const float *logits, long B, long V, const float *temperature, const int32_t *top_k,
                    const float *top_p, const float *min_p, const double *u, float *processed,
                    const uint8_t *want, int64_t *tokens, int nthreads) {
    const long KB = (V + CHUNK - 1) / CHUNK;
#pragma omp parallel num_threads(nthreads) if (B > 1)
    {
        float *e = (float *)malloc(sizeof(float) * (size_t)V);
        double *sums = (double *)malloc(sizeof(double) * (size_t)KB);
        cand *c = (cand *)malloc(sizeof(cand) * (size_t)V);
        double *w = (double *)malloc(sizeof(double) * (size_t)V);
#pragma omp for schedule(dynamic, 1)
        for (long b = 0; b < B; b++) {
            if (!e || !sums || !c || !w) {
                tokens[b] = -1; /* out of memory: the caller raises */
                continue;
            }
            float *out = processed && want && want[b] ? processed + b * V : NULL;
            tokens[b] = sample_row(logits + b * V, V, temperature[b], top_k[b], top_p[b], min_p[b], u[b], out, e,
                                   sums, c, w);
        }
        free(e);
        free(sums);
        free(c);
        free(w);
    }
}
