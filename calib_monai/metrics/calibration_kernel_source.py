"""The C source of ``calibration_kernel``, compiled at first use: kept apart so the Python glue stays
short. Entry points: ``calib_chunk`` (ECE bins and bucket histograms of a chunk), ``calib_refine`` (the values of
marked buckets), ``calib_count`` / ``calib_select`` (the "gt" voxel selection with the input checks' extremes),
``calib_gt`` (the selection, ECE's bins and the bucket histograms of a volume in one pass over its labels)."""

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Label dtypes: 0 uint8, 1 int8, 2 int16, 3 int32, 4 int64, read in place (no int64 copy). Several copies (lanes)
   of each accumulator, merged at the end: consecutive voxels often hit the same bin, and one read-modify-write
   chain through memory would serialise the loop. */
#define LANES 4
#define PACK_ONE ((int64_t)1 << 40)

static inline int64_t bucket(int32_t w, int32_t offset) {
    int32_t key = w >> 13;
    return (int64_t)(key < offset ? offset : key) - offset; /* 0: below the grid, or -0.0 */
}

/* equal-width bin (lo, hi] of a value in [0, 1]: ceil(v m) - 1, corrected by the float edges' tables */
static inline int64_t equal_width_bin(double v64, int64_t m, const double *lower, const double *upper) {
    double t = v64 * (double)m, whole = (double)(int64_t)t;
    double up = t > whole ? whole + 1.0 : whole; /* ceil, t >= 0 */
    int64_t b = (int64_t)(up < 1.0 ? 1.0 : (up > (double)m ? (double)m : up)) - 1;
    b -= v64 <= lower[b];
    return b + (v64 > upper[b]);
}

/* packed[k * size + q] += count << 40 + low 13 bits; zero_sum[k] += bucket 0's values: class by class, row-wise */
static int grid_rows(const float *p, int64_t n, int64_t c, int64_t size, int32_t offset, int64_t *packed,
                     double *zero_sum) {
    int64_t *lanes = calloc((size_t)(LANES * size), sizeof(int64_t));
    if (!lanes) return 1;
    for (int64_t k = 0; k < c; ++k) {
        const float *row = p + k * n;
        const int32_t *bits = (const int32_t *)row;
        double z[LANES] = {0.0};
        int64_t i = 0;
        for (; i + LANES <= n; i += LANES) {
            for (int l = 0; l < LANES; ++l) {
                int32_t w = bits[i + l];
                int64_t q = bucket(w, offset);
                lanes[l * size + q] += PACK_ONE + (int64_t)(w & 8191);
                z[l] += q == 0 ? (double)row[i + l] : 0.0;
            }
        }
        for (; i < n; ++i) {
            int32_t w = bits[i];
            int64_t q = bucket(w, offset);
            lanes[q] += PACK_ONE + (int64_t)(w & 8191);
            z[0] += q == 0 ? (double)row[i] : 0.0;
        }
        int64_t *out = packed + k * size;
        for (int64_t q = 0; q < size; ++q) {
            int64_t sum = 0;
            for (int l = 0; l < LANES; ++l) {
                sum += lanes[l * size + q];
                lanes[l * size + q] = 0;
            }
            out[q] += sum;
        }
        zero_sum[k] += (z[0] + z[1]) + (z[2] + z[3]);
    }
    free(lanes);
    return 0;
}

