#include "reference.h"

#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct narrow {
  int nbits, ebits, mbits, bias;
  int has_inf;   /* IEEE-style all-ones exponent */
  int saturate;  /* out of range -> largest finite (CUDA satfinite) */
  uint32_t nan;
  double *vals;  /* positive finite values, indexed by code */
  int nvals;
  double *all;   /* every code's value */
};

static struct narrow fmts[4] = {
    {16, 5, 10, 15, 1, 0, 0x7e00},  /* float16 */
    {16, 8, 7, 127, 1, 0, 0x7fc0},  /* bfloat16 */
    {8, 4, 3, 7, 0, 1, 0x7f},       /* e4m3 */
    {8, 5, 2, 15, 1, 1, 0x7f},      /* e5m2 */
};

static struct narrow *fmt_of(ccs_dtype_t t) {
  switch (t) {
  case CCS_FLOAT16: return &fmts[0];
  case CCS_BFLOAT16: return &fmts[1];
  case CCS_FLOAT8_E4M3: return &fmts[2];
  case CCS_FLOAT8_E5M2: return &fmts[3];
  default: return NULL;
  }
}

static double decode(const struct narrow *f, uint32_t code) {
  uint32_t sign = code >> (f->nbits - 1) & 1;
  uint32_t e = code >> f->mbits & ((1u << f->ebits) - 1), m = code & ((1u << f->mbits) - 1);
  double v;
  if (f->has_inf && e == (1u << f->ebits) - 1) v = m ? NAN : INFINITY;
  else if (!f->has_inf && e == (1u << f->ebits) - 1 && m == (1u << f->mbits) - 1) v = NAN;
  else if (e == 0) v = ldexp((double)m, 1 - f->bias - f->mbits);
  else v = ldexp(1.0 + ldexp((double)m, -f->mbits), (int)e - f->bias);
  return sign ? -v : v;
}

static void build_tables(void) {
  for (int i = 0; i < 4; i++) {
    struct narrow *f = &fmts[i];
    uint32_t half = 1u << (f->nbits - 1);
    f->vals = malloc(sizeof(double) * half);
    f->nvals = 0;
    f->all = malloc(sizeof(double) * 2 * half);
    for (uint32_t c = 0; c < 2 * half; c++) f->all[c] = decode(f, c);
    for (uint32_t c = 0; c < half; c++) {
      double v = decode(f, c);
      if (!isfinite(v)) break;
      f->vals[f->nvals++] = v;
    }
  }
}

const double *ref_narrow_values[CCS_DTYPE_COUNT];

__attribute__((constructor)) static void init_tables(void) {
  build_tables();
  ref_narrow_values[CCS_FLOAT16] = fmts[0].all;
  ref_narrow_values[CCS_BFLOAT16] = fmts[1].all;
  ref_narrow_values[CCS_FLOAT8_E4M3] = fmts[2].all;
  ref_narrow_values[CCS_FLOAT8_E5M2] = fmts[3].all;
}

double ref_narrow_decode(ccs_dtype_t t, uint32_t code) { return fmt_of(t)->all[code]; }

static uint32_t narrow_encode(const struct narrow *f, double x);

/* Tests encode the same few values millions of times: remember them. */
uint32_t ref_narrow_encode(ccs_dtype_t t, double x) {
  static __thread struct {
    double x;
    uint32_t code;
    int valid;
  } cache[4][1024];
  const struct narrow *f = fmt_of(t);
  uint64_t bits;
  memcpy(&bits, &x, sizeof(bits));
  size_t k = (size_t)(f - fmts), slot = (size_t)((bits * 0x9e3779b97f4a7c15ull) >> 54);
  if (cache[k][slot].valid && !memcmp(&cache[k][slot].x, &x, sizeof(x)))
    return cache[k][slot].code;
  uint32_t code = narrow_encode(f, x);
  cache[k][slot].x = x;
  cache[k][slot].code = code;
  cache[k][slot].valid = 1;
  return code;
}

/* The code whose value is the largest not above a (finite, at most the
 * largest finite value), found by arithmetic on a's exponent and
 * significand: where the search of the table below starts (the table,
 * not this, decides). */
static int code_below(const struct narrow *f, double a) {
  if (a == 0) return 0;
  int e;
  double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  int biased = e - 1 + f->bias;
  double steps = biased >= 1 ? (2 * m - 1) * ldexp(1, f->mbits) : ldexp(a, f->bias - 1 + f->mbits);
  if (biased < 1) biased = 0;
  double code = ldexp(biased, f->mbits) + floor(steps);
  return code >= f->nvals ? f->nvals - 1 : (int)code;
}

