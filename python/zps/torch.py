"""zps.torch - a PyTorch model as a worker of a zps job.

    import zps.torch as zt
    run = zt.Run("tcp://host:5555", model, dataset_size=len(train_set))
    for work in run:                       # a piece of a step's global batch
        x, y = collate(train_set, work.indices)
        work.backward(loss_fn(model(x), y))   # the mean loss over the piece
    run.close()                            # model: the job's final parameters

What Run does to the model, and why:
- Its parameters (model.parameters(), in that order) become views of one
  flat fp32 vector, the job's layout; libzps writes each step's parameters
  into it in place, so no copy is made per step. Rank 0's values at the
  start are the job's initial ones (Horovod's broadcast_parameters). A
  bf16/fp16 model or one on a GPU keeps its own tensors and trains staged
  (_torch_state.py): copies to and from the flat vectors per bucket.
- Their .grad become views of one flat gradient, and a hook on each
  parameter's gradient accumulator pushes a bucket the moment the last
  parameter in it is final, so the wire works while the earlier layers'
  backward still runs (DDP's and Horovod's overlap).
- The training script's parts go to the shards (_torch_optim.py): the
  user's torch optimizer and its param_groups (optimizer=), a step-based
  scheduler's table of learning rates (scheduler=), clipping by the global
  norm (clip_grad_norm=); opt.step() then does nothing here. Without
  optimizer=, the server's flags are the job's optimizer.
- Floating-point buffers (BatchNorm's running statistics) lie in the flat
  vector after the parameters and are averaged by the shards (buffers=
  "average"; "broadcast": rank 0's; "local": each worker's own).
  torch.nn.Dropout draws its masks from this process's generator: Run
  warns; zps.torch.Dropout draws them from (seed, step, sample) instead,
  so a piece's masks do not depend on how the global batch is split.
- work.micro_batches(n) cuts a piece into micro-batches pushed once.
- A deterministic job (zps-server --deterministic --micro-batch M;
  run.micro_batch is M) gives the same bits for any split of the global
  batch: each micro-batch of M samples is computed alone (the flat
  gradient zeroed before it) and its gradient pushed through
  zps_push_micro, which sums micro-batches in the job's one tree order;
  torch.use_deterministic_algorithms is on while the Run is open.
- Ctrl-C leaves the job (BYE: the others take this worker's share), and
  every wait is bounded (timeout=, join_timeout=).

DiLoCo (zps-server --mode diloco --inner-steps H): every step of the job
is an outer round, in which each worker trains H global batches of its
slice alone with its own torch optimizer, then the shards average the
pseudo-gradients (the round's start minus each worker's parameters) under
their outer Nesterov step and every worker starts the next round from the
same bits. The loop is the same; Run takes the optimizer, built over
model.parameters() before or after Run, and work.backward(loss) runs
loss.backward() and optimizer.step() on the flat vector (no bucket is
pushed; libzps pushes the round's pseudo-gradient after its last inner
step). The optimizer's state stays across rounds, as DiLoCo keeps it; a
torch LR scheduler is the caller's to step. work.step is then the global
batch trained (round * H + inner), work.round and work.inner say where in
the round it is, and run.total_steps and run.step count rounds:

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = zt.Run("tcp://host:5555", model, dataset_size=len(train_set), optimizer=opt)
    for work in run:                       # inner step work.inner of round work.round
        x, y = collate(train_set, work.indices)
        work.backward(loss_fn(model(x), y))   # backward, then opt.step()
"""
import atexit
import ctypes
import os
import select
import signal
import threading
import time
import warnings

import numpy as np
import torch

from . import BadArgument, Client, JobGone, TimedOut, ZpsError, _lib, _torch_optim, _torch_state
from ._lib import lib

__all__ = ["Run", "Work", "MicroBatch", "Dropout", "ZpsWarning", "global_batch_indices",
           "sample_context", "load_checkpoint"]


class ZpsWarning(UserWarning):
    """Something of the model that zps's promise does not cover."""


def global_batch_indices(dataset_size, global_batch, seed, step):
    """The dataset indices one process training on the global batch takes
    at step (a LongTensor of global_batch): the data order of every zps job."""
    out = (ctypes.c_uint32 * global_batch)()
    err = lib.zps_batch_indices(seed, dataset_size, global_batch, step, 0, global_batch, out)
    if err != _lib.OK:
        raise BadArgument(err, f"global_batch_indices(dataset_size={dataset_size}, "
                               f"global_batch={global_batch}, step={step}): needs "
                               f"1 <= global_batch <= dataset_size")
    return torch.from_numpy(np.frombuffer(out, dtype=np.uint32).astype(np.int64))


# ---------------------------------------------------------------- sampling

_context = threading.local()


class sample_context:
    """Within it, zps.torch.Dropout draws the masks of (seed, step, indices):
    what Run sets for each piece, for a single process to do the same."""

    def __init__(self, seed, step, indices):
        self.value = (int(seed), int(step), indices)

    def __enter__(self):
        self.prior = getattr(_context, "value", None)
        _context.value = self.value
        return self

    def __exit__(self, *exc):
        _context.value = self.prior


def _mix(*words):
    """splitmix64 over the words: a seed per (seed, step, sample)."""
    h = 0
    for w in words:
        h = (h ^ (int(w) & 0xFFFFFFFFFFFFFFFF)) + 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h & 0x7FFFFFFFFFFFFFFF


