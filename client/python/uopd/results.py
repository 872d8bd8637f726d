"""What uopd answers, as plain dataclasses (uopd.v1's messages, proto/uopd.proto)."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple, Union

import numpy as np

from uopd import dtypes
from uopd._stubs import pb

_CACHE_STATUS = {pb.HIT: "hit", pb.MISS: "miss", pb.COALESCED: "coalesced"}


@dataclass
class Kernel:
    """One kernel of a compiled graph (uopd.v1.Kernel)."""

    name: str
    digest: str  # hex SHA-256 of the normalized kernel
    cache_key: str
    status: str  # "hit", "miss", "coalesced" or "unspecified"
    tier: str  # for a hit: "memory", "disk" or "redis"
    compile_ms: float  # for a miss
    abi: str  # the kernel ABI, text form (Compile's answer; "" in a Run's)
    binary: bytes = b""  # on request: the object (cpu) or cubin (cuda)
    source: str = ""  # on request: LLVM IR or CUDA C

    def describe_cache(self) -> str:
        """As `uop` prints it: "miss, compiled in 12 ms", "hit (memory)"."""
        if self.status == "miss":
            ms = self.compile_ms
            return f"miss, compiled in {ms:.1f} ms" if ms < 10 else f"miss, compiled in {ms:.0f} ms"
        if self.status == "hit":
            return f"hit ({self.tier})" if self.tier else "hit"
        if self.status == "coalesced":
            return "coalesced (waited for a concurrent compile)"
        return "cache status not reported"


@dataclass
class CompileResult:
    kernels: List[Kernel]  # execution order; a repeated kernel appears once
    graph_digest: str
    plan_cached: bool


@dataclass
class ExplainStage:
    name: str  # a pipeline stage
    kernel: str  # for per-kernel stages
    text: str  # the IR after the stage


@dataclass
class KernelProfile:
    """One kernel's share of a profiled run (uopd.v1.KernelProfile): every launch timed on
    its worker; flops and bytes are the compiler's estimate (0 where it has none)."""

    name: str
    digest: str
    launches: int
    total_ms: float
    per_launch_ms: float
    flops: float
    bytes: float
    gflops: float
    gbytes_per_s: float
    device: str
    schedule: str  # the axis types of its ranges


@dataclass
class TensorInfo:
    """An input or output of a held model."""

    name: str
    dtype: str  # uopd's name: "float32"
    shape: Tuple[int, ...]


@dataclass
class WorkerStatus:
    id: str
    device: str
    address: str
    state: str  # "up", "starting", "down"
    pid: int
    restarts: int
    last_error: str


@dataclass
class Stats:
    """The server's counters (uopd.v1.StatsResponse); field names as in the proto."""

    compiles: int = 0
    cache_hits_memory: int = 0
    cache_hits_disk: int = 0
    cache_hits_redis: int = 0
    cache_misses: int = 0
    cache_coalesced: int = 0
    cache_errors: int = 0
    plan_cache_hits: int = 0
    plan_cache_misses: int = 0
    kernels_run: int = 0
    sessions: int = 0
    buffers: int = 0
    buffer_bytes: int = 0
    compiler_build_id: str = ""
    worker_executes_lane: int = 0
    worker_executes_grpc: int = 0
    compile_queue_depth: int = 0
    compile_tasks_running: int = 0
    compiles_in_progress: int = 0
    launches_timed: int = 0
    model_weight_buffers_written: int = 0
    model_weight_bytes_written: int = 0
    bytes_uploaded: int = 0
    run_graph_bytes: int = 0
    # Schedule search (uop tune, --search=beam): searches, candidates timed and dropped by
    # reason, tuning records found by tier / missing / refused / written, the server's
    # --search, and searches left to (or taken over by) another server sharing the Redis.
    searches: int = 0
    candidates_timed: int = 0
    candidates_dropped_compile: int = 0
    candidates_dropped_mismatch: int = 0
    candidates_dropped_crash: int = 0
    candidates_dropped_timeout: int = 0
    tuning_records_memory: int = 0
    tuning_records_disk: int = 0
    tuning_records_redis: int = 0
    tuning_record_misses: int = 0
    tuning_record_errors: int = 0
    tuning_records_written: int = 0
    search: str = ""
    leases_held_elsewhere: int = 0
    leases_lost: int = 0
    workers: List[WorkerStatus] = field(default_factory=list)


