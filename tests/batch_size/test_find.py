"""``find_batch_size`` on real models: exact sequences, bit-for-bit restore, real Trainer fits."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import nn

from lightning_maxtp.batch_size import BatchSizePlan, find_batch_size
from lightning_maxtp.batch_size.trial import replicate_batch
from tests.helpers.oom_models import PlantedModule, PlantedOOM, example_batch, loss_fn
from tests.helpers.runif import RunIf

# Threshold 20 from init 2: double to 32 (fails), bisect 24, 20, 22, 21 -> ceiling 20; the
# margin leaves 16, which was timed, so no refine trial follows.
SEQUENCE_20 = (2, 4, 8, 16, 32, 24, 20, 22, 21)


def search(model: nn.Module, **kwargs: Any) -> BatchSizePlan:
    optimizer = kwargs.pop("optimizer", None) or torch.optim.SGD(model.parameters(), lr=0.1)
    return find_batch_size(
        model, kwargs.pop("batch", example_batch()), optimizer=optimizer, loss_fn=loss_fn, **kwargs
    )


@pytest.mark.parametrize("where", ["forward", "backward", "allocator"])
def test_exact_sizes_tried_whether_the_oom_is_in_forward_backward_or_the_allocator(
    where: str,
) -> None:
    model = PlantedOOM(threshold=20, where=where)
    plan = search(model)
    assert plan.tried == SEQUENCE_20
    fits = [(t.batch_size, t.samples_per_s is not None) for t in plan.trials if t.fits]
    assert fits == [(2, True), (4, True), (8, True), (16, True), (20, False)]  # 20: fit check
    assert (plan.ceiling, plan.first_oom, plan.safe_max_batch_size) == (20, 21, 16)
    assert plan.bound == "memory" and plan.fastest_batch_size <= 16
    failed = [t for t in plan.trials if not t.fits]
    assert [t.batch_size for t in failed] == [32, 24, 22, 21]
    planted = "OutOfMemoryError: CUDA out of memory. Tried to allocate 32 MiB (planted, {})"
    expected = {
        "forward": planted.format("forward"),
        "backward": planted.format("backward"),
        "allocator": "RuntimeError: [enforce fail at",
    }[where]
    assert failed[0].error is not None and failed[0].error.startswith(expected)
    if where == "backward":
        assert 32 in model.calls  # the forward pass at 32 ran; only its backward failed
    assert all(t.peak_memory_bytes for t in plan.trials if t.fits)  # process peak RSS on a CPU
    assert plan.memory_limit_bytes is not None


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "values": [t.clone() for t in (*model.parameters(), *model.buffers())],
        "grads": [None if p.grad is None else (p.grad, p.grad.clone()) for p in model.parameters()],
        "opt": copy.deepcopy(opt.state_dict()),
        "opt_tensors": [t for st in opt.state.values() for t in st.values()],
        "flags": [m.training for m in model.modules()],
        "rng": (random.getstate(), np.random.get_state(), torch.get_rng_state()),
    }


def test_state_is_restored_bit_for_bit_after_a_search_with_ooms() -> None:
    torch.manual_seed(0)
    model = PlantedOOM(threshold=20)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):  # real history: Adam moments, BatchNorm running stats, a step count
        opt.zero_grad()
        loss_fn(model, example_batch()).backward()
        opt.step()
    model.net[0].weight.grad = None  # one gradient None, the others real values
    model.net[3].eval()  # a flag the search must put back
    random.seed(1), np.random.seed(2), torch.manual_seed(3)  # type: ignore[func-returns-value]
    before = _state(model, opt)

    plan = search(model, optimizer=opt)

    assert any(not t.fits for t in plan.trials) and len(model.calls) > 20  # steps really ran
    after = _state(model, opt)
    for a, b in zip(before["values"], after["values"], strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    for a, b in zip(before["grads"], after["grads"], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a[0] is b[0] and torch.equal(a[1], b[1])  # same tensor object, same bits
    for key in ("step", "exp_avg", "exp_avg_sq"):
        for i in before["opt"]["state"]:
            assert torch.equal(before["opt"]["state"][i][key], after["opt"]["state"][i][key])
    assert before["opt"]["param_groups"] == after["opt"]["param_groups"]
    assert all(a is b for a, b in zip(before["opt_tensors"], after["opt_tensors"], strict=True))
    assert before["flags"] == after["flags"]
    assert before["rng"][0] == after["rng"][0]
    assert all(np.array_equal(x, y) for x, y in zip(before["rng"][1], after["rng"][1], strict=True))
    assert torch.equal(before["rng"][2], after["rng"][2])


def test_a_fresh_optimizer_stays_empty() -> None:
    model = PlantedOOM(threshold=20)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    search(model, optimizer=opt)
    assert opt.state_dict()["state"] == {}
    assert all(p.grad is None for p in model.parameters())


def test_lightning_module_alone_uses_its_training_step_and_optimizer() -> None:
    module = PlantedModule(threshold=20)
    plan = find_batch_size(module, example_batch(), precision="bf16-mixed")
    assert plan.tried == SEQUENCE_20 and plan.precision == "bf16-mixed"
    # "keep": the global batch of 8 stays, whichever micro-batch was fastest.
    assert plan.previous_batch_size == 8 and plan.global_batch_size == 8
    assert plan.batch_size * plan.accumulate_grad_batches == 8


def test_plan_text_and_json() -> None:
    plan = search(PlantedOOM(threshold=20), global_batch="grow", lr_scaling="none")
    text = str(plan)
    assert text.startswith(f"batch size plan: micro-batch {plan.batch_size} x 1 device(s)")
    assert "ceiling 20 (first out of memory: 21), margin 20% -> at most 16" in text
    assert "<- fastest" in text and "does not fit: OutOfMemoryError" in text
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["tried"] == list(SEQUENCE_20) and len(data["trials"]) == len(SEQUENCE_20)


def test_replicate_batch_repeats_samples_in_order_and_leaves_shared_parts() -> None:
    batch = {"x": torch.arange(3), "mask": torch.ones(5), "name": "abc", "pair": (torch.arange(3),)}
    grown = replicate_batch(batch, 3, 7)
    assert grown["x"].tolist() == [0, 1, 2, 0, 1, 2, 0] and grown["pair"][0].shape == (7,)
    assert grown["mask"] is batch["mask"] and grown["name"] == "abc"
    assert replicate_batch(batch, 3, 2)["x"].tolist() == [0, 1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"margin": 1.0}, r"`margin` must be in \[0, 1\), got 1.0"),
        ({"tolerance": -0.1}, r"`tolerance` must be in \[0, 1\), got -0.1"),
        ({"time_budget_s": 0}, r"`time_budget_s` must be > 0, got 0; pass e.g. 20"),
        ({"init_batch_size": 64, "max_batch_size": 32}, r"`max_batch_size` must be >= `init"),
        ({"steps_per_trial": 0}, r"`steps_per_trial` must be >= 1, got 0"),
        ({"precision": "8-true"}, r"`precision` must be one of"),
        ({"batch": {"ids": [1, 2, 3]}}, r"must contain a tensor whose first dimension"),
        ({"target_global_batch_size": 0}, r"`target_global_batch_size` must be >= 1 or None"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        search(PlantedOOM(threshold=20), **kwargs)


def test_plain_module_needs_an_optimizer_and_a_loss() -> None:
    with pytest.raises(ValueError, match=r"plain nn.Module needs `optimizer=` and `loss_fn=`"):
        find_batch_size(PlantedOOM(20), example_batch())
    with pytest.raises(ValueError, match=r"`batch` is required without a `trainer`"):
        find_batch_size(PlantedOOM(20), None, loss_fn=loss_fn)


def test_impossible_global_batch_requests_fail_before_any_trial() -> None:
    model = PlantedOOM(threshold=20)
    lbfgs = torch.optim.LBFGS(model.parameters())
    with pytest.raises(ValueError, match=r"cannot tell how to scale the learning rate of 'LBFGS'"):
        search(model, optimizer=lbfgs, global_batch="grow")
    assert model.calls == []


def test_nothing_fits_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"no batch size fits: batch 1 already failed"):
        search(PlantedOOM(threshold=0))


class SearchThenApply(pl.Callback):
    """What MaxThroughputCallback will do: search in ``on_fit_start``, then apply the plan."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.plan = kwargs, None
        self.loop_before: dict[str, Any] = {}
        self.loop_after: dict[str, Any] = {}
        self.optimizer_steps_seen = 0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.loop_before = trainer.fit_loop.state_dict()
        self.plan = find_batch_size(pl_module, trainer=trainer, **self.kwargs)
        self.loop_after = trainer.fit_loop.state_dict()
        self.plan.apply(trainer)
        pl_module.recording = True  # type: ignore[assignment]

    def on_before_optimizer_step(self, *args: Any) -> None:
        self.optimizer_steps_seen += 1  # hidden from the search's steps


