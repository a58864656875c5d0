"""Repetition detection: a generation whose output ends in one pattern repeated min_count times stops early.

vLLM's rule (`RepetitionDetectionParams`, vllm/v1/core/sched/utils.py): for each pattern
size from min_pattern_size to max_pattern_size, the last size * min_count output tokens
are the last `size` tokens repeated min_count times. The repeated tail stays in the
output; the finish reason is "stop" (vLLM's metrics label it "repetition"). Checked after
every appended token from the output's end, stopping at the first token that breaks a
pattern: about one comparison per pattern size for output that does not repeat, never a
pass over the whole output.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RepetitionDetection:
    """max_pattern_size >= 1, 1 <= min_pattern_size <= max_pattern_size (0 means 1), min_count >= 2.

    Raises ValueError otherwise.
    """

    max_pattern_size: int
    min_pattern_size: int = 1
    min_count: int = 2

    def __post_init__(self):
        if self.min_pattern_size <= 0:
            object.__setattr__(self, "min_pattern_size", 1)
        if self.max_pattern_size < 1 or self.min_pattern_size > self.max_pattern_size:
            raise ValueError("repetition_detection needs 1 <= min_pattern_size <= max_pattern_size")
        if self.min_count < 2:
            raise ValueError("repetition_detection.min_count must be at least 2")


def repeats(token_ids: list[int], num_output: int, rule: RepetitionDetection) -> bool:
    """Whether the output (the last `num_output` of `token_ids`) ends in a pattern of rule's sizes
    repeated rule.min_count times.

    The tail of size * min_count tokens repeats a pattern of `size` when it has period `size`:
    token -j equals token -j - size for every j, compared from the end and stopped at the first
    difference, so a size whose period breaks at once costs one comparison.
    """
    t, count = token_ids, rule.min_count
    last = len(t) - 1
    for size in range(rule.min_pattern_size, rule.max_pattern_size + 1):
        span = size * count
        if span > num_output:
            return False
        if t[last - size] != t[last]:
            continue
        if all(t[last - j] == t[last - j - size] for j in range(1, span - size)):
            return True
    return False
