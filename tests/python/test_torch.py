"""zps.torch (python/zps/torch.py) in this process against a real
zps-server: the model's storage, the refusals and failures (one exception
each, in bounded time), the warnings, the sampling helpers."""
import os
import signal
import subprocess
import time
import warnings

import pytest
import torch

import zps
import zps.torch as zt
from conftest import BIN

N = 160  # train records of the tiny jobs


def tiny(seed=0, hidden=5):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 3))


def data():
    g = torch.Generator().manual_seed(9)
    return torch.randn(N, 4, generator=g), torch.randint(0, 3, (N,), generator=g)


def tiny_server(procs, *args, steps=40):
    return procs.server("--model", "external", "--global-batch", "16", "--steps", str(steps),
                        "--workers", "1", "--lr-schedule", "constant", *args)


def train(run, model, stop_after=None):
    x, y = data()
    pieces = 0
    for work in run:
        work.backward(torch.nn.functional.cross_entropy(model(x[work.indices]),
                                                        y[work.indices]))
        pieces += 1
        if stop_after and pieces == stop_after:
            return pieces
    return pieces


def test_parameters_are_updated_in_place_in_one_flat_storage(procs):
    s = tiny_server(procs)
    model = tiny()
    before = [p.detach().clone() for p in model.parameters()]
    ptrs = [p.data_ptr() for p in model.parameters()]
    with zt.Run(s.endpoint, model, dataset_size=N, join_timeout=30) as run:
        assert train(run, model) == 40
        assert run.done
    assert [p.data_ptr() for p in model.parameters()] != ptrs  # moved once, into the flat vector
    flat = list(model.parameters())[0].data_ptr()
    at = 0
    for p in model.parameters():
        assert p.data_ptr() == flat + 4 * at  # views of one vector, in parameters() order
        at += p.numel()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    procs.ok(s, 30)


def test_the_shards_update_equals_sgd_on_the_whole_batch(procs):
    s = tiny_server(procs, "--lr", "0.1", "--momentum", "0.9", steps=30)
    model, ref = tiny(), tiny()
    with zt.Run(s.endpoint, model, dataset_size=N, join_timeout=30) as run:
        seed = run.seed
        train(run, model)
    x, y = data()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(30):
        idx = zt.global_batch_indices(N, 16, seed, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x[idx]), y[idx]).backward()
        opt.step()
    diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
    assert diff < 1e-6, diff


def test_a_layout_that_is_not_the_jobs_is_refused_naming_the_tensor(procs):
    s = tiny_server(procs, steps=100000)
    first = zt.Run(s.endpoint, tiny(), dataset_size=N, join_timeout=30)  # the job's layout
    t = time.monotonic()
    with pytest.raises(zps.Refused, match=r"tensor 0 differs.*'0.weight' \[6, 4\]"):
        zt.Run(s.endpoint, tiny(hidden=6), dataset_size=N, join_timeout=30)
    assert time.monotonic() - t < 15
    first.close()


def test_a_dataset_that_is_not_the_jobs_is_refused(procs):
    s = tiny_server(procs, "--dataset", f"size:{N}")
    with pytest.raises(zps.Refused, match="train records"):
        zt.Run(s.endpoint, tiny(), dataset_size=N + 1, join_timeout=30)


def test_a_server_gone_mid_run_ends_the_loop_with_job_gone(procs):
    s = tiny_server(procs, steps=100000)
    model = tiny()
    run = zt.Run(s.endpoint, model, dataset_size=N, timeout=2, join_timeout=30)
    assert train(run, model, stop_after=5) == 5
    os.kill(s.pid, signal.SIGKILL)
    t = time.monotonic()
    with pytest.raises(zps.JobGone):
        train(run, model)
    assert time.monotonic() - t < 15
    run.close()


def test_a_refused_run_gives_python_its_wakeup_fd_back(procs):
    import signal as sig
    s = tiny_server(procs, "--dataset", f"size:{N}")
    with pytest.raises(zps.Refused):
        zt.Run(s.endpoint, tiny(), dataset_size=N + 1, join_timeout=30)
    assert sig.set_wakeup_fd(-1) == -1  # nothing of the failed Run is left set


def test_a_bad_coordinator_address_fails_at_once():
    t = time.monotonic()
    with pytest.raises(zps.TransportError):
        zt.Run("tcp://nowhere:port", tiny(), dataset_size=N)
    assert time.monotonic() - t < 5


