"""_lib.py - libzps (include/zps.h) through ctypes, in ABI mode.

Nothing here is compiled against Python or torch: the declarations below
mirror include/zps.h, whose layout does not change within a major version,
so one package works with any torch and any Python 3. Each constant is the
header's name without ZPS_, and tests/python/test_abi.py holds every one of
them, Work's fields and the bound calls against the header and the C
compiler: a header change without its mirror here fails that test. ctypes releases the
GIL around every call, so a call that waits lets other Python threads run.

Where the library is found, first match wins (find_library):
  1. $ZPS_LIB, a path to libzps.so.1; when set, the only place looked at;
  2. libzps.so.1 beside this file (site-packages/zps/ of a pip install);
  3. bin/libzps.so.1 of the source tree this package lies in (make);
  4. lib/ of the prefixes make install is given: /usr/local (its default),
     ~/.local, and the running venv's (make install PREFIX=.venv);
  5. the loader's search path (LD_LIBRARY_PATH, ldconfig's cache).
None found is one ImportError line naming every place looked at.
"""
import ctypes
import os
import sys

SO_MAJOR = 1


class Work(ctypes.Structure):
    """struct zps_work."""

    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("step", ctypes.c_uint64),
        ("epoch", ctypes.c_uint64),
        ("offset", ctypes.c_uint32),
        ("count", ctypes.c_uint32),
        ("indices", ctypes.POINTER(ctypes.c_uint32)),
        ("data_ms", ctypes.c_double),
        ("inner", ctypes.c_uint32),         # diloco (1.2): inner step of the round
        ("inner_steps", ctypes.c_uint32),   # the round's inner steps here
        ("round", ctypes.c_uint64),         # the outer round (step: its global batch)
        ("reserved_", ctypes.c_uint64 * 4),
    ]


# enum zps_err
OK, EINVAL, EPROTO, EVERSION, EJOB, ERANGE, ESTALE, ENOENT, EDUP, ESTATE, ENOMEM, EIO, \
    ETIMEDOUT, ECLOSED, EAGAIN, EPERM, ECOUNT_ = range(17)
# enum zps_next
NEXT_ERROR, NEXT_WORK, NEXT_EVAL, NEXT_ROLLBACK, NEXT_REJOINED, NEXT_DONE, NEXT_OVER, \
    NEXT_STOPPED = -1, 1, 2, 3, 4, 5, 6, 7
WORK_TRAIN, WORK_EVAL = 1, 2
# enum zps_opt
OPT_DEVICE, OPT_SHARE, OPT_TIMEOUT_MS, OPT_JOIN_TIMEOUT_MS, OPT_HEARTBEAT_MS, OPT_SNDBUF, \
    OPT_SHM = range(1, 8)
# enum zps_info
INFO_JOB_ID, INFO_RANK, INFO_SEED, INFO_GLOBAL_BATCH, INFO_TOTAL_STEPS, INFO_STEPS_PER_EPOCH, \
    INFO_START_STEP, INFO_STEP, INFO_N_PARAMS, INFO_N_BUCKETS, INFO_MODE, INFO_INNER_STEPS, \
    INFO_INNER_OPTIM, INFO_INNER_NESTEROV, INFO_MICRO_BATCH, INFO_PUSHED_BYTES = range(1, 17)
MODE_SYNC, MODE_DILOCO = 0, 1
INNER_SGD, INNER_ADAM, INNER_ADAMW = 1, 2, 3
INFO_MODEL, INFO_DATASET = 100, 101
# zps_info_f64 (1.3)
INFO_INNER_LR, INFO_INNER_MOMENTUM, INFO_INNER_WEIGHT_DECAY, INFO_INNER_BETA1, INFO_INNER_BETA2, \
    INFO_INNER_EPS = range(200, 206)
# zps_declare_buffer (1.4)
BUFFER_AVERAGE, BUFFER_BROADCAST = 1, 2
# zps_checkpoint_info, zps_checkpoint_read (1.5)
CHECKPOINT_STEP, CHECKPOINT_SHARDS, CHECKPOINT_N_PARAMS, CHECKPOINT_OPTIM, \
    CHECKPOINT_OPTIM_STEP, CHECKPOINT_SEED, CHECKPOINT_N_TENSORS, CHECKPOINT_N_GROUPS = \
    range(300, 308)
