"""zps - Python workers of a zps job, over libzps (include/zps.h).

    import zps.torch as zt        # PyTorch models: zt.Run, see zps/torch.py

This module is the part without torch: the errors, the data order of every
zps job (batch_indices) and Client, a thin object over one libzps client
for those who drive the library themselves. Every failure is a ZpsError
whose message is the library's one-line reason.
"""
import ctypes

from . import _lib
from ._lib import lib

__all__ = ["ZpsError", "BadArgument", "Refused", "NotYet", "TimedOut", "JobGone",
           "TransportError", "ProtocolError", "Client", "batch_indices", "set_log_level",
           "version"]


class ZpsError(Exception):
    """A libzps call failed: .code is the zps_err, .reason the library's line."""

    def __init__(self, code, reason):
        super().__init__(reason)
        self.code = code
        self.reason = reason


class BadArgument(ZpsError, ValueError):
    """An argument or a declaration this process made is not usable."""


class Refused(ZpsError):
    """The job said no: a model or dataset that is not the job's, a share
    that does not fit, a job that admits no more workers, a message this
    worker's role or CURVE key may not send (EPERM)."""


class NotYet(ZpsError):
    """Not yet (EAGAIN): the job cannot take this now, and the same call
    may succeed later. libzps retries "not yet" answers itself; a piece
    whose step ended during a pause makes Client.work_start return False."""


class TimedOut(ZpsError):
    """A bounded wait ran out: nothing answered (no server at the address,
    a CURVE key the servers do not know, a job that never started)."""


class JobGone(ZpsError):
    """The job is over without this worker, or its servers went silent."""


class TransportError(ZpsError):
    """A socket or file could not be used (a bad endpoint)."""


class ProtocolError(ZpsError):
    """A peer sent what zps does not speak."""


_BY_CODE = {_lib.EINVAL: Refused, _lib.EJOB: Refused, _lib.EVERSION: Refused,
            _lib.ESTATE: Refused, _lib.ENOENT: Refused, _lib.ERANGE: Refused,
            _lib.EDUP: Refused, _lib.EPERM: Refused, _lib.EAGAIN: NotYet,
            _lib.ETIMEDOUT: TimedOut, _lib.ECLOSED: JobGone,
            _lib.EIO: TransportError, _lib.EPROTO: ProtocolError}
# Raised as a plain ZpsError: ESTALE, which libzps mends itself (it asks
# the coordinator where the job is), and ENOMEM, which no class would help
# a caller act on. Every other code has its class (test_abi.py holds that).
_PLAIN = (_lib.ESTALE, _lib.ENOMEM)


def error(code, reason, local=False):
    """The exception for a zps_err; local: raised by this process's own
    argument (EINVAL is then BadArgument, not a refusal)."""
    if local and code == _lib.EINVAL:
        cls = BadArgument
    else:
        cls = _BY_CODE.get(code, ZpsError)
    return cls(code, reason or lib.zps_strerror(code).decode())


def version():
    """libzps's (major, minor, patch)."""
    v = [ctypes.c_int() for _ in range(3)]
    lib.zps_version(*(ctypes.byref(x) for x in v))
    return tuple(x.value for x in v)


def set_log_level(level):
    """'debug', 'info' (default), 'warn' or 'error': libzps's lines on stderr."""
    levels = {"debug": _lib.LOG_LEVEL_DEBUG, "info": _lib.LOG_LEVEL_INFO,
              "warn": _lib.LOG_LEVEL_WARN, "error": _lib.LOG_LEVEL_ERROR}
    if level not in levels:
        raise BadArgument(_lib.EINVAL, f"log level {level!r}: one of {', '.join(levels)}")
    lib.zps_set_log_level(levels[level])


def batch_indices(n_train, global_batch, seed, step, offset=0, count=None):
    """Train indices [offset, offset + count) of step's global batch, as
    every zps job orders its data (zps_batch_indices): a list of ints."""
    count = global_batch - offset if count is None else count
    out = (ctypes.c_uint32 * max(count, 1))()
    err = lib.zps_batch_indices(seed, n_train, global_batch, step, offset, count, out)
    if err != _lib.OK:
        raise error(err, f"batch_indices(n_train={n_train}, global_batch={global_batch}, "
                         f"step={step}, offset={offset}, count={count}): "
                         f"{lib.zps_strerror(err).decode()}", local=True)
    return list(out[:count])


_INT_OPTS = {"share": _lib.OPT_SHARE, "timeout_ms": _lib.OPT_TIMEOUT_MS,
             "join_timeout_ms": _lib.OPT_JOIN_TIMEOUT_MS, "heartbeat_ms": _lib.OPT_HEARTBEAT_MS,
             "sndbuf": _lib.OPT_SNDBUF, "shm": _lib.OPT_SHM}
