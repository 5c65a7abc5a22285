/* Who a process is, from the launcher that started it (launcher.h): its
 * rank and the job's size, the job's identity (which names its
 * communicator, so no id has to be passed around) and, where the job spans
 * nodes, the daemon the ranks' daemons meet at. Launchers are tried in
 * order, each by the variables it sets; everything is read through `get`,
 * so that tests can hand in an environment of their own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "launcher.h"

#define DEFAULT_ROOT_PORT 7000 /* the daemons' port in the docs' examples */

static int number(const char *s, long lo, long hi, long *ret) {
  if (!s || !*s) return -1;
  char *end;
  long v = strtol(s, &end, 10);
  if (*end || v < lo || v > hi) return -1;
  *ret = v;
  return 0;
}

struct launcher {
  const char *name, *rank, *size, *local_size; /* local_size: ranks on this node, or NULL */
};

/* In order: ccs's own, then the launchers by the variables they set. */
static const struct launcher launchers[] = {
    {"CCS", "CCS_RANK", "CCS_NRANKS", NULL},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"PMI", "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_SIZE"},
    {"PMIx", "PMIX_RANK", "PMI_SIZE", NULL},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", NULL},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"},
};

/* The job's identity, by the first launcher variable that names one. */
static void job_of(ccs__getenv_fn get, void *arg, char *job, size_t len) {
  const char *v;
  job[0] = 0;
  if ((v = get("CCS_JOB", arg)) && *v) snprintf(job, len, "%s", v);
  else if ((v = get("SLURM_JOB_ID", arg)) && *v) {
    const char *step = get("SLURM_STEP_ID", arg);
    snprintf(job, len, "slurm:%s.%s", v, step && *step ? step : "0");
  } else if ((v = get("PMIX_NAMESPACE", arg)) && *v) snprintf(job, len, "pmix:%s", v);
  else if ((v = get("OMPI_MCA_ess_base_jobid", arg)) && *v) snprintf(job, len, "ompi:%s", v);
  else if ((v = get("TORCHELASTIC_RUN_ID", arg)) && *v) snprintf(job, len, "torchrun:%s", v);
}

int ccs__slurm_first_host(const char *list, char *out, size_t len) {
  /* "gpu[07-09,12],cpu3": a prefix, then a bracket of ranges, or a plain name */
  size_t n = strcspn(list, ",[");
  if (n == 0 || n >= len) return -1;
  memcpy(out, list, n);
  out[n] = 0;
  if (list[n] != '[') return 0;
  const char *first = list + n + 1;
  size_t m = strspn(first, "0123456789");
  if (m == 0 || n + m >= len || !strchr("-,]", first[m])) return -1;
  memcpy(out + n, first, m);
  out[n + m] = 0;
  return 0;
}

/* HOST:PORT, resolved to the numeric address ids carry. */
static int resolve(const char *hostport, char *root, size_t len, const char *from, char *err,
                   size_t errlen) {
  char why[256];
  if (ccs_addr_resolve(hostport, root, len, why, sizeof(why))) {
    snprintf(err, errlen, "%s: %s", from, why);
    return -1;
  }
  return 0;
}

static int root_of(const char *hostport, struct ccs__launch *l, const char *from, char *err,
                   size_t errlen) {
  return resolve(hostport, l->root, sizeof(l->root), from, err, errlen);
}

int ccs__launch_root(ccs__getenv_fn get, void *arg, char *root, size_t len, char *err,
                     size_t errlen) {
  const char *at = get("CCS_ROOT", arg);
  root[0] = 0;
  return at && *at ? resolve(at, root, len, "CCS_ROOT", err, errlen) : 0;
}