CHECKPOINT_PARAMS, CHECKPOINT_STATE_0, CHECKPOINT_STATE_1 = 0, 1, 2
LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR = range(4)

_P = ctypes.c_void_p
_U32 = ctypes.c_uint32
_U64 = ctypes.c_uint64
_I64 = ctypes.c_int64
_INT = ctypes.c_int
_STR = ctypes.c_char_p
_WORK = ctypes.POINTER(Work)
_FLOATS = ctypes.c_void_p  # float *, passed as an address (a tensor's data_ptr)

# name: (result, argument types)
_SIGNATURES = {
    "zps_version": (_INT, [ctypes.POINTER(_INT)] * 3),
    "zps_strerror": (_STR, [_INT]),
    "zps_set_log_level": (None, [_INT]),
    "zps_client_new": (_P, [_STR]),
    "zps_client_destroy": (None, [ctypes.POINTER(_P)]),
    "zps_errmsg": (_STR, [_P]),
    "zps_errcode": (_INT, [_P]),
    "zps_client_set_int": (_INT, [_P, _INT, _I64]),
    "zps_client_set_str": (_INT, [_P, _INT, _STR]),
    "zps_client_set_curve": (_INT, [_P, _STR, _STR]),
    "zps_client_stop": (None, [_P]),
    "zps_declare_tensor": (_INT, [_P, _STR, _INT, ctypes.POINTER(_I64)]),
    "zps_declare_dataset": (_INT, [_P, _U32, _U32]),
    "zps_declare_group": (_INT, [_P, _INT, _INT, ctypes.c_double, ctypes.c_double, _INT,
                                 ctypes.c_double, ctypes.c_double, ctypes.c_double,
                                 ctypes.c_double]),  # 1.4
    "zps_declare_tensor_group": (_INT, [_P, _STR, _INT]),  # 1.4
    "zps_declare_buffer": (_INT, [_P, _STR, _INT, ctypes.POINTER(_I64), _INT]),  # 1.4
    "zps_declare_lr_table": (_INT, [_P, _INT, _U64, _FLOATS]),  # 1.4
    "zps_declare_clip_grad_norm": (_INT, [_P, ctypes.c_double]),  # 1.4
    "zps_connect": (_INT, [_P]),
    "zps_join": (_INT, [_P]),
    "zps_info_u64": (_U64, [_P, _INT]),
    "zps_info_str": (_STR, [_P, _INT]),
    "zps_info_f64": (ctypes.c_double, [_P, _INT]),  # 1.3
    "zps_inner_lr": (ctypes.c_double, [_P, _U64]),  # 1.3
    "zps_bucket_range": (_INT, [_P, _INT, ctypes.POINTER(_U64), ctypes.POINTER(_U64)]),
    "zps_set_params": (_INT, [_P, _FLOATS, ctypes.c_size_t]),
    "zps_set_dataset": (_INT, [_P, _U32, _U32]),
    "zps_next_work": (_INT, [_P, _WORK]),
    "zps_work_start": (_INT, [_P, _WORK]),
    "zps_push_bucket": (_INT, [_P, _WORK, _INT, _FLOATS, ctypes.c_float]),
    "zps_push_micro": (_INT, [_P, _WORK, _U32, _INT, _FLOATS, ctypes.c_float]),  # 1.6
    "zps_work_done": (_INT, [_P, _WORK]),
    "zps_inner_done": (_INT, [_P, _WORK, ctypes.c_float]),  # 1.2
    "zps_eval_done": (_INT, [_P, _WORK, _U32, ctypes.c_double]),
    "zps_batch_indices": (_INT, [_U64, _U32, _U32, _U64, _U32, _U32, ctypes.POINTER(_U32)]),
    "zps_leave": (_INT, [_P]),
    "zps_checkpoint_open": (_INT, [_STR, _I64, ctypes.POINTER(_P), ctypes.c_char_p,
                                   ctypes.c_size_t]),  # 1.5
    "zps_checkpoint_destroy": (None, [ctypes.POINTER(_P)]),  # 1.5
    "zps_checkpoint_info": (_U64, [_P, _INT]),  # 1.5
    "zps_checkpoint_tensor": (_INT, [_P, _INT, ctypes.POINTER(_STR), ctypes.POINTER(_INT),
                                     ctypes.POINTER(_I64), ctypes.POINTER(_INT),
                                     ctypes.POINTER(_INT)]),  # 1.5
    "zps_checkpoint_group": (_INT, [_P, _INT, ctypes.POINTER(_INT)]
                             + [ctypes.POINTER(ctypes.c_double)] * 2 + [ctypes.POINTER(_INT)]
                             + [ctypes.POINTER(ctypes.c_double)] * 4),  # 1.5
    "zps_checkpoint_read": (_INT, [_P, _INT, _FLOATS, ctypes.c_size_t]),  # 1.5
}