static uint32_t narrow_encode(const struct narrow *f, double x) {
  if (isnan(x)) return f->nan;
  uint32_t sign = signbit(x) ? 1u << (f->nbits - 1) : 0;
  double a = fabs(x), max = f->vals[f->nvals - 1];
  uint32_t code;
  if (a > max) {
    double half_ulp = (max - f->vals[f->nvals - 2]) / 2;
    if (f->saturate || (a < max + half_ulp && !isinf(a))) code = (uint32_t)f->nvals - 1;
    else code = (uint32_t)f->nvals; /* the first code past the finite ones: infinity */
  } else {
    int lo = code_below(f, a), hi = lo + 1 < f->nvals ? lo + 1 : lo;
    if (!(f->vals[lo] <= a && a <= f->vals[hi])) { /* not where it should be: search it all */
      lo = 0, hi = f->nvals - 1;                    /* vals[lo] <= a <= vals[hi] */
      while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (f->vals[mid] <= a) lo = mid;
        else hi = mid;
      }
    }
    double dlo = a - f->vals[lo], dhi = f->vals[hi] - a;
    code = (uint32_t)(dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi));
  }
  return sign | code;
}

static const size_t sizes[CCS_DTYPE_COUNT] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8, 1, 1};

uint64_t ref_get_bits(ccs_dtype_t t, const void *buf, size_t i) {
  const char *p = (const char *)buf + i * sizes[t];
  uint8_t b1;
  uint16_t b2;
  uint32_t b4;
  uint64_t b8;
  switch (sizes[t]) { /* little endian, zero-extended */
  case 1: memcpy(&b1, p, 1); return b1;
  case 2: memcpy(&b2, p, 2); return b2;
  case 4: memcpy(&b4, p, 4); return b4;
  default: memcpy(&b8, p, 8); return b8;
  }
}

static void set_bits(ccs_dtype_t t, void *buf, size_t i, uint64_t v) {
  size_t sz = sizes[t];
  memcpy((char *)buf + i * sz, &v, sz);
}

void ref_set_bits(ccs_dtype_t t, void *buf, size_t i, uint64_t bits) { set_bits(t, buf, i, bits); }

void ref_set_int(ccs_dtype_t t, void *buf, size_t i, int64_t v) { set_bits(t, buf, i, (uint64_t)v); }

void ref_set(ccs_dtype_t t, void *buf, size_t i, double v) {
  switch (t) {
  case CCS_FLOAT32: {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    set_bits(t, buf, i, u);
    return;
  }
  case CCS_FLOAT64: {
    uint64_t u;
    memcpy(&u, &v, 8);
    set_bits(t, buf, i, u);
    return;
  }
  case CCS_FLOAT16:
  case CCS_BFLOAT16:
  case CCS_FLOAT8_E4M3:
  case CCS_FLOAT8_E5M2: set_bits(t, buf, i, ref_narrow_encode(t, v)); return;
  default: ref_set_int(t, buf, i, (int64_t)v); return;
  }
}

uint64_t ref_stored_bits(ccs_dtype_t t, double v) {
  uint64_t cell = 0;
  ref_set(t, &cell, 0, v);
  return cell;
}

double ref_stored(ccs_dtype_t t, double v) {
  uint64_t cell = ref_stored_bits(t, v);
  return ref_get(t, &cell, 0);
}

double ref_hop_exact_value(ccs_dtype_t t, ccs_redop_t op, uint64_t h) {
  if (ref_is_float(t) && ccs_dtype_size(t) < 4 && op != CCS_MAX && op != CCS_MIN) {
    if (op == CCS_PROD) return h % 2 ? 1 : -1;
    return (double)(h % 3) - 1;
  }
  return ref_exact_value(t, op, h);
}

double ref_exact_value(ccs_dtype_t t, ccs_redop_t op, uint64_t h) {
  if (op == CCS_PROD) {
    static const int s[] = {1, 2, -1, -2, 1, 3};
    int v = s[h % 6];
    return ref_is_signed(t) ? v : (v < 0 ? -v : v);
  }
  int v = (int)(h % 17) - 8;
  return ref_is_signed(t) ? v : v + 8;
}

/* --- exact bits ------------------------------------------------------- */

static uint64_t width_mask(ccs_dtype_t t) {
  return sizes[t] == 8 ? UINT64_MAX : (UINT64_C(1) << (8 * sizes[t])) - 1;
}

