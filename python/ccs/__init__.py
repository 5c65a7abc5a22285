"""ccs: collectives as a service, from Python.

A ctypes binding of libccs. Communicators (by unique id, by name, or from
the launcher's environment), every collective on NumPy arrays and on any
object with the buffer protocol, zero-copy arrays on memory the daemon maps
(:func:`empty`), groups as a context manager, and errors as :class:`Error`
carrying the result code and the daemon's text.
"""
import contextlib
import ctypes
import ctypes.util
import os
import weakref

import numpy as np

__all__ = ["Comm", "Error", "alloc_library", "empty", "get_unique_id", "group", "SUM", "PROD", "MAX",
           "MIN", "AVG"]

SUM, PROD, MAX, MIN, AVG = "sum", "prod", "max", "min", "avg"
_OPS = {SUM: 0, PROD: 1, MAX: 2, MIN: 3, AVG: 4}
UNIQUE_ID_BYTES = 128


def _load():
    names = [os.environ.get("CCS_LIBRARY"), ctypes.util.find_library("ccs"), "libccs.so.0"]
    errors = []
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise ImportError("libccs not found (set CCS_LIBRARY): " + "; ".join(errors))


_lib = _load()


def alloc_library():
    """The path of libccs-alloc beside the libccs this module loaded, for
    LD_PRELOAD: a program's large mallocs (NumPy arrays) then are memory
    the daemon maps, zero copy (docs/using.md). None where it is not there."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and os.path.basename(fields[5]).startswith("libccs.so"):
                path = os.path.join(os.path.dirname(fields[5]), "libccs-alloc.so")
                return path if os.path.exists(path) else None
    return None


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


_c = ctypes.c_void_p
_sz = ctypes.c_size_t
_i = ctypes.c_int


class _Config(ctypes.Structure):  # ccs_comm_config_t
    _fields_ = [("size", _sz), ("priority", _i)]


# a comm's class within its user's share (ccs_priority_t)
PRIORITIES = {None: -1, "normal": 0, "latency": 1, "bulk": 2}


def _config(priority):
    if priority not in PRIORITIES:
        raise ValueError(f"priority {priority!r}: one of 'latency', 'normal', 'bulk' (or None)")
    return ctypes.byref(_Config(ctypes.sizeof(_Config), PRIORITIES[priority]))


for _name, _args in {
    "ccs_get_unique_id": [ctypes.POINTER(_UniqueId)],
    "ccs_comm_init_rank": [ctypes.POINTER(_c), _i, _UniqueId, _i],
    "ccs_comm_init_rank_config": [ctypes.POINTER(_c), _i, _UniqueId, _i, _c],
    "ccs_comm_init_named": [ctypes.POINTER(_c), ctypes.c_char_p, _i, _i],
    "ccs_comm_init_from_env": [ctypes.POINTER(_c)],
    "ccs_comm_destroy": [_c], "ccs_comm_abort": [_c],
    "ccs_comm_count": [_c, ctypes.POINTER(_i)], "ccs_comm_user_rank": [_c, ctypes.POINTER(_i)],
    "ccs_comm_get_async_error": [_c, ctypes.POINTER(_i)],
    "ccs_mem_alloc": [ctypes.POINTER(_c), _sz], "ccs_mem_free": [_c],
    "ccs_all_reduce": [_c, _c, _sz, _i, _i, _c, _c],
    "ccs_broadcast": [_c, _c, _sz, _i, _i, _c, _c],
    "ccs_reduce": [_c, _c, _sz, _i, _i, _i, _c, _c],
    "ccs_all_gather": [_c, _c, _sz, _i, _c, _c],
    "ccs_reduce_scatter": [_c, _c, _sz, _i, _i, _c, _c],
    "ccs_all_to_all": [_c, _c, _sz, _i, _c, _c],
    "ccs_gather": [_c, _c, _sz, _i, _i, _c, _c],
    "ccs_scatter": [_c, _c, _sz, _i, _i, _c, _c],
    "ccs_send": [_c, _sz, _i, _i, _c, _c], "ccs_recv": [_c, _sz, _i, _i, _c, _c],
    "ccs_barrier": [_c], "ccs_group_start": [], "ccs_group_end": [],
    "ccs_comm_split": [_c, _i, _i, ctypes.POINTER(_c), _c],
    "ccs_comm_shrink": [_c, ctypes.POINTER(_i), _i, ctypes.POINTER(_c), _i],
    "ccs_comm_revoke": [_c],
    "ccs_comm_grow": [_c, _i, _UniqueId, _i, ctypes.POINTER(_c)],
    "ccs_comm_finalize": [_c],
}.items():
    _f = getattr(_lib, _name)
    _f.argtypes = _args
    _f.restype = _i
_lib.ccs_comm_last_error.argtypes = [_c]
_lib.ccs_comm_last_error.restype = ctypes.c_char_p
_lib.ccs_result_name.argtypes = [_i]
_lib.ccs_result_name.restype = ctypes.c_char_p


class Error(RuntimeError):
    """A ccs call failed: ``code`` (ccs_result_t), ``name`` ("CCS_ERR_TIMEOUT") and the text."""

    def __init__(self, code, text):
        self.code = code
        self.name = _lib.ccs_result_name(code).decode()
        self.text = text
        super().__init__(f"{self.name}: {text}")


def _check(rc, comm=None):
    if rc != 0:
        raise Error(rc, (_lib.ccs_comm_last_error(comm) or b"").decode(errors="replace"))


# NumPy dtypes and ccs's (ccs.h's numbers); bfloat16 and float8 where ml_dtypes is
_DTYPES = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int32): 2,
           np.dtype(np.uint32): 3, np.dtype(np.int64): 4, np.dtype(np.uint64): 5,
           np.dtype(np.float16): 6, np.dtype(np.float32): 8, np.dtype(np.float64): 9}
try:
    import ml_dtypes

    _DTYPES.update({np.dtype(ml_dtypes.bfloat16): 7, np.dtype(ml_dtypes.float8_e4m3fn): 10,
                    np.dtype(ml_dtypes.float8_e5m2): 11})
except Exception:  # absent, or built for another NumPy: those types are not offered
    pass


def _array(buf, dtype=None):
    """A NumPy view of buf (an array, or any writable buffer with dtype)."""
    a = buf if isinstance(buf, np.ndarray) else np.frombuffer(memoryview(buf), dtype=dtype or np.uint8)
    if not a.flags.c_contiguous:
        raise ValueError("ccs needs contiguous buffers")
    if a.dtype not in _DTYPES:
        raise TypeError(f"no ccs type for {a.dtype}")
    return a


def _ptr(a):
    return ctypes.c_void_p(a.ctypes.data)


def _writable(a, what):
    if not a.flags.writeable:
        raise ValueError(f"{what} must be writable")
    return a


def get_unique_id():
    """A fresh 128-byte unique id from this node's daemon, to hand to the other ranks."""
    uid = _UniqueId()
    _check(_lib.ccs_get_unique_id(ctypes.byref(uid)))
    return bytes(uid)  # all 128 bytes (the field's value would stop at a zero)


