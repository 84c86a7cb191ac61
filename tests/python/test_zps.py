"""zps (python/zps/__init__.py): the library's data order, versions and
errors, without torch."""
import time

import pytest

import zps


def test_version_is_the_headers_major():
    assert zps.version()[0] == 1


def test_batch_indices_of_a_step_are_its_pieces_joined():
    whole = zps.batch_indices(1000, 64, seed=3, step=5)
    assert len(whole) == 64 and len(set(whole)) == 64
    assert zps.batch_indices(1000, 64, 3, 5, offset=0, count=20) + \
        zps.batch_indices(1000, 64, 3, 5, offset=20, count=44) == whole


def test_batch_indices_of_an_epoch_are_a_permutation():
    steps = 1000 // 100
    seen = [i for t in range(steps) for i in zps.batch_indices(1000, 100, seed=1, step=t)]
    assert sorted(seen) == list(range(1000))
    assert zps.batch_indices(1000, 100, 1, 0) != zps.batch_indices(1000, 100, 1, steps)


def test_batch_indices_refuses_a_batch_larger_than_the_data():
    with pytest.raises(zps.BadArgument):
        zps.batch_indices(10, 64, 0, 0)


def test_unknown_option_is_a_bad_argument():
    c = zps.Client("tcp://127.0.0.1:1")
    with pytest.raises(zps.BadArgument, match="no option"):
        c.set("colour", 3)
    with pytest.raises(zps.BadArgument):
        c.set("timeout_ms", -5)
    c.close()


def test_clip_grad_norm_is_declared_with_the_model_and_positive():
    c = zps.Client("tcp://127.0.0.1:9")
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(zps.BadArgument, match="finite and > 0"):
            c.declare_clip_grad_norm(bad)
    c.declare_clip_grad_norm(1.0)
    c.connect()
    with pytest.raises(zps.Refused, match="declared with the model"):
        c.join()  # no tensor declared: nothing to clip
    c.close()


def test_malformed_endpoint_is_a_transport_error_at_once():
    c = zps.Client("tcp://no port here")
    t = time.monotonic()
    with pytest.raises(zps.TransportError):
        c.connect()
    assert time.monotonic() - t < 5
    c.close()


def test_no_server_at_the_address_times_out_within_the_join_timeout():
    c = zps.Client("tcp://127.0.0.1:9")  # the discard port: nothing listens
    c.set("join_timeout_ms", 1500)
    c.connect()
    t = time.monotonic()
    with pytest.raises(zps.TimedOut, match="gave up after"):
        c.join()
    assert time.monotonic() - t < 10
    c.close()


def test_log_level_takes_known_names_only():
    zps.set_log_level("warn")
    zps.set_log_level("info")
    with pytest.raises(zps.BadArgument):
        zps.set_log_level("loud")