int64_t ref_int_of(ccs_dtype_t t, uint64_t bits) {
  bits &= width_mask(t);
  if (!ref_is_signed(t) || sizes[t] == 8) return (int64_t)bits;
  uint64_t sign = UINT64_C(1) << (8 * sizes[t] - 1);
  return (int64_t)((bits ^ sign) - sign);
}

static double float_of(ccs_dtype_t t, uint64_t bits) {
  switch (t) {
  case CCS_FLOAT32: {
    uint32_t u = (uint32_t)bits;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  case CCS_FLOAT64: {
    double d;
    memcpy(&d, &bits, 8);
    return d;
  }
  default: return ref_narrow_decode(t, (uint32_t)(bits & width_mask(t)));
  }
}

int ref_bits_nan(ccs_dtype_t t, uint64_t bits) { return ref_is_float(t) && isnan(float_of(t, bits)); }

int ref_same_bits(ccs_dtype_t t, uint64_t got, uint64_t want) {
  got &= width_mask(t), want &= width_mask(t);
  return got == want || (ref_bits_nan(t, got) && ref_bits_nan(t, want));
}

static uint64_t int_reduce(ccs_dtype_t t, ccs_redop_t op, size_t divisor, const uint64_t *bits, int n) {
  int sgn = ref_is_signed(t);
  uint64_t acc = bits[0] & width_mask(t);
  for (int j = 1; j < n; j++) {
    uint64_t v = bits[j] & width_mask(t);
    switch (op) {
    case CCS_SUM:
    case CCS_AVG: acc = (acc + v) & width_mask(t); break;
    case CCS_PROD: acc = (acc * v) & width_mask(t); break;
    case CCS_MAX:
      if (sgn ? ref_int_of(t, acc) < ref_int_of(t, v) : acc < v) acc = v;
      break;
    case CCS_MIN:
      if (sgn ? ref_int_of(t, v) < ref_int_of(t, acc) : v < acc) acc = v;
      break;
    default: break;
    }
  }
  if (op == CCS_AVG && divisor > 0)
    acc = sgn ? (uint64_t)(ref_int_of(t, acc) / (int64_t)divisor) : acc / divisor;
  return acc & width_mask(t);
}

/* one step in the accumulator type: a float32 accumulator rounds each
 * result to float */
static double acc_round(ccs_dtype_t t, double x) { return t == CCS_FLOAT64 ? x : (double)(float)x; }

uint64_t ref_reduce_bits(ccs_dtype_t t, ccs_redop_t op, size_t divisor, const uint64_t *bits, int n) {
  if (!ref_is_float(t)) return int_reduce(t, op, divisor, bits, n);
  double acc = float_of(t, bits[0]);
  for (int j = 1; j < n; j++) {
    double v = float_of(t, bits[j]);
    switch (op) {
    case CCS_SUM:
    case CCS_AVG: acc = acc_round(t, acc + v); break;
    case CCS_PROD: acc = acc_round(t, acc * v); break;
    case CCS_MAX: acc = acc < v ? v : acc; break;
    case CCS_MIN: acc = v < acc ? v : acc; break;
    default: break;
    }
  }
  if (op == CCS_AVG && divisor > 0) acc = acc_round(t, acc / (double)divisor);
  uint64_t out = 0;
  if (t == CCS_FLOAT32) {
    float f = (float)acc;
    uint32_t u;
    memcpy(&u, &f, 4);
    out = u;
  } else if (t == CCS_FLOAT64) {
    memcpy(&out, &acc, 8);
  } else {
    out = ref_narrow_encode(t, acc);
  }
  return out;
}

uint64_t ref_random_bits(ccs_dtype_t t, uint64_t h) {
  uint64_t mask = width_mask(t), r = (h ^ h >> 29) * 0xbf58476d1ce4e5b9ull; /* the value's own bits */
  if (ref_is_float(t) || h >> 62) return r & mask;
  int sgn = ref_is_signed(t);
  uint64_t top = UINT64_C(1) << (8 * sizes[t] - 1);
  switch ((h >> 56) % 6) {
  case 0: return 0;
  case 1: return 1;
  case 2: return mask; /* -1, or the unsigned maximum */
  case 3: return sgn ? top - 1 : top;       /* the largest, or the high bit alone */
  case 4: return sgn ? top : top - 1;       /* the smallest, or the largest below the high bit */
  default: return sgn ? top + 1 : mask - 1; /* the smallest but one, or the maximum but one */
  }
}