class LrRecorder(PlantedModule):
    recording = False

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.recording:
            self.lrs.append(optimizer.param_groups[0]["lr"])


def fit(module: pl.LightningModule, callback: pl.Callback, max_steps: int) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback],
    )  # fmt: skip
    trainer.fit(module)
    return trainer


def test_trainer_keep_global_batch_trains_on_with_the_plan_and_accumulation() -> None:
    # Threshold 10 from 8: 8 fits, 16/12/11 do not, 10 does -> ceiling 10, at most 8, so 8 is the
    # only candidate; keeping the global batch of 64 then takes 8 micro-batches of 8.
    module = PlantedModule(threshold=10, batch_size=64)
    callback = SearchThenApply(init_batch_size=8)
    trainer = fit(module, callback, max_steps=2)
    plan = callback.plan
    assert plan is not None and plan.tried == (8, 16, 12, 10, 11)
    assert (plan.batch_size, plan.accumulate_grad_batches, plan.global_batch_size) == (8, 8, 64)
    assert plan.changes == ("batch_size: 64 -> 8", "accumulate_grad_batches: 1 -> 8")
    assert module.hparams.batch_size == 8 and trainer.accumulate_grad_batches == 8
    assert module.seen_batches == [8] * 16 and trainer.global_step == 2
    assert callback.optimizer_steps_seen == 2
    assert callback.loop_after == callback.loop_before


