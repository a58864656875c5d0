"""Faults around the engine thread: a bounded waiting queue (EngineOverloaded at once), and the loop itself
dying (every request ends with Failed, later submissions too, and on_fatal is called)."""
import asyncio
import logging
import threading
import time

import pytest

from inference.engine.async_engine import AsyncEngine
from inference.engine.config import ConfigError, EngineConfig
from inference.engine.outputs import EngineOverloaded, Failed, Finished, TokenEvent
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams

from .test_async_engine import make_engine, prompts
from .tiny_models import make_tiny_model

LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
SHORT = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


async def last_event(handle):
    events = [ev async for ev in handle]
    return events[-1]


def until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_past_max_waiting_requests_submit_raises_engine_overloaded_at_once(tiny_folder, monkeypatch):
    engine = make_engine(tiny_folder, max_waiting_requests=2)
    ae = AsyncEngine(engine)
    gate = threading.Event()
    real_step = engine.step
    monkeypatch.setattr(engine, "step", lambda: gate.wait() and real_step())  # hold the engine thread

    async def run():
        first = ae.submit(EngineRequest(prompts(1)[0], SHORT))
        await asyncio.to_thread(until, lambda: ae._num_queued == 0)  # admitted; the step is held
        second = ae.submit(EngineRequest(prompts(1)[0], SHORT))
        assert ae.num_waiting == 2
        t0 = time.monotonic()
        with pytest.raises(EngineOverloaded) as info:
            ae.submit(EngineRequest(prompts(1)[0], SHORT))
        assert time.monotonic() - t0 < 0.1 and info.value.retry_after_s >= 1
        assert "2 requests are already waiting" in str(info.value)
        gate.set()
        ends = await asyncio.gather(last_event(first), last_event(second))
        after = await last_event(ae.submit(EngineRequest(prompts(1)[0], SHORT)))  # room again
        return ends, after

    ends, after = asyncio.run(run())
    assert all(isinstance(e, Finished) and e.reason == "length" for e in [*ends, after])
    assert ae.num_waiting == 0
    ae.stop()


def test_max_waiting_requests_is_checked():
    with pytest.raises(ConfigError, match="max_waiting_requests"):
        EngineConfig(model_path="x", max_waiting_requests=-1)


@pytest.mark.parametrize("where", ["schedule", "admission"])
def test_when_the_loop_dies_every_request_fails_later_ones_too_and_on_fatal_is_called(tiny_folder, caplog, where):
    engine = make_engine(tiny_folder)
    fatal = []
    ae = AsyncEngine(engine, on_fatal=fatal.append)

    def bug(*args, **kwargs):
        raise RuntimeError(f"{where} bug")

    async def run():
        handles = [ae.submit(EngineRequest(p, LONG)) for p in prompts(3)]
        firsts = [await anext(h) for h in handles]  # every request is running
        assert all(isinstance(ev, TokenEvent) for ev in firsts)
        # An exception outside the per-request isolation: in the step's schedule, or in draining commands.
        if where == "schedule":
            engine.scheduler.schedule = bug
        else:
            engine.add_request = bug
            handles.append(ae.submit(EngineRequest(prompts(1)[0], SHORT)))
        ends = await asyncio.wait_for(asyncio.gather(*(last_event(h) for h in handles)), 10)
        await asyncio.to_thread(until, lambda: bool(fatal))
        late = await asyncio.wait_for(last_event(ae.submit(EngineRequest(prompts(1)[0], SHORT))), 1)
        return ends, late

    with caplog.at_level(logging.CRITICAL, logger="metrale.engine"):
        ends, late = asyncio.run(run())
    assert all(isinstance(e, Failed) and f"{where} bug" in e.message for e in [*ends, late])
    assert len(ends) == (3 if where == "schedule" else 4)
    assert len(fatal) == 1 and str(fatal[0]) == f"{where} bug"
    assert "the engine thread's loop died" in caplog.text and f"{where} bug" in caplog.text
    assert not ae._thread.is_alive()
