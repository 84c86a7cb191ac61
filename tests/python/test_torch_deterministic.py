"""zps.torch in a deterministic job (zps-server --deterministic
--micro-batch M; issue 29): examples/torch_fmnist.py's CNN ends with the
same bits on one worker and on two of unlike shares, over whole runs; the
default mode with the same splits does not (so the comparison can fail);
and what the mode cannot take is refused in one line.

Each job's processes are real and killed by pid at the end (conftest.py);
every wait is bounded.
"""
import os
import signal
import subprocess
import warnings

import numpy as np
import pytest
import torch

import zps
import zps.torch as zt
from conftest import BIN, PYTHON, params, save_arg, single
from test_torch_fmnist import wait_steps

M = 8
# lr 0.01: where this CNN is not chaotic over a few dozen steps, so that
# the default mode's run stays near the deterministic one (a check that
# the deterministic run trains the job, not only agrees with itself).
JOB = ["--model", "external", "--lr-schedule", "constant", "--global-batch", "64",
       "--optimizer", "sgd", "--momentum", "0.9"]
DET = ["--deterministic", "--micro-batch", str(M)]


def job(procs, name, shares, steps, flags=DET, worker_args=(), timeout=120, lr=0.01):
    """One job of len(shares) torch_fmnist.py workers of those shares: each
    worker's final parameters, and the job's initial ones."""
    s = procs.server(*JOB, *flags, "--lr", str(lr), "--steps", str(steps), "--workers",
                     str(len(shares)), name=f"{name}-server")
    init = os.path.join(procs.tmp, f"{name}.init")
    ws = [procs.torch_worker(f"{name}{i}", s.endpoint, "--share", str(k), "--test-size", "0",
                             *save_arg(procs, f"{name}{i}"), *worker_args,
                             *(["--save-init", init] if i == 0 else []))
          for i, k in enumerate(shares)]
    for w in ws:
        procs.ok(w, timeout)
    procs.ok(s, 30)
    return [params(procs, f"{name}{i}") for i in range(len(shares))], np.fromfile(init, np.float32)


def check_bitwise(procs, steps, worker_args=(), timeout=120, lr=0.01):
    (one,), init = job(procs, "one", [64], steps, worker_args=worker_args, timeout=timeout,
                       lr=lr)
    (a, b), init2 = job(procs, "two", [24, 40], steps, worker_args=worker_args,
                        timeout=timeout, lr=lr)
    assert np.array_equal(init, init2)  # the same start (rank 0's torch.manual_seed(1))
    moved = float(np.abs(one - init).max())
    assert moved > 1e-3, f"the parameters barely moved in {steps} steps: {moved}"
    assert np.array_equal(a, b)  # every replica of a job holds the same bits
    diff = np.flatnonzero(one != a)
    assert diff.size == 0, (f"{diff.size} of {one.size} parameters differ after {steps} steps, "
                            f"max {float(np.abs(one - a).max()):.3g}")
    print(f"{steps} steps at lr {lr}, M={M}: 1 worker and 2 of 24+40 bitwise equal "
          f"({one.size} parameters, max |final - init| {moved:.3g})")
    return one


def test_one_worker_and_two_of_24_and_40_end_bitwise_equal_after_60_steps(procs):
    check_bitwise(procs, 60)


@pytest.mark.long
def test_one_worker_and_two_of_24_and_40_end_bitwise_equal_after_300_steps_at_lr_005(procs):
    # lr 0.05, the example's default: where a last-bit difference of the
    # default mode grows to 1e-5..1e-3 in 30 steps (test_torch_fmnist.py's
    # note); here none appears in 300.
    check_bitwise(procs, 300, timeout=300, lr=0.05)


