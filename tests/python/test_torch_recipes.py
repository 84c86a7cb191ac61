"""A training script's recipes on zps (docs/pytorch.md, "Your training
script"): the user's optimizer with parameter groups and its scheduler,
clipping by the global norm, buffers held the same everywhere,
micro-batches, half precision and the staged path a GPU model takes.

Each runs real zps-server processes and real workers (recipe_worker.py,
one process each) and compares them with one torch process on the global
batch over a short horizon (10-20 steps: training is chaotic past ~100
steps at these learning rates, docs/tests.md). Adam amplifies round-off
where a gradient is near zero, so an Adam comparison bounds the gap to the
plain torch process by the gap of a torch process that splits the batch as
the workers do (--split).
"""
import os

import pytest
import torch

from conftest import PYTHON

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.join(HERE, "recipe_worker.py")


def server(procs, *args, workers=1, steps=20, shards=1, name="server"):
    s = procs.server("--model", "external", "--global-batch", "40", "--steps", str(steps),
                     "--workers", str(workers), "--seed", "1", "--shards", str(shards), *args,
                     name=name)
    for k in range(1, shards):
        procs.start(f"{name}-shard{k}", [os.path.join(os.environ.get("ZPS_BIN_DIR", ""), "zps-server"),
                                  "--shard", str(k), "--shards", str(shards),
                                  "--coordinator", s.endpoint, "--listen", "tcp://127.0.0.1:*"])
    return s


def sgd_flags(lr="0.05"):
    return ("--optimizer", "sgd", "--lr", lr, "--momentum", "0.9", "--lr-schedule", "constant")


def run_workers(procs, endpoint, names, *args, shares=None):
    ps = []
    for i, name in enumerate(names):
        share = ["--share", str(shares[i])] if shares else []
        ps.append(procs.start(name, [PYTHON, RECIPE, "--coordinator", endpoint, *share,
                                     "--save", os.path.join(procs.tmp, name + ".pt"), *args]))
    for p in ps:
        procs.ok(p, 180)
    return [load(procs, n) for n in names]


def run_single(procs, name, *args):
    p = procs.start(name, [PYTHON, RECIPE, "--single", "--save",
                           os.path.join(procs.tmp, name + ".pt"), *args])
    procs.ok(p, 180)
    return load(procs, name)


def load(procs, name):
    return torch.load(os.path.join(procs.tmp, name + ".pt"))


def max_gap(a, b):
    return max(float((x.float() - y.float()).abs().max()) for x, y in
               zip(a["state"].values(), b["state"].values()) if x.is_floating_point())


def bitwise(a, b):
    return all(torch.equal(x, y) for x, y in zip(a["state"].values(), b["state"].values()))


def test_micro_batches_of_8_within_a_piece_of_40_equal_one_backward(procs):
    s = server(procs, *sgd_flags(), steps=15)
    (w,) = run_workers(procs, s.endpoint, ["micro"], "--optimizer", "none", "--micro", "8",
                       "--steps", "15")
    ref = run_single(procs, "single", "--optimizer", "sgd", "--lr", "0.05", "--steps", "15")
    gap = max_gap(w, ref)
    assert gap < 1e-5, gap
    assert w["losses"][-1] < w["losses"][0]


def test_the_staged_path_gives_the_bits_of_the_in_place_one(procs):
    # The path a GPU or half-precision model takes (copies per bucket into
    # the flat gradient, parameters copied back per piece), forced on a
    # float32 CPU model: the same gradients reach the shards, so the same bits.
    s = server(procs, *sgd_flags(), steps=15)
    (staged,) = run_workers(procs, s.endpoint, ["staged"], "--optimizer", "none", "--staged",
                            "--steps", "15")
    s2 = server(procs, *sgd_flags(), steps=15, name="server2")
    (plain,) = run_workers(procs, s2.endpoint, ["plain"], "--optimizer", "none", "--steps", "15")
    assert bitwise(staged, plain)
    assert torch.equal(staged["flat"], plain["flat"])


