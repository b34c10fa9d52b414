"""A rank's live bytes along the joint schedule, with the points between steps where hooks run."""

from __future__ import annotations

import numpy as np

from ..plan.planner import StepModel


class Timeline:
    """Live bytes at each schedule step and at each point between a step and the next (where FSDP's
    hooks run: a block's gather before its first op, its frees and reduce-scatter after its last), as
    difference arrays; and moments: the bytes while a hook runs, above its point's."""

    def __init__(self, steps: int, dtype) -> None:
        self.steps = steps
        self.at = np.zeros(steps + 2, dtype=dtype)  # index s + 1: step s
        self.between = np.zeros(steps + 2, dtype=dtype)  # index b + 1: after step b (b = -1: before 0)
        self.buffers_at = np.zeros(steps + 2, dtype=dtype)  # the communication buffers among them
        self.buffers_between = np.zeros(steps + 2, dtype=dtype)
        self.moments: list[tuple[int, int, int]] = []  # (point, bytes above it, of them buffers)

    def add(self, born: int, last: int, value: int, buffer: bool = False) -> None:
        """Made by step ``born`` (or before it: -1 before the first) and freed after step ``last``."""
        StepModel.add_span(self.at, (born, last), value)
        if last > born:
            StepModel.add_span(self.between, (born, last - 1), value)
        if buffer:
            StepModel.add_span(self.buffers_at, (born, last), value)
            if last > born:
                StepModel.add_span(self.buffers_between, (born, last - 1), value)

    def hooked(self, first: int, last: int, value: int, buffer: bool = True) -> None:
        """Made by a hook before step ``first`` and freed by one after step ``last``."""
        if last >= first:
            StepModel.add_span(self.at, (first, last), value)
            if buffer:
                StepModel.add_span(self.buffers_at, (first, last), value)
        StepModel.add_span(self.between, (first - 1, last - 1), value)
        if buffer:
            StepModel.add_span(self.buffers_between, (first - 1, last - 1), value)

    def top(self) -> tuple[int, int | None, int]:
        """(largest live bytes, the step at or after which it happens, buffer bytes there)."""
        at = np.cumsum(self.at)[1:self.steps + 1]
        between = np.cumsum(self.between)[:self.steps + 1]
        buffers_at = np.cumsum(self.buffers_at)[1:self.steps + 1]
        buffers_between = np.cumsum(self.buffers_between)[:self.steps + 1]
        best = (int(at.max()), int(at.argmax()), int(buffers_at[at.argmax()])) if self.steps else (0, None, 0)
        b = int(between.argmax())
        if between[b] > best[0]:
            best = (int(between[b]), max(b - 1, 0), int(buffers_between[b]))
        for point, extra, buffered in self.moments:
            value = int(between[point + 1]) + extra
            if value > best[0]:
                best = (value, max(point, 0), int(buffers_between[point + 1]) + buffered)
        return best