@pytest.mark.long  # make test-long: as test_torch_fmnist.py's kill, the C suite's in make test
def test_a_worker_killed_mid_run_the_survivors_end_bitwise_equal_to_one_worker(procs):
    # The dead worker's micro-batches are handed on and computed by the
    # survivors, alone each, so they are the same bits: the whole run is.
    steps = 60
    s = procs.server(*JOB, *DET, "--lr", "0.05", "--steps", str(steps), "--workers", "3",
                     "--worker-timeout-ms", "1500", "--metrics-log",
                     os.path.join(procs.tmp, "metrics.jsonl"), name="three-server")
    ws = [procs.torch_worker(f"three{i}", s.endpoint, "--test-size", "0",
                             *save_arg(procs, f"three{i}")) for i in range(3)]
    wait_steps(procs, 12, s)
    os.kill(ws[2].pid, signal.SIGKILL)
    procs.wait(ws[2], 10)
    procs.ok(ws[0])
    procs.ok(ws[1])
    procs.ok(s, 30)
    assert "evict" in procs.log(s)
    (one,), _ = job(procs, "one", [64], steps, lr=0.05)
    a, b = params(procs, "three0"), params(procs, "three1")
    assert np.array_equal(a, b)
    diff = np.flatnonzero(one != a)
    assert diff.size == 0, (f"{diff.size} of {one.size} parameters differ from the undisturbed "
                            f"run, max {float(np.abs(one - a).max()):.3g}")
    print(f"a third worker killed after step 12 of {steps}: the survivors bitwise equal to "
          f"one worker")


def test_the_default_mode_with_the_same_splits_differs(procs):
    # What the two tests above would see without the mode: the sums of a
    # piece of 64 and of pieces of 24 and 40 round differently, so the
    # bitwise comparison is one that fails. The deterministic run trains the
    # job: it stays near one torch process on the same batches (--single).
    # That bound is a share of how far the parameters moved, not a round-off
    # figure: over 60 steps a last-bit difference can tip a ReLU and grow,
    # by how much depends on the machine's kernels (on an AMD EPYC the
    # default mode's one worker was 7e-9 from --single at step 10 and 1.4e-3
    # at step 60, the deterministic run 2.5e-7 at step 60).
    steps = 60
    (one,), init = job(procs, "one", [64], steps, flags=())
    (a, b), _ = job(procs, "two", [24, 40], steps, flags=())
    (det, _), _ = job(procs, "det", [24, 40], steps)
    assert np.array_equal(a, b)
    assert not np.array_equal(one, a)
    init_file = os.path.join(procs.tmp, "job.init")
    init.tofile(init_file)
    ref = single(procs, "single", "--steps", str(steps), "--global-batch", "64", "--lr", "0.01",
                 "--momentum", "0.9", "--lr-schedule", "constant", "--init", init_file)
    moved = float(np.abs(ref - init).max())
    split = float(np.abs(one - a).max())
    near = float(np.abs(ref - det).max())
    print(f"default mode, {steps} steps: max |1 worker - 24+40| = {split:.3g}; "
          f"deterministic 24+40 to one torch process: {near:.3g} (moved {moved:.3g})")
    assert near < 0.05 * moved


# The staged path (a GPU's or a 16-bit model's: the model's own tensors,
# each gradient copied into the flat one as it is final) through
# recipe_worker.py, an MLP of B = 40 (5 micro-batches of 8).
RECIPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipe_worker.py")


def recipe_job(procs, name, shares, *args, steps=20):
    s = procs.server("--model", "external", "--global-batch", "40", "--steps", str(steps),
                     "--workers", str(len(shares)), "--seed", "1", "--optimizer", "sgd", "--lr",
                     "0.05", "--momentum", "0.9", "--lr-schedule", "constant", *DET,
                     name=f"{name}-server")
    ws = [procs.start(f"{name}{i}", [PYTHON, RECIPE, "--coordinator", s.endpoint, "--share",
                                     str(k), "--optimizer", "none", "--micro", str(M),
                                     "--steps", str(steps), "--save",
                                     os.path.join(procs.tmp, f"{name}{i}.pt"), *args])
          for i, k in enumerate(shares)]
    for w in ws:
        procs.ok(w, 120)
    procs.ok(s, 30)
    return [torch.load(os.path.join(procs.tmp, f"{name}{i}.pt")) for i in range(len(shares))]