class Dropout(torch.nn.Module):
    """torch.nn.Dropout whose mask of each sample is drawn from (the job's
    seed, the step, the sample's dataset index): the same whichever worker
    computes the sample, as one process would. Needs a piece (inside a Run's
    loop) or a sample_context."""

    def __init__(self, p=0.5, salt=0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise BadArgument(_lib.EINVAL, f"Dropout p={p}: in [0, 1)")
        self.p = p
        self.salt = salt  # tells two Dropout modules of one model apart

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        ctx = getattr(_context, "value", None)
        if ctx is None:
            raise BadArgument(_lib.EINVAL, "zps.torch.Dropout outside a piece: train inside a "
                                           "zt.Run loop or a zt.sample_context(seed, step, "
                                           "indices)")
        seed, step, indices = ctx
        if len(indices) != x.shape[0]:
            raise BadArgument(_lib.EINVAL, f"zps.torch.Dropout: {x.shape[0]} rows for "
                                           f"{len(indices)} samples")
        keep = torch.empty(x.shape, dtype=x.dtype)
        g = torch.Generator()
        for row, i in enumerate(indices.tolist()):
            g.manual_seed(_mix(seed, step, i, self.salt))
            keep[row] = torch.rand(x.shape[1:], generator=g) >= self.p
        return x * keep.to(x.device) / (1.0 - self.p)


# ---------------------------------------------------------------- Ctrl-C

class _Interrupts:
    """Makes Ctrl-C stop a libzps wait: the main thread sits in C, where
    Python's handler cannot run until the call returns, so Python's wakeup
    fd (written by its C-level handler) wakes a thread that calls
    zps_client_stop; the call returns, and KeyboardInterrupt follows. Where
    the wakeup fd is taken (asyncio) or this is not the main thread, a wait
    ends on its own bounds instead."""

    def __init__(self, client):
        self.client = client
        self.thread = None
        if threading.current_thread() is not threading.main_thread():
            return
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)
        prior = signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)
        if prior != -1:
            signal.set_wakeup_fd(prior)
            os.close(self.r)
            os.close(self.w)
            return
        self.quit_r, self.quit_w = os.pipe()
        self.thread = threading.Thread(target=self._watch, name="zps-interrupts", daemon=True)
        self.thread.start()

    def _watch(self):
        while True:
            ready, _, _ = select.select([self.r, self.quit_r], [], [])
            if self.quit_r in ready:
                return
            try:
                got = os.read(self.r, 64)
            except BlockingIOError:
                continue
            if signal.SIGINT in got:
                self.client.stop()

    def close(self):
        if self.thread is None:
            return
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(-1)
        os.write(self.quit_w, b"q")
        self.thread.join(timeout=5)
        for fd in (self.r, self.w, self.quit_r, self.quit_w):
            os.close(fd)
        self.thread = None


# ---------------------------------------------------------------- the run

class Work:
    """A piece of a step: train the samples `indices` (a LongTensor into
    the dataset) on the parameters now in the model, then backward(loss)."""

    __slots__ = ("_run", "_w", "_done", "step", "epoch", "offset", "count", "indices", "inner",
                 "inner_steps", "round")

    def __init__(self, run, w, indices):
        self._run = run
        self._w = w
        self._done = False
        self.step = w.step
        self.epoch = w.epoch
        self.offset = w.offset
        self.count = w.count
        self.indices = indices
        # Diloco: inner step `inner` of the `inner_steps` this worker takes
        # in outer round `round` (step: the global batch it trains); 0 in sync.
        self.inner = w.inner
        self.inner_steps = w.inner_steps
        self.round = w.round

    def backward(self, loss):
        """loss: the mean over this piece's samples, as one writes it for a
        batch. Runs loss.backward(), pushing each bucket once it is final;
        diloco: loss.backward(), then the Run's optimizer.step(). A
        deterministic job takes it only for a piece of one micro-batch."""
        m = self._run._micro
        if m:
            if self.count != m:
                raise BadArgument(_lib.EINVAL, f"work.backward on a piece of {self.count} "
                                               f"samples: this deterministic job computes "
                                               f"micro-batches of {m} alone: for mb in "
                                               f"work.micro_batches({m}): mb.backward(loss)")
            self._run._backward_micro(self, loss, 0, 1)
            return
        self._run._backward(self, loss)

    def micro_batches(self, max_samples):
        """The piece cut into micro-batches of at most max_samples (a slice
        that does not fit in memory at once, DDP's no_sync): for each,
        mb.backward(loss of mb.indices). Their gradients add up weighted by
        samples, and the piece is pushed once, after the last: the same as
        one backward over the piece, within round-off.

        A deterministic job (run.micro_batch M > 0) takes max_samples M
        alone: each micro-batch of M samples is then computed and pushed on
        its own, so its gradient is the same bits whichever worker computes
        it::

            for mb in work.micro_batches(run.micro_batch):
                mb.backward(loss_fn(model(x[mb.indices]), y[mb.indices]))
        """
        m = self._run._micro
        if m and max_samples != m:
            raise BadArgument(_lib.EINVAL, f"micro_batches({max_samples}): this deterministic "
                                           f"job's micro-batches are {m} samples "
                                           f"(run.micro_batch): micro_batches({m})")
        if int(max_samples) < 1:
            raise BadArgument(_lib.EINVAL, f"micro_batches({max_samples}): at least 1 sample")
        return self._micro_batches(int(max_samples))

    def _micro_batches(self, step):
        for lo in range(0, self.count, step):
            hi = min(self.count, lo + step)
            mb = MicroBatch(self, lo, hi)
            piece = getattr(_context, "value", None)  # zps.torch.Dropout: the mb's samples
            if piece is None or mb.indices is None:
                yield mb
            else:
                with sample_context(piece[0], piece[1], mb.indices):
                    yield mb
            if not mb._done:
                raise BadArgument(_lib.EINVAL, f"micro-batch [{lo}, {hi}) of step {self.step} "
                                               f"was not computed: call mb.backward(loss)")

    def __repr__(self):
        if self.inner_steps:
            return (f"Work(round={self.round}, inner={self.inner}/{self.inner_steps}, "
                    f"step={self.step}, offset={self.offset}, count={self.count})")
        return f"Work(step={self.step}, offset={self.offset}, count={self.count})"


