"""A data-parallel layout as users write it in torchtitan configs, and what each degree means.

``dp_replicate`` ranks hold whole replicas (DDP: ``DistributedDataParallel``); ``dp_shard`` ranks shard
the parameters, gradients and optimizer state among them (FSDP2's ``fully_shard`` on every block and the
root, ZeRO-3); both together are HSDP (shard within a group of ``dp_shard``, replicate across).
``zero=1`` under plain replication shards only the optimizer state (torch's ``ZeroRedundancyOptimizer``).
Replicas over tensor-parallel ranks are DDP over each tensor-parallel share; replicas of a pipeline are DDP
over each stage.
The world is the product of the degrees; ``--batch`` is each rank's own (torchtitan's
``local_batch_size``), so the global batch is it times the data-parallel degree.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import UsageError

DEVICES = {"cpu": "gloo", "cuda": "NCCL"}  # the backend each device's collectives run on
INTERLEAVED = "interleaved-1f1b"  # ScheduleInterleaved1F1B: --virtual-stages stages per rank
SCHEDULES = ("1f1b", "gpipe", INTERLEAVED)  # torch.distributed.pipelining's Schedule1F1B, ScheduleGPipe
MAX_WORLD = 1 << 17  # 131,072 ranks: beyond the largest clusters trained on; the JSON lists every rank id


@dataclass(frozen=True)
class Layout:
    dp_replicate: int = 1
    dp_shard: int = 1
    zero: int | None = None  # 1: optimizer state sharded over the replicas (ZeroRedundancyOptimizer)
    reshard_after_forward: bool = True  # FSDP2: free a block's gathered parameters after its forward
    world: int | None = None  # the world size the user says, checked against the degrees' product
    tp: int = 1  # tensor parallel: each block's column/row pairs split over tp ranks (parallel.tensor)
    sp: bool = False  # sequence parallel with the tensor parallel: norms and residuals split by sequence
    pp: int = 1  # pipeline stages, one per rank (parallel.pipeline)
    microbatches: int | None = None  # the batch's microbatches under --pp (default: pp)
    pp_schedule: str = "1f1b"  # Schedule1F1B, gpipe (ScheduleGPipe) or interleaved-1f1b
    virtual: int = 2  # interleaved-1f1b: the stages each rank holds (the blocks split into pp x virtual)

    @property
    def size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp

    @property
    def chunks(self) -> int:
        """The microbatches each step's batch is cut into (1 without a pipeline)."""
        return (self.microbatches or self.pp) if self.pp > 1 else 1

    @property
    def data_parallel(self) -> int:
        """The ranks that read different batches (tensor-parallel ranks read one)."""
        return self.dp_replicate * self.dp_shard

    @property
    def sharded(self) -> bool:
        return self.dp_shard > 1

    @property
    def name(self) -> str:
        """torchtitan's words for it: 'FSDP 4', 'HSDP 2x4', 'DDP 8 + ZeRO-1', 'TP 2', 'single device'."""
        if self.pp > 1 and self.pp_schedule == INTERLEAVED:
            return (f"PP {self.pp} (interleaved 1F1B, {self.virtual} stages per rank, {self.chunks} "
                    "microbatches)")
        if self.pp > 1:
            data = f" x DDP {self.dp_replicate}" + (" + ZeRO-1" if self.zero == 1 else "") \
                if self.dp_replicate > 1 else ""
            data += (f" x FSDP {self.dp_shard}" + ("" if self.reshard_after_forward else
                                                   " (no reshard after forward)")) if self.sharded else ""
            data += f" x TP {self.tp}" if self.tp > 1 else ""
            return f"PP {self.pp} ({self.pp_schedule.upper()}, {self.chunks} microbatches){data}"
        tp = f"TP {self.tp}" + (" + SP" if self.sp else "") if self.tp > 1 else ""
        if self.sharded:
            kind = f"HSDP {self.dp_replicate}x{self.dp_shard}" if self.dp_replicate > 1 else \
                f"FSDP {self.dp_shard}"
            kind += f" x {tp}" if tp else ""
            return kind + ("" if self.reshard_after_forward else " (no reshard after forward)")
        if tp and self.dp_replicate > 1:
            return f"DDP {self.dp_replicate} x {tp}"
        if tp:
            return tp
        if self.dp_replicate > 1:
            return f"DDP {self.dp_replicate}" + (" + ZeRO-1" if self.zero == 1 else "")
        return "single device"

    def check(self) -> None:
        """UsageError for a layout that cannot run: a degree below 1, a world the degrees do not
        multiply to, ZeRO levels that are another flag's job."""
        for name, n in (("--dp-replicate", self.dp_replicate), ("--dp-shard", self.dp_shard),
                        ("--tp", self.tp), ("--pp", self.pp), ("--microbatches", self.microbatches or 1)):
            if n < 1:
                raise UsageError(f"{name} {n}: a degree is at least 1")
        if self.size > MAX_WORLD:
            raise UsageError(f"a world of {self.size:,} ranks: at most {MAX_WORLD:,}")
        if self.world is not None and self.world != self.size:
            raise UsageError(f"--world {self.world}: the degrees multiply to {self.size} "
                             f"(--dp-replicate {self.dp_replicate} x --dp-shard {self.dp_shard} x --tp "
                             f"{self.tp} x --pp {self.pp})")
        if self.pp > 1 and self.dp_replicate > 1 and (self.tp > 1 or self.sharded):
            raise UsageError("--pp with --dp-replicate and --dp-shard or --tp is not modelled yet (--pp "
                             "with --dp-shard and --tp, torchtitan's 3-D layout, is)")
        if self.pp > 1 and self.sp:
            raise UsageError("--sp with --pp (the stages' boundary split along the sequence) is not "
                             "modelled yet: --pp with --tp is")
        if self.pp_schedule == INTERLEAVED and (self.size != self.pp or self.virtual < 2):
            raise UsageError("--pp-schedule interleaved-1f1b: modelled for a pipeline alone (no other "
                             "degree) with --virtual-stages 2 or more")
        if self.pp_schedule != INTERLEAVED and self.virtual != 2:
            raise UsageError("--virtual-stages is an interleaved-1f1b setting: give --pp-schedule "
                             "interleaved-1f1b")
        if self.pp > 1 and self.pp_schedule == "1f1b" and self.chunks < self.pp:
            # torch.distributed.pipelining's Schedule1F1B raises ValueError for fewer microbatches than stages
            raise UsageError(f"--pp {self.pp} with --microbatches {self.chunks}: Schedule1F1B needs at least "
                             "one microbatch per stage (more --microbatches, or --pp-schedule gpipe)")
        if self.pp == 1 and (self.microbatches is not None or self.pp_schedule != "1f1b"):
            raise UsageError("--microbatches and --pp-schedule are pipeline settings: give --pp N (N >= 2)")
        if self.sp and self.tp < 2:
            raise UsageError("--sp splits the tensor-parallel ranks' norms and residuals along the "
                             "sequence: give --tp N (N >= 2)")
        if self.zero == 1 and self.sharded:
            raise UsageError("--zero 1 shards the optimizer state over replicas; with --dp-shard the "
                             "parameters, gradients and state are sharded already (ZeRO-3)")
        if self.zero == 1 and self.tp > 1:
            raise UsageError("--zero 1 with --tp (ZeroRedundancyOptimizer over tensor-parallel shares) is "
                             "not modelled yet: DDP x TP without it is")
        if self.zero == 1 and self.dp_replicate < 2:
            raise UsageError("--zero 1 needs replicas to shard over: give --dp-replicate N (N >= 2)")
        if self.zero in (2, 3):
            raise UsageError(f"--zero {self.zero}: give --dp-shard N (FSDP2, ZeRO-3; with "
                             "--no-reshard-after-forward the gathered parameters stay from forward to "
                             "backward, as ZeRO-2 keeps them whole)")
        if not self.reshard_after_forward and not self.sharded:
            raise UsageError("--no-reshard-after-forward is an FSDP setting: give --dp-shard N")
        if self.pp_schedule not in SCHEDULES:
            raise UsageError(f"--pp-schedule {self.pp_schedule}: one of {', '.join(SCHEDULES)}")


def ranks_of(layout: Layout) -> list[int]:
    """Every rank id of the layout, in the mesh's order (replicate outer, shard inner)."""
    return list(range(layout.size))
