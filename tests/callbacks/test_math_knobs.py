"""``MathKnobs`` on a stand-in Trainer: each knob set, read back and undone without a fit."""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightning_maxtp.callbacks.bottleneck_monitor import BottleneckMonitor
from lightning_maxtp.callbacks.loader_trial import tried_knobs
from lightning_maxtp.callbacks.math_knobs import MathKnobs
from lightning_maxtp.callbacks.tuner import Tuner
from lightning_maxtp.knobs import NotOffered, Offer
from lightning_maxtp.knobs.registry import knob_class
from lightning_maxtp.observe import JobContext
from lightning_maxtp.resources import inspect_resources
from lightning_maxtp.tuning.config import TuningConfig
from tests.helpers.fake_nvml import FakeGpu, FakeNvml
from tests.helpers.models import ConvModel


def _knobs(device: str = "cpu", optimizer: Any = None) -> tuple[MathKnobs, Any]:
    module = ConvModel()
    optimizer = optimizer or torch.optim.Adam(module.parameters(), lr=1e-3)
    trainer = SimpleNamespace(
        lightning_module=module, optimizers=[optimizer], precision="32-true",
        strategy=SimpleNamespace(root_device=torch.device(device)),
    )  # fmt: skip
    knobs = MathKnobs(("fused_optimizer", "tf32", "cudnn_benchmark", "channels_last"))
    knobs.bind(trainer)  # type: ignore[arg-type]
    return knobs, trainer