class MicroBatch:
    """Samples [offset, offset + count) of a piece (offsets within it):
    indices, then backward(loss), loss the mean over these samples."""

    __slots__ = ("_work", "_done", "offset", "count", "indices")

    def __init__(self, work, lo, hi):
        self._work = work
        self._done = False
        self.offset, self.count = lo, hi - lo
        self.indices = work.indices[lo:hi] if work.indices is not None else None

    def backward(self, loss):
        if self._done:
            raise BadArgument(_lib.EINVAL, "mb.backward: once per micro-batch")
        w = self._work
        self._done = True
        m = w._run._micro
        if m:
            w._run._backward_micro(w, loss, self.offset // m, w.count // m)
            return
        w._run._backward(w, loss, self.count, first=self.offset == 0,
                         last=self.offset + self.count == w.count)

    def __repr__(self):
        return f"MicroBatch(step={self._work.step}, offset={self.offset}, count={self.count})"


def _check_model(model, staged):
    """The parameters, and whether they need the staged path: a dtype other
    than fp32, a device other than the CPU (or staged=True)."""
    named = list(model.named_parameters())
    if not named:
        raise BadArgument(_lib.EINVAL, "the model has no parameters")
    for name, p in named:
        if p.dtype not in _STAGED_DTYPES:
            raise BadArgument(_lib.EINVAL, f"parameter {name} is {p.dtype}: zps trains float32, "
                                           f"bfloat16 and float16 parameters")
    plain = all(p.dtype == torch.float32 and p.device.type == "cpu" for _, p in named)
    if staged is False and not plain:
        name, p = next((n, p) for n, p in named
                       if p.dtype != torch.float32 or p.device.type != "cpu")
        raise BadArgument(_lib.EINVAL, f"parameter {name} is {p.dtype} on {p.device}: only "
                                       f"float32 on the CPU trains in place (staged=False)")
    return named, bool(staged) or not plain


_STAGED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_inner_optimizer(optimizer, named):
    """A diloco job's inner optimizer steps the model's own parameters,
    which Run makes views of the flat vector the job's rounds start from."""
    if optimizer is None:
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise BadArgument(_lib.EINVAL, f"optimizer= is a {type(optimizer).__name__}: give a "
                                       f"torch.optim.Optimizer over model.parameters()")
    mine = {id(p) for _, p in named}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in mine:
                raise BadArgument(_lib.EINVAL, f"the optimizer steps a tensor {list(p.shape)} "
                                               f"that is not one of the model's parameters: "
                                               f"build it over model.parameters()")


def _state_buffers(model):
    """(name, tensor) of the buffers in the model's state_dict: a buffer
    registered persistent=False (a constant such as a causal mask) is no
    state and does not travel."""
    out = []
    for prefix, mod in model.named_modules():
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        for name, b in mod.named_buffers(recurse=False):
            if b is not None and name not in skip:
                out.append((f"{prefix}.{name}" if prefix else name, b))
    return out


_BUFFER_MODES = {"average": _lib.BUFFER_AVERAGE, "broadcast": _lib.BUFFER_BROADCAST,
                 "local": None}


def _warn_uncovered(model, buffers):
    for name, mod in model.named_modules():
        name = name or type(mod).__name__
        bufs = [b for b, _ in mod.named_buffers(recurse=False)]
        if bufs and buffers == "local":
            warnings.warn(f"zps: module '{name}' ({type(mod).__name__}) keeps buffers "
                          f"{', '.join(bufs)} and Run(buffers='local'): each worker's buffers "
                          f"come from its own pieces and stay its own", ZpsWarning, stacklevel=3)
        if bufs and isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) and mod.training:
            warnings.warn(f"zps: module '{name}' ({type(mod).__name__}) normalises over a "
                          f"piece, not the global batch, so its gradient is not one process's "
                          f"(docs/pytorch.md, BatchNorm); GroupNorm and LayerNorm keep the "
                          f"promise", ZpsWarning, stacklevel=3)
        if isinstance(mod, torch.nn.modules.dropout._DropoutNd) and mod.p > 0:
            warnings.warn(f"zps: module '{name}' ({type(mod).__name__}) draws its masks from "
                          f"this process's generator, so they depend on how the global batch "
                          f"is split; zps.torch.Dropout draws them from (seed, step, sample)",
                          ZpsWarning, stacklevel=3)


