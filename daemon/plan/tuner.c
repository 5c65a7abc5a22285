#include "plan/tuner.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct link_model ccsd_link_tcp = {20e-6, 1.6e9, 0};
const struct link_model ccsd_link_mapped = {0, 0, 1};

int ccsd_algo_builds(enum sched_algo a, enum sched_coll c, int n) {
  struct schedule s;
  if (sched_build(a, c, n, 0, 0, 1, &s)) return 0;
  sched_free(&s);
  return 1;
}

static double log2i(int n) { return n > 1 ? ceil(log2((double)n)) : 0; }

double ccsd_algo_cost(enum sched_algo a, enum sched_coll c, int n, uint64_t bytes,
                      const struct link_model *link) {
  double al = link->alpha_s, S = (double)bytes / link->beta_Bps, f = (double)(n - 1) / n;
  double lg = log2i(n);
  if (n == 1) return 0;
  /* pipelined chains and trees cut the message into chunks of ~1 MiB */
  double k = bytes > (1u << 20) ? (double)bytes / (1u << 20) : 1;
  int pow2 = (n & (n - 1)) == 0;
  switch (a) {
  case SCHED_RING:
    switch (c) {
    case SCHED_ALL_REDUCE: return 2 * (n - 1) * al + 2 * f * S;
    case SCHED_REDUCE_SCATTER: case SCHED_ALL_GATHER: return (n - 1) * al + f * S;
    case SCHED_BROADCAST: case SCHED_REDUCE: return (n - 2 + k) * al + S * (k + n - 2) / k;
    default: return INFINITY;
    }
  case SCHED_TREE:
    switch (c) {
    case SCHED_BROADCAST: case SCHED_REDUCE: return (lg + k - 1) * al + lg * S / (k > lg ? 1 : lg / k);
    case SCHED_ALL_REDUCE: /* double binary tree: half of the data up and down each tree */
      return 2 * (lg + k - 1) * al + 2 * S;
    case SCHED_GATHER: case SCHED_SCATTER: return lg * al + f * S;
    default: return INFINITY;
    }
  case SCHED_RHD:
    switch (c) {
    case SCHED_ALL_REDUCE: return 2 * lg * al + 2 * f * S + (pow2 ? 0 : 2 * al + 2 * S);
    case SCHED_REDUCE_SCATTER: case SCHED_ALL_GATHER: /* folding costs a step and a copy */
      return pow2 ? lg * al + f * S : (lg + 2) * al + f * S + S;
    default: return INFINITY;
    }
  case SCHED_DIRECT: /* a sender injects its n-1 messages one after another */
    switch (c) {
    case SCHED_ALL_REDUCE: case SCHED_BROADCAST: case SCHED_REDUCE: return (n - 1) * (al + S);
    case SCHED_ALL_GATHER: case SCHED_REDUCE_SCATTER: case SCHED_ALL_TO_ALL:
    case SCHED_GATHER: case SCHED_SCATTER: return (n - 1) * al + f * S;
    default: return INFINITY;
    }
  default: return INFINITY;
  }
}

/* "64K", "1.5M", "max": digits first (strtod alone takes "nan", "inf",
 * hex and exponents, none of which is a size). */
static int parse_bytes(const char *s, uint64_t *ret) {
  if (!strcmp(s, "max")) {
    *ret = UINT64_MAX;
    return 0;
  }
  if (!isdigit((unsigned char)s[0])) return -1;
  for (const char *c = s; *c; c++)
    if (!isdigit((unsigned char)*c) && *c != '.' && !strchr("KkMmGg", *c)) return -1;
  char *end;
  double v = strtod(s, &end);
  if (end == s || !isfinite(v) || v < 0) return -1;
  if (*end == 'K' || *end == 'k') v *= 1024, end++;
  else if (*end == 'M' || *end == 'm') v *= 1048576, end++;
  else if (*end == 'G' || *end == 'g') v *= 1073741824.0, end++;
  if (*end || v > 1.8e19) return -1;
  *ret = (uint64_t)v;
  return 0;
}

static int find(const char *name, const char *(*namer)(int), int count) {
  for (int i = 0; i < count; i++)
    if (!strcmp(name, namer(i))) return i;
  return -1;
}
static const char *coll_namer(int i) { return sched_coll_name((enum sched_coll)i); }
static const char *algo_namer(int i) { return sched_algo_name((enum sched_algo)i); }

