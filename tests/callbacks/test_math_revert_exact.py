"""A reverted math trial leaves the training step as it was, bit for bit.

Each knob a CPU fit can try is offered and switched on at step ``START`` of a real fit, runs
``TRIAL_STEPS`` steps, is switched back, and the numerics guard restores the state of step
``START`` (as after a failed trial); a control fit does the same with no knob. From then on the
two fits must compute the same losses and end with the same parameters and optimizer state,
bit for bit, and the precision plugin, the tensors' layouts, the optimizer's flags and the
process-wide state must be those before the trial.

The model has one convolution in NHWC by hand (a user converting part of a network): reverting
``channels_last`` once put every weight in NCHW, and the same steps then ended with other
parameters.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lightning_maxtp._compat.torch_modules import compiled_call, is_compiled
from lightning_maxtp.callbacks.drift import process_state
from lightning_maxtp.callbacks.guard import NumericsGuard
from lightning_maxtp.callbacks.math_knobs import MathKnobs
from lightning_maxtp.data.hooks import HOOKS
from lightning_maxtp.knobs import Offer
from tests.helpers.models import ConvModel, image_loader

START, TRIAL_STEPS, AFTER_STEPS = 3, 3, 4
CPU_KNOBS = ("precision", "channels_last", "fused_optimizer", "gc")
"""The math knobs a CPU fit tries mid-fit (``compile`` compiles for tens of seconds: below)."""


class PartlyNhwc(ConvModel):
    """``ConvModel`` with its second convolution in channels_last by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.net[2].to(memory_format=torch.channels_last)


def _fit_state(trainer: pl.Trainer) -> dict[str, Any]:
    """What a revert must put back: the step's plugin, layouts, optimizer flags, the process."""
    module, optimizer = trainer.lightning_module, trainer.optimizers[0]
    tensors = [*module.named_parameters(), *module.named_buffers()]
    groups = optimizer.param_groups
    state = [optimizer.state[p] for group in groups for p in group["params"]]
    return {
        "precision plugin": id(trainer.strategy.precision_plugin),
        "precision": trainer.precision,
        "layouts": {n: (t.dtype, t.device, t.stride()) for n, t in tensors},
        "param groups": [{k: v for k, v in g.items() if k != "params"} for g in groups],
        "optimizer state": [
            {k: (v.dtype, v.device, v.stride()) if torch.is_tensor(v) else v for k, v in s.items()}
            for s in state
        ],
        "batch hooks": sorted(h for h in HOOKS if h in vars(module)),
        "compiled": is_compiled(module),
        **process_state(),
    }  # fmt: skip


class KnobTrial(Callback):
    """At ``START``: snapshot, switch ``knob`` to its offer; ``TRIAL_STEPS`` later: undo both.

    With ``knob=None`` only the snapshot and its restore: the control fit.
    """

    def __init__(self, knob: str | None) -> None:
        self.knob = knob
        self.math = MathKnobs(CPU_KNOBS)
        self.guard = NumericsGuard()
        self.before: dict[str, Any] = {}
        self.after: dict[str, Any] = {}
        self.offer: Any = None

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        step = trainer.global_step
        if step == START:
            self.math.bind(trainer)
            self.before = _fit_state(trainer)
            self.guard.snapshot(trainer)
            if self.knob is not None:
                self.offer = self.math.offer(self.knob)
                assert isinstance(self.offer, Offer), self.offer
                self.math.set(self.knob, self.offer.proposed)
        elif step == START + TRIAL_STEPS:
            if self.knob is not None:
                self.math.set(self.knob, self.offer.current)
                assert self.math.in_force == {}
            assert self.guard.restore(trainer)
            self.after = _fit_state(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.math.restore()  # as the callback does when the fit ends


def _fit(knob: str | None) -> tuple[PartlyNhwc, pl.Trainer, KnobTrial]:
    pl.seed_everything(0, verbose=False)
    model, trial = PartlyNhwc(), KnobTrial(knob)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=START + TRIAL_STEPS + AFTER_STEPS, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[trial],
    )  # fmt: skip
    trainer.fit(model, image_loader(size=256, batch_size=16))
    return model, trainer, trial


@pytest.fixture(scope="module")
def control() -> tuple[PartlyNhwc, pl.Trainer, KnobTrial]:
    return _fit(None)


@pytest.mark.parametrize("knob", CPU_KNOBS)
def test_a_reverted_trial_leaves_the_step_bit_for_bit_as_it_was(
    knob: str, control: tuple[PartlyNhwc, pl.Trainer, KnobTrial]
) -> None:
    ref_model, ref_trainer, _ = control
    model, trainer, trial = _fit(knob)

    assert trial.offer.proposed != trial.offer.current  # the knob did change the step
    was, now = trial.before, trial.after
    assert now == was, {k: (v, now[k]) for k, v in was.items() if v != now[k]}
    # The same steps from the same state: the same losses and the same end state, bit for bit.
    after = START + TRIAL_STEPS
    assert model.losses[after:] == ref_model.losses[after:]
    assert len(model.losses[after:]) == AFTER_STEPS
    for (name, value), ref in zip(
        model.state_dict().items(), ref_model.state_dict().values(), strict=True
    ):
        assert torch.equal(value, ref), name
    optimizer, ref_optimizer = trainer.optimizers[0], ref_trainer.optimizers[0]
    for p, ref_p in zip(model.parameters(), ref_model.parameters(), strict=True):
        state, ref_state = optimizer.state[p], ref_optimizer.state[ref_p]
        assert state.keys() == ref_state.keys()
        for key, value in state.items():
            assert torch.equal(value, ref_state[key]) and value.dtype == ref_state[key].dtype, key
    # The hand-set NHWC weight is NHWC still, the others NCHW.
    assert model.net[2].weight.is_contiguous(memory_format=torch.channels_last)
    assert not model.net[2].weight.is_contiguous() and model.net[0].weight.is_contiguous()


def test_a_reverted_compile_runs_every_submodule_eagerly_again() -> None:
    from types import SimpleNamespace

    module = PartlyNhwc()
    trainer = SimpleNamespace(lightning_module=module, optimizers=[], precision="32-true")
    math = MathKnobs(("compile",))
    math.bind(trainer)  # type: ignore[arg-type]
    math.set("compile", True)  # compiled lazily, on the next call: no compiling here
    assert is_compiled(module) and math.in_force == {"compile": True}
    math.set("compile", False)
    assert not is_compiled(module) and math.in_force == {}
    assert all(compiled_call(m) is None for m in module.modules())