_INFO = {"job_id": _lib.INFO_JOB_ID, "rank": _lib.INFO_RANK, "seed": _lib.INFO_SEED,
         "global_batch": _lib.INFO_GLOBAL_BATCH, "total_steps": _lib.INFO_TOTAL_STEPS,
         "steps_per_epoch": _lib.INFO_STEPS_PER_EPOCH, "start_step": _lib.INFO_START_STEP,
         "step": _lib.INFO_STEP, "n_params": _lib.INFO_N_PARAMS,
         "n_buckets": _lib.INFO_N_BUCKETS, "mode": _lib.INFO_MODE,
         "inner_steps": _lib.INFO_INNER_STEPS, "micro_batch": _lib.INFO_MICRO_BATCH,
         "pushed_bytes": _lib.INFO_PUSHED_BYTES}


class Client:
    """One libzps client (zps_client): the calls of include/zps.h, each
    raising the ZpsError of its failure. One thread drives it at a time;
    stop() alone may come from any thread."""

    def __init__(self, coordinator):
        self._c = lib.zps_client_new(coordinator.encode())
        if not self._c:
            raise ZpsError(_lib.ENOMEM, "zps_client_new: out of memory or ZeroMQ contexts")
        self.coordinator = coordinator

    def _check(self, err, what, local=False):
        if err != _lib.OK:
            msg = lib.zps_errmsg(self._c).decode(errors="replace")
            raise error(err, msg or f"{what}: {lib.zps_strerror(err).decode()}", local)

    def set(self, name, value):
        """An option before connect(): share, timeout_ms, join_timeout_ms,
        heartbeat_ms, sndbuf, shm (ints: 0 off, 1 auto, 2 on) or device (a string)."""
        if name == "device":
            err = lib.zps_client_set_str(self._c, _lib.OPT_DEVICE, str(value).encode())
        elif name in _INT_OPTS:
            err = lib.zps_client_set_int(self._c, _INT_OPTS[name], int(value))
        else:
            raise BadArgument(_lib.EINVAL, f"no option {name!r}: one of device, "
                                           f"{', '.join(_INT_OPTS)}")
        self._check(err, f"option {name}={value!r}", local=True)

    def set_curve(self, secret_file, server_key_file):
        err = lib.zps_client_set_curve(self._c, str(secret_file).encode(),
                                       str(server_key_file).encode())
        self._check(err, "CURVE keys", local=True)

    def declare_tensor(self, name, shape):
        dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self._check(lib.zps_declare_tensor(self._c, name.encode(), len(shape), dims),
                    f"tensor {name}", local=True)

    def _need_1_4(self, call):
        if not _lib.has(call):
            major, minor, _ = version()
            raise BadArgument(_lib.EINVAL, f"libzps {major}.{minor} has no {call}: declaring "
                                           f"an optimizer needs libzps 1.4 or later")

    def declare_group(self, group, kind, lr, momentum=0.0, nesterov=False, weight_decay=0.0,
                      betas=(0.9, 0.999), eps=1e-8):
        """Parameter group `group` (0..n-1, in order, before join) of the
        job's optimizer: kind _lib.INNER_SGD, INNER_ADAM or INNER_ADAMW, and
        the group's hyperparameters as torch names them."""
        self._need_1_4("zps_declare_group")
        self._check(lib.zps_declare_group(self._c, group, kind, lr, momentum, int(bool(nesterov)),
                                          weight_decay, betas[0], betas[1], eps),
                    f"group {group}", local=True)

    def declare_tensor_group(self, name, group):
        """The group of declared tensor `name` (default 0), before join."""
        self._need_1_4("zps_declare_tensor_group")
        self._check(lib.zps_declare_tensor_group(self._c, name.encode(), group),
                    f"tensor {name}", local=True)

    def declare_buffer(self, name, shape, how=_lib.BUFFER_AVERAGE):
        """A buffer of the flat vector (fp32, not optimized): its value is
        pushed in the gradient, and the new one (_lib.BUFFER_AVERAGE: the
        sample-weighted mean; BUFFER_BROADCAST: sample 0's slice's) comes
        back with the parameters."""
        self._need_1_4("zps_declare_buffer")
        dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self._check(lib.zps_declare_buffer(self._c, name.encode(), len(shape), dims, how),
                    f"buffer {name}", local=True)

    def declare_lr_table(self, groups, steps=0, lr=None):
        """A learning-rate table, lr[step * groups + g] (floats): before
        join with steps 0 and lr None to announce it, after join and before
        the first next_work with the table (rank 0's is sent with INIT)."""
        self._need_1_4("zps_declare_lr_table")
        buf = None
        if lr is not None:
            buf = (ctypes.c_float * len(lr))(*lr)
        self._check(lib.zps_declare_lr_table(self._c, groups, steps,
                                             ctypes.addressof(buf) if buf is not None else None),
                    "learning-rate table", local=True)

    def declare_dataset(self, n_train, n_test=0):
        self._check(lib.zps_declare_dataset(self._c, n_train, n_test), "dataset", local=True)

    def declare_clip_grad_norm(self, max_norm):
        """With a declared model, before join: the shards clip every step's
        averaged gradient to a global 2-norm of at most `max_norm`, as
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) would
        (zps-server --clip-grad-norm wins if given; a different value is
        refused at join).

        Example::

            client.declare_tensor("fc.weight", (10, 784))
            client.declare_clip_grad_norm(1.0)
        """
        if not _lib.has("zps_declare_clip_grad_norm"):
            major, minor, _ = version()
            raise BadArgument(_lib.EINVAL, f"libzps {major}.{minor} has no "
                                           f"zps_declare_clip_grad_norm: it needs libzps 1.4")
        self._check(lib.zps_declare_clip_grad_norm(self._c, float(max_norm)),
                    f"clip_grad_norm {max_norm}", local=True)

    def connect(self):
        self._check(lib.zps_connect(self._c), f"connecting to {self.coordinator}")

    def join(self):
        self._check(lib.zps_join(self._c), f"joining the job at {self.coordinator}")

    def info(self, name):
        """A number of the job (job_id, rank, seed, global_batch, ..., mode:
        _lib.MODE_SYNC or MODE_DILOCO, inner_steps: diloco's H, micro_batch: a
        deterministic job's M, 0 otherwise) or model, dataset (strings)."""
        if not self._c:
            raise BadArgument(_lib.EINVAL, f"{name}: the client is closed")
        if name in ("model", "dataset"):
            key = _lib.INFO_MODEL if name == "model" else _lib.INFO_DATASET
            return lib.zps_info_str(self._c, key).decode()
        if name not in _INFO:
            raise BadArgument(_lib.EINVAL, f"no job information {name!r}")
        return lib.zps_info_u64(self._c, _INFO[name])

    def bucket_range(self, b):
        lo, hi = ctypes.c_uint64(), ctypes.c_uint64()
        self._check(lib.zps_bucket_range(self._c, b, ctypes.byref(lo), ctypes.byref(hi)),
                    f"bucket {b}", local=True)
        return lo.value, hi.value

    def set_params(self, address, n):
        """address: of n floats (a tensor's data_ptr()), kept alive by the caller."""
        self._check(lib.zps_set_params(self._c, address, n), "parameters", local=True)

    def set_dataset(self, n_train, n_test=0):
        self._check(lib.zps_set_dataset(self._c, n_train, n_test), "dataset", local=True)

    def next_work(self, work):
        """A zps_next (_lib.NEXT_*) with work filled; raises on NEXT_ERROR."""
        r = lib.zps_next_work(self._c, ctypes.byref(work))
        if r == _lib.NEXT_ERROR:
            self._check(lib.zps_errcode(self._c) or _lib.EIO, "next work")
        return r

    def work_start(self, work):
        """True to compute work, False when its step is over already."""
        err = lib.zps_work_start(self._c, ctypes.byref(work))
        if err == _lib.EAGAIN:
            return False
        self._check(err, f"starting the piece of step {work.step}")
        return True

    def push_bucket(self, work, b, grad_address, loss):
        self._check(lib.zps_push_bucket(self._c, ctypes.byref(work), b, grad_address, loss),
                    f"pushing bucket {b} of step {work.step}")

    def push_micro(self, work, micro, b, grad_address, loss):
        """A deterministic job (libzps 1.6): bucket b of micro-batch `micro`
        of work (its mean gradient over the job's M samples, read at once)
        with the micro-batch's mean loss; micro-batches in order per bucket."""
        if not _lib.has("zps_push_micro"):
            major, minor, _ = version()
            raise BadArgument(_lib.EINVAL, f"libzps {major}.{minor} has no zps_push_micro: a "
                                           f"deterministic job needs libzps 1.6 or later")
        self._check(lib.zps_push_micro(self._c, ctypes.byref(work), micro, b, grad_address,
                                       loss),
                    f"pushing bucket {b} of micro-batch {micro} of step {work.step}")

    def work_done(self, work):
        self._check(lib.zps_work_done(self._c, ctypes.byref(work)),
                    f"the piece of step {work.step}")

    def inner_done(self, work, loss):
        """Diloco, instead of push_bucket and work_done: inner step `work`
        is computed and the caller's optimizer has stepped the parameter
        buffer; after the round's last one the pseudo-gradient is pushed."""
        if not _lib.has("zps_inner_done"):
            major, minor, _ = version()
            raise BadArgument(_lib.EINVAL, f"libzps {major}.{minor} has no zps_inner_done: a "
                                           f"diloco job needs libzps 1.2 or later")
        self._check(lib.zps_inner_done(self._c, ctypes.byref(work), loss),
                    f"inner step {work.inner} of round {work.round}", local=True)

    def eval_done(self, work, correct, loss_sum):
        self._check(lib.zps_eval_done(self._c, ctypes.byref(work), correct, loss_sum),
                    "an evaluation")

    def stop(self):
        """Every wait returns soon and next_work answers NEXT_STOPPED; any thread."""
        if self._c:
            lib.zps_client_stop(self._c)

    def leave(self):
        self._check(lib.zps_leave(self._c), "leaving the job")

    def close(self):
        """Destroys the client (a queued BYE still goes out); idempotent."""
        if self._c:
            p = ctypes.c_void_p(self._c)
            lib.zps_client_destroy(ctypes.byref(p))
            self._c = None

    def __del__(self):
        self.close()