int ccsd_algo_rules_parse(const char *text, struct algo_rules *ret, char *err, size_t errlen) {
  struct algo_rules rules = {.n = 0};
  char copy[2048];
  if (strlen(text) >= sizeof(copy)) {
    snprintf(err, errlen, "algorithm rules longer than %zu characters", sizeof(copy) - 1);
    return -1;
  }
  strcpy(copy, text);
  char *save;
  for (char *rule_ = strtok_r(copy, ";", &save); rule_; rule_ = strtok_r(NULL, ";", &save)) {
    while (*rule_ == ' ') rule_++;
    for (size_t len = strlen(rule_); len && rule_[len - 1] == ' ';) rule_[--len] = 0;
    if (!*rule_) continue;
    char rule[256]; /* as written, for messages (tokenising cuts rule_) */
    snprintf(rule, sizeof(rule), "%s", rule_);
    if (rules.n == CCSD_MAX_RULES) {
      snprintf(err, errlen, "more than %d algorithm rules", CCSD_MAX_RULES);
      return -1;
    }
    /* fields split exactly: an empty one ("ring::0-1K", ":") is an error,
     * not skipped */
    char *f[4] = {0};
    int nf = 0;
    for (char *rest = rule_, *t; (t = strsep(&rest, ":")) != NULL;) {
      if (nf == 4 || !*t) {
        snprintf(err, errlen, "rule '%s': %s", rule, nf == 4 ? "more than 4 fields" : "an empty field");
        return -1;
      }
      f[nf++] = t;
    }
    struct algo_rule r = {-1, SCHED_RING, 0, UINT64_MAX};
    int i = 0, coll = find(f[0], coll_namer, SCHED_COLL_COUNT);
    if (coll >= 0) r.coll = coll, i = 1;
    int algo = i < nf ? find(f[i], algo_namer, SCHED_ALGO_COUNT) : -1;
    if (algo < 0) {
      snprintf(err, errlen, "rule '%s': '%s' is not an algorithm (direct, ring, tree, rhd)%s", rule,
               i < nf ? f[i] : "", coll < 0 && i == 0 ? " nor a collective" : "");
      return -1;
    }
    r.algo = (enum sched_algo)algo;
    i++;
    if (i < nf) {
      char *dash = strchr(f[i], '-');
      if (!dash) {
        snprintf(err, errlen, "rule '%s': size range '%s' is not LO-HI (e.g. 0-64K, 1M-max)", rule, f[i]);
        return -1;
      }
      *dash = 0;
      if (parse_bytes(f[i], &r.lo) || parse_bytes(dash + 1, &r.hi) || r.lo > r.hi) {
        snprintf(err, errlen, "rule '%s': bad size range", rule);
        return -1;
      }
      i++;
    }
    if (i < nf) {
      snprintf(err, errlen, "rule '%s': unexpected '%s'", rule, f[i]);
      return -1;
    }
    /* a named collective must be one the algorithm builds (for some n) */
    if (r.coll >= 0 && !ccsd_algo_builds(r.algo, (enum sched_coll)r.coll, 4) &&
        !ccsd_algo_builds(r.algo, (enum sched_coll)r.coll, 3)) {
      snprintf(err, errlen, "rule '%s': %s does not implement %s", rule, sched_algo_name(r.algo),
               sched_coll_name((enum sched_coll)r.coll));
      return -1;
    }
    rules.r[rules.n++] = r;
  }
  *ret = rules;
  return 0;
}

enum sched_algo ccsd_tune(enum sched_coll c, int n, uint64_t bytes, const struct link_model *link,
                          const struct algo_rules *rules, char *why, size_t whylen) {
  /* on a tie the earlier one: ring's neighbour-only traffic is kindest to
   * a shared network, direct's all-to-all pattern the least */
  static const enum sched_algo order[] = {SCHED_RING, SCHED_RHD, SCHED_TREE, SCHED_DIRECT};
  enum sched_algo best = SCHED_DIRECT;
  double best_cost = INFINITY;
  for (int i = 0; i < SCHED_ALGO_COUNT && !link->mapped; i++) {
    if (!ccsd_algo_builds(order[i], c, n)) continue;
    double t = ccsd_algo_cost(order[i], c, n, bytes, link);
    if (t < best_cost) best_cost = t, best = order[i];
  }
  if (link->mapped) {
    best = SCHED_DIRECT; /* builds every collective */
    if (whylen)
      snprintf(why, whylen, "one node: every algorithm is one pass over the mapped buffers, direct has the fewest steps");
  } else if (whylen) {
    snprintf(why, whylen, "model: %.1f us, the lowest for %d participants and %llu bytes",
             best_cost * 1e6, n, (unsigned long long)bytes);
  }
  for (int i = rules ? rules->n - 1 : -1; i >= 0; i--) { /* the last matching rule wins */
    const struct algo_rule *r = &rules->r[i];
    if ((r->coll >= 0 && r->coll != (int)c) || bytes < r->lo || bytes > r->hi) continue;
    if (!ccsd_algo_builds(r->algo, c, n)) continue; /* "ring" alone: where ring applies */
    if (whylen)
      snprintf(why, whylen, "rule %d (%s%s%s)", i + 1,
               r->coll >= 0 ? sched_coll_name((enum sched_coll)r->coll) : "", r->coll >= 0 ? ":" : "",
               sched_algo_name(r->algo));
    return r->algo;
  }
  return best;
}