# late: the HELLO leaves after the server refused the handshake, when
# libzmq has dropped the connection (the send itself times out), which a
# busy machine does by chance; the answer is the same.
@pytest.mark.parametrize("late", [False, True], ids=["hello_at_once", "hello_after_refusal"])
def test_an_unauthorized_curve_key_times_out_within_the_join_timeout(procs, monkeypatch, late):
    if late:
        join = zps.Client.join
        monkeypatch.setattr(zps.Client, "join", lambda c: (time.sleep(0.5), join(c))[1])
    keys = os.path.join(procs.tmp, "keys")
    os.mkdir(keys)
    os.mkdir(os.path.join(keys, "authorized"))
    for name in ("server", "worker"):
        subprocess.run([os.path.join(BIN, "zps-ctl"), "keygen", os.path.join(keys, name)],
                       check=True, capture_output=True, timeout=10)
    s = tiny_server(procs, "--curve-secret", os.path.join(keys, "server.key"),
                    "--authorized-keys", os.path.join(keys, "authorized"))
    t = time.monotonic()
    with pytest.raises(zps.TimedOut, match="authorized-keys"):
        zt.Run(s.endpoint, tiny(), dataset_size=N, join_timeout=2,
               curve=(os.path.join(keys, "worker.key"), os.path.join(keys, "server.pub")))
    assert time.monotonic() - t < 10


def test_a_piece_not_computed_is_an_error_and_the_worker_leaves(procs):
    s = tiny_server(procs, "--workers", "1")
    model = tiny()
    run = zt.Run(s.endpoint, model, dataset_size=N, join_timeout=30)
    with pytest.raises(zps.BadArgument, match="work.backward"):
        for _ in run:
            pass
    assert run._left  # BYE said: the job knows at once
    run.close()


@pytest.mark.parametrize("buffers", ["average", "local"])
def test_batchnorm_local_buffers_and_torch_dropout_are_named_in_a_warning(procs, buffers):
    s = tiny_server(procs)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5),
                                torch.nn.Dropout(0.2), torch.nn.Linear(5, 3))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        run = zt.Run(s.endpoint, model, dataset_size=N, join_timeout=30, buffers=buffers)
    text = [str(w.message) for w in got if issubclass(w.category, zt.ZpsWarning)]
    assert any("'1' (BatchNorm1d) normalises over a piece" in m for m in text), text
    local = [m for m in text if "running_mean" in m and "buffers='local'" in m]
    assert bool(local) == (buffers == "local"), text
    assert any("'2' (Dropout)" in m and "zps.torch.Dropout" in m for m in text), text
    run.close()


def test_a_bad_buffers_mode_or_a_scheduler_without_optimizer_is_refused_before_joining():
    with pytest.raises(zps.BadArgument, match="buffers='shared': one of average"):
        zt.Run("tcp://127.0.0.1:1", tiny(), dataset_size=N, buffers="shared")
    opt = torch.optim.SGD(tiny().parameters(), lr=0.1)
    with pytest.raises(zps.BadArgument, match="scheduler= needs Run's optimizer="):
        zt.Run("tcp://127.0.0.1:1", tiny(), dataset_size=N,
               scheduler=torch.optim.lr_scheduler.StepLR(opt, 5))
    with pytest.raises(zps.BadArgument, match="clip_grad_norm=0"):
        zt.Run("tcp://127.0.0.1:1", tiny(), dataset_size=N, clip_grad_norm=0)
    with pytest.raises(zps.BadArgument, match="float64"):
        zt.Run("tcp://127.0.0.1:1", tiny().double(), dataset_size=N)


def test_zps_dropout_masks_do_not_depend_on_the_split():
    drop = zt.Dropout(0.5)
    x = torch.ones(64, 10)
    idx = zt.global_batch_indices(1000, 64, seed=4, step=7)
    with zt.sample_context(4, 7, idx):
        whole = drop(x)
    with zt.sample_context(4, 7, idx[:20]):
        a = drop(x[:20])
    with zt.sample_context(4, 7, idx[20:]):
        b = drop(x[20:])
    assert torch.equal(whole, torch.cat([a, b]))
    assert 0.3 < float((whole == 0).float().mean()) < 0.7
    with zt.sample_context(4, 8, idx):
        assert not torch.equal(whole, drop(x))  # another step, other masks


def test_zps_dropout_outside_a_piece_is_an_error():
    with pytest.raises(zps.BadArgument, match="outside a piece"):
        zt.Dropout(0.5)(torch.ones(2, 2))


def test_global_batch_indices_are_the_librarys_order():
    assert zt.global_batch_indices(1000, 64, 3, 5).tolist() == zps.batch_indices(1000, 64, 3, 5)
    assert zt.global_batch_indices(1000, 64, 3, 5).dtype == torch.long
