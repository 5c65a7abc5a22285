"""The Python binding against a real daemon: forked ranks, fresh random
data (the seed is printed), every collective checked element by element
against NumPy references, every type and reduction, 1 to 4 ranks and
sizes 0, 1, odd and large; zero-copy arrays; groups; errors."""
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import ccs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEED = int(os.environ.get("CCS_TEST_SEED", time.time_ns() % 2**32))
print(f"# CCS_TEST_SEED={SEED}")

INTS = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64]
FLOATS = [np.float16, np.float32, np.float64]
OPS = [ccs.SUM, ccs.PROD, ccs.MAX, ccs.MIN, ccs.AVG]


@pytest.fixture(scope="module")
def daemon():
    ccsd = os.environ.get("CCSD_PATH", os.path.join(ROOT, "build", "daemon", "ccsd"))
    d = tempfile.mkdtemp(prefix="ccs-py-")
    sock = os.path.join(d, "ccsd.sock")
    p = subprocess.Popen([ccsd, "--config", "/dev/null", "--socket", sock], stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    os.environ["CCS_SOCKET"] = sock
    yield sock
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    shutil.rmtree(d, ignore_errors=True)


def inputs(rank, n, dtype, salt):
    """Small integers every type holds exactly: sums and products are exact
    in NumPy's arithmetic too (products: 0, 1 and 2 only, few ranks)."""
    rng = np.random.default_rng([SEED, rank, salt])
    return rng.integers(0, 3 if dtype in (np.int8, np.uint8) else 5, size=n).astype(dtype)


def reference(op, arrays):
    stack = np.stack(arrays).astype(np.float64)
    if op == ccs.SUM:
        out = stack.sum(0)
    elif op == ccs.PROD:
        out = stack.prod(0)
    elif op == ccs.MAX:
        out = stack.max(0)
    elif op == ccs.MIN:
        out = stack.min(0)
    else:
        out = stack.sum(0) / len(arrays)
    return out


def run(nranks, fn, *args):
    """fn(comm, *args) in nranks forked ranks of one comm; every rank must return None."""
    uid = ccs.get_unique_id()
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def rank_main(r):
        try:
            with ccs.Comm(r, nranks, uid) as comm:
                fn(comm, *args)
            q.put((r, None))
        except BaseException as e:  # reported to the parent
            q.put((r, repr(e)))

    procs = [ctx.Process(target=rank_main, args=(r,)) for r in range(nranks)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(10)
    bad = {r: e for r, e in results.items() if e}
    assert not bad, bad


def check_all_reduce(comm, dtype, op, count):
    n, r = comm.nranks, comm.rank
    x = inputs(r, count, dtype, 1)
    y = np.empty_like(x)
    comm.all_reduce(x, y, op)
    want = reference(op, [inputs(k, count, dtype, 1) for k in range(n)])
    if op == ccs.AVG and np.dtype(dtype).kind in "iu":
        want = np.trunc(want)
    np.testing.assert_array_equal(y, want.astype(dtype))
    comm.all_reduce(x, op=op)  # in place
    np.testing.assert_array_equal(x, want.astype(dtype))


@pytest.mark.parametrize("nranks", [1, 3])
@pytest.mark.parametrize("dtype", INTS + FLOATS)
def test_all_reduce_types_ops(daemon, nranks, dtype):
    for op in OPS:
        run(nranks, check_all_reduce, dtype, op, 33)


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("count", [0, 1, 1001, 1 << 18])
def test_all_reduce_sizes(daemon, nranks, count):
    run(nranks, check_all_reduce, np.float32, ccs.SUM, count)


def check_others(comm, count):
    n, r = comm.nranks, comm.rank
    mine = [inputs(k, count, np.int32, 2) for k in range(n)]
    full = [inputs(k, count * n, np.int32, 3) for k in range(n)]
    # broadcast from the last rank, out of place and in place
    root = n - 1
    b = np.empty(count, np.int32)
    comm.broadcast(mine[r], root, b)
    np.testing.assert_array_equal(b, mine[root])
    x = mine[r].copy()
    comm.broadcast(x, 0)
    np.testing.assert_array_equal(x, mine[0])
    # reduce to rank 0
    out = np.zeros(count, np.int32)
    comm.reduce(mine[r], out, ccs.MAX, 0)
    if r == 0:
        np.testing.assert_array_equal(out, np.max(np.stack(mine), 0))
    # all_gather, reduce_scatter, all_to_all
    g = np.empty(count * n, np.int32)
    comm.all_gather(mine[r], g)
    np.testing.assert_array_equal(g, np.concatenate(mine))
    rs = np.empty(count, np.int32)
    comm.reduce_scatter(full[r], rs, ccs.SUM)
    np.testing.assert_array_equal(rs, np.sum(np.stack(full), 0)[r * count:(r + 1) * count])
    a2a = np.empty(count * n, np.int32)
    comm.all_to_all(full[r], a2a)
    np.testing.assert_array_equal(a2a, np.concatenate([full[k][r * count:(r + 1) * count] for k in range(n)]))
    # gather and scatter at the last rank
    got = comm.gather(mine[r], np.empty(count * n, np.int32) if r == root else None, root)
    if r == root:
        np.testing.assert_array_equal(got, np.concatenate(mine))
    s = np.empty(count, np.int32)
    comm.scatter(full[root] if r == root else None, s, root)
    np.testing.assert_array_equal(s, full[root][r * count:(r + 1) * count])
    # a ring of sends and receives in one group; a barrier
    back = np.empty(count, np.int32)
    with ccs.group():
        comm.send(mine[r], (r + 1) % n)
        comm.recv(back, (r - 1) % n)
    np.testing.assert_array_equal(back, mine[(r - 1) % n])
    comm.barrier()


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("count", [1, 257])
def test_every_collective(daemon, nranks, count):
    run(nranks, check_others, count)


def check_zero_copy_and_buffers(comm):
    n, r = comm.nranks, comm.rank
    a = ccs.empty((4, 8), np.float64)  # on memory the daemon maps
    a[:] = r + np.arange(32).reshape(4, 8)
    comm.all_reduce(a)
    np.testing.assert_array_equal(a, n * np.arange(32).reshape(4, 8) + n * (n - 1) / 2)
    raw = bytearray(np.full(16, r + 1, np.int32).tobytes())  # any buffer, with its type
    comm.all_reduce(raw, dtype=np.int32)
    np.testing.assert_array_equal(np.frombuffer(raw, np.int32), n * (n + 1) // 2)


def test_zero_copy_and_buffers(daemon):
    run(3, check_zero_copy_and_buffers)


def check_errors(comm):
    x = np.zeros(8, np.float32)
    with pytest.raises(ccs.Error) as e:
        comm.broadcast(x, root=comm.nranks + 5)
    assert e.value.name == "CCS_ERR_INVALID_ARGUMENT" and "out of range" in e.value.text
    with pytest.raises(TypeError):
        comm.all_reduce(np.zeros(4, np.complex64))
    with pytest.raises(ValueError):
        comm.all_reduce(np.zeros(8, np.float32)[::2])  # not contiguous
    with pytest.raises(ValueError):
        comm.all_gather(x, np.zeros(3, np.float32))  # too small for every rank's
    with pytest.raises(ValueError):
        comm.all_reduce(np.zeros(4, np.float32), np.zeros(5, np.float32))  # sizes differ
    assert comm.async_error() is None


def test_errors(daemon):
    run(2, check_errors)


def test_unique_ids_and_names(daemon):
    with pytest.raises(ValueError):
        ccs.Comm(0, 1, b"short")
    with pytest.raises(ccs.Error) as e:
        ccs.Comm(0, 1, bytes(128))  # not an id of this daemon
    assert e.value.name == "CCS_ERR_INVALID_ARGUMENT"
    with ccs.Comm.named("python job", 1, 0) as comm:
        x = np.arange(5, dtype=np.int64)
        comm.all_reduce(x)
        np.testing.assert_array_equal(x, np.arange(5))
    os.environ.update(CCS_RANK="0", CCS_NRANKS="1", CCS_JOB="py-env")
    try:
        with ccs.Comm.from_env() as comm:
            assert (comm.rank, comm.nranks) == (0, 1)
    finally:
        for k in ("CCS_RANK", "CCS_NRANKS", "CCS_JOB"):
            del os.environ[k]


def check_split(comm):
    n, r = comm.nranks, comm.rank
    sub = comm.split(r % 2, key=-r)  # reversed order within each color
    members = sorted((k for k in range(n) if k % 2 == r % 2), reverse=True)
    assert (sub.rank, sub.nranks) == (members.index(r), len(members))
    x = np.array([r], np.int64)
    sub.all_reduce(x)
    assert x[0] == sum(members)
    sub.destroy()
    assert comm.split(None) is None


def test_split(daemon):
    run(3, check_split)


def check_priorities(comm, priority):
    n, r = comm.nranks, comm.rank
    x = np.full(9, r + 1, np.int32)
    comm.all_reduce(x)
    np.testing.assert_array_equal(x, n * (n + 1) // 2)
    sub = comm.split(0, priority="bulk")  # every rank, another class
    y = np.full(3, r, np.int64)
    sub.all_reduce(y)
    np.testing.assert_array_equal(y, n * (n - 1) // 2)
    sub.destroy()
    with pytest.raises(ValueError):
        comm.split(0, priority="urgent")


@pytest.mark.parametrize("priority", ["latency", "normal", "bulk"])
def test_priorities(daemon, priority):
    uid = ccs.get_unique_id()
    ctx = mp.get_context("fork")

    def rank_main(r):
        with ccs.Comm(r, 2, uid, priority=priority) as comm:
            check_priorities(comm, priority)

    procs = [ctx.Process(target=rank_main, args=(r,)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    with pytest.raises(ValueError):
        ccs.Comm(0, 1, uid, priority="urgent")


def narrow_inputs(rank, n, dtype, salt):
    """Small integers and halves every narrow type holds, whose sums over a
    few ranks it holds too (float8 e5m2: 2 bits of significand)."""
    rng = np.random.default_rng([SEED, rank, salt])
    return (rng.integers(-2, 3, size=n) / 2).astype(dtype)


def check_narrow(comm, dtype):
    n, r = comm.nranks, comm.rank
    for salt, op in enumerate((ccs.SUM, ccs.MAX, ccs.MIN)):
        x = narrow_inputs(r, 65, dtype, salt)
        y = np.empty_like(x)
        comm.all_reduce(x, y, op)
        want = reference(op, [narrow_inputs(k, 65, dtype, salt) for k in range(n)]).astype(dtype)
        np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))  # bit for bit


def test_narrow_floats(daemon):
    """bfloat16 and both float8s through ml_dtypes' NumPy types (the
    packaged run installs ml_dtypes; the in-tree run deselects this)."""
    import ml_dtypes

    for dtype in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        run(3, check_narrow, dtype)


def test_grow_and_finalize(daemon):
    """Two ranks grow their comm by a newcomer (rank 2); every rank checks
    an all_reduce on the grown comm, then finalizes."""
    uid, grown = ccs.get_unique_id(), ccs.get_unique_id()
    ctx = mp.get_context("fork")

    def rank_main(r):
        if r < 2:
            with ccs.Comm(r, 2, uid) as comm:
                big = comm.grow(3, grown)
        else:
            big = ccs.Comm.join_grown(3, grown, 2)
        x = np.full(5, big.rank + 1, np.int64)
        big.all_reduce(x)
        np.testing.assert_array_equal(x, 6)
        big.finalize()
        big.destroy()

    procs = [ctx.Process(target=rank_main, args=(r,)) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]


ALLOC_SCRIPT = r"""
import multiprocessing as mp, sys
import numpy as np
import ccs

def rank(r, n, uid, q):
    try:
        with ccs.Comm(r, n, uid) as comm:
            x = (np.arange(1 << 20) % 1000 + r).astype(np.float32)  # 4 MiB: malloc'd by NumPy
            y = np.empty_like(x)
            comm.all_reduce(x, y)
            want = sum((np.arange(1 << 20) % 1000 + k).astype(np.float64) for k in range(n))
            np.testing.assert_array_equal(y, want.astype(np.float32))
        q.put(None)
    except BaseException as e:
        q.put(repr(e))

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    q, uid = ctx.Queue(), ccs.get_unique_id()
    procs = [ctx.Process(target=rank, args=(r, 2, uid, q)) for r in range(2)]
    for p in procs:
        p.start()
    errors = [e for e in (q.get(timeout=120) for _ in procs) if e]
    for p in procs:
        p.join(10)
    sys.exit(repr(errors) if errors else 0)
"""


def test_numpy_arrays_zero_copy_under_libccs_alloc(daemon):
    """NumPy's own arrays, under LD_PRELOAD=libccs-alloc.so, go zero copy:
    with staging kept too small for them, the call succeeds only so."""
    alloc = ccs.alloc_library()  # beside the libccs loaded here
    assert alloc and os.path.exists(alloc), alloc
    env = dict(os.environ, LD_PRELOAD=alloc, CCS_STAGING_MAX_BYTES="65536")
    done = subprocess.run([sys.executable, "-c", ALLOC_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    env.pop("LD_PRELOAD")  # and without it the same arrays are staged: refused here
    env["CCS_STAGED_PART_BYTES"] = "0"  # (staged whole: in parts they need no staging)
    done = subprocess.run([sys.executable, "-c", ALLOC_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0 and "CCS_STAGING_MAX_BYTES" in done.stderr + done.stdout