def _from_environment(coordinator, share, curve):
    """Run(None, ...): the coordinator, share and CURVE keys of zps-run or
    of a ConfigMap, from ZPS_COORDINATOR, ZPS_SHARE, ZPS_CURVE_SECRET and
    ZPS_SERVER_KEY (zps-worker's flags as environment variables)."""
    if coordinator is not None:
        return coordinator, share, curve
    env = os.environ
    coordinator = env.get("ZPS_COORDINATOR")
    if not coordinator:
        raise BadArgument(_lib.EINVAL, "Run(None, ...): no coordinator: give Run the endpoint "
                                       "(tcp://HOST:PORT), set ZPS_COORDINATOR, or start the "
                                       "script under zps-run")
    if share is None and env.get("ZPS_SHARE"):
        try:
            share = int(env["ZPS_SHARE"])
        except ValueError:
            raise BadArgument(_lib.EINVAL, f"ZPS_SHARE={env['ZPS_SHARE']!r}: a number of "
                                           f"samples") from None
    if curve is None and env.get("ZPS_CURVE_SECRET") and env.get("ZPS_SERVER_KEY"):
        curve = (env["ZPS_CURVE_SECRET"], env["ZPS_SERVER_KEY"])
    return coordinator, share, curve


def _load_state(model, state, what):
    """Copies state (name: tensor) into the model's tensors of those names,
    every parameter of the model among them; one line otherwise."""
    own = model.state_dict()
    for name, t in state.items():
        if name not in own:
            raise BadArgument(_lib.EINVAL, f"{what}: tensor {name} is not in the model's "
                                           f"state_dict")
        if tuple(own[name].shape) != tuple(t.shape):
            raise BadArgument(_lib.EINVAL, f"{what}: tensor {name} is {list(t.shape)}, the "
                                           f"model's {list(own[name].shape)}")
    missing = [n for n, _ in model.named_parameters() if n not in state]
    if missing:
        raise BadArgument(_lib.EINVAL, f"{what}: no tensor {missing[0]} (of the model's "
                                       f"parameters; {len(missing)} missing)")
    with torch.no_grad():
        for name, t in state.items():
            own[name].copy_(t)


def _resume(model, path):
    """Run(resume_from=path): the file's model tensors into the model."""
    f = torch.load(path, map_location="cpu")
    state = f["model"] if isinstance(f, dict) and isinstance(f.get("model"), dict) else f
    if not isinstance(state, dict):
        raise BadArgument(_lib.EINVAL, f"resume_from={path!r}: neither a state_dict nor "
                                       f"{{'model': state_dict, ...}}")
    _load_state(model, state, f"resume_from={path!r}")
    opt = f.get("optimizer") if isinstance(f, dict) else None
    if opt and opt.get("state"):
        warnings.warn(f"zps: resume_from={path!r}: the parameters are the job's initial values; "
                      f"its optimizer state is not: the shards start theirs afresh (zeros, step "
                      f"0)", ZpsWarning, stacklevel=3)


def load_checkpoint(model, directory, optimizer=None, step=None):
    """Loads the checkpoint of a job (zps-server --checkpoint-dir directory)
    into model: the newest step every shard has a valid file of, or step.
    The tensors are named by the job's declared model and must be the
    model's state_dict's (names and shapes; every parameter among them);
    buffers too when the job declared them. With optimizer (a torch.optim
    SGD, Adam or AdamW over the model's parameters, of the job's kind), the
    shards' state goes into optimizer.state in torch.optim's format
    (Adam, AdamW: step, exp_avg, exp_avg_sq; SGD: momentum_buffer), so
    optimizer.step() in plain torch goes on from it; its param_groups stay
    the caller's. Returns the step loaded. Reads through libzps 1.5
    (zps.checkpoint.Checkpoint); raises ZpsError or BadArgument in one line."""
    from .checkpoint import Checkpoint
    ck = Checkpoint(directory, step)
    what = f"{directory} (step {ck.step})"
    _load_state(model, ck.model_state(), what)
    if optimizer is None:
        return ck.step
    if type(optimizer).__name__ != ck.optimizer:
        raise BadArgument(_lib.EINVAL, f"{what} holds the state of {ck.optimizer}, the "
                                       f"optimizer is a {type(optimizer).__name__}")
    params = dict(model.named_parameters())
    mine = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for name, _, st in ck.param_state():
        p = params.get(name)
        if p is None or id(p) not in mine:
            continue  # a tensor the optimizer does not step
        optimizer.state[p] = {k: (v.to(p.device) if k != "step" and v is not None else v)
                              for k, v in st.items()}
    return ck.step