# The bf16 wire is the long tier's (make test-long): the fp32 one shows the masters.
@pytest.mark.parametrize("wire", ["fp32", pytest.param("bf16", marks=pytest.mark.long)])
def test_a_bf16_model_trains_on_fp32_masters_the_same_on_every_worker(procs, wire):
    s = server(procs, *sgd_flags("0.1"), "--wire-dtype", wire, workers=2, steps=20)
    a, b = run_workers(procs, s.endpoint, ["w0", "w1"], "--optimizer", "none", "--dtype",
                       "bfloat16", "--steps", "20", shares=[24, 16])
    assert a["state"]["0.weight"].dtype == torch.bfloat16
    assert torch.equal(a["flat"], b["flat"])  # what each worker got from the shards
    assert bitwise(a, b)
    rounded = torch.equal(a["flat"], a["flat"].bfloat16().float())
    # An fp32 wire brings the shards' masters, which keep what bf16 drops;
    # a bf16 wire brings them rounded to the workers' dtype.
    assert rounded == (wire == "bf16")
    assert sum(a["losses"][-5:]) < sum(a["losses"][:5])


@pytest.mark.long
def test_autocast_inside_the_loop_trains_fp32_parameters(procs):
    s = server(procs, *sgd_flags(), workers=2, steps=15)
    a, b = run_workers(procs, s.endpoint, ["w0", "w1"], "--optimizer", "none", "--autocast",
                       "--steps", "15", shares=[20, 20])
    ref = run_single(procs, "single", "--optimizer", "sgd", "--lr", "0.05", "--autocast",
                     "--steps", "15", "--split", "20,20")
    assert bitwise(a, b)
    assert max_gap(a, ref) < 1e-4, max_gap(a, ref)  # bf16 matmuls: each piece's own rounding


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device for torch here: the GPU copies run on a GPU only "
                           "(their logic runs on the CPU in the staged test above)")
def test_a_model_on_cuda_trains_with_the_bits_of_the_cpu_staged_path(procs):
    s = server(procs, *sgd_flags(), steps=10)
    (gpu,) = run_workers(procs, s.endpoint, ["gpu"], "--optimizer", "none", "--device",
                         "cuda", "--steps", "10")
    ref = run_single(procs, "single", "--optimizer", "sgd", "--lr", "0.05", "--steps", "10")
    assert max_gap(gpu, ref) < 1e-4


GPT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "torch_gpt.py")


def gpt(procs, name, *args):
    out = os.path.join(procs.tmp, name + ".pt")
    return procs.start(name, [PYTHON, GPT, "--steps", "10", "--log-every", "0", "--save", out,
                              *args]), out


def test_the_example_gpt_as_two_workers_agrees_with_single_over_10_steps(procs):
    # No optimizer flags: the job takes rank 0's AdamW groups, its
    # SequentialLR's table and the clipping. bf16 autocast rounds each
    # piece's matmuls on its own and AdamW amplifies round-off, so the bound
    # is that of one process that splits the batch as the workers do.
    s = procs.server("--model", "external", "--global-batch", "32", "--steps", "10",
                     "--workers", "2", "--seed", "1")
    w0, out0 = gpt(procs, "w0", "--coordinator", s.endpoint, "--share", "20")
    w1, out1 = gpt(procs, "w1", "--coordinator", s.endpoint, "--share", "12")
    single, out_s = gpt(procs, "single", "--single", "--global-batch", "32", "--seed", "1")
    split, out_p = gpt(procs, "split", "--single", "--global-batch", "32", "--seed", "1",
                       "--split", "20,12")
    for p in (w0, w1, single, split):
        procs.ok(p, 240)
    a, b, ref, ref_split = (torch.load(o) for o in (out0, out1, out_s, out_p))
    assert bitwise(a, b)
    own = max_gap(ref_split, ref)
    gap = max_gap(a, ref)
    assert gap <= max(4 * own, 1e-5), (gap, own)
    assert max_gap(a, ref_split) <= max(4 * own, 1e-5)


