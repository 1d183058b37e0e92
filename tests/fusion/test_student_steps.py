"""Every optimiser step of a fused model (students and generators; FedHydra's stratification
aside, see below) is `fusion.student.descend`, which refuses a non-finite loss and names the rate to
lower; DENSE and Co-Boosting distil their synthetic pools in one schedule, `pool_batches`
(issue 35: one step and one loop, not seven)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from edgefl.errors import FusionError
from edgefl.fusion.student import descend, pool_batches

FUSION = Path(__file__).resolve().parents[2] / "edgefl" / "fusion"


def _backward_calls():
    for path in sorted(FUSION.glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("backward", "zero_grad")
                ):
                    yield f"{path.name}:{fn.name}"


def test_only_descend_steps_an_optimizer():
    # FedHydra's stratification keeps its own step on purpose: a (client, class) generator that
    # diverges loses only that pair's guidance measure, not the whole fusion.
    assert sorted(set(_backward_calls())) == ["fedhydra.py:stratify", "student.py:descend"]


def test_a_generator_step_on_a_non_finite_loss_names_the_generator_rate():
    w = torch.zeros(2, requires_grad=True)
    opt = torch.optim.Adam([w], lr=0.1)
    with pytest.raises(FusionError, match="the DENSE generator's training loss became nan") as e:
        descend(opt, (w * float("nan")).sum(), "the DENSE generator", rate="gen_lr")
    assert "--opt gen_lr=" in e.value.hint
    assert torch.equal(w, torch.zeros(2))  # no step was taken
    assert descend(opt, (w - 1).pow(2).sum()) == 2.0 and not torch.equal(w, torch.zeros(2))


def test_one_pass_over_the_pool_when_no_steps_are_asked():
    batches = pool_batches(10, 4, 0, torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(torch.cat(batches).tolist()) == list(range(10))


def test_a_fixed_number_of_steps_cycles_fresh_permutations():
    batches = pool_batches(10, 4, 7, torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2, 4]
    first, second = torch.cat(batches[:3]), torch.cat(batches[3:6])
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(10))
    assert first.tolist() != second.tolist()  # a fresh order, not the same pass again
    assert len(pool_batches(10, 4, 2, torch.Generator().manual_seed(0))) == 2