def _from_response(name: str) -> Any:
    """A RunResult attribute read from its response's field `name` when asked."""
    return property(lambda self: getattr(self._response, name), doc=f"uopd.v1.RunResponse.{name}")


class RunResult:
    """A Run's (or RunModel's) answer: outputs by name (arrays, or Buffers when kept), the
    kernels with their cache status, where the time went (ms), and the per-kernel profile
    if asked for. Read from the response when asked: a run() that wants only its outputs
    pays for nothing else."""

    def __init__(self, outputs: Dict[str, Union[np.ndarray, Any]], response: "pb.RunResponse"):
        self.outputs = outputs
        self._response = response

    device: str = _from_response("device")
    plan_ms: float = _from_response("plan_ms")
    compile_ms: float = _from_response("compile_ms")
    run_ms: float = _from_response("run_ms")
    collective_ms: float = _from_response("collective_ms")
    graph_digest: str = _from_response("graph_digest")

    @functools.cached_property
    def kernels(self) -> List[Kernel]:
        return [kernel(k) for k in self._response.kernels]

    @functools.cached_property
    def profile(self) -> List[KernelProfile]:
        return [_plain(KernelProfile, k) for k in self._response.profile]

    def __repr__(self) -> str:
        return (f"RunResult(outputs={list(self.outputs)}, kernels={len(self._response.kernels)}, device={self.device!r}, "
                f"plan_ms={self.plan_ms:.3f}, compile_ms={self.compile_ms:.3f}, run_ms={self.run_ms:.3f})")


_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _plain(cls: Any, msg: Any, **overrides: Any) -> Any:
    """A dataclass from the message fields of the same names."""
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    values = {n: getattr(msg, n) for n in names if n not in overrides}
    return cls(**values, **overrides)


def kernel(k: "pb.Kernel") -> Kernel:
    return _plain(Kernel, k, status=_CACHE_STATUS.get(k.status, "unspecified"))


def compile_result(r: "pb.CompileResponse") -> CompileResult:
    return CompileResult([kernel(k) for k in r.kernels], r.graph_digest, r.plan_cached)


def explain_text(stages: List[ExplainStage]) -> str:
    """As `uop explain` prints them: "=== stage [kernel]" and the IR after it."""
    out = []
    for s in stages:
        out.append(f"=== {s.name}{f' [{s.kernel}]' if s.kernel else ''}\n{s.text}")
        if s.text and not s.text.endswith("\n"):
            out.append("\n")
    return "".join(out)


def stats(r: "pb.StatsResponse") -> Stats:
    return _plain(Stats, r, workers=[_plain(WorkerStatus, w) for w in r.workers])


def tensor_infos(ts: Any) -> List[TensorInfo]:
    return [TensorInfo(t.name, dtypes.name(t.dtype), tuple(t.shape)) for t in ts]


def profile_table(rows: List[KernelProfile]) -> str:
    """The table `uop run --profile` prints, slowest first."""
    table = [["kernel", "launches", "total ms", "per launch ms", "GFLOPS", "GB/s", "schedule"]]
    for k in rows:
        timed = k.total_ms > 0
        table.append([k.name, str(k.launches), f"{k.total_ms:.3f}", f"{k.per_launch_ms:.3f}",
                      f"{k.gflops:.2f}" if k.flops > 0 and timed else "-",
                      f"{k.gbytes_per_s:.2f}" if k.bytes > 0 and timed else "-", k.schedule])
    width = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = []
    for r in table:
        cells = [c.ljust(width[i]) if i in (0, len(r) - 1) else c.rjust(width[i]) for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"