def _step(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    torch.nn.functional.cross_entropy(module.net(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_fused_adam_steps_and_is_undone_with_its_step_counters() -> None:
    knobs, trainer = _knobs()
    module, optimizer = trainer.lightning_module, trainer.optimizers[0]
    _step(module, optimizer)  # state exists before the switch, as mid-fit
    offer = knobs.offer("fused_optimizer")
    assert isinstance(offer, Offer) and (offer.current, offer.proposed) == (False, True)
    assert "fused" in offer.why

    knobs.set("fused_optimizer", True)
    assert all(g["fused"] and not g["foreach"] for g in optimizer.param_groups)
    assert knobs.current("fused_optimizer") and knobs.in_force == {"fused_optimizer": True}
    _step(module, optimizer)
    assert knobs.offer("fused_optimizer") == NotOffered("already on", quiet=True)

    knobs.set("fused_optimizer", False)
    assert all(not g["fused"] and g["foreach"] is None for g in optimizer.param_groups)
    assert knobs.in_force == {}
    _step(module, optimizer)
    assert all(s["step"].device.type == "cpu" for s in optimizer.state.values())


def test_an_optimizer_without_a_fused_step_is_not_offered() -> None:
    module = ConvModel()
    knobs, _ = _knobs(optimizer=torch.optim.RMSprop(module.parameters()))
    assert knobs.offer("fused_optimizer") == NotOffered(
        "no optimizer with a fused step (Adam, AdamW, SGD, Adagrad on the device)"
    )


def test_cuda_flags_are_not_offered_on_a_cpu_and_are_put_back_at_the_fit_end() -> None:
    knobs, _ = _knobs()
    cuda_only = NotOffered("CUDA only", quiet=True)
    assert knobs.offer("tf32") == cuda_only and knobs.offer("cudnn_benchmark") == cuda_only
    matmul, benchmark = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    try:
        knobs.set("tf32", True)
        knobs.set("cudnn_benchmark", True)
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.benchmark
        knobs.restore()
        assert torch.get_float32_matmul_precision() == matmul
        assert torch.backends.cudnn.benchmark == benchmark
        # What was in force stays in the report after the fit put it back.
        assert knobs.in_force == {"tf32": True, "cudnn_benchmark": True}
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.benchmark = benchmark


@pytest.fixture
def cuda_flags_off() -> Iterator[None]:
    """TF32 and cuDNN's benchmark off (torch's defaults) for the test, put back after it."""
    matmul, benchmark = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = False
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.benchmark = benchmark


@pytest.mark.usefixtures("cuda_flags_off")
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_tf32_and_cudnn_benchmark_are_offered_for_a_cuda_device_and_not_for_a_cpu(
    device: str,
) -> None:
    # The fit's root device is a CUDA one (a description: nothing runs on it here).
    cuda, flags = device == "cuda", ("tf32", "cudnn_benchmark")
    knobs, trainer = _knobs(device)
    refused = NotOffered("CUDA only", quiet=True)
    for name in flags:
        expected = Offer(False, True, knob_class(name).reason) if cuda else refused
        assert knobs.offer(name) == expected, name
    # The loop's choice for a compute-bound window of that device: each flag in turn, or none.
    monitor = BottleneckMonitor(window_steps=8, sampler_interval_s=None, verbose=False)
    monitor.context = JobContext(device_type=device)
    tuner = Tuner(TuningConfig(allow=flags), monitor, None, verbosity="quiet", allowed=flags)
    tuner.adopt(trainer)  # type: ignore[arg-type]
    offered = []
    while (change := tuner.math_trials.change("compute", math.inf)) is not None:
        assert change.settings == {change.knob: True}
        offered.append(change.knob)
        tuner.loop.tried.add((change.knob, "True"))  # as a trial of it would leave it
    assert sorted(offered) == (sorted(flags) if cuda else []), offered
    # And what the plan says the loop may try on a host with a GPU, or without one.
    host = inspect_resources(nvml=FakeNvml([FakeGpu()] if cuda else []))
    tried = tried_knobs(TuningConfig(allow=flags), host)
    assert sorted(tried) == (sorted(flags) if cuda else []), tried


def test_channels_last_converts_weights_and_batches_and_back() -> None:
    knobs, trainer = _knobs()
    module = trainer.lightning_module
    knobs.set("channels_last", True)
    assert knobs.current("channels_last")
    batch = module.on_after_batch_transfer((torch.randn(2, 3, 8, 8), torch.arange(2)), 0)
    assert batch[0].is_contiguous(memory_format=torch.channels_last)
    assert not batch[0].is_contiguous() and torch.equal(batch[1], torch.arange(2))
    knobs.set("channels_last", False)
    assert not knobs.current("channels_last") and "on_after_batch_transfer" not in vars(module)


class _Pointwise(pl.LightningModule):
    """A 1x1 and a single-input-channel convolution (contiguous in both layouts) and a 3x3."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3), torch.nn.Conv2d(8, 8, 3), torch.nn.Conv2d(8, 4, 1)
        )


def test_channels_last_is_read_from_strides_and_the_optimizer_state_follows() -> None:
    module = _Pointwise()
    optimizer = torch.optim.Adam(module.parameters())
    module.net(torch.randn(2, 1, 8, 8)).sum().backward()
    optimizer.step()
    knobs, _ = _knobs(optimizer=optimizer)
    knobs.trainer.lightning_module = module  # type: ignore[union-attr]
    assert knobs.current("channels_last") is False

    knobs.set("channels_last", True)
    assert knobs.current("channels_last") is True
    assert module.net[1].weight.is_contiguous(memory_format=torch.channels_last)
    for p in module.parameters():  # fused kernels pair weights and moments by memory offset
        for key in ("exp_avg", "exp_avg_sq"):
            assert optimizer.state[p][key].stride() == p.stride(), (key, p.shape)
    knobs.set("channels_last", False)
    assert knobs.current("channels_last") is False
    assert all(p.is_contiguous() for p in module.parameters())
    assert optimizer.state[module.net[1].weight]["exp_avg"].is_contiguous()


def test_precision_is_not_offered_while_gradients_accumulate() -> None:
    from lightning.pytorch.strategies import SingleDeviceStrategy

    knobs, trainer = _knobs()
    trainer.strategy = SingleDeviceStrategy(device=torch.device("cpu"))
    trainer.accumulate_grad_batches, trainer.gradient_clip_val = 1, None
    offer = knobs.offer("precision")
    assert isinstance(offer, Offer) and offer.proposed == "bf16-mixed"
    trainer.accumulate_grad_batches = 4
    assert str(knobs.offer("precision")) == "gradients accumulate over several batches"


def test_the_guard_restores_the_optimizer_state_in_place_and_keeps_the_schedule() -> None:
    from lightning_maxtp.callbacks.guard import NumericsGuard

    _, trainer = _knobs()
    module, optimizer = trainer.lightning_module, trainer.optimizers[0]
    _step(module, optimizer)
    trainer.global_step = 1
    guard = NumericsGuard()
    guard.snapshot(trainer)  # type: ignore[arg-type]
    params = {k: v.clone() for k, v in module.state_dict().items()}
    moments = [optimizer.state[p]["exp_avg"].clone() for p in module.parameters()]
    group = optimizer.param_groups[0]
    for _ in range(3):
        _step(module, optimizer)
    group["lr"] = 5e-4  # the schedule moved on meanwhile

    assert guard.restore(trainer)  # type: ignore[arg-type]
    assert all(torch.equal(v, params[k]) for k, v in module.state_dict().items())
    restored = [optimizer.state[p]["exp_avg"] for p in module.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(restored, moments, strict=True))
    assert optimizer.param_groups[0] is group and group["lr"] == 5e-4
    assert all(p.grad is None for p in module.parameters())
    assert guard.restore(trainer)  # type: ignore[arg-type]  # the snapshot serves again


def test_compile_switches_in_place_and_reuses_the_compiled_callables() -> None:
    knobs, trainer = _knobs()
    knobs.allowed = ("compile",)
    module = trainer.lightning_module
    assert not knobs.current("compile")
    knobs.set("compile", True)  # compiled lazily, on the next call: nothing compiles here
    assert knobs.current("compile") and knobs.in_force == {"compile": True}
    first = [m._compiled_call_impl for m in module.children()]
    assert all(c is not None for c in first)
    knobs.set("compile", False)
    assert not knobs.current("compile") and knobs.in_force == {}
    knobs.set("compile", True)
    assert [m._compiled_call_impl for m in module.children()] == first
    assert knobs.offer("compile") == NotOffered("already on", quiet=True)


def test_knobs_set_by_hand_that_can_slow_a_cpu_are_offered_off_and_back() -> None:
    from lightning.pytorch.strategies import SingleDeviceStrategy

    module = ConvModel().to(memory_format=torch.channels_last)  # the user's own choices
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3, fused=True)
    trainer = SimpleNamespace(
        lightning_module=module, optimizers=[optimizer], precision="32-true",
        strategy=SingleDeviceStrategy(torch.device("cpu")),
    )  # fmt: skip
    knobs = MathKnobs(("fused_optimizer", "channels_last"))
    knobs.bind(trainer)  # type: ignore[arg-type]
    _step(module, optimizer)
    for name in ("channels_last", "fused_optimizer"):
        offer = knobs.offer(name)
        assert isinstance(offer, Offer) and (offer.current, offer.proposed) == (True, False)
        assert offer.why.startswith("set by hand; ") and "measured on 2 cores" in offer.why

    knobs.set("fused_optimizer", False)
    assert all(not g["fused"] for g in optimizer.param_groups)
    assert knobs.in_force == {"fused_optimizer": False}
    _step(module, optimizer)
    knobs.set("fused_optimizer", True)  # reverted: the user's setting back
    assert all(g["fused"] for g in optimizer.param_groups) and knobs.in_force == {}
    _step(module, optimizer)
    knobs.set("channels_last", False)
    assert not knobs.current("channels_last") and knobs.in_force == {"channels_last": False}
    # A kept change is not offered back; on a GPU the NHWC layout set by hand stays.
    assert knobs.offer("channels_last") == NotOffered("already on", quiet=True)
    on_gpu, _ = _knobs("cuda")
    on_gpu.set("channels_last", True)
    on_gpu.in_force.clear()  # as if the user had set it
    assert on_gpu.offer("channels_last") == NotOffered("already on", quiet=True)


def test_a_fused_trial_on_mixed_groups_puts_each_group_back_as_the_user_set_it() -> None:
    from lightning.pytorch.strategies import SingleDeviceStrategy

    module = ConvModel()
    params = list(module.parameters())
    optimizer = torch.optim.Adam(
        [{"params": params[:2], "fused": True}, {"params": params[2:]}], lr=1e-3
    )
    trainer = SimpleNamespace(
        lightning_module=module, optimizers=[optimizer], precision="32-true",
        strategy=SingleDeviceStrategy(torch.device("cpu")),
    )  # fmt: skip
    knobs = MathKnobs(("fused_optimizer",))
    knobs.bind(trainer)  # type: ignore[arg-type]
    _step(module, optimizer)
    before = [(g.get("fused"), g.get("foreach")) for g in optimizer.param_groups]
    offer = knobs.offer("fused_optimizer")  # one group of two fused: the knob is off
    assert isinstance(offer, Offer) and (offer.current, offer.proposed) == (False, True)
    knobs.set("fused_optimizer", True)
    assert all(g["fused"] for g in optimizer.param_groups)
    _step(module, optimizer)
    knobs.set("fused_optimizer", False)  # reverted: the group fused by hand stays fused
    assert [(g.get("fused"), g.get("foreach")) for g in optimizer.param_groups] == before
    _step(module, optimizer)
