#include "reference.h"

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
    int lo = 0, hi = f->nvals - 1; /* vals[lo] <= a <= vals[hi] */
    while (hi - lo > 1) {
      int mid = (lo + hi) / 2;
      if (f->vals[mid] <= a) lo = mid;
      else hi = mid;
    }
    double dlo = a - f->vals[lo], dhi = f->vals[hi] - a;
    code = (uint32_t)(dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi));
  }
  return sign | code;
}


int ref_mantissa_bits(ccs_dtype_t t) {
  switch (t) {
  case CCS_FLOAT16: return 10;
  case CCS_BFLOAT16: return 7;
  case CCS_FLOAT32: return 23;
  case CCS_FLOAT64: return 52;
  case CCS_FLOAT8_E4M3: return 3;
  case CCS_FLOAT8_E5M2: return 2;
  default: return 0;
  }
}

static const size_t sizes[CCS_DTYPE_COUNT] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8, 1, 1};

uint64_t ref_get_bits(ccs_dtype_t t, const void *buf, size_t i) {
  size_t sz = sizes[t];
  uint64_t v = 0;
  memcpy(&v, (const char *)buf + i * sz, sz); /* little endian */
  return v;
}

static void set_bits(ccs_dtype_t t, void *buf, size_t i, uint64_t v) {
  size_t sz = sizes[t];
  memcpy((char *)buf + i * sz, &v, sz);
}

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

int ref_close(ccs_dtype_t t, double got, double want) {
  if (!ref_is_float(t)) return got == want;
  if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
  if (isinf(want) || isinf(got)) return got == want;
  double tol = ldexp(fabs(want), -ref_mantissa_bits(t));
  if (t == CCS_FLOAT8_E4M3 || t == CCS_FLOAT8_E5M2 || t == CCS_FLOAT16 || t == CCS_BFLOAT16) {
    /* the smallest subnormal step bounds the error near zero */
    double step = t == CCS_FLOAT16 ? 0x1p-24 : t == CCS_BFLOAT16 ? 0x1p-133
                  : t == CCS_FLOAT8_E4M3 ? 0x1p-9 : 0x1p-16;
    if (tol < step) tol = step;
  }
  return fabs(got - want) <= tol;
}

int64_t ref_wrap(ccs_dtype_t t, int64_t v) {
  switch (t) {
  case CCS_INT8: return (int8_t)v;
  case CCS_UINT8: return (uint8_t)v;
  case CCS_INT32: return (int32_t)v;
  case CCS_UINT32: return (uint32_t)v;
  default: return v;
  }
}

double ref_reduce(ccs_dtype_t t, ccs_redop_t op, const double *values, int n) {
  double acc = values[0];
  int64_t iacc = (int64_t)values[0];
  for (int j = 1; j < n; j++) {
    double v = values[j];
    int64_t iv = (int64_t)v;
    switch (op) {
    case CCS_SUM:
    case CCS_AVG: acc += v, iacc = (int64_t)((uint64_t)iacc + (uint64_t)iv); break;
    case CCS_PROD: acc *= v, iacc = (int64_t)((uint64_t)iacc * (uint64_t)iv); break;
    case CCS_MAX: acc = v > acc ? v : acc, iacc = iv > iacc ? iv : iacc; break;
    case CCS_MIN: acc = v < acc ? v : acc, iacc = iv < iacc ? iv : iacc; break;
    default: break;
    }
  }
  if (ref_is_float(t)) return op == CCS_AVG ? acc / n : acc;
  return (double)(op == CCS_AVG ? ref_wrap(t, iacc) / n : ref_wrap(t, iacc));
}

double ref_reduced(ref_input_fn input, ccs_dtype_t t, ccs_redop_t op, uint64_t key, int n, size_t i) {
  double v[REF_MAX_RANKS];
  if (n > REF_MAX_RANKS) abort();
  for (int r = 0; r < n; r++) v[r] = input(t, op, key, r, i);
  return ref_reduce(t, op, v, n);
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
