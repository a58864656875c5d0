"""AsyncEngine.fail_all, what a draining server uses past its grace period: every request in
flight ends with Failed(message) and gives its KV blocks back; the engine serves on."""
import asyncio

from inference.engine.async_engine import AsyncEngine
from inference.engine.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.engine.outputs import Failed, Finished, TokenEvent
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams
from tests.engine.tiny_models import make_tiny_model


def test_fail_all_ends_every_live_request_in_band_and_the_engine_serves_on(tmp_path):
    folder = make_tiny_model("llama", tmp_path / "llama")
    engine = LLMEngine(EngineConfig(model_path=str(folder), kv_cache_bytes=4 << 20,
                                    weights="model"))
    ae = AsyncEngine(engine)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def run():
        handles = [ae.submit(EngineRequest(list(range(5, 25 + i)), long)) for i in range(4)]
        for handle in handles:  # all of them generating
            assert isinstance(await handle.__anext__(), TokenEvent)
        ae.fail_all("shutting down")
        ends = []
        for handle in handles:
            async for event in handle:
                if not isinstance(event, TokenEvent):
                    ends.append(event)
        after = ae.submit(EngineRequest(list(range(5, 25)), SamplingParams(max_tokens=3,
                                                                           ignore_eos=True)))
        return ends, [event async for event in after]

    try:
        ends, after = asyncio.run(run())
    finally:
        ae.stop()
    assert ends == [Failed("shutting down")] * 4
    assert isinstance(after[-1], Finished) and len(after) == 4
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.has_work()
