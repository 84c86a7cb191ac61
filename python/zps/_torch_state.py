"""_torch_state.py - what a zps.torch model holds beside the job's flat
vectors: the parameters of a model that trains staged (bf16 or fp16, on a
GPU, or staged=True), and the model's buffers.

The job's parameters and gradients are two flat fp32 vectors in host memory
(pinned where a GPU is used), which libzps reads and writes. A float32 model
on the CPU trains on views of them (torch.py); any other model keeps its own
tensors, and Stage copies between the two: the parameters into the model
before each piece (rounded to the model's dtype), each parameter's gradient
into the flat gradient the moment it is final, on a side stream on a GPU so
that the copy of one bucket overlaps the backward of the next, as the pushes
do. Buffers (BatchNorm's running statistics) lie in the flat vector after
the parameters: before a piece they are set to the step's values, after its
forward their new values are what the piece pushes there, and the shards
average them (or take rank 0's) as they update the parameters.
"""
import torch


class Stage:
    """Copies between the flat host vectors and a model's own parameters."""

    def __init__(self, params, ranges, flat, gflat):
        self.params, self.ranges = params, ranges
        self.flat, self.gflat = flat, gflat
        devices = {p.device for p in params if p.device.type == "cuda"}
        self.device = next(iter(devices)) if devices else None
        self.stream = torch.cuda.Stream(self.device) if self.device is not None else None
        self.copied = False

    @staticmethod
    def host(n, cuda):
        """A zeroed fp32 host vector, pinned when a GPU copies from it."""
        return torch.zeros(n, dtype=torch.float32, pin_memory=cuda)

    def to_model(self):
        """The flat vector's parameters into the model (before a piece):
        queued on the current stream, ahead of the forward that reads them."""
        with torch.no_grad():
            for p, (lo, hi) in zip(self.params, self.ranges):
                p.copy_(self.flat[lo:hi].view(p.shape), non_blocking=True)

    def begin(self):
        """A piece's first backward: the model's gradients start from none."""
        for p in self.params:
            p.grad = None
        self.copied = False

    def grad_final(self, i):
        """Parameter i's gradient is final: into the flat gradient."""
        p = self.params[i]
        if p.grad is None:
            return
        lo, hi = self.ranges[i]
        dst = self.gflat[lo:hi]
        if self.stream is None:
            dst.copy_(p.grad.reshape(-1))
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            src = p.grad.reshape(-1).float()  # converted on the GPU, before it leaves
            dst.copy_(src, non_blocking=True)
            src.record_stream(self.stream)
        self.copied = True

    def bucket_ready(self):
        """Before a bucket is pushed: its copies have landed in host memory."""
        if self.stream is not None and self.copied:
            self.stream.synchronize()


class Buffers:
    """A model's buffers as tensors of the job's flat vector, after the
    parameters: floating ones averaged by the shards (or rank 0's taken),
    integer ones (num_batches_tracked) carried exactly (as floats: below 2^24)
    as rank 0's, and checked to be this worker's own count too."""

    def __init__(self, named, at):
        self.entries = []
        for name, b in named:
            n = b.numel()
            self.entries.append((name, b, at, at + n, b.dtype.is_floating_point))
            at += n
        self.end = at
        self.mismatch = None

    def declared(self, how):
        """(name, shape, how) of each, for zps_declare_buffer: integers are
        rank 0's whatever the floats do."""
        from . import _lib
        return [(name, list(b.shape), how if is_float else _lib.BUFFER_BROADCAST)
                for name, b, _, _, is_float in self.entries]

    def load(self, flat, check):
        """The step's buffers into the model (before a piece); check: the
        model's integer buffers should already hold them (one step on)."""
        with torch.no_grad():
            for name, b, lo, hi, is_float in self.entries:
                v = flat[lo:hi].view(b.shape)
                if not is_float:
                    v = v.round().to(b.dtype)
                    if check and self.mismatch is None and not torch.equal(v, b.cpu()):
                        self.mismatch = name
                b.copy_(v, non_blocking=True)

    def store(self, gflat):
        """The buffers after a piece's forward, into the flat gradient."""
        with torch.no_grad():
            for _, b, lo, hi, _ in self.entries:
                gflat[lo:hi].copy_(b.detach().reshape(-1))