#define DEFINE(T, SUFFIX)                                                                                         \
static int chunk_##SUFFIX(const float *p, int64_t n, int64_t c, const T *y, int64_t m, const double *lower,      \
                          const double *upper, int64_t *ece_count, double *ece_sum, int64_t size, int32_t offset, \
                          int64_t *packed, int64_t *hit, double *zero_sum, int do_ece, int do_grid) {            \
    const int32_t *bits = (const int32_t *)p;                                                                     \
    if (do_ece) {                                                                                                 \
        int64_t *counts = calloc((size_t)(LANES * 2 * m), sizeof(int64_t));                                       \
        double *sums = calloc((size_t)(LANES * m), sizeof(double));                                               \
        if (!counts || !sums) { free(counts); free(sums); return 1; }                                             \
        for (int64_t i = 0; i < n; ++i) {                                                                         \
            float conf = p[i]; /* first argmax, as torch.max and NumPy */                                         \
            int64_t arg = 0;                                                                                      \
            for (int64_t k = 1; k < c; ++k) {                                                                     \
                float v = p[k * n + i];                                                                           \
                int above = v > conf; /* branch-free: which class wins follows no pattern */                      \
                arg = above ? k : arg;                                                                            \
                conf = above ? v : conf;                                                                          \
            }                                                                                                     \
            double v64 = (double)conf;                                                                            \
            int64_t b = equal_width_bin(v64, m, lower, upper);                                                    \
            int64_t l = i & (LANES - 1);                                                                          \
            counts[l * 2 * m + 2 * b + (arg == (int64_t)y[i])] += 1;                                              \
            sums[l * m + b] += v64;                                                                               \
        }                                                                                                         \
        for (int l = 0; l < LANES; ++l) {                                                                         \
            for (int64_t b = 0; b < 2 * m; ++b) ece_count[b] += counts[l * 2 * m + b];                            \
            for (int64_t b = 0; b < m; ++b) ece_sum[b] += sums[l * m + b];                                        \
        }                                                                                                         \
        free(counts);                                                                                             \
        free(sums);                                                                                               \
    }                                                                                                             \
    if (do_grid) {                                                                                                \
        if (grid_rows(p, n, c, size, offset, packed, zero_sum)) return 1;                                         \
        for (int64_t i = 0; i < n; ++i) { /* hits: the bucket of each voxel's own class */                        \
            int64_t k = (int64_t)y[i];                                                                            \
            if (k < 0 || k >= c) return 2; /* never a write outside the tables */                                 \
            hit[k * size + bucket(bits[k * n + i], offset)] += 1;                                                 \
        }                                                                                                         \
    }                                                                                                             \
    return 0;                                                                                                     \
}                                                                                                                 \
static int64_t refine_##SUFFIX(const float *p, int64_t n, int64_t stride, int64_t c, const T *y, int64_t size,  \
                               int32_t offset, const uint8_t *lut, int64_t cap, int64_t *keys, float *values,     \
                               uint8_t *hits) {                                                                   \
    const int32_t *bits = (const int32_t *)p;                                                                     \
    int64_t j = 0;                                                                                                \
    for (int64_t k = 0; k < c; ++k) {                                                                             \
        const uint8_t *marks = lut + k * size;                                                                    \
        for (int64_t i = 0; i < n; ++i) {                                                                         \
            int64_t q = bucket(bits[k * stride + i], offset);                                                     \
            if (!marks[q]) continue;                                                                              \
            if (j < cap) { keys[j] = k * size + q; values[j] = p[k * stride + i]; hits[j] = (int64_t)y[i] == k; } \
            ++j;                                                                                                  \
        }                                                                                                         \
    }                                                                                                             \
    return j;                                                                                                     \
}

/* "gt" selection: voxels with y != 0, copied out as (C, n) and (n,), with the extremes the input checks need */
#define SELECT(T, SUFFIX)                                                                                         \
static int64_t count_##SUFFIX(const T *y, int64_t size) {                                                         \
    int64_t n = 0;                                                                                                \
    for (int64_t i = 0; i < size; ++i) n += y[i] != 0;                                                            \
    return n;                                                                                                     \
}                                                                                                                 \
static void select_##SUFFIX(const float *p, int64_t size, int64_t c, const T *y, int64_t n, float *out_p,        \
                            T *out_y, double *extremes) {                                                         \
    float lo = INFINITY, hi = -INFINITY, sum_lo = INFINITY, sum_hi = -INFINITY;                                   \
    int64_t ylo = INT64_MAX, yhi = INT64_MIN, j = 0, nan = 0;                                                     \
    for (int64_t i = 0; i < size; ++i) {                                                                          \
        if (y[i] == 0) continue;                                                                                  \
        float total = 0.0f;                                                                                       \
        for (int64_t k = 0; k < c; ++k) {                                                                         \
            float v = p[k * size + i];                                                                            \
            out_p[k * n + j] = v;                                                                                 \
            nan |= v != v;                                                                                        \
            lo = v < lo ? v : lo;                                                                                 \
            hi = v > hi ? v : hi;                                                                                 \
            total += v;                                                                                           \
        }                                                                                                         \
        int64_t t = (int64_t)y[i];                                                                                \
        sum_lo = total < sum_lo ? total : sum_lo;                                                                 \
        sum_hi = total > sum_hi ? total : sum_hi;                                                                 \
        ylo = t < ylo ? t : ylo;                                                                                  \
        yhi = t > yhi ? t : yhi;                                                                                  \
        out_y[j++] = y[i];                                                                                        \
    }                                                                                                             \
    if (nan) lo = hi = sum_lo = sum_hi = NAN;                                                                     \
    extremes[0] = lo; extremes[1] = hi; extremes[2] = sum_lo; extremes[3] = sum_hi;                               \
    extremes[4] = (double)ylo; extremes[5] = (double)yhi;                                                         \
}

SELECT(uint8_t, u8)
SELECT(int8_t, i8)
SELECT(int16_t, i16)
SELECT(int32_t, i32)
SELECT(int64_t, i64)