int ccs__launch_read(ccs__getenv_fn get, void *arg, struct ccs__launch *l, char *err,
                     size_t errlen) {
  memset(l, 0, sizeof(*l));
  const struct launcher *by = NULL;
  long rank = 0, size = 0, local = -1;
  const struct launcher *sizeless = NULL; /* gave a rank but no size: a later one may */
  for (size_t i = 0; i < sizeof(launchers) / sizeof(launchers[0]) && !by; i++) {
    const char *r = get(launchers[i].rank, arg);
    if (!r || !*r) continue;
    const char *s = get(launchers[i].size, arg);
    if (!s && !sizeless) { /* PMIx hands the size out by a call, not the environment */
      sizeless = &launchers[i];
      continue;
    }
    if (number(s, 1, 1 << 20, &size) || number(r, 0, size - 1, &rank)) {
      snprintf(err, errlen, "%s: %s=%s, %s=%s: a rank from 0 to the size - 1 expected",
               launchers[i].name, launchers[i].rank, r, launchers[i].size, s ? s : "(unset)");
      return -1;
    }
    by = &launchers[i];
    const char *ls = by->local_size ? get(by->local_size, arg) : NULL;
    if (number(ls, 1, size, &local)) local = -1;
  }
  if (!by && sizeless) {
    snprintf(err, errlen, "%s: %s=%s but %s=(unset), and no other launcher gives the job's size: "
             "set CCS_RANK and CCS_NRANKS", sizeless->name, sizeless->rank,
             get(sizeless->rank, arg), sizeless->size);
    return -1;
  }
  if (!by) {
    snprintf(err, errlen, "no launcher's rank in the environment (CCS_RANK and CCS_NRANKS, Open "
             "MPI, PMI, PMIx, Slurm or torchrun)");
    return 1;
  }
  l->rank = (int)rank;
  l->nranks = (int)size;
  l->launcher = by->name;
  job_of(get, arg, l->job, sizeof(l->job));
  if (!l->job[0]) {
    snprintf(err, errlen, "%s gives the rank but no job identity to name the communicator by: "
             "set CCS_JOB (the same for every rank of the job)", by->name);
    return -1;
  }
  /* where the ranks' daemons meet, when the job spans nodes */
  const char *root = get("CCS_ROOT", arg), *port = get("CCS_ROOT_PORT", arg);
  long root_port = DEFAULT_ROOT_PORT;
  if (port && *port && number(port, 1, 65535, &root_port)) {
    snprintf(err, errlen, "CCS_ROOT_PORT=%s: a port number expected", port);
    return -1;
  }
  if (root && *root) return root_of(root, l, "CCS_ROOT", err, errlen);
  const char *nodes = get("SLURM_JOB_NUM_NODES", arg), *list = get("SLURM_JOB_NODELIST", arg);
  long nnodes = 1;
  /* a job of several Slurm nodes, whichever launcher Slurm's srun (or an
   * mpirun inside the allocation) speaks through: its first node's daemon */
  if (nodes && !number(nodes, 1, 1 << 20, &nnodes) && nnodes > 1) {
    char host[256], hostport[300];
    if (!list || ccs__slurm_first_host(list, host, sizeof(host))) {
      snprintf(err, errlen, "Slurm: SLURM_JOB_NODELIST=%s names no first host: set CCS_ROOT",
               list ? list : "(unset)");
      return -1;
    }
    snprintf(hostport, sizeof(hostport), "%s:%ld", host, root_port);
    return root_of(hostport, l, "the first host of SLURM_JOB_NODELIST", err, errlen);
  }
  const char *master = get("MASTER_ADDR", arg);
  if (!strcmp(by->name, "torchrun") && local > 0 && local < size && master && *master) {
    char hostport[300];
    snprintf(hostport, sizeof(hostport), "%s:%ld", master, root_port);
    return root_of(hostport, l, "MASTER_ADDR", err, errlen);
  }
  if (local > 0 && local < size) {
    snprintf(err, errlen, "%s: the job's %ld ranks span nodes (%ld here): set CCS_ROOT=HOST:PORT "
             "to the daemon of one of them", by->name, size, local);
    return -1;
  }
  return 0; /* one node: its daemon is the root */
}
