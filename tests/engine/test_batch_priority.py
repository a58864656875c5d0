"""The scheduler's batch priority: interactive sequences are admitted and prefilled first, batch sequences are
capped in number and in prefill chunk size (no model: the plan alone)."""
from inference.engine.block_manager import BlockManager
from inference.engine.request import BATCH_PRIORITY
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Sequence


def seq(name: str, prompt_len: int, priority: int = 0) -> Sequence:
    return Sequence(name, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=4), priority=priority)


def scheduler(**kw) -> Scheduler:
    return Scheduler(BlockManager(256, 16, enable_prefix_caching=False), max_num_seqs=8,
                     max_num_batched_tokens=256, batch_max_num_seqs=2, batch_prefill_chunk=32, **kw)


def planned(batch) -> dict[str, int]:
    return {s.request_id: n for s, n in batch.items}


def test_an_interactive_request_queued_after_batch_lines_is_admitted_first():
    sched = scheduler()
    for i in range(4):
        sched.add(seq(f"b{i}", 100, BATCH_PRIORITY))
    sched.add(seq("chat", 100))
    assert [s.request_id for s in sched.waiting] == ["chat", "b0", "b1", "b2", "b3"]
    plan = planned(sched.schedule())
    assert plan["chat"] == 100  # its whole prompt in the first step
    assert {k: v for k, v in plan.items() if k != "chat"} == {"b0": 32, "b1": 32}  # two batch, chunks of 32


def test_batch_sequences_are_capped_and_their_prefill_chunked():
    sched = scheduler()
    for i in range(4):
        sched.add(seq(f"b{i}", 100, BATCH_PRIORITY))
    first = planned(sched.schedule())
    assert first == {"b0": 32, "b1": 32}
    second = planned(sched.schedule())
    assert second == {"b0": 32, "b1": 32}  # the other two still wait: at most two batch sequences run
    assert [s.request_id for s in sched.waiting] == ["b2", "b3"]


def test_a_waiting_interactive_request_is_prefilled_before_a_running_batch_prefill():
    sched = Scheduler(BlockManager(256, 16, enable_prefix_caching=False), max_num_seqs=8,
                      max_num_batched_tokens=64, batch_max_num_seqs=2, batch_prefill_chunk=64)
    sched.add(seq("b0", 200, BATCH_PRIORITY))
    batch = sched.schedule()
    assert planned(batch) == {"b0": 64}
    batch.items[0][0].num_computed_tokens += 64  # what postprocess does
    sched.add(seq("chat", 40))
    assert planned(sched.schedule()) == {"chat": 40, "b0": 24}  # chat first; b0 takes what is left


def test_without_batch_work_nothing_changes():
    sched = Scheduler(BlockManager(256, 16, enable_prefix_caching=False), max_num_seqs=8, max_num_batched_tokens=256)
    for i in range(3):
        sched.add(seq(f"c{i}", 100))
    assert planned(sched.schedule()) == {"c0": 100, "c1": 100, "c2": 56}
