"""The activation side of ``nibble_q8_cpu``: x rounded to int8 per block of 32 into the codes' layout (with its steps
and its sums per group), and the integer dot products of one 32-byte load of codes against it, whole or in halves.
Pasted into that kernel's source after its ISA and DOT macros (immintrin.h included there); imports nothing.
"""

DOTS = r"""
static inline int hsum_epi32(__m256i t) {
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
}

/* How x's steps are taken: as ggml takes them for the weight type at hand, so that a GGUF's codes compute what
   llama.cpp computes with them. X32: max |x| / 127 per block of 32 in fp32 (our own checkpoints); XQ8_0: the same
   rounded to fp16 (ggml's Q8_0, for Q4_0 and Q5_0); XQ8_1: that, and each block's sum d x sum(xi) rounded to fp16
   (Q8_1, for Q4_1); XQ8_K: one step per 256 inputs, 1 / (127 / max |x|) in fp32 (Q8_K, for the K-quants). The codes
   are round(x * 127 / max |x|) to nearest even in every mode, as ggml's x86 code rounds them. */
#define X32 0
#define XQ8_0 1
#define XQ8_1 2
#define XQ8_K 3

static inline __m256 abs_ps(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }

static inline float hmax_ps(__m256 top) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* max |x| over XQ8_K's 256 inputs (the per-32 modes take theirs from the block's registers, loaded once) */
static inline float amax_of(const float *x, int n) {
    __m256 top = _mm256_setzero_ps();
    for (int k = 0; k < n; k += 8) top = _mm256_max_ps(top, abs_ps(_mm256_loadu_ps(x + k)));
    return hmax_ps(top);
}

static inline float to_half(float v) { return _cvtsh_ss(_cvtss_sh(v, 0)); }

/* Row r of x [M, I] -> xi (I bytes, each block of 64 as [low-nibble inputs 32 | high-nibble inputs 32]),
   d [I/64 * 8] (per block of 64: lanes 0-3 the step of its inputs 0-31, lanes 4-7 of 32-63, as the dot
   product's lanes are laid out) and sums [G]: the sums over each group of gs inputs of x as rounded.
   XQ8_K needs I a multiple of 256. */
static void quantize_row(const float *x, signed char *xi, float *d, float *sums, int I, int G, int gs, int mode) {
    float step = 0.f, inv = 0.f, raw = 0.f;  /* raw: max |x| / 127 unrounded */
    for (int g = 0; g < G; g++) sums[g] = 0.f;
    for (int c = 0; c < I / 32; c++) {  /* vectors: one float at a time this was ~1.5 % of a decode step, run alone */
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 32 * c + 8 * k);
        if (mode != XQ8_K || c % 8 == 0) {
            const float amax = mode == XQ8_K ? amax_of(x + 32 * c, 256) : hmax_ps(_mm256_max_ps(
                _mm256_max_ps(abs_ps(v[0]), abs_ps(v[1])), _mm256_max_ps(abs_ps(v[2]), abs_ps(v[3]))));
            inv = amax > 0.f ? 127.f / amax : 0.f;
            raw = amax / 127.f;
            step = mode == XQ8_K ? (amax > 0.f ? 1.f / inv : 0.f) : mode == X32 ? raw : to_half(raw);
        }
        for (int l = 0; l < 4; l++) d[(c / 2) * 8 + (c % 2) * 4 + l] = step;
        __m256i q[4];  /* round to nearest even, as lrintf */
        for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(inv)));
        /* packs work within 128-bit lanes: permute back to input order; |q| <= 127, nothing saturates */
        const __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);  /* inputs 0-15, int16 */
        const __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);  /* inputs 16-31 */
        const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(lo, hi), 0xD8);   /* 0-15 | 16-31 */
        /* chunk c of its block: low nibbles' inputs at bytes 16 (c % 2) + j, high ones' 32 further */
        signed char *o = xi + 64 * (c / 2) + 16 * (c % 2);
        _mm_storeu_si128((__m128i *)o, _mm256_castsi256_si128(bytes));
        _mm_storeu_si128((__m128i *)(o + 32), _mm256_extracti128_si256(bytes, 1));
        const __m256i first = _mm256_add_epi32(q[0], q[1]), second = _mm256_add_epi32(q[2], q[3]);  /* inputs 0-15, 16-31 */
        if (gs == 16) {  /* SIX: two groups a block of 32 */
            sums[2 * c] = step * (float)hsum_epi32(first);
            sums[2 * c + 1] = step * (float)hsum_epi32(second);
        } else if (mode == XQ8_1)  /* gs is 32: Q8_1's s, from the unrounded step */
            sums[c] = to_half(raw * (float)hsum_epi32(_mm256_add_epi32(first, second)));
        else
            sums[c * 32 / gs] += step * (float)hsum_epi32(_mm256_add_epi32(first, second));
    }
}

/* 8 int32 lanes summing to (codes . xi) over one block of 64: lo/hi the codes' nibbles as bytes. */
static inline __m256i block_dot(__m256i lo, __m256i hi, const signed char *xi) {
    const __m256i xl = _mm256_loadu_si256((const __m256i *)xi), xh = _mm256_loadu_si256((const __m256i *)(xi + 32));
#if ISA >= 2
    return DOT(DOT(_mm256_setzero_si256(), lo, xl), hi, xh);
#else
    /* u8 x s8 pairs summed to int16: at most 2 * 31 * 127 each (5-bit codes), twice that after the add: no overflow */
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

/* block_dot's two halves apart: the low nibbles' lanes (dl) and the high ones' (dh), for groups of 16 (SIX) */
static inline void half_dots(__m256i lo, __m256i hi, const signed char *xi, __m256i *dl, __m256i *dh) {
    const __m256i xl = _mm256_loadu_si256((const __m256i *)xi), xh = _mm256_loadu_si256((const __m256i *)(xi + 32));
#if ISA >= 2
    *dl = DOT(_mm256_setzero_si256(), lo, xl);
    *dh = DOT(_mm256_setzero_si256(), hi, xh);
#else
    *dl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_set1_epi16(1));  /* 2 * 63 * 127 a pair at most */
    *dh = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), _mm256_set1_epi16(1));
#endif
}
"""
