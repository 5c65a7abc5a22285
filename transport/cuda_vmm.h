/* CUDA virtual memory shared between processes: an allocation exported as
 * a POSIX fd, passed over the Unix socket, imported and mapped by the
 * daemon (docs/gpus.md). Unlike a cudaIpcMemHandle the fd is not a
 * bearer token, and the memory stays valid until every mapping is gone.
 *
 * The driver functions are fetched through the CUDA runtime (linked
 * statically), so nothing here links against libcuda: a process on a
 * machine without the driver loads and runs host-only. */
#ifndef CCS_CUDA_VMM_H
#define CCS_CUDA_VMM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* 0 when the driver and at least one GPU are usable; otherwise -1 and why
 * ("no CUDA driver: ...", "no GPU: ..."). Checked once per process. */
int ccs__cuda_usable(char *why, size_t len);

/* A new allocation of at least `bytes` on `device`, mapped read-write for
 * it at *ret_ptr (*ret_size: rounded to the granularity), and its POSIX fd
 * in *ret_fd (the caller passes it on and closes it). */
int ccs__vmm_alloc(int device, size_t bytes, void **ret_ptr, size_t *ret_size, int *ret_fd,
                   char *err, size_t errlen);

/* Imports fd (not closed here) and maps `size` bytes of it, read-write for
 * the device it lives on (*ret_device) and for every device in
 * devices[0..ndevices) that has peer access to it. Fails if the allocation
 * holds less than size. */
int ccs__vmm_import(int fd, size_t size, const int *devices, int ndevices, void **ret_ptr,
                    int *ret_device, char *err, size_t errlen);

/* Unmaps what alloc or import mapped (the memory goes once every process
 * holding a mapping did so). */
void ccs__vmm_unmap(void *ptr, size_t size);

/* Legacy CUDA IPC (cudaIpcMemHandle_t, 64 bytes): a bearer token, used
 * only where the daemon is told to accept it. The handle of the whole
 * allocation holding ptr, with its base and size; and the importing side:
 * the opened pointer, and the driver block [*ret_block, + *ret_block_size)
 * it lies in (the driver's range for it, which starts at the block's start
 * and may hold other allocations too). The open returns 1 where this
 * process holds the handle's block open already (the driver allows one
 * open of a block per process), -1 on other failures. */
int ccs__cuda_ipc_handle(const void *ptr, void **ret_base, size_t *ret_size, uint8_t *handle,
                         char *err, size_t errlen);
int ccs__cuda_ipc_open(const uint8_t *handle, int device, void **ret_ptr, void **ret_block,
                       size_t *ret_block_size, char *err, size_t errlen);
void ccs__cuda_ipc_close(void *ptr);

/* Whether this process has a CUDA context (the current thread's, or a
 * device's primary one active), without making one: memory it has not
 * allocated through ccs cannot be device memory otherwise, and asking the
 * runtime would create a context, and its GPU memory, in host-only jobs. */
int ccs__cuda_has_context(void);

/* The calling thread's current context, whatever made it (the primary
 * context of a device, or a framework's own), and back: libccs switches
 * devices for its own calls and must leave the caller's context as it
 * found it. */
void *ccs__cuda_context_save(void);
void ccs__cuda_context_restore(void *saved);

/* Host memory GPUs read and write (stream flags, proto/ring.h): pinned and
 * mapped for every device of the process, and back. */
int ccs__cuda_host_register(void *ptr, size_t len, char *err, size_t errlen);
void ccs__cuda_host_unregister(void *ptr);
/* Stream memory operations on a 32-bit word of registered host memory:
 * the stream writes value there, or waits until the word has reached value
 * ((int32_t)(word - value) >= 0). -1 with err when the device cannot (an
 * old driver, a GPU without stream memory operations). */
int ccs__cuda_stream_write32(void *stream, _Atomic uint32_t *word, uint32_t value, char *err,
                             size_t errlen);
int ccs__cuda_stream_wait32(void *stream, _Atomic uint32_t *word, uint32_t value, char *err,
                            size_t errlen);

/* The device ordinal of this process whose UUID is uuid (16 bytes), or -1
 * (read once per process). */
int ccs__cuda_device_of_uuid(const uint8_t *uuid);
/* The UUID of device ordinal `device` into uuid[16]; 0 on success. */
int ccs__cuda_uuid_of_device(int device, uint8_t *uuid);

#endif