def test_resnet18_with_batchnorm_holds_the_same_bits_of_parameters_and_buffers(procs):
    pytest.importorskip("torchvision", reason="python3-torchvision (install-deps.sh --test)")
    s = server(procs, *sgd_flags("0.02"), workers=2, steps=10)
    a, b = run_workers(procs, s.endpoint, ["w0", "w1"], "--model", "resnet18", "--optimizer",
                       "none", "--steps", "10", "--snapshot-step", "1", shares=[24, 16])
    assert bitwise(a, b)  # every state_dict tensor: parameters, running stats, counts
    assert int(a["state"]["bn1.num_batches_tracked"]) == 10
    ref = run_single(procs, "single", "--model", "resnet18", "--optimizer", "sgd", "--lr",
                     "0.02", "--steps", "1")
    # After one step the running mean is the global batch's: the pieces'
    # means weighted by samples are the batch's mean.
    mean = a["snap"]["bn1.running_mean"]
    assert float(mean.abs().max()) > 1e-4  # it moved (0.1 of a mean near 0: random images)
    assert torch.allclose(mean, ref["state"]["bn1.running_mean"], rtol=0, atol=1e-6)


def test_adamw_with_two_groups_and_a_lambdalr_warmup_follows_the_torch_process(procs):
    # No optimizer flags: the job takes the workers' AdamW (decay 0.1 on the
    # matrices, 0 on the biases), and the LambdaLR's table.
    s = server(procs, workers=2, steps=20)
    a, b = run_workers(procs, s.endpoint, ["w0", "w1"], "--optimizer", "adamw-groups",
                       "--scheduler", "lambda", "--steps", "20", shares=[28, 12])
    ref = run_single(procs, "single", "--optimizer", "adamw-groups", "--scheduler", "lambda",
                     "--steps", "20")
    ref_split = run_single(procs, "split", "--optimizer", "adamw-groups", "--scheduler",
                           "lambda", "--steps", "20", "--split", "28,12")
    assert bitwise(a, b)
    own = max_gap(ref_split, ref)  # the split's own round-off, as Adam amplifies it
    gap = max_gap(a, ref)
    assert gap <= max(4 * own, 1e-6), (gap, own)
    # Without the groups or the warm-up the run would be another one.
    plain = run_single(procs, "plain", "--optimizer", "adamw-groups", "--steps", "20")
    assert max_gap(plain, ref) > 100 * max(gap, 1e-7)


def metrics(procs, name):
    import json
    with open(os.path.join(procs.tmp, name + ".metrics")) as f:
        return [json.loads(line) for line in f if '"grad_norm"' in line]


def test_clipping_at_half_is_active_every_step_and_gives_the_same_bits_on_1_2_and_3_shards(procs):
    runs = []
    for shards in (1, 2, 3):
        name = f"s{shards}"
        s = server(procs, *sgd_flags(), "--metrics-log",
                   os.path.join(procs.tmp, name + ".metrics"), steps=12, shards=shards,
                   name=name)
        (w,) = run_workers(procs, s.endpoint, [f"w-{name}"], "--optimizer", "none",
                           "--clip", "0.5", "--loss-scale", "4", "--steps", "12")
        procs.ok(s, 60)
        runs.append(w)
        norms = [m["grad_norm"] for m in metrics(procs, name)]
        assert len(norms) == 12 and min(norms) > 0.5, norms  # the clip was active each step
    assert bitwise(runs[0], runs[1]) and bitwise(runs[0], runs[2])
    ref = run_single(procs, "single", "--optimizer", "sgd", "--lr", "0.05", "--clip", "0.5",
                     "--loss-scale", "4", "--steps", "12")
    assert max_gap(runs[0], ref) < 1e-5, max_gap(runs[0], ref)
    unclipped = run_single(procs, "unclipped", "--optimizer", "sgd", "--lr", "0.05",
                           "--loss-scale", "4", "--steps", "12")
    assert max_gap(unclipped, ref) > 1e-3