# Calls added by a minor version, which an older libzps 1.x lacks: bound
# when present; the methods that call them say which version they need.
_SINCE = {"zps_inner_done": (1, 2), "zps_info_f64": (1, 3), "zps_inner_lr": (1, 3),
          "zps_declare_group": (1, 4), "zps_declare_tensor_group": (1, 4),
          "zps_declare_buffer": (1, 4), "zps_declare_lr_table": (1, 4),
          "zps_declare_clip_grad_norm": (1, 4), "zps_checkpoint_open": (1, 5),
          "zps_checkpoint_destroy": (1, 5), "zps_checkpoint_info": (1, 5),
          "zps_checkpoint_tensor": (1, 5), "zps_checkpoint_group": (1, 5),
          "zps_checkpoint_read": (1, 5), "zps_push_micro": (1, 6)}


def has(name):
    """Whether the loaded libzps has the call `name` (see _SINCE)."""
    return getattr(lib, name, None) is not None


SONAME = f"libzps.so.{SO_MAJOR}"


def install_prefixes():
    """The PREFIXes make install is given (Makefile: default /usr/local)."""
    prefixes = ["/usr/local", os.path.expanduser("~/.local")]
    if sys.prefix != sys.base_prefix:
        prefixes.append(sys.prefix)  # a venv: make install PREFIX=.venv
    return list(dict.fromkeys(prefixes))


def find_library(environ=None, here=None, prefixes=None, soname=SONAME):
    """(ctypes.CDLL, path) of the first libzps found in the order above.

    The arguments default to os.environ, this package's directory and
    install_prefixes(); the tests give others. ImportError when none loads,
    one line naming each place looked at and what to do.
    """
    environ = os.environ if environ is None else environ
    here = os.path.dirname(os.path.abspath(__file__)) if here is None else here
    prefixes = install_prefixes() if prefixes is None else prefixes
    env = environ.get("ZPS_LIB")
    if env:
        places = [(env, f"ZPS_LIB={env}: no such file")]
    else:
        places = [(os.path.join(here, soname), f"ZPS_LIB unset; not beside {here}")]
        tree = os.path.normpath(os.path.join(here, "..", ".."))
        if os.path.isfile(os.path.join(tree, "include", "zps.h")):
            places.append((os.path.join(tree, "bin", soname),
                           f"not in {os.path.join(tree, 'bin')} (make)"))
        places += [(os.path.join(p, "lib", soname), f"not in {os.path.join(p, 'lib')}")
                   for p in prefixes]
        places.append((soname, "not on the loader's path"))
    missed = []
    for path, miss in places:
        if os.path.sep in path and not os.path.exists(path):
            missed.append(miss)
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            err = " ".join(str(e).split())
            missed.append(miss if err.startswith(f"{soname}: cannot open") else err)
    if env:
        fix = "Point ZPS_LIB at a libzps.so.1 (make builds bin/libzps.so.1), or unset it"
    else:
        fix = "Run make install, or set ZPS_LIB to a libzps.so.1"
    raise ImportError(f"{soname} not found: " + "; ".join(missed) + f". {fix}")


def _load():
    lib, path = find_library()
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is None and name in _SINCE:
            continue  # an older libzps 1.x: the calls of its minor version only
        if fn is None:
            raise ImportError(f"{path} has no {name}: not a libzps {SO_MAJOR}")
        fn.restype = res
        fn.argtypes = args
    major = _INT()
    lib.zps_version(ctypes.byref(major), None, None)
    if major.value != SO_MAJOR:
        raise ImportError(f"{path} is libzps {major.value}, this package speaks {SO_MAJOR}")
    return lib, path


lib, lib_path = _load()  # lib_path: where libzps was found