class Comm:
    """A communicator. ``Comm(rank, nranks, uid)`` joins by unique id;
    :meth:`named` and :meth:`from_env` find the other ranks by name.
    ``priority`` ('latency', 'normal', 'bulk'; None: CCS_PRIORITY, else
    normal) is its class within its user's share of the daemon."""

    def __init__(self, rank=None, nranks=None, uid=None, *, priority=None, _handle=None):
        if _handle is None:
            if uid is None or len(uid) != UNIQUE_ID_BYTES:
                raise ValueError("a 128-byte unique id (get_unique_id) is needed")
            handle = ctypes.c_void_p()
            cuid = _UniqueId.from_buffer_copy(bytes(uid))
            _check(_lib.ccs_comm_init_rank_config(ctypes.byref(handle), nranks, cuid, rank,
                                                  _config(priority)))
            _handle = handle
        self._h = _handle
        n, r = _i(), _i()
        _lib.ccs_comm_count(self._h, ctypes.byref(n))
        _lib.ccs_comm_user_rank(self._h, ctypes.byref(r))
        self.nranks, self.rank = n.value, r.value

    @classmethod
    def named(cls, name, nranks, rank):
        """The communicator called `name` of this user (ccs_comm_init_named)."""
        h = ctypes.c_void_p()
        _check(_lib.ccs_comm_init_named(ctypes.byref(h), name.encode(), nranks, rank))
        return cls(_handle=h)

    @classmethod
    def from_env(cls):
        """Rank, size and name from the launcher (ccs_comm_init_from_env)."""
        h = ctypes.c_void_p()
        _check(_lib.ccs_comm_init_from_env(ctypes.byref(h)))
        return cls(_handle=h)

    def destroy(self):
        if self._h:
            h, self._h = self._h, None
            _check(_lib.ccs_comm_destroy(h))

    def abort(self):
        if self._h:
            h, self._h = self._h, None
            _check(_lib.ccs_comm_abort(h))

    close = destroy

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __del__(self):
        if getattr(self, "_h", None):
            _lib.ccs_comm_destroy(self._h)

    def split(self, color, key=0, priority=None):
        """Collective: a new Comm of the ranks of this color, ranked by key
        (None for color None); its priority this one's unless given."""
        h = ctypes.c_void_p()
        _check(_lib.ccs_comm_split(self._h, -1 if color is None else color, key, ctypes.byref(h),
                                   _config(priority)), self._h)
        return Comm(_handle=h) if h.value else None

    def shrink(self, exclude=(), abort=False):
        """The other ranks' new Comm (also of a failed comm)."""
        arr = (_i * max(len(exclude), 1))(*exclude)
        h = ctypes.c_void_p()
        _check(_lib.ccs_comm_shrink(self._h, arr, len(exclude), ctypes.byref(h), 1 if abort else 0), self._h)
        return Comm(_handle=h)

    def revoke(self):
        """Every rank's pending and later ops fail with CCS_ERR_REVOKED."""
        _check(_lib.ccs_comm_revoke(self._h), self._h)

    def grow(self, nranks, uid):
        """A Comm of nranks under the new unique id `uid`: this comm's ranks
        keep their ranks, newcomers join with :meth:`join_grown`."""
        h = ctypes.c_void_p()
        _check(_lib.ccs_comm_grow(self._h, nranks, _UniqueId.from_buffer_copy(bytes(uid)), 0,
                                  ctypes.byref(h)), self._h)
        return Comm(_handle=h)

    @classmethod
    def join_grown(cls, nranks, uid, rank):
        """A newcomer's rank of a comm that others grow (:meth:`grow`)."""
        h = ctypes.c_void_p()
        _check(_lib.ccs_comm_grow(None, nranks, _UniqueId.from_buffer_copy(bytes(uid)), rank,
                                  ctypes.byref(h)))
        return cls(_handle=h)

    def finalize(self):
        """Waits for this comm's calls in flight; raises their first failure."""
        _check(_lib.ccs_comm_finalize(self._h), self._h)

    def async_error(self):
        """None, or the :class:`Error` that ended the communicator."""
        rc = _i()
        _check(_lib.ccs_comm_get_async_error(self._h, ctypes.byref(rc)), self._h)
        return Error(rc.value, (_lib.ccs_comm_last_error(self._h) or b"").decode()) if rc.value else None

    def _call(self, fn, *args):
        if not self._h:
            raise ValueError("the communicator is destroyed")
        _check(fn(*args, self._h, None), self._h)

    def _pair(self, send, recv, dtype, recv_size=None):
        s = _array(send, dtype)
        if recv is None:  # in place
            return _writable(s, "an in-place buffer"), s
        r = _writable(_array(recv, dtype or s.dtype), "the receive buffer")
        if r.dtype != s.dtype:
            raise TypeError(f"send is {s.dtype}, receive {r.dtype}")
        if recv_size is not None and r.size != recv_size:
            raise ValueError(f"the receive buffer holds {r.size} elements, {recv_size} needed")
        return s, r

    def all_reduce(self, send, recv=None, op=SUM, dtype=None):
        """recv[i] = op over ranks of send[i]; in place without recv."""
        s, r = self._pair(send, recv, dtype, None)
        if recv is not None and r.size != s.size:
            raise ValueError("send and receive differ in size")
        self._call(_lib.ccs_all_reduce, _ptr(s), _ptr(r), s.size, _DTYPES[s.dtype], _OPS[op])
        return r

    def broadcast(self, buf, root=0, recv=None, dtype=None):
        s, r = self._pair(buf, recv, dtype, None)
        self._call(_lib.ccs_broadcast, _ptr(s), _ptr(r), r.size, _DTYPES[s.dtype], root)
        return r

    def reduce(self, send, recv=None, op=SUM, root=0, dtype=None):
        s, r = self._pair(send, recv, dtype, None)
        self._call(_lib.ccs_reduce, _ptr(s), _ptr(r), s.size, _DTYPES[s.dtype], _OPS[op], root)
        return r

    def all_gather(self, send, recv, dtype=None):
        """recv holds every rank's send, by rank (nranks * send.size elements)."""
        s, r = self._pair(send, recv, dtype, _array(send, dtype).size * self.nranks)
        self._call(_lib.ccs_all_gather, _ptr(s), _ptr(r), s.size, _DTYPES[s.dtype])
        return r

    def reduce_scatter(self, send, recv, op=SUM, dtype=None):
        """recv (send.size / nranks elements) is this rank's block of the reduction."""
        s = _array(send, dtype)
        if s.size % self.nranks:
            raise ValueError("send's size is not a multiple of the ranks")
        s, r = self._pair(send, recv, dtype, s.size // self.nranks)
        self._call(_lib.ccs_reduce_scatter, _ptr(s), _ptr(r), r.size, _DTYPES[s.dtype], _OPS[op])
        return r

    def all_to_all(self, send, recv, dtype=None):
        s = _array(send, dtype)
        if s.size % self.nranks:
            raise ValueError("send's size is not a multiple of the ranks")
        s, r = self._pair(send, recv, dtype, s.size)
        self._call(_lib.ccs_all_to_all, _ptr(s), _ptr(r), s.size // self.nranks, _DTYPES[s.dtype])
        return r

    def gather(self, send, recv=None, root=0, dtype=None):
        s = _array(send, dtype)
        if self.rank == root:
            s, r = self._pair(send, recv, dtype, s.size * self.nranks)
        else:
            r = s
        self._call(_lib.ccs_gather, _ptr(s), _ptr(r), s.size, _DTYPES[s.dtype], root)
        return r if self.rank == root else None

    def scatter(self, send, recv, root=0, dtype=None):
        r = _writable(_array(recv, dtype), "the receive buffer")
        s = _array(send, dtype) if self.rank == root else r
        if self.rank == root and s.size != r.size * self.nranks:
            raise ValueError("the root's send holds nranks * recv.size elements")
        self._call(_lib.ccs_scatter, _ptr(s), _ptr(r), r.size, _DTYPES[r.dtype], root)
        return r

    def send(self, buf, peer, dtype=None):
        s = _array(buf, dtype)
        self._call(_lib.ccs_send, _ptr(s), s.size, _DTYPES[s.dtype], peer)

    def recv(self, buf, peer, dtype=None):
        r = _writable(_array(buf, dtype), "the receive buffer")
        self._call(_lib.ccs_recv, _ptr(r), r.size, _DTYPES[r.dtype], peer)
        return r

    def barrier(self):
        if not self._h:
            raise ValueError("the communicator is destroyed")
        _check(_lib.ccs_barrier(self._h), self._h)


@contextlib.contextmanager
def group():
    """The calls inside are submitted together and done when the block ends."""
    _check(_lib.ccs_group_start())
    try:
        yield
    finally:
        _check(_lib.ccs_group_end())


class _Memory:
    """ccs_mem_alloc memory, freed with the last array that views it."""

    def __init__(self, nbytes):
        p = ctypes.c_void_p()
        _check(_lib.ccs_mem_alloc(ctypes.byref(p), max(nbytes, 1)))
        self.ptr = p.value
        self._free = weakref.finalize(self, _lib.ccs_mem_free, ctypes.c_void_p(p.value))


def empty(shape, dtype=np.float32):
    """An uninitialised array on memory the daemon maps (no copies in collectives)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) if np.ndim(shape) else int(shape)
    mem = _Memory(n * dt.itemsize)
    raw = (ctypes.c_char * max(n * dt.itemsize, 1)).from_address(mem.ptr)
    a = np.frombuffer(raw, dtype=dt, count=n).reshape(shape)
    a.flags.writeable = True
    # the array keeps the memory: NumPy's base chain ends at raw, which holds mem
    raw._ccs_memory = mem
    return a
