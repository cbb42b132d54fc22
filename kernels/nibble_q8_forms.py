"""The C of ``nibble_q8_cpu``'s forms (``nibble_forms``): the constants naming how a weight's scales and offsets are
held, and how the kernel's tile reads a row's scales, its offsets' term and Q5_0's fifth bits in each. Pasted into
that kernel's source inside its AVX2 block (immintrin.h and string.h included there); imports nothing.
"""

FORMS = r"""
/* How a weight's scales and offsets are held (``compact``): F32 both fp32; F16 both fp16 (a GGUF's Q4_1, whose d and
   m are fp16); SYM fp16 scales and no offsets, w = s (q - 8) (Q4_0). At g32 a row of W reads 6 bits a weight as F32,
   5.5 as F16 and 4.5 as SYM (llama.cpp's Q4_0 bytes). FIVE: SYM's with a fifth bit a code from a plane of masks,
   w = s (q - 16) (Q5_0 held as ``nibble_five`` lays it out: 5.5 bits a weight, as the file). */
#define F32 0
#define F16 1
#define SYM 2
#define FIVE 3
/* SUPER: Q4_K's super-blocks, (k_scale, k_offset) bytes per group of 32 and fp32 (unit_scale, unit_offset) per 8
   groups (``nibble_forms``): 4.75 bits a weight. */
#define SUPER 4
/* SIX: Q6_K as ``nibble_six`` lays it out: nibbles, their top 2 bits as crumbs in the offsets' place, and
   per super-block of 16 groups of 16 their int8 sub-scales then an fp32 unit; w = unit k (q - 32), 6.625 bits. */
#define SIX 5
#define ZERO(fmt) (fmt == FIVE ? -16.f : -8.f)
#define SIX_BYTES 20  /* a SIX super-block's scale bytes */

/* Bytes of a row's second array (``of``) where it is row-major: offsets (F32, F16: es a group; SUPER: the row's units,
   two fp32 per 8 groups), Q5_0's fifth bits (FIVE: a bit an input) or nothing (SYM). */
static inline size_t offsets_row_bytes(const int fmt, int I, int G, int es) {
    switch (fmt) {
    case SYM: return 0;
    case FIVE: return (size_t)I / 8;
    case SUPER: return (size_t)G;
    default: return (size_t)G * es;
    }
}

/* Row o's offsets (``of``): row-major, or SIX's crumbs tiled by 4 rows as the codes are (row_tiles.py) */
static inline const char *offsets_at(const void *of, int o, const int fmt, int I, int G, int es) {
    if (fmt == SIX) return (const char *)of + (size_t)(o - o % 4) * (I / 4) + 32 * (o % 4);
    return (const char *)of + (size_t)o * offsets_row_bytes(fmt, I, G, es);
}

/* Bytes of a row's scales (``sc``): es a group, SIX's 20 a super-block of 16 groups. */
static inline size_t scales_row_bytes(const int fmt, int G, int es) {
    return fmt == SIX ? (size_t)G / 16 * SIX_BYTES : (size_t)G * es;
}

/* A SIX row's scales of block b's four groups of 16 (s: the row's scale bytes): lo lanes 0-3 group 4b, 4-7 group
   4b + 2 (the low nibbles' inputs 0-15 and 32-47), hi lanes the groups 4b + 1 and 4b + 3. */
static inline __attribute__((always_inline)) void six_scales(const unsigned char *s, int b, __m256 *lo, __m256 *hi) {
    const unsigned char *blk = s + (size_t)(b / 4) * SIX_BYTES;
    int four;
    float unit;
    memcpy(&four, blk + 4 * (b % 4), sizeof four);
    memcpy(&unit, blk + 16, sizeof unit);
    const __m128 k = _mm_mul_ps(_mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four))), _mm_set1_ps(unit));
    const __m256 k8 = _mm256_castps128_ps256(k);
    *lo = _mm256_permutevar8x32_ps(k8, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
    *hi = _mm256_permutevar8x32_ps(k8, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
}

/* 8 of a SIX row's offsets from group g (a multiple of 8): -32 times their scales */
static inline __attribute__((always_inline)) __m256 six_offsets8(const unsigned char *s, int g) {
    const unsigned char *blk = s + (size_t)(g / 16) * SIX_BYTES;
    float unit;
    memcpy(&unit, blk + 16, sizeof unit);
    const __m256 k = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + g % 16))));
    return _mm256_mul_ps(k, _mm256_set1_ps(-32.f * unit));
}

/* 32 bytes, 16 where bit k of the little-endian 32-bit mask at p is set, else 0: a code's fifth bit in place */
static inline __m256i fifth_bits(const unsigned char *p) {
    unsigned int m;
    memcpy(&m, p, sizeof m);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_mov_epi8(m, _mm256_set1_epi8(16));
#else
    /* ggml's bytes_from_bits_32: byte k takes byte k / 8 of the mask, every bit set but bit k % 8 */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), _mm256_set_epi64x(
        0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i all = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(all, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(16));
#endif
}

/* Row n's scales of groups g (lanes 0-3) and g + 1 (lanes 4-7) at gs 32, else of group g in every lane. */
static inline __attribute__((always_inline)) __m256 scale_vector(const void *sc, const void *of, size_t at, int gs,
                                                                  const int fmt) {
    if (fmt == SUPER) {  /* gs 32: groups at and at + 1, one super-block */
        const unsigned char *k = (const unsigned char *)sc + 2 * at;
        const float unit = ((const float *)of)[2 * (at / 8)];
        return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(unit * k[0])), _mm_set1_ps(unit * k[2]), 1);
    }
    if (fmt == F32) {
        const float *s = (const float *)sc + at;
        return gs == 32 ? _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(s[0])), _mm_set1_ps(s[1]), 1)
                        : _mm256_set1_ps(s[0]);
    }
    const unsigned short *h = (const unsigned short *)sc + at;
    if (gs != 32) return _mm256_set1_ps(_cvtsh_ss(h[0]));
    int two;
    memcpy(&two, h, sizeof two);
    const __m128 s = _mm_cvtph_ps(_mm_cvtsi32_si128(two));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

/* 8 of row n's offsets from group at (fp32 or fp16; SYM, FIVE: -8 or -16 times the scales) */
static inline __attribute__((always_inline)) __m256 offsets8(const void *sc, const void *of, size_t at, const int fmt) {
    if (fmt == F32) return _mm256_loadu_ps((const float *)of + at);
    if (fmt == SUPER) {  /* at: a whole super-block; its 8 offset bytes are every second byte */
        const __m128i pairs = _mm_loadu_si128((const __m128i *)((const unsigned char *)sc + 2 * at));
        const __m128i k = _mm_shuffle_epi8(pairs, _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(k)), _mm256_set1_ps(((const float *)of)[2 * (at / 8) + 1]));
    }
    const void *src = fmt >= SYM ? (const unsigned short *)sc + at : (const unsigned short *)of + at;
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
    return fmt >= SYM ? _mm256_mul_ps(v, _mm256_set1_ps(ZERO(fmt))) : v;
}

static inline float offset1(const void *sc, const void *of, size_t at, const int fmt) {
    if (fmt == F32) return ((const float *)of)[at];
    if (fmt == SUPER) return ((const float *)of)[2 * (at / 8) + 1] * ((const unsigned char *)sc)[2 * at + 1];
    return fmt >= SYM ? ZERO(fmt) * _cvtsh_ss(((const unsigned short *)sc)[at]) : _cvtsh_ss(((const unsigned short *)of)[at]);
}
"""
