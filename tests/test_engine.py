"""The loader's engine: order, bounded queues, errors delivered in order, cancellation that wakes every
blocked thread (no polling), per-stage timing."""

from __future__ import annotations

import threading
import time

import pytest

from gpupipe.engine import BoundedQueue, Closed, Engine, StageTimes


def engine(source, stages, capacity=2):
    return Engine(source, stages, capacity=capacity, times=StageTimes([name for name, *_ in stages]), name="gpupipe-test")


def test_items_come_out_in_order_through_every_stage():
    e = engine(range(50), [("a", lambda x: x * 2), ("b", lambda x: x + 1)])
    assert list(e) == [2 * i + 1 for i in range(50)]
    assert not e.alive


def test_a_stage_error_arrives_after_the_items_before_it_and_stops_the_engine():
    def fail_at_7(x):
        if x == 7:
            raise KeyError("seven")
        return x

    e = engine(range(20), [("a", fail_at_7), ("b", lambda x: x)])
    got = []
    with pytest.raises(KeyError, match="seven"):
        for x in e:
            got.append(x)
    assert got == list(range(7))
    time.sleep(0.05)
    assert not e.alive


def test_an_error_in_the_source_iterator_is_delivered_too():
    def source():
        yield 1
        raise OSError("shard unreadable")

    with pytest.raises(OSError, match="shard unreadable"):
        list(engine(source(), [("a", lambda x: x)]))


def test_queues_are_bounded():
    produced = []

    def record(x):
        produced.append(x)
        return x

    e = engine(range(100), [("a", record), ("b", lambda x: x)], capacity=2)
    assert next(e) == 0
    time.sleep(0.2)
    assert len(produced) <= 1 + 2 + 1 + 2 + 1  # taken, 2 queued + 1 in hand per stage
    e.close()


def test_close_wakes_a_consumer_blocked_on_a_slow_stage_at_once():
    release = threading.Event()
    e = engine(range(3), [("slow", lambda x: release.wait(60) and x)])
    results = []
    consumer = threading.Thread(target=lambda: results.append(list(e)))
    consumer.start()
    time.sleep(0.1)
    e._queues[-1].close()  # what close() does first: the consumer returns without polling
    consumer.join(30)
    # (an order, not a time: the consumer returned while the slow stage still holds its item)
    assert not consumer.is_alive() and e._threads[0].is_alive() and not release.is_set()
    release.set()
    e.close()
    assert not e.alive


def test_bounded_queue_close_raises_in_waiters():
    q = BoundedQueue(1)
    q.put(1)
    errors = []

    def blocked_put():
        try:
            q.put(2)
        except Closed:
            errors.append("put")

    t = threading.Thread(target=blocked_put)
    t.start()
    time.sleep(0.05)
    q.close()
    t.join(30)
    assert errors == ["put"]
    with pytest.raises(Closed):
        q.get()


def test_stage_times_are_recorded():
    times = StageTimes(["sleep"])
    e = Engine(range(3), [("sleep", lambda x: time.sleep(0.02) or x)], capacity=1, times=times)
    assert list(e) == [0, 1, 2]
    busy, wait = times.snapshot()
    assert busy["sleep"] >= 0.05 and wait > 0


def test_stage_threads_make_a_cuda_loaders_device_their_current_one(monkeypatch):
    """A new thread's current CUDA device is 0 whatever its starter set (torch.cuda.set_device is
    per thread): a rank's Loader on device k allocated, pinned and decoded on device 0 in its stage
    threads. Each stage thread sets the Loader's device first; a CPU engine sets nothing."""
    import torch

    from gpupipe import _args

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append((threading.current_thread().name, d)))
    e = Engine(range(3), [("a", lambda x: x), ("b", lambda x: x)], capacity=2, times=StageTimes(["a", "b"]),
               name="gpupipe-test", device=torch.device("cuda", 1))
    assert list(e) == [0, 1, 2]
    assert sorted(calls) == [("gpupipe-test-a", torch.device("cuda", 1)), ("gpupipe-test-b", torch.device("cuda", 1))]
    calls.clear()
    assert list(Engine(range(3), [("a", lambda x: x)], capacity=2, times=StageTimes(["a"]), device=torch.device("cpu"))) == [0, 1, 2]
    assert calls == []
    # "cuda" without an index is fixed to the caller's current device when the Loader is made
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _args.concrete_device(torch.device("cuda")) == torch.device("cuda", 3)
    assert _args.concrete_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert _args.concrete_device(torch.device("cpu")) == torch.device("cpu")
