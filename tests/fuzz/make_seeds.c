/* Writes fuzz_session's seed corpus: well-formed conversations that reach
 * deep into the session (hello, ids, comms joined on ids signed with the
 * fuzz targets' fixed key (fuzz_daemon.h), every op kind run, stats,
 * queries, destroy), plus a few broken ones. The ids are root's (uid 0),
 * as the suite runs. Run once; its output is committed under
 * tests/fuzz/corpus/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frames.h"
#include "fuzz_daemon.h"

static FILE *out;

static void emit_frame(struct frame f) {
  fwrite(f.data, 1, f.len, out);
  free(f.data);
}

static void emit(Ccs__Request *req, uint64_t id) {
  req->id = id;
  emit_frame(frame_of(req));
}

static void hello(void) { emit_frame(frame_hello(1, CCS__PROTOCOL_VERSION)); }

static void open_seed(const char *dir, const char *name, int step) {
  char path[256];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  out = fopen(path, "wb");
  fputc(step, out);
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : ".";
  Ccs__Request r = CCS__REQUEST__INIT; /* for those frames.h does not build */
  open_seed(dir, "hello-stats-id", 7);
  hello();
  emit_frame(frame_stats(2));
  emit_frame(frame_get_unique_id(3));
  fclose(out);

  /* a comm of one rank on a valid id, and an op of every kind on it (of
   * count 0: no buffers without fds); send and receive to itself in one
   * call; with algorithm rules for every other kind */
  for (uint32_t kind = 0; kind < CCS__COLL_KIND_COUNT; kind++) {
    if (kind == CCS__RECV) continue; /* with the send */
    char name[64];
    snprintf(name, sizeof(name), "join-and-%s", kind == CCS__SEND ? "send-recv" : ccs__coll_name(kind));
    open_seed(dir, name, 200);
    hello();
    struct ccs__unique_id uid;
    fuzz_unique_id(0x5eed0000u + kind, 0, "", &uid);
    uint8_t idbytes[CCS_UNIQUE_ID_BYTES] = {0};
    memcpy(idbytes, &uid, sizeof(uid));
    Ccs__CommInit ci = CCS__COMM_INIT__INIT;
    ci.id = (ProtobufCBinaryData){sizeof(idbytes), idbytes};
    ci.nranks = 1;
    ci.algo = kind % 2 ? "all_reduce:ring;tree" : "";
    ci.debug = kind % 3 == 0;
    r.body_case = CCS__REQUEST__BODY_COMM_INIT;
    r.comm_init = &ci;
    emit(&r, 4);
    Ccs__Op op = CCS__OP__INIT, back = CCS__OP__INIT, *ops[2] = {&op, &back};
    op.comm = back.comm = 1;
    op.kind = kind;
    op.dtype = CCS_FLOAT32;
    back.kind = CCS__RECV;
    back.dtype = CCS_FLOAT32;
    emit_frame(frame_submit(5, ops, kind == CCS__SEND ? 2 : 1));
    Ccs__CommQuery cq = CCS__COMM_QUERY__INIT;
    cq.comm = 1;
    r.body_case = CCS__REQUEST__BODY_COMM_QUERY;
    r.comm_query = &cq;
    emit(&r, 6);
    emit_frame(frame_stats(7));
    Ccs__CommDestroy cd = CCS__COMM_DESTROY__INIT;
    cd.comm = 1;
    r.body_case = CCS__REQUEST__BODY_COMM_DESTROY;
    r.comm_destroy = &cd;
    emit(&r, 8);
    fclose(out);
  }

  open_seed(dir, "mem-register-without-fd", 3);
  hello();
  emit_frame(frame_mem_register(7));
  Ccs__MemDeregister md = CCS__MEM_DEREGISTER__INIT;
  md.buffer = 9;
  r.body_case = CCS__REQUEST__BODY_MEM_DEREGISTER;
  r.mem_deregister = &md;
  emit(&r, 8);
  fclose(out);

  static const char *const admin_cmds[] = {"status", "stuck", "comms", "abort", "config", "metrics"};
  for (int i = 0; i < 6; i++) {
    char name[64];
    snprintf(name, sizeof(name), "admin-%s", admin_cmds[i]);
    open_seed(dir, name, 11);
    hello();
    Ccs__Admin a = CCS__ADMIN__INIT;
    char *args[1] = {"7"};
    a.command = (char *)admin_cmds[i];
    a.json = i % 2;
    a.n_args = i == 1 || i == 3;
    a.args = args;
    r.body_case = CCS__REQUEST__BODY_ADMIN;
    r.admin = &a;
    emit(&r, 10);
    fclose(out);
  }

  open_seed(dir, "oversized-length", 1);
  fwrite("\xff\xff\xff\x7f", 1, 4, out);
  fclose(out);

  open_seed(dir, "no-hello", 5);
  emit_frame(frame_stats(9));
  fclose(out);
  return 0;
}
