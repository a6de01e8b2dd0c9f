"""Which shard this job is: `--shard I/N`, `--shard auto` (the scheduler's variables) and the
optional `--balance-from` record that splits by measured case times instead of the name hash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Mapping

from ..config import scheduler_variables
from ..errors import UsageError
from .parallel import Shard
from ..records.record import VERIFY_KIND, read_json, record_kind

# (index variable, count variable, index base variable or None, scheduler name); the first one
# whose index variable is set wins. Kubernetes' Indexed Jobs give no count: --shard-count gives it.
SCHEDULERS = (
    ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "Slurm array"),
    ("BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT", None, "Buildkite parallelism"),
    ("CIRCLE_NODE_INDEX", "CIRCLE_NODE_TOTAL", None, "CircleCI parallelism"),
    ("JOB_COMPLETION_INDEX", None, None, "Kubernetes Indexed Job"),
)
SLURM_STEP = "SLURM_ARRAY_TASK_STEP"      # a stepped array (--array=0-6:2): its IDs have gaps
NO_SCHEDULER = ("--shard auto: no scheduler variable is set (SLURM_ARRAY_TASK_ID, BUILDKITE_PARALLEL_JOB, "
                "CIRCLE_NODE_INDEX or JOB_COMPLETION_INDEX); give --shard I/N instead")


def scheduler_shard(shard_count: int | None = None) -> Shard:
    """This job's shard from the scheduler's variables (0-based index there, 1-based here)."""
    found = scheduler_variables()
    for index_name, count_name, base_name, scheduler in SCHEDULERS:
        if index_name not in found:
            continue
        if index_name == SCHEDULERS[0][0] and found.get(SLURM_STEP, 1) != 1:
            raise UsageError(f"--shard auto: {SLURM_STEP}={found[SLURM_STEP]}: a stepped Slurm array leaves gaps "
                             "between task IDs and cannot shard; use a dense one (--array=0-3)")
        index = found[index_name] - (found.get(base_name, 0) if base_name else 0)
        if count_name is None:
            if shard_count is None:
                raise UsageError(f"--shard auto: {index_name} is set ({scheduler}) but gives no count; "
                                 "add --shard-count N (the Job's completions)")
            count, given = shard_count, "--shard-count"
        else:
            if count_name not in found:
                raise UsageError(f"--shard auto: {index_name} is set but {count_name} is not")
            if base_name and base_name not in found:
                raise UsageError(f"--shard auto: {index_name} is set but {base_name} is not "
                                 "(an array may start at any index)")
            count, given = found[count_name], count_name
            if shard_count is not None and shard_count != count:
                raise UsageError(f"--shard-count {shard_count} disagrees with {count_name}={count}")
        base = f" - {base_name}" if base_name else ""
        if count < 1 or not 0 <= index < count:
            raise UsageError(f"--shard auto: {index_name}{base} = {index} is not in 0..{given}-1 = "
                             f"0..{count - 1} ({scheduler}; a stepped or sparse array cannot shard)")
        return Shard(index + 1, count)
    raise UsageError(NO_SCHEDULER)


def resolve_shard(text: str | None, shard_count: int | None = None,
                  balance_from: str | Path | None = None) -> Shard | None:
    """The three shard options of gen-refs, verify and bench as one Shard (None: the whole suite)."""
    if text is None:
        for option, value in (("--shard-count", shard_count), ("--balance-from", balance_from)):
            if value is not None:
                raise UsageError(f"{option} needs --shard (auto or I/N)")
        return None
    if text == "auto":
        shard = scheduler_shard(shard_count)
    elif shard_count is not None:
        raise UsageError("--shard-count goes with --shard auto (--shard I/N names its count)")
    else:
        shard = Shard.parse(text)
    if balance_from is None:
        return shard
    costs = case_seconds(balance_from)
    canonical = json.dumps(sorted(costs.items()), separators=(",", ":")).encode()
    return Shard(shard.index, shard.count, costs=costs, split=hashlib.sha256(canonical).hexdigest()[:12])


def case_seconds(path: str | Path) -> Mapping[str, float]:
    """"op/case" -> seconds it took in an earlier verify or bench record (verify: its rows' seconds
    summed over trials and implementations; bench: the record's case_seconds)."""
    path = Path(path)
    try:
        data = read_json(path)
        kind = record_kind(data, path)
    except UsageError as err:
        raise UsageError(f"--balance-from: {err.message}", file=path, field=err.field) from None
    seconds: dict[str, float] = {}
    try:
        if kind == VERIFY_KIND:
            for index, row in enumerate(data.get("rows") or ()):
                key = f"{row['op']}/{row['case']}"
                taken = row.get("seconds")
                if isinstance(taken, bool) or not isinstance(taken, (int, float)):
                    raise UsageError(f"--balance-from: rows[{index}] ({key}) has no seconds: a record without "
                                     "case times cannot balance shards", file=path)
                seconds[key] = seconds.get(key, 0.0) + float(taken)
        else:
            for name, value in (data.get("case_seconds") or {}).items():
                op_variant, _, case = str(name).partition(" ")      # "op/variant case"
                key = f"{op_variant.split('/')[0]}/{case}"
                seconds[key] = seconds.get(key, 0.0) + float(value)
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise UsageError(f"--balance-from: malformed record: {type(err).__name__}: {err}", file=path) from None
    if not seconds or not all(s >= 0 for s in seconds.values()) or not any(s > 0 for s in seconds.values()):
        raise UsageError("--balance-from: the record holds no case times to balance by", file=path)
    return seconds

