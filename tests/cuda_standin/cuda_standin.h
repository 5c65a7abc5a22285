/* The CUDA stand-in's controls and records (cuda_standin.c). */
#ifndef CCS_CUDA_STANDIN_H
#define CCS_CUDA_STANDIN_H
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#define STANDIN_MAX_DEVICES 8

struct standin {
  int ndevices;
  pthread_t loop;             /* the thread standin_reset ran on: the test's (the loop's) */
  char module_loading[32];    /* CUDA_MODULE_LOADING when the runtime started */
  _Atomic int fail_next_launch; /* the next launch's own result (a cudaError_t) */
  _Atomic int launches, mallocs, frees, frees_on_loop, streams, set_device_calls, uuid_reads;
  _Atomic int host_unregisters;
  char peer[STANDIN_MAX_DEVICES][STANDIN_MAX_DEVICES]; /* access enabled from [i] to [j] */
  void *_Atomic last_stream_context; /* where the last stream write or wait was queued */
  _Atomic int hold_writes;   /* stream writes wait for standin_release_writes */
};
extern struct standin standin;

/* Forgets everything: ndevices GPUs, none started, the caller as the loop. */
void standin_reset(int ndevices);
/* An error left on the calling thread by an earlier call. */
void standin_set_last_error(cudaError_t e);
/* Device d's primary context; the calling thread's current one. */
void *standin_context_of(int device);
void *standin_current_context(void);
void standin_set_current_context(void *ctx);
/* The stream writes held (hold_writes) land now, in the order queued. */
void standin_release_writes(void);

#endif