def same_bits(a, b):
    return all(torch.equal(x, b["state"][k]) for k, x in a["state"].items())


@pytest.mark.parametrize("how", [("--staged",), ("--dtype", "bfloat16")],
                         ids=["staged-fp32", "bf16"])
def test_the_staged_path_gives_the_same_bits_for_one_worker_and_16_plus_24(procs, how):
    (one,) = recipe_job(procs, "one", [40], *how)
    a, b = recipe_job(procs, "two", [16, 24], *how)
    assert one["losses"][-1] < one["losses"][0]  # it trained
    assert same_bits(a, b)
    assert same_bits(one, a)
    assert torch.equal(one["flat"], a["flat"])  # the fp32 masters too
    if how == ("--staged",):  # and the in-place path's bits: the same gradients pushed
        (plain,) = recipe_job(procs, "plain", [40])
        assert same_bits(plain, one)


# ---------------------------------------------------------------- in this process

N = 160  # train records of the tiny jobs


def tiny(norm=None):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 5)] + ([norm] if norm else []) + [torch.nn.Tanh(),
                                                                   torch.nn.Linear(5, 3)]
    return torch.nn.Sequential(*layers)


def data():
    g = torch.Generator().manual_seed(9)
    return torch.randn(N, 4, generator=g), torch.randint(0, 3, (N,), generator=g)


def loss_of(model, idx):
    x, y = data()
    return torch.nn.functional.cross_entropy(model(x[idx]), y[idx])


def tiny_server(procs, batch=16, m=4, steps=6, name="server"):
    return procs.server("--model", "external", "--global-batch", str(batch), "--steps",
                        str(steps), "--workers", "1", "--lr-schedule", "constant",
                        "--deterministic", "--micro-batch", str(m), name=name)


@pytest.fixture
def one_thread():
    prior = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prior)


def test_other_micro_batch_sizes_and_a_whole_piece_are_refused_naming_m(procs, one_thread):
    s = tiny_server(procs)
    model = tiny()
    assert not torch.are_deterministic_algorithms_enabled()
    with zt.Run(s.endpoint, model, dataset_size=N, join_timeout=30) as run:
        assert run.micro_batch == 4
        for work in run:
            assert torch.are_deterministic_algorithms_enabled()
            with pytest.raises(zps.BadArgument) as e:
                work.micro_batches(8)
            assert str(e.value) == ("micro_batches(8): this deterministic job's micro-batches "
                                    "are 4 samples (run.micro_batch): micro_batches(4)")
            with pytest.raises(zps.BadArgument) as e:
                work.backward(loss_of(model, work.indices))
            assert "work.backward on a piece of 16 samples" in str(e.value)
            assert "work.micro_batches(4)" in str(e.value)
            n = 0
            for mb in work.micro_batches(4):  # the refusals left the piece as it was
                assert mb.count == 4
                mb.backward(loss_of(model, mb.indices))
                with pytest.raises(zps.BadArgument, match="once per micro-batch"):
                    mb.backward(loss_of(model, mb.indices))
                n += 1
            assert n == 4
        assert run.done
    assert not torch.are_deterministic_algorithms_enabled()  # the caller's setting back
    procs.ok(s, 30)


def test_a_piece_of_one_micro_batch_takes_work_backward_and_moves_the_model(procs, one_thread):
    s = tiny_server(procs, batch=8, m=8, steps=5)
    model = tiny()
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error", zt.ZpsWarning)  # one thread: no warning
        with zt.Run(s.endpoint, model, dataset_size=N, join_timeout=30) as run:
            for work in run:
                work.backward(loss_of(model, work.indices))
            assert run.done and run.timing["pieces"] == 5
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert not torch.equal(before, after)
    procs.ok(s, 30)


