/* Writes the seed corpus: well-formed conversations that reach deep into
 * the session (hello, ids, comms, every op kind, stats), plus a few broken
 * ones. Run once; its output is committed under tests/fuzz/corpus/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static FILE *out;

static void emit(Ccs__Request *req, uint64_t id) {
  size_t len;
  req->id = id;
  uint8_t *f = ccs__frame_pack(&req->base, &len);
  fwrite(f, 1, len, out);
  free(f);
}

static void hello(void) {
  Ccs__Request r = CCS__REQUEST__INIT;
  Ccs__Hello h = CCS__HELLO__INIT;
  h.protocol = CCS__PROTOCOL_VERSION;
  r.body_case = CCS__REQUEST__BODY_HELLO;
  r.hello = &h;
  emit(&r, 1);
}

static void open_seed(const char *dir, const char *name, int step) {
  char path[256];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  out = fopen(path, "wb");
  fputc(step, out);
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : ".";
  open_seed(dir, "hello-stats-id", 7);
  hello();
  Ccs__Request r = CCS__REQUEST__INIT;
  Ccs__Stats st = CCS__STATS__INIT;
  r.body_case = CCS__REQUEST__BODY_STATS;
  r.stats = &st;
  emit(&r, 2);
  Ccs__GetUniqueId g = CCS__GET_UNIQUE_ID__INIT;
  r.body_case = CCS__REQUEST__BODY_GET_UNIQUE_ID;
  r.get_unique_id = &g;
  emit(&r, 3);
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
    Ccs__CommInit ci = CCS__COMM_INIT__INIT;
    ci.id.data = idbytes;
    ci.id.len = sizeof(idbytes);
    ci.nranks = 1;
    r.body_case = CCS__REQUEST__BODY_COMM_INIT;
    r.comm_init = &ci;
    emit(&r, 4);
    Ccs__BufRef ref = CCS__BUF_REF__INIT;
    ref.buffer = 1;
    ref.length = 64;
    Ccs__Op op = CCS__OP__INIT, *ops[2] = {&op, &op};
    op.comm = 1;
    op.kind = kind;
    op.count = kind == CCS__BARRIER ? 0 : 16;
    op.dtype = CCS_FLOAT32;
    op.send = op.recv = &ref;
    Ccs__Submit sub = CCS__SUBMIT__INIT;
    sub.n_ops = kind % 2 + 1;
    sub.ops = ops;
    r.body_case = CCS__REQUEST__BODY_SUBMIT;
    r.submit = &sub;
    emit(&r, 5);
    Ccs__CommDestroy cd = CCS__COMM_DESTROY__INIT;
    cd.comm = 1;
    r.body_case = CCS__REQUEST__BODY_COMM_DESTROY;
    r.comm_destroy = &cd;
    emit(&r, 6);
    fclose(out);
  }

  open_seed(dir, "mem-register-without-fd", 3);
  hello();
  Ccs__MemRegister mr = CCS__MEM_REGISTER__INIT;
  r.body_case = CCS__REQUEST__BODY_MEM_REGISTER;
  r.mem_register = &mr;
  emit(&r, 7);
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
  r.body_case = CCS__REQUEST__BODY_STATS;
  r.stats = &st;
  emit(&r, 9);
  fclose(out);
  return 0;
}
