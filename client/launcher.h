/* Rank, size, job identity and root daemon from the launcher's
 * environment (launcher.c), for ccs_comm_init_from_env. */
#ifndef CCS_CLIENT_LAUNCHER_H
#define CCS_CLIENT_LAUNCHER_H

#include <stddef.h>

typedef const char *(*ccs__getenv_fn)(const char *name, void *arg);

struct ccs__launch {
  int rank, nranks;
  const char *launcher; /* "Open MPI", "Slurm", ... */
  char job[128];        /* the comm's name: the same for every rank of the job */
  char root[64];        /* numeric ADDR:PORT of the daemon the ranks' daemons meet at; "": this node's */
};

/* 0; 1 when no launcher says a rank; -1 when what they say is wrong or
 * missing (err says what). */
int ccs__launch_read(ccs__getenv_fn get, void *arg, struct ccs__launch *ret, char *err,
                     size_t errlen);
/* CCS_ROOT alone, resolved ("" when unset). */
int ccs__launch_root(ccs__getenv_fn get, void *arg, char *root, size_t len, char *err,
                     size_t errlen);
/* The first host of a Slurm node list ("gpu[07-09],cpu3" -> "gpu07"). */
int ccs__slurm_first_host(const char *list, char *out, size_t len);

#endif