int64_t calib_count(const void *y, int ytype, int64_t size) {
    switch (ytype) {
        case 0: return count_u8((const uint8_t *)y, size);
        case 1: return count_i8((const int8_t *)y, size);
        case 2: return count_i16((const int16_t *)y, size);
        case 3: return count_i32((const int32_t *)y, size);
        default: return count_i64((const int64_t *)y, size);
    }
}

void calib_select(const float *p, int64_t size, int64_t c, const void *y, int ytype, int64_t n, float *out_p,
                  void *out_y, double *extremes) {
    switch (ytype) {
        case 0: select_u8(p, size, c, (const uint8_t *)y, n, out_p, (uint8_t *)out_y, extremes); break;
        case 1: select_i8(p, size, c, (const int8_t *)y, n, out_p, (int8_t *)out_y, extremes); break;
        case 2: select_i16(p, size, c, (const int16_t *)y, n, out_p, (int16_t *)out_y, extremes); break;
        case 3: select_i32(p, size, c, (const int32_t *)y, n, out_p, (int32_t *)out_y, extremes); break;
        default: select_i64(p, size, c, (const int64_t *)y, n, out_p, (int64_t *)out_y, extremes); break;
    }
}

DEFINE(uint8_t, u8)
DEFINE(int8_t, i8)
DEFINE(int16_t, i16)
DEFINE(int32_t, i32)
DEFINE(int64_t, i64)

int calib_chunk(const float *p, int64_t n, int64_t c, const void *y, int ytype, int64_t m, const double *lower,
                const double *upper, int64_t *ece_count, double *ece_sum, int64_t size, int32_t offset,
                int64_t *packed, int64_t *hit, double *zero_sum, int do_ece, int do_grid) {
#define CALL(T, S) chunk_##S(p, n, c, (const T *)y, m, lower, upper, ece_count, ece_sum, size, offset, packed, hit, \
                             zero_sum, do_ece, do_grid)
    switch (ytype) {
        case 0: return CALL(uint8_t, u8);
        case 1: return CALL(int8_t, i8);
        case 2: return CALL(int16_t, i16);
        case 3: return CALL(int32_t, i32);
        default: return CALL(int64_t, i64);
    }
}

int64_t calib_refine(const float *p, int64_t n, int64_t stride, int64_t c, const void *y, int ytype, int64_t size,
                     int32_t offset, const uint8_t *lut, int64_t cap, int64_t *keys, float *values, uint8_t *hits) {
#define REFINE(T, S) refine_##S(p, n, stride, c, (const T *)y, size, offset, lut, cap, keys, values, hits)
    switch (ytype) {
        case 0: return REFINE(uint8_t, u8);
        case 1: return REFINE(int8_t, i8);
        case 2: return REFINE(int16_t, i16);
        case 3: return REFINE(int32_t, i32);
        default: return REFINE(int64_t, i64);
    }
}

/* "gt" voxels of a volume slab p (C rows of `stride`, voxels [0, size)) in one pass over its labels: each selected
   voxel's values are copied to out_p (C rows of `cap`, for calib_refine) and its label to out_y (uint8, c <= 256),
   its top label goes into ECE's bins (bucket -> bin table `ece_lut`, `m` for a bucket that straddles an edge) and
   its class values into the bucket histograms, as calib_chunk; with the extremes of the input checks. Class values
   are added voxel by voxel: the histograms' read-modify-write chains of the C classes interleave, with no lanes to
   merge. A label outside [0, c) or a value outside [0, 1] writes nothing outside the tables (the caller raises). */