def test_apply_refuses_a_loader_passed_to_fit_that_it_cannot_resize() -> None:
    module = PlantedModule(threshold=10, batch_size=64)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[SearchThenApply(init_batch_size=8)],
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"the train DataLoader was passed to `fit\(\)`"):
        trainer.fit(module, train_dataloaders=module.train_dataloader())


def test_trainer_grow_scales_the_learning_rate_with_a_warmup() -> None:
    module = LrRecorder(threshold=10, batch_size=2, lr=0.1)
    module.lrs = []  # type: ignore[attr-defined]
    callback = SearchThenApply(init_batch_size=8, global_batch="grow", lr_warmup_steps=4)
    fit(module, callback, max_steps=6)
    plan = callback.plan
    assert plan is not None and (plan.batch_size, plan.global_batch_size) == (8, 8)
    assert plan.lr_rules == ("linear",) and plan.lr_scales == (4.0,)
    assert "learning rate (optimizer 0): x4 (linear rule, linear warm-up over 4 steps)" in (
        plan.changes
    )
    assert module.lrs == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])  # type: ignore[attr-defined]
    assert module.seen_batches == [8] * 6


@RunIf(min_cuda_gpus=1)
def test_cuda_real_oom_ceiling_is_exact_and_memory_returns_to_baseline() -> None:
    device = torch.device("cuda", 0)
    model = nn.Sequential(nn.Linear(1024, 16384), nn.ReLU(), nn.Linear(16384, 10)).to(device)
    opt = torch.optim.Adam(model.parameters())
    batch = (torch.randn(8, 1024, device=device), torch.randint(0, 10, (8,), device=device))
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, 2 * 2**30 / total), device)  # ~2 GiB
    try:
        # cuBLAS keeps a workspace from its first call; take it before the baseline.
        loss_fn(model, batch).backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        baseline = torch.cuda.memory_allocated(device)
        weights = [p.detach().clone() for p in model.parameters()]
        plan = find_batch_size(
            model, batch, optimizer=opt, loss_fn=loss_fn, max_batch_size=2**20, time_budget_s=60
        )
        assert plan.bound == "memory" and plan.ceiling is not None
        assert plan.first_oom == plan.ceiling + 1
        assert any((t.error or "").startswith("OutOfMemoryError") for t in plan.trials)
        assert torch.cuda.memory_allocated(device) == baseline
        assert all(torch.equal(a, p) for a, p in zip(weights, model.parameters(), strict=True))
        assert opt.state_dict()["state"] == {}
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def test_a_plain_pytorch_user_applies_the_plan_by_hand() -> None:
    model = PlantedOOM(threshold=20)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    searched = search(model, optimizer=opt, global_batch="grow", lr_warmup_steps=4)
    # Which batch is fastest depends on the machine's load; the rules applied by hand do not:
    # the plan as a 4x larger batch would give it.
    plan = dataclasses.replace(searched, lr_scales=(4.0,), lr_warmup_steps=4)
    scale = plan.lr_scales[0]
    plan.scale_learning_rates([opt])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * scale)
    # The warm-up the docs name: LinearLR from the old rate to the scaled one.
    warmup = torch.optim.lr_scheduler.LinearLR(
        opt, start_factor=1 / scale, total_iters=plan.lr_warmup_steps
    )
    lrs = []
    for _ in range(plan.lr_warmup_steps + 1):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        warmup.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[-1] == pytest.approx(0.1 * scale)
    with pytest.raises(
        ValueError, match=r"`optimizers` has 2 optimizer\(s\) but the plan scales 1"
    ):
        plan.scale_learning_rates([opt, opt])
