/* Frame codec: partial reads, several frames per read, the size cap, the
 * unpack budget, and garbage. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "frames.h"
#include "harness.h"

static uint8_t *pack_submit(size_t nops, size_t *len) {
  Ccs__Op *ops = calloc(nops, sizeof(*ops));
  Ccs__Op **ptrs = calloc(nops, sizeof(*ptrs));
  Ccs__BufRef ref = CCS__BUF_REF__INIT;
  ref.buffer = 7;
  ref.offset = 4096;
  ref.length = 1234;
  for (size_t i = 0; i < nops; i++) {
    ccs__op__init(&ops[i]);
    ops[i].comm = 3;
    ops[i].kind = CCS__ALL_REDUCE;
    ops[i].count = i;
    ops[i].send = &ref;
    ptrs[i] = &ops[i];
  }
  struct frame f = frame_submit(42, ptrs, nops);
  free(ops);
  free(ptrs);
  *len = f.len;
  return f.data;
}

/* Feeds `len` bytes in pieces of `step`; returns the frames seen. */
static int feed(struct ccs__frame_reader *r, const uint8_t *data, size_t len, size_t step,
                size_t *last_len) {
  int frames = 0;
  for (size_t off = 0; off < len;) {
    uint8_t *space;
    size_t room;
    assert_int_equal(ccs__frame_reader_space(r, &space, &room), 0);
    size_t n = len - off < step ? len - off : step;
    if (n > room) n = room;
    memcpy(space, data + off, n);
    ccs__frame_reader_commit(r, n);
    off += n;
    const uint8_t *payload;
    size_t plen;
    int rc;
    while ((rc = ccs__frame_reader_next(r, &payload, &plen)) == 1) {
      Ccs__Request *req = ccs__request_unpack(payload, plen);
      assert_non_null(req);
      assert_int_equal(req->id, 42);
      assert_int_equal(req->body_case, CCS__REQUEST__BODY_SUBMIT);
      assert_int_equal(req->submit->ops[req->submit->n_ops - 1]->send->length, 1234);
      ccs__request__free_unpacked(req, NULL);
      *last_len = plen;
      frames++;
    }
    if (rc < 0) return -1;
  }
  return frames;
}

static void test_partial_reads(void **state) {
  size_t len, last = 0;
  uint8_t *f = pack_submit(50, &len);
  static const size_t steps[] = {1, 2, 3, 4, 5, 7, 100, 4096};
  for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++) {
    struct ccs__frame_reader r;
    ccs__frame_reader_init(&r, CCS__FRAME_MAX);
    assert_int_equal(feed(&r, f, len, steps[s], &last), 1);
    assert_int_equal(last, len - CCS__FRAME_HEADER);
    assert_int_equal(ccs__frame_reader_pending(&r), 0);
    ccs__frame_reader_close(&r);
  }
  free(f);
}

static void test_many_frames_per_read(void **state) {
  size_t len, last;
  uint8_t *f = pack_submit(3, &len);
  size_t n = 100;
  uint8_t *many = malloc(len * n);
  for (size_t i = 0; i < n; i++) memcpy(many + i * len, f, len);
  struct ccs__frame_reader r;
  ccs__frame_reader_init(&r, CCS__FRAME_MAX);
  assert_int_equal(feed(&r, many, len * n, 1000, &last), (int)n);
  ccs__frame_reader_close(&r);
  free(many);
  free(f);
}

static void test_size_cap(void **state) {
  struct ccs__frame_reader r;
  ccs__frame_reader_init(&r, 1000);
  uint8_t *space;
  size_t room;
  assert_int_equal(ccs__frame_reader_space(&r, &space, &room), 0);
  uint32_t len = 1001;
  memcpy(space, &len, 4); /* little-endian host */
  ccs__frame_reader_commit(&r, 4);
  const uint8_t *p;
  size_t plen;
  assert_int_equal(ccs__frame_reader_next(&r, &p, &plen), -1);
  ccs__frame_reader_close(&r);
  /* exactly at the cap is fine */
  ccs__frame_reader_init(&r, 1000);
  assert_int_equal(ccs__frame_reader_space(&r, &space, &room), 0);
  len = 1000;
  memcpy(space, &len, 4);
  memset(space + 4, 0, 1000);
  ccs__frame_reader_commit(&r, 1004);
  assert_int_equal(ccs__frame_reader_next(&r, &p, &plen), 1);
  assert_int_equal(plen, 1000);
  ccs__frame_reader_close(&r);
  /* packing refuses what the reader would refuse */
  size_t flen;
  assert_null(pack_submit(CCS__FRAME_MAX / 8, &flen));
}

static void test_unpack_budget(void **state) {
  /* Request{submit{ops: empty x N}}: 2 bytes per op on the wire, ~100 in
   * memory. Must fail cleanly, not allocate hundreds of MiB. */
  size_t nops = 400000, inner = nops * 2, n = 0;
  uint8_t *buf = malloc(inner + 16);
  buf[n++] = 10 << 3 | 2; /* field 10, length-delimited */
  for (size_t v = inner; ; v >>= 7) {
    buf[n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    if (v < 0x80) break;
  }
  for (size_t i = 0; i < nops; i++) buf[n++] = 1 << 3 | 2, buf[n++] = 0;
  assert_null(ccs__request_unpack(buf, n));
  free(buf);
}

static void test_garbage(void **state) {
  uint64_t seed = test_seed();
  uint8_t junk[512];
  for (int round = 0; round < 20000; round++) {
    size_t len = test_mix(seed, (uint64_t)round) % sizeof(junk);
    for (size_t i = 0; i < len; i++) junk[i] = (uint8_t)test_mix(seed ^ 0x55, round * 1000 + i);
    Ccs__Request *r = ccs__request_unpack(junk, len);
    if (r) ccs__request__free_unpacked(r, NULL); /* either way: no crash, no leak */
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_partial_reads),     cmocka_unit_test(test_many_frames_per_read),
      cmocka_unit_test(test_size_cap),          cmocka_unit_test(test_unpack_budget),
      cmocka_unit_test(test_garbage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
