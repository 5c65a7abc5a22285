/* Writes the seed corpus: well-formed conversations that reach deep into
 * the session (hello, ids, comms, every op kind, stats), plus a few broken
 * ones. Run once; its output is committed under tests/fuzz/corpus/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frames.h"

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

  /* ids cannot be forged, so a comm needs a real one; the fuzzer can still
   * explore init and submit on a forged id's error paths */
  for (uint32_t kind = 0; kind < CCS__COLL_KIND_COUNT; kind++) {
    char name[64];
    snprintf(name, sizeof(name), "submit-%s", ccs__coll_name(kind));
    open_seed(dir, name, 200);
    hello();
    struct ccs__unique_id uid = {.magic = CCS__UNIQUE_ID_MAGIC, .protocol = CCS__PROTOCOL_VERSION, .secret = {1, 2, 3}};
    uint8_t idbytes[CCS_UNIQUE_ID_BYTES] = {0};
    memcpy(idbytes, &uid, sizeof(uid));
    emit_frame(frame_comm_init(4, (ProtobufCBinaryData){sizeof(idbytes), idbytes}, 1, 0));
    Ccs__BufRef ref = CCS__BUF_REF__INIT;
    ref.buffer = 1;
    ref.length = 64;
    Ccs__Op op = CCS__OP__INIT, *ops[2] = {&op, &op};
    op.comm = 1;
    op.kind = kind;
    op.count = kind == CCS__BARRIER ? 0 : 16;
    op.dtype = CCS_FLOAT32;
    op.send = op.recv = &ref;
    emit_frame(frame_submit(5, ops, kind % 2 + 1));
    Ccs__CommDestroy cd = CCS__COMM_DESTROY__INIT;
    cd.comm = 1;
    r.body_case = CCS__REQUEST__BODY_COMM_DESTROY;
    r.comm_destroy = &cd;
    emit(&r, 6);
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