def test_a_thread_count_other_than_1_is_named_in_a_warning(procs):
    s = tiny_server(procs, steps=1)
    prior = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.warns(zt.ZpsWarning, match="torch uses 2 threads in a deterministic job"):
            run = zt.Run(s.endpoint, tiny(), dataset_size=N, join_timeout=30)
        run.close()
    finally:
        torch.set_num_threads(prior)


def test_buffers_are_refused_in_one_line_and_local_ones_are_not(procs, one_thread):
    # The coordinator refuses a declared layout with buffers at the join
    # (zps.Refused); Run's own check, after joining, is for a server that
    # would not.
    s = tiny_server(procs, steps=1)
    with pytest.raises(zps.ZpsError) as e:
        zt.Run(s.endpoint, tiny(torch.nn.BatchNorm1d(5)), dataset_size=N, join_timeout=30)
    msg = str(e.value)
    assert "takes no buffers (1.running_mean)" in msg and "\n" not in msg, msg
    assert not torch.are_deterministic_algorithms_enabled()  # refused: nothing changed
    run = stub_run(diloco=False, bufs=[("1.running_mean", torch.zeros(5))])
    with pytest.raises(zps.BadArgument) as e:
        run._check_mode()
    assert str(e.value).startswith("a deterministic job takes no buffers: the model's "
                                   "1.running_mean would be averaged"), str(e.value)
    assert "buffers='local'" in str(e.value)
    s = tiny_server(procs, steps=2, name="server2")
    model = tiny(torch.nn.BatchNorm1d(5))
    with pytest.warns(zt.ZpsWarning):  # local buffers and BatchNorm: named, as in any job
        run = zt.Run(s.endpoint, model, dataset_size=N, join_timeout=30, buffers="local")
    with run:
        for work in run:
            for mb in work.micro_batches(run.micro_batch):
                mb.backward(loss_of(model, mb.indices))
        assert run.done
    procs.ok(s, 30)


def stub_run(diloco, bufs=()):
    """A Run as _check_mode sees one of a deterministic job after joining
    (no server offers these: the checks behind the server's own)."""
    run = zt.Run.__new__(zt.Run)
    model = tiny()
    run.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run._diloco, run._micro, run._staged, run.scheduler = diloco, M, False, None
    run._bufs = zt._torch_state.Buffers(list(bufs), 0)
    return run


def test_diloco_is_refused_by_the_server_and_by_run(procs):
    out = subprocess.run([os.path.join(BIN, "zps-server"), *DET, "--mode", "diloco",
                          "--inner-steps", "4", "--model", "external"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr == "zps-server: --deterministic takes no --mode diloco\n"
    # A job that offered both (no server does) would still not train.
    run = stub_run(diloco=True)
    with pytest.raises(zps.BadArgument, match="^a deterministic job .* has no diloco rounds"):
        run._check_mode()


def test_a_default_job_has_no_micro_batch_and_keeps_torchs_setting(procs):
    s = procs.server("--model", "external", "--global-batch", "16", "--steps", "2",
                     "--workers", "1", "--lr-schedule", "constant")
    model = tiny()
    with zt.Run(s.endpoint, model, dataset_size=N, join_timeout=30) as run:
        assert run.micro_batch == 0
        for work in run:
            assert not torch.are_deterministic_algorithms_enabled()
            for mb in work.micro_batches(5):  # any size, as before the mode
                mb.backward(loss_of(model, mb.indices))
    procs.ok(s, 30)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: two GPU workers against one, bitwise, needs one")
def test_two_gpu_workers_and_one_end_bitwise_equal(procs):
    # Both workers of the two-worker job share the one GPU: the same kernel
    # on the same shapes, whichever process runs it. Passed on an H200
    # (docs/gpu.md); skipped on the CPU-only machines that run make test.
    check_bitwise(procs, 60, worker_args=("--device", "cuda"), timeout=300)
