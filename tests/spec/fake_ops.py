"""Fake ops and suite helpers for the spec tests: a suite written to disk, loaded against the fakes,
and an expected SpecError with its line and field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from kdtr.errors import SpecError
from kdtr.ops.base import Generated, Op, Param
from kdtr.bundle.spec import Suite, load_suite


# -- fake ops -----------------------------------------------------------------------------------

class FakeAttn(Op):
    name = "fake_attn"
    variants = ("fp32", "bf16_paged")
    params = (
        Param("heads", int, None, min=1, max=128),
        Param("prefix", int, 0, min=0),
        Param("batch", int, 1, min=1, max=64),
        Param("sm_scale", float, 0.07216878, min=0.0),
        Param("mode", str, "tree", choices=("tree", "chain")),
        Param("causal", bool, True),
    )
    inline_inputs = ("visibility",)
    outputs = ("out", "lse")

    def case_name(self, variant, params):
        return f"{variant}_h{params['heads']}_p{params['prefix']}_b{params['batch']}"

    def check_params(self, variant, params):
        if variant == "bf16_paged" and params["heads"] % 8:
            raise ValueError("bf16_paged needs heads divisible by 8")


class FakeAccept(Op):
    name = "fake_accept"
    params = (Param("budget", int, None, min=0),)
    inline_inputs = ("tokens", "parents", "target_ids")
    outputs = ("accept_len", "accept_nodes", "bonus")

    def case_name(self, variant, params):
        return f"b{params['budget']}"

    def input_specs(self, variant):
        return {"tokens": "i32", "parents": "i32", "target_ids": "i32"}

    def generate(self, case):
        """The inline inputs as the op's dtypes; nothing is generated."""
        return Generated({k: np.asarray(v, np.int32) for k, v in case.inline.items()}, {})


class FakeBadNames(Op):
    name = "fake_bad_names"
    params = (Param("n", int, 0),)

    def case_name(self, variant, params):
        return f"n = {params['n']}"          # spaces: not a safe file stem


OPS = {op.name: op for op in (FakeAttn(), FakeAccept(), FakeBadNames())}
LOOKUP = OPS.__getitem__


# -- helpers ------------------------------------------------------------------------------------

def write(tmp_path: Path, text: str | bytes, name: str = "suite.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load(tmp_path: Path, text: str, name: str = "suite.yaml") -> Suite:
    return load_suite(write(tmp_path, text, name), lookup=LOOKUP)


def line_of(text: str, marker: str = "# <-") -> int:
    """The 1-based line of the fixture text that carries the marker."""
    hits = [i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if marker in line]
    assert len(hits) == 1, f"fixture needs exactly one {marker!r} marker"
    return hits[0]


def expect_error(path: Path, line: int | None, field: str | None, fragment: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_suite(path, lookup=LOOKUP)
    err = info.value
    message = str(err)
    assert str(path) in message and path.name in message
    assert err.line == line, message
    assert err.field == field, message
    prefix = f"{path}:{line}: " if line is not None else f"{path}: "
    assert message.startswith(prefix + (f"{field}: " if field else "")), message
    assert fragment in message, message
    return err