#define GT(T, SUFFIX)                                                                                             \
static int64_t gt_##SUFFIX(const float *p, int64_t stride, int64_t size, int64_t c, const T *y, int64_t cap,      \
                           float *out_p, uint8_t *out_y, double *extremes, int64_t m, const uint8_t *ece_lut,     \
                           const double *lower, const double *upper, int64_t *ece_count, double *ece_sum,        \
                           int64_t gsize, int32_t offset, int64_t *packed, int64_t *hit, double *zero_sum,       \
                           int do_ece, int do_grid) {                                                             \
    float lo = INFINITY, hi = -INFINITY, sum_lo = INFINITY, sum_hi = -INFINITY;                                   \
    int64_t ylo = INT64_MAX, yhi = INT64_MIN, j = 0, top = gsize - 1;                                             \
    int nan = 0;                                                                                                  \
    int64_t *counts = calloc((size_t)(LANES * 2 * m + 1), sizeof(int64_t));                                       \
    double *sums = calloc((size_t)(LANES * m + 1), sizeof(double)), *z = calloc((size_t)c, sizeof(double));       \
    if (!counts || !sums || !z) { free(counts); free(sums); free(z); return -1; }                                 \
    for (int64_t i = 0; i < size; ++i) {                                                                          \
        if (y[i] == 0) continue;                                                                                  \
        int64_t t = (int64_t)y[i];                                                                                \
        ylo = t < ylo ? t : ylo;                                                                                  \
        yhi = t > yhi ? t : yhi;                                                                                  \
        float total = 0.0f, conf = -INFINITY;                                                                     \
        int64_t arg = 0;                                                                                          \
        for (int64_t k = 0; k < c; ++k) {                                                                         \
            float v = p[k * stride + i];                                                                          \
            out_p[k * cap + j] = v;                                                                               \
            nan |= v != v;                                                                                        \
            lo = v < lo ? v : lo;                                                                                 \
            hi = v > hi ? v : hi;                                                                                 \
            total += v;                                                                                           \
            int above = v > conf; /* first argmax, as torch.max */                                                \
            arg = above ? k : arg;                                                                                \
            conf = above ? v : conf;                                                                              \
            if (do_grid) {                                                                                        \
                int32_t w;                                                                                        \
                memcpy(&w, &v, sizeof w);                                                                         \
                int64_t q = bucket(w, offset);                                                                    \
                q = q > top ? top : q; /* above 1 or NaN: raised by the caller */                                 \
                packed[k * gsize + q] += PACK_ONE + (int64_t)(w & 8191);                                          \
                z[k] += q == 0 ? (double)v : 0.0;                                                                 \
                if (k == t) hit[k * gsize + q] += 1;                                                              \
            }                                                                                                     \
        }                                                                                                         \
        sum_lo = total < sum_lo ? total : sum_lo;                                                                 \
        sum_hi = total > sum_hi ? total : sum_hi;                                                                 \
        out_y[j] = (uint8_t)t;                                                                                    \
        if (do_ece && t >= 0 && t < c) {                                                                          \
            int32_t w;                                                                                            \
            memcpy(&w, &conf, sizeof w);                                                                          \
            int64_t q = bucket(w, offset);                                                                        \
            q = q > top ? top : q;                                                                                \
            /* the bucket's bin, or for a bucket across a bin edge the comparison with the edges */              \
            int64_t b = ece_lut[q] < m ? ece_lut[q] : equal_width_bin((double)conf, m, lower, upper);             \
            int64_t l = j & (LANES - 1);                                                                          \
            counts[l * 2 * m + 2 * b + (arg == t)] += 1;                                                          \
            sums[l * m + b] += (double)conf;                                                                      \
        }                                                                                                         \
        ++j;                                                                                                      \
    }                                                                                                             \
    for (int l = 0; l < LANES && do_ece; ++l) {                                                                   \
        for (int64_t b = 0; b < 2 * m; ++b) ece_count[b] += counts[l * 2 * m + b];                                \
        for (int64_t b = 0; b < m; ++b) ece_sum[b] += sums[l * m + b];                                            \
    }                                                                                                             \
    for (int64_t k = 0; k < c && do_grid; ++k) zero_sum[k] += z[k];                                               \
    free(counts);                                                                                                 \
    free(sums);                                                                                                   \
    free(z);                                                                                                      \
    if (nan) lo = hi = sum_lo = sum_hi = NAN;                                                                     \
    extremes[0] = lo; extremes[1] = hi; extremes[2] = sum_lo; extremes[3] = sum_hi;                               \
    extremes[4] = (double)ylo; extremes[5] = (double)yhi;                                                         \
    return j;                                                                                                     \
}

GT(uint8_t, u8)
GT(int8_t, i8)
GT(int16_t, i16)
GT(int32_t, i32)
GT(int64_t, i64)

int64_t calib_gt(const float *p, int64_t stride, int64_t size, int64_t c, const void *y, int ytype, int64_t cap,
                 float *out_p, uint8_t *out_y, double *extremes, int64_t m, const uint8_t *ece_lut, const double *lower,
                 const double *upper, int64_t *ece_count, double *ece_sum, int64_t gsize, int32_t offset,
                 int64_t *packed, int64_t *hit, double *zero_sum, int do_ece, int do_grid) {
#define GT_CALL(T, S) gt_##S(p, stride, size, c, (const T *)y, cap, out_p, out_y, extremes, m, ece_lut, lower, upper, \
                             ece_count, ece_sum, gsize, offset, packed, hit, zero_sum, do_ece, do_grid)
    switch (ytype) {
        case 0: return GT_CALL(uint8_t, u8);
        case 1: return GT_CALL(int8_t, i8);
        case 2: return GT_CALL(int16_t, i16);
        case 3: return GT_CALL(int32_t, i32);
        default: return GT_CALL(int64_t, i64);
    }
}

"""