class Run:
    """This process's part in the zps job whose coordinator is at
    `coordinator`, training `model`.

    coordinator None: $ZPS_COORDINATOR, which zps-run (python -m zps.run)
    and deploy/k8s/zps.yaml's ConfigMap zps-worker set; then share None is
    $ZPS_SHARE when set, and curve None is ($ZPS_CURVE_SECRET,
    $ZPS_SERVER_KEY) when both are set, as zps-worker reads its flags. The
    job's ranks come from the coordinator (the order workers join), not
    from the environment:

        run = zt.Run(None, model, dataset_size=len(train_set))   # zps-run -- python3 train.py

    dataset_size: train records (the job's global-batch order runs over
    them); test_size and evaluate(offset, count) -> (correct, loss_sum):
    the test records an epoch's end asks a worker to evaluate. share:
    samples of each global batch (None: the job splits). timeout: leave when
    the coordinator is silent this long (s); join_timeout: the bound on
    waiting for the job to start (s). curve: (secret key file, servers'
    public key file), see zps-ctl keygen.

    The training script's parts (docs/pytorch.md): optimizer, a
    torch.optim SGD, Adam or AdamW over model.parameters() with any
    param_groups, which the shards then apply per tensor (a diloco job: the
    inner optimizer, which Run steps); scheduler, a torch.optim.lr_scheduler
    of that optimizer whose learning rate depends on the step alone, whose
    table over the job's steps the shards follow; clip_grad_norm, the
    shards clip the averaged gradient to that global 2-norm; buffers,
    "average" (the shards average floating-point buffers by samples, every
    replica holds the same), "broadcast" (rank 0's, as DDP) or "local";
    device: the name the job's status shows for this worker (None:
    "torch-" and the model's device, "torch-cpu", "torch-cuda:0").
    staged: None (a bf16/fp16 model or one on a GPU trains staged: its own
    tensors, copied to and from fp32 host vectors per bucket), True (force
    that path), False (refuse it). resume_from: a torch file ({'model':
    state_dict, ...} as python3 -m zps.checkpoint export writes, or a plain
    state_dict) loaded into the model first, so that rank 0 of a fresh job
    declares its tensors as the job's initial values; the parameters only:
    the shards start the optimizer's state afresh (docs/pytorch.md,
    Checkpoints).

    Joins on creation: raises Refused, TimedOut, JobGone, TransportError
    (all ZpsError) with the library's reason, BadArgument for an argument
    the job cannot take. The first call that waits is bounded the same way."""

    def __init__(self, coordinator, model, dataset_size, share=None, test_size=0,
                 evaluate=None, timeout=60.0, join_timeout=600.0, heartbeat=None, curve=None,
                 sndbuf=None, device=None, optimizer=None, scheduler=None,
                 clip_grad_norm=None, buffers="average", staged=None, resume_from=None):
        named, self._staged = _check_model(model, staged)
        if resume_from is not None:
            _resume(model, resume_from)
        if buffers not in _BUFFER_MODES:
            raise BadArgument(_lib.EINVAL, f"buffers={buffers!r}: one of "
                                           f"{', '.join(_BUFFER_MODES)}")
        if scheduler is not None and optimizer is None:
            raise BadArgument(_lib.EINVAL, "scheduler= needs Run's optimizer= (the one it "
                                           "schedules)")
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise BadArgument(_lib.EINVAL, f"clip_grad_norm={clip_grad_norm}: a norm > 0")
        _check_inner_optimizer(optimizer, named)
        coordinator, share, curve = _from_environment(coordinator, share, curve)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.evaluate = evaluate
        self._timeout = timeout
        self._buffers_mode = buffers
        self.done = False
        self._closed = False
        self._joined = False
        self._left = False
        self._hooks = []
        self._work = None
        self._hook_error = None
        self._diloco = False
        self._micro = 0  # a deterministic job's M (zps-server --micro-batch)
        self._micro_i = None  # the micro-batch whose buckets the hooks push
        self._det_prior = None  # torch's deterministic settings before the Run
        self._table = None
        self._patched = None
        self._last_step = None
        self.timing = {"pieces": 0, "python_s": 0.0, "wait_s": 0.0, "backward_s": 0.0,
                       "lib_s": 0.0, "optimizer_s": 0.0}
        self._client = Client(coordinator)
        self._interrupts = None
        try:
            self._setup(named, dataset_size, test_size, share, timeout, join_timeout, heartbeat,
                        curve, sndbuf, device, clip_grad_norm)
        except BaseException:
            if self._interrupts:
                self._interrupts.close()  # Python's wakeup fd back as it was
            if self._joined:
                try:
                    self._client.leave()  # admitted: BYE, the others take the share at once
                except ZpsError:
                    pass
            self._client.close()
            raise
        self._deterministic_on()
        _warn_uncovered(model, buffers)
        atexit.register(self.close)

    def _declare(self, named, clip_grad_norm):
        """The layout (parameters, then buffers), the optimizer's groups and
        the clipping: what rank 0's HELLO makes the job's."""
        c = self._client
        for name, p in named:
            c.declare_tensor(name, list(p.shape))
        how = _BUFFER_MODES[self._buffers_mode]
        bufs = _state_buffers(self.model) if how else []
        self._bufs = _torch_state.Buffers(bufs, sum(p.numel() for _, p in named))
        for name, shape, kind in self._bufs.declared(how):
            c.declare_buffer(name, shape, kind)
        self._groups_error = None
        if self.optimizer is not None:
            try:
                kind, groups, of = _torch_optim.optimizer_groups(self.optimizer,
                                                                 [p for _, p in named])
            except BadArgument as e:  # a diloco job's inner optimizer may be any
                self._groups_error = e
                return self._declare_clip(clip_grad_norm)
            self._groups = groups
            for g, (lr, momentum, nesterov, wd, b1, b2, eps) in enumerate(groups):
                c.declare_group(g, kind, lr, momentum, nesterov, wd, (b1, b2), eps)
            for (name, _), g in zip(named, of):
                if g:
                    c.declare_tensor_group(name, g)
            if self.scheduler is not None:
                c.declare_lr_table(len(groups))  # announced; the table comes after joining
        self._declare_clip(clip_grad_norm)

    def _declare_clip(self, clip_grad_norm):
        if clip_grad_norm is not None:
            self._client.declare_clip_grad_norm(float(clip_grad_norm))

    def _setup(self, named, dataset_size, test_size, share, timeout, join_timeout, heartbeat,
               curve, sndbuf, device, clip_grad_norm):
        c = self._client
        if device is None:
            # What the job's status shows, and a deterministic job's device
            # class: its coordinator refuses a GPU worker beside CPU ones.
            on = next((p.device for _, p in named if p.device.type != "cpu"), "cpu")
            device = f"torch-{on}"
        c.set("device", device)
        c.set("timeout_ms", int(timeout * 1000))
        c.set("join_timeout_ms", int(join_timeout * 1000))
        if share:
            c.set("share", share)
        if heartbeat:
            c.set("heartbeat_ms", int(heartbeat * 1000))
        if sndbuf:
            c.set("sndbuf", sndbuf)
        if curve:
            c.set_curve(*curve)
        self._declare(named, clip_grad_norm)
        c.declare_dataset(dataset_size, test_size)
        self._flatten([p for _, p in named])
        c.connect()
        self._interrupts = _Interrupts(c)
        c.join()
        self._joined = True
        n = c.info("n_params")
        if n != self._flat.numel():
            raise BadArgument(_lib.EINVAL, f"the job's model has {n} parameters and buffers, "
                                           f"this one {self._flat.numel()}")
        self._diloco = c.info("mode") == _lib.MODE_DILOCO
        self._micro = c.info("micro_batch")  # 0 from a libzps before 1.6: no such job
        self._check_mode()
        if not self._diloco and self._groups_error:
            raise self._groups_error
        if not self._diloco and self.optimizer is not None:
            self._take_optimizer(c.info("total_steps"))
        c.set_params(self._flat.data_ptr(), n)
        if not self._diloco:
            self._buckets(named)  # diloco pushes no gradients: libzps pushes the round

    def _check_mode(self):
        if self._diloco and self.optimizer is None:
            raise BadArgument(_lib.EINVAL, "a diloco job (zps-server --mode diloco) trains each "
                                           "worker with its own optimizer: give Run optimizer="
                                           "torch.optim.AdamW(model.parameters(), ...) or another")
        if self._diloco and (self._staged or self._bufs.entries or self.scheduler):
            raise BadArgument(_lib.EINVAL, "a diloco job trains float32 models on the CPU, "
                                           "without buffers=average/broadcast or scheduler= "
                                           "(step your scheduler yourself; buffers='local')")
        if self._micro and self._diloco:
            raise BadArgument(_lib.EINVAL, "a deterministic job (zps-server --deterministic) "
                                           "has no diloco rounds: each worker's own steps "
                                           "would depend on its share")
        if self._micro and self._bufs.entries:
            # A buffer's new value is a forward's over a whole piece, pushed
            # with its gradient: averaged by pieces, it depends on the split.
            # The coordinator refuses such a layout at the join; this is for
            # a server that would not.
            raise BadArgument(_lib.EINVAL, f"a deterministic job takes no buffers: the model's "
                                           f"{self._bufs.entries[0][0]} would be averaged over "
                                           f"pieces of any split; Run(buffers='local') keeps "
                                           f"each worker's own, or use GroupNorm or LayerNorm")

    def _deterministic_on(self):
        """A deterministic job: torch's deterministic kernels while the Run
        is open (close() restores the caller's setting), cuBLAS's fixed
        workspace where CUDA computes, and a word when the thread count is
        not 1, on which a CPU kernel's summation order may depend."""
        if not self._micro:
            return
        if any(p.device.type == "cuda" for p in self._params):
            # cuBLAS reads it when its handle is made: in time unless the
            # model ran a matmul on the GPU before Run. A value of the
            # caller's own (":16:8") is deterministic too, and stays.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        self._det_prior = (torch.are_deterministic_algorithms_enabled(),
                           torch.is_deterministic_algorithms_warn_only_enabled())
        torch.use_deterministic_algorithms(True)
        n = torch.get_num_threads()
        if n != 1:
            warnings.warn(f"zps: torch uses {n} threads in a deterministic job: its bits then "
                          f"depend on the thread count too (torch.set_num_threads(1) on every "
                          f"worker, or the same count on each)", ZpsWarning, stacklevel=3)

    def _deterministic_off(self):
        if self._det_prior is not None:
            torch.use_deterministic_algorithms(self._det_prior[0], warn_only=self._det_prior[1])
            self._det_prior = None

    def _take_optimizer(self, total_steps):
        """Sync: the shards step the optimizer; its schedule is declared as
        a table over the job's steps, and opt.step() does nothing here."""
        if self.scheduler is not None:
            frozen = len(self._groups) > len(self.optimizer.param_groups)
            self._table = _torch_optim.lr_table(self.scheduler, self.optimizer, total_steps,
                                                frozen)
            self._client.declare_lr_table(len(self._groups), total_steps, self._table)
        opt = self.optimizer
        said = []

        def step(*_, **__):
            if not said:
                said.append(True)
                warnings.warn("zps: opt.step() does nothing in a synchronous zps job: the "
                              "shards apply this optimizer to the averaged gradient",
                              ZpsWarning, stacklevel=2)
        self._patched = opt.__dict__.get("step")
        opt.step = step

    def _flatten(self, params):
        """The parameters (then the buffers) in one flat fp32 vector, their
        gradients in another: the model's own tensors are views of them, or
        (staged) copied to and from them by Stage."""
        n = self._bufs.end
        cuda = any(p.device.type == "cuda" for p in params)
        self._flat = _torch_state.Stage.host(n, cuda)
        self._gflat = _torch_state.Stage.host(n, cuda)
        self._params, self._ranges, self._grads = params, [], []
        at = 0
        with torch.no_grad():
            for p in params:
                k = p.numel()
                self._flat[at:at + k].copy_(p.reshape(-1))
                self._ranges.append((at, at + k))
                if not self._staged:
                    p.data = self._flat[at:at + k].view_as(p)
                    g = self._gflat[at:at + k].view_as(p)
                    p.grad = g
                    self._grads.append(g)
                at += k
            for _, b, lo, hi, _ in self._bufs.entries:
                self._flat[lo:hi].copy_(b.reshape(-1))  # rank 0's are the job's first
        self._stage = (_torch_state.Stage(params, self._ranges, self._flat, self._gflat)
                       if self._staged else None)

    def _buckets(self, named):
        """Which buckets each parameter lies in, and a hook on its gradient
        accumulator that counts it final."""
        c = self._client
        self._bucket_ranges = [c.bucket_range(b) for b in range(c.info("n_buckets"))]
        self._param_buckets = []
        self._need = [0] * len(self._bucket_ranges)
        for i, (lo, hi) in enumerate(self._ranges):
            bs = [b for b, (blo, bhi) in enumerate(self._bucket_ranges) if blo < hi and lo < bhi]
            self._param_buckets.append(bs)
            if self._params[i].requires_grad:
                for b in bs:
                    self._need[b] += 1
                acc = self._params[i].expand_as(self._params[i]).grad_fn.next_functions[0][0]
                acc.register_hook(self._final_hook(i))
                self._hooks.append(acc)  # the accumulator lives as long as the hook is wanted

    def _final_hook(self, i):
        def hook(*_):
            if self._work is None:
                return  # a backward of the caller's own, or a micro-batch before the last
            t = time.perf_counter()
            try:
                if self._stage:
                    self._stage.grad_final(i)
                for b in self._param_buckets[i]:
                    self._pending[b] -= 1
                    if self._pending[b] == 0:
                        self._push(b)
            except ZpsError as e:
                self._hook_error = self._hook_error or e
            self._hook_s += time.perf_counter() - t
        return hook

    def _push(self, b):
        self._pushed[b] = True
        if self._stage:
            self._stage.bucket_ready()
        t = time.perf_counter()
        if self._micro_i is not None:
            self._client.push_micro(self._work._w, self._micro_i, b, self._gflat.data_ptr(),
                                    self._loss)
        else:
            self._client.push_bucket(self._work._w, b, self._gflat.data_ptr(), self._loss)
        self._lib_s += time.perf_counter() - t

    # Properties of the job, after joining.
    @property
    def rank(self):
        return self._client.info("rank")

    @property
    def seed(self):
        return self._client.info("seed")

    @property
    def global_batch(self):
        return self._client.info("global_batch")

    @property
    def total_steps(self):
        """The job's steps (diloco: its outer rounds)."""
        return self._client.info("total_steps")

    @property
    def step(self):
        """The step being computed (diloco: the outer round)."""
        return self._client.info("step")

    @property
    def micro_batch(self):
        """A deterministic job's M (zps-server --deterministic --micro-batch
        M), the samples of each micro-batch of work.micro_batches; 0 when
        the job is not deterministic."""
        return self._micro

    @property
    def mode(self):
        """The job's mode: "sync" or "diloco" (zps-server --mode)."""
        return "diloco" if self._client.info("mode") == _lib.MODE_DILOCO else "sync"

    @property
    def inner_steps(self):
        """Diloco: H, the global batches of each round (zps-server
        --inner-steps; under auto, the most a worker takes); 0 in sync."""
        return self._client.info("inner_steps") if self._diloco else 0

    def info(self, name):
        """Any of zps.Client.info's names: job_id, steps_per_epoch, model, ..."""
        return self._client.info(name)

    def __iter__(self):
        c = self._client
        w = _lib.Work()
        seed = self.seed
        try:
            while not self._closed:
                t = time.perf_counter()
                try:
                    r = c.next_work(w)
                except TimedOut as e:  # the one wait of a run: its servers are gone
                    raise JobGone(e.code, f"the job's servers were silent for "
                                          f"{self._timeout:g} s: {e.reason}") from None
                self.timing["wait_s"] += time.perf_counter() - t
                if r == _lib.NEXT_WORK:
                    if not c.work_start(w):
                        continue
                    self._load(w.step)
                    work = Work(self, w, self._indices(w))
                    with sample_context(seed, w.step, work.indices):
                        yield work
                    if not work._done:
                        raise BadArgument(_lib.EINVAL, f"the piece of step {w.step} was not "
                                                       f"computed: call work.backward(loss)")
                elif r == _lib.NEXT_EVAL:
                    self._load(None)
                    self._evaluate(w)
                elif r == _lib.NEXT_DONE:
                    self.done = True
                    return
                elif r in (_lib.NEXT_OVER, _lib.NEXT_STOPPED):
                    return
                # ROLLBACK, REJOINED: the model holds the step to go on from
        except BaseException:
            self._leave()  # Ctrl-C or a failure: BYE, the others take the share
            raise

    def _indices(self, w):
        if not w.indices:
            return None
        a = np.ctypeslib.as_array(w.indices, shape=(w.count,))
        return torch.from_numpy(a.astype(np.int64))

    def _evaluate(self, w):
        if w.count == 0:  # a job without test records still ends its epochs so
            self._client.eval_done(w, 0, 0.0)
            return
        if self.evaluate is None:
            raise BadArgument(_lib.EINVAL, f"the job asks for test records [{w.offset}, "
                                           f"{w.offset + w.count}) to be evaluated: give Run "
                                           f"evaluate=fn(offset, count) -> (correct, loss_sum)")
        correct, loss_sum = self.evaluate(w.offset, w.count)
        self._client.eval_done(w, int(correct), float(loss_sum))

    def _load(self, step):
        """Before a piece of `step` (None: an evaluation): a staged model's
        parameters and the buffers from the flat vector, which holds the
        step's; the integer buffers are checked one step on."""
        if self._stage:
            self._stage.to_model()
        if self._bufs.entries:
            self._bufs.load(self._flat, step is not None and self._last_step == step - 1)
            if self._bufs.mismatch:
                name, self._bufs.mismatch = self._bufs.mismatch, None
                warnings.warn(f"zps: integer buffer {name} differs from rank 0's: the workers' "
                              f"forwards count differently; rank 0's is taken", ZpsWarning,
                              stacklevel=3)
        if step is not None:
            self._last_step = step

    def _backward(self, work, loss, count=None, first=True, last=True):
        """loss.backward() of a piece, or of its micro-batch of `count`
        samples (weighted count / work.count); after the last, the push."""
        if work._run is not self or work._done or self._work is not None:
            raise BadArgument(_lib.EINVAL, "work.backward: once per piece, inside its iteration")
        if first:
            self._t0 = time.perf_counter()
            self._loss_sum = 0.0
            self._gflat.zero_()
            self._fresh_grads()
        count = work.count if count is None else count
        self._loss_sum += float(loss.detach()) * count
        if count != work.count:
            loss = loss * (count / work.count)
        if not last:
            loss.backward()  # accumulates; the hooks push nothing yet
            return
        self._loss = self._loss_sum / work.count
        self._bufs.store(self._gflat)
        if self._diloco:
            self._inner_step(work, loss, self._t0)
            return
        self._backward_and_push(work, loss)

    def _backward_micro(self, work, loss, micro, n):
        """A deterministic job: micro-batch `micro` of the piece's n, alone
        (the flat gradient zeroed first, so nothing of another micro-batch
        is in its sum), each bucket pushed through zps_push_micro once
        final; after the last one, the piece is done."""
        if work._run is not self or work._done or self._work is not None:
            raise BadArgument(_lib.EINVAL, "mb.backward: once per micro-batch, inside its "
                                           "piece's iteration")
        self._t0 = time.perf_counter()
        self._gflat.zero_()
        self._fresh_grads()
        self._loss = float(loss.detach())
        self._micro_i = micro
        try:
            self._backward_and_push(work, loss, last=micro == n - 1)
        finally:
            self._micro_i = None

    def _fresh_grads(self):
        if self._stage:
            self._stage.begin()
            return
        for p, g in zip(self._params, self._grads):
            if p.grad is None or p.grad.data_ptr() != g.data_ptr():
                p.grad = g  # the caller's zero_grad(set_to_none=True) undid it

    def _backward_and_push(self, work, loss, last=True):
        """loss.backward(), the hooks pushing each bucket once final; last:
        the piece is then done (a deterministic job's micro-batches before
        the last push their buckets and no more)."""
        t0 = self._t0
        self._pending = list(self._need)
        self._pushed = [False] * len(self._need)
        self._hook_s = self._lib_s = 0.0
        self._work = work
        try:
            for b, need in enumerate(self._need):
                if need == 0 and self._bufs.entries:
                    self._push(b)  # buffers alone: final since the forward
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            if self._hook_error:
                raise self._hook_error
            for b, pushed in enumerate(self._pushed):
                if not pushed:
                    self._push(b)  # parameters the loss does not depend on: zeros
            t3 = time.perf_counter()
            if last:
                self._client.work_done(work._w)
            self._lib_s += time.perf_counter() - t3
        finally:
            self._work = None
            self._hook_error = None
        work._done = last
        # backward_s: torch's; lib_s: libzps's pushes (the wire's share of
        # the step); python_s: this module's own cost, hooks included.
        tm = self.timing
        tm["pieces"] += last
        tm["backward_s"] += t2 - t1 - self._hook_s
        tm["lib_s"] += self._lib_s
        tm["python_s"] += time.perf_counter() - t0 - (t2 - t1) + self._hook_s - self._lib_s

    def _inner_step(self, work, loss, t0):
        """Diloco: backward, the caller's optimizer on the flat vector, and
        zps_inner_done (after the round's last, the pseudo-gradient's push)."""
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.optimizer.step()
        t3 = time.perf_counter()
        self._client.inner_done(work._w, self._loss)
        t4 = time.perf_counter()
        work._done = True
        tm = self.timing
        tm["pieces"] += 1
        tm["backward_s"] += t2 - t1
        tm["optimizer_s"] += t3 - t2
        tm["lib_s"] += t4 - t3
        tm["python_s"] += (t1 - t0) + (time.perf_counter() - t4)

    def _leave(self):
        if self._joined and not self._left and not self._closed:
            self._left = True
            try:
                self._client.leave()
            except ZpsError as e:
                warnings.warn(f"zps: leaving the job: {e}", ZpsWarning, stacklevel=2)

    def _give_optimizer_back(self):
        """opt.step is the optimizer's again, and its param_groups hold the
        learning rates of the job's last step."""
        opt = self.optimizer
        if opt is None or self._diloco:
            return
        if self._patched is not None:
            opt.step = self._patched
        else:
            opt.__dict__.pop("step", None)
        if self._table:
            last = self._table[-len(self._groups):]
            for g, lr in zip(opt.param_groups, last):
                g["lr"] = lr

    def stop(self):
        """From any thread: the loop ends soon (zps_client_stop)."""
        self._client.stop()

    def close(self):
        """Leaves the job (BYE at the step reached, or the end of the job)
        and frees the client; the model keeps the last parameters. Idempotent."""
        if self._closed:
            return
        if self._interrupts:
            self._interrupts.close()
        self._leave()
        self._closed = True
        self._client.close()
        self._hooks = []  # the accumulators; their hooks do nothing once closed
        self._deterministic_off()
        if self._joined:
            self._load(None)  # a staged model and the buffers: the last values
            self._give_optimizer_back()
        atexit.unregister(self.close)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
