"""Interleaved 1F1B: V virtual stages per rank, the blocks split into pp x V chunks and chunk g on rank
g mod pp (torch.distributed.pipelining's ScheduleInterleaved1F1B, Narayanan et al. 2021's depth-first
form), and what a rank holds as it runs its actions in order.

The actions are torch's (``_get_1f1b_rank_ops`` without zero bubble): ``warmup`` forwards, then a
forward and a backward each op, then the backwards left; op j's forward runs chunk
``(j // per_round) % V`` of the rank, its backward chunk ``V - 1 - ((j - warmup) // per_round) % V``.
The runtime (``_PipelineScheduleRuntime``) keeps every send's work in a list until the step returns, so
each output a chunk sends and each input gradient it sends back stay alive to the step's end.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import UsageError


@dataclass(frozen=True)
class Action:
    chunk: int  # the virtual stage, 0 .. pp * V - 1
    microbatch: int
    forward: bool


def rounds(microbatches: int, pp: int) -> tuple[int, int]:
    """(rounds, microbatches per round); UsageError where torch refuses the count."""
    n = max(1, microbatches // pp)
    if microbatches % n:
        raise UsageError(f"--microbatches {microbatches}: Interleaved1F1B needs a multiple of its {n} "
                         f"rounds (microbatches // pp)")
    return n, microbatches // n


def rank_actions(rank: int, pp: int, virtual: int, microbatches: int) -> list[Action]:
    """Rank ``rank``'s compute actions in order (the module docstring)."""
    _, per_round = rounds(microbatches, pp)
    total = virtual * microbatches
    warmup = min((virtual - 1) * per_round + 2 * (pp - 1 - rank), total)
    steady = total - warmup

    def forward_chunk(op: int) -> int:
        return ((op // per_round) % virtual) * pp + rank

    def backward_chunk(op: int) -> int:
        return (virtual - 1 - ((op - warmup) // per_round) % virtual) * pp + rank

    done_f: dict[int, int] = {}
    done_b: dict[int, int] = {}
    out: list[Action] = []

    def add(chunk: int, forward: bool) -> None:
        seen = done_f if forward else done_b
        out.append(Action(chunk, seen.get(chunk, 0), forward))
        seen[chunk] = seen.get(chunk, 0) + 1

    for op in range(warmup + steady + warmup):
        if op < warmup:
            add(forward_chunk(op), True)
        elif op < warmup + steady:
            add(forward_chunk(op), True)
            add(backward_chunk(op), False)
        else:
            add(backward_chunk(op), False)
    return out


@dataclass
class Chunk:
    """What rank_peak reads of one virtual stage: its one-microbatch StageStep, where its backward begins,
    its parameters' gradient bytes, and whether it is the last stage (which sends no output)."""

    step: object  # pipeline.StageStep
    boundary: int
    gradients: int
    last: bool


def rank_peak(actions: list[Action], chunks: dict[int, Chunk]) -> tuple[int, int, int, int, int]:
    """(the activations' peak on the rank above its resident state, its chunk and local step, the most
    saved bytes held at once, the most microbatch-chunks in flight): each action's own microbatch at its
    chunk's live bytes (at each local step of its forward or backward part), beside what the actions
    before it hold: every in-flight microbatch's kept bytes, the gradients of the chunks whose first
    backward has run, and every sent output and input gradient (their works, kept to the step's end)."""
    held: dict[tuple[int, int], tuple[int, int]] = {}  # (chunk, microbatch) -> (kept bytes, saved bytes)
    grads_made: set[int] = set()
    sent = 0
    best = (0, 0, 0)
    most_saved = most_flight = 0
    for a in actions:
        c = chunks[a.chunk]
        step, b = c.step, c.boundary
        others = sum(v for k, (v, _) in held.items() if k != (a.chunk, a.microbatch)) + sent + \
            sum(chunks[g].gradients for g in grads_made if g != a.chunk)
        if a.forward:
            part = step.live[:b]
        elif a.chunk in grads_made:  # a later backward of the chunk: its gradients made already
            part = (step.live - step.gradients + c.gradients)[b:]
        else:
            part = step.live[b:]
        if len(part):
            k = int(part.argmax())
            if others + int(part[k]) > best[0]:
                best = (others + int(part[k]), a.chunk, k + (0 if a.forward else b))
        if a.forward:
            held[(a.chunk, a.microbatch)] = (step.held, step.saved)
            most_saved = max(most_saved, sum(s for _, s in held.values()))
            most_flight = max(most_flight, len(held))
        else:
            held.pop((a.chunk, a.microbatch), None)
            grads_made.add(a.chunk)
            sent += step.sent_gradient + (0 if c.last else step.held - step.saved)
    return (*best, most_saved, most_flight)
