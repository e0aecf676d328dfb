from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from lightning_maxtp.strategy import StrategyPlan, estimate_memory, plan_strategy
from lightning_maxtp.strategy.model_size import FSDP_MIN_UNIT_PARAMS, ModelSize
from tests.helpers.fake_nvml import GIB, fake_machine

ROOT = Path(__file__).resolve().parents[2]
A4 = 4 * GIB  # a measured activation size, so the table's numbers are easy to follow


@pytest.fixture(autouse=True)
def _all_gpus_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("LIGHTNING_MAXTP_PLAN", raising=False)


def llm(num_params: float, unit_params: float) -> ModelSize:
    """A transformer-like model: all trainable, FSDP units of ``unit_params``."""
    n = int(num_params)
    return ModelSize(n, n, int(unit_params), 4 * n)


SMALL = ModelSize.from_count(10_000_000)
M3B, M5B, M7B = llm(3e9, 1e8), llm(5e9, 1e8), llm(7e9, 2e8)
M40B, M70B = llm(40e9, 5e8), llm(70e9, 1e9)


# --- the memory formula ------------------------------------------------------------------------


def test_memory_terms_per_precision_and_optimizer() -> None:
    fp32 = estimate_memory(1000, precision="32-true", optimizer="adam")
    assert (fp32.weight_bytes, fp32.grad_bytes, fp32.optimizer_bytes) == (4000, 4000, 8000)
    assert fp32.autocast_bytes == 0 and fp32.activation_bytes == 4000  # 25 % of 16000
    assert not fp32.activation_measured
    # AMP keeps fp32 master weights, grads and states and adds a bf16 copy: more than fp32.
    amp = estimate_memory(1000, precision="bf16-mixed", optimizer="adam")
    assert (amp.weight_bytes, amp.grad_bytes, amp.optimizer_bytes) == (4000, 4000, 8000)
    assert amp.autocast_bytes == 2000 and amp.activation_bytes == 4500
    assert amp.single_device_bytes() == 22500 > fp32.single_device_bytes() == 20000
    assert amp.ddp_bytes() == 22500 + 4000  # the gradient buckets
    # FSDP over 4: a quarter of the state, 3 units (whole model here) in bf16, activations.
    assert amp.fsdp_bytes(4) == 4000 + 3 * 1000 * 2 + 4500
    assert amp.fsdp_bytes(4, cpu_offload=True) == 6000 + 4500
    assert amp.fsdp_host_bytes(4) == 4000
    half = estimate_memory(1000, precision="bf16-true", optimizer="adamw", activation_bytes=7)
    assert (half.weight_bytes, half.grad_bytes, half.optimizer_bytes) == (2000, 2000, 4000)
    assert half.activation_bytes == 7 and half.activation_measured
    sgd = estimate_memory(1000, optimizer="sgd")
    momentum = estimate_memory(1000, optimizer="sgd_momentum")
    assert (sgd.optimizer_bytes, momentum.optimizer_bytes) == (0, 4000)
    assert estimate_memory(1000, optimizer=3).optimizer_bytes == 12000
    infer = estimate_memory(1000, training=False)
    assert (infer.grad_bytes, infer.optimizer_bytes, infer.ddp_bytes()) == (0, 0, 5000)
    assert infer.fsdp_bytes(2) == 2000 + 2 * 1000 * 4 + 1000
    frozen = estimate_memory(ModelSize.from_count(1000, trainable_params=250))
    assert (frozen.weight_bytes, frozen.grad_bytes, frozen.optimizer_bytes) == (4000, 1000, 2000)
    assert estimate_memory(1000, precision="bf16").precision == "bf16-mixed"
    assert estimate_memory(1000, precision=16).precision == "16-mixed"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"precision": "fp8"}, r"`precision` must be one of .*got 'fp8'"),
        ({"optimizer": "lamb"}, r"`optimizer` must be one of .*got 'lamb'"),
        ({"optimizer": -1}, r"`optimizer` must be one of"),
        ({"activation_bytes": -5}, r"`activation_bytes` must be None or >= 0, got -5"),
    ],
)
def test_memory_estimate_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        estimate_memory(1000, **kwargs)


def test_model_size_rejects_bad_counts() -> None:
    with pytest.raises(ValueError, match=r"`num_params` must be an int >= 0, got -1"):
        ModelSize.from_count(-1)
    with pytest.raises(ValueError, match=r"`trainable_params` must be between 0 and num_params"):
        ModelSize.from_count(10, trainable_params=11)


def _torch_fsdp_units(module: Any, min_params: int) -> int:
    """The largest unit torch's own ``_recursive_wrap`` makes with the size-based policy."""
    from functools import partial

    from torch.distributed.fsdp.wrap import _recursive_wrap, size_based_auto_wrap_policy

    units: list[int] = []

    def record(m: Any, **_: Any) -> Any:
        units.append(sum(p.numel() for p in m.parameters()))
        return m

    _, wrapped = _recursive_wrap(
        module, auto_wrap_policy=partial(size_based_auto_wrap_policy, min_num_params=min_params),
        wrapper_cls=record, ignored_modules=set(), ignored_params=set(), only_wrap_children=True,
    )  # fmt: skip
    return max([*units, sum(p.numel() for p in module.parameters()) - wrapped])


def test_model_size_from_module_matches_torch_fsdp_wrapping() -> None:
    from torch import nn

    class Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(width, 4)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.Linear(4 * width, width))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(3000, 128)
            self.blocks = nn.ModuleList(Block(128) for _ in range(4))
            self.head = nn.Linear(128, 3000)
            self.head.weight = self.embed.weight  # tied: counted once
            self.frozen = nn.Linear(128, 128)
            self.frozen.requires_grad_(False)

    net = Net()
    size = ModelSize.from_module(net, min_unit_params=100_000)
    params = list(net.parameters())
    assert size.num_params == sum(p.numel() for p in params)
    assert size.trainable_params == size.num_params - 128 * 128 - 128
    assert size.param_bytes == 4 * size.num_params
    for min_params in (10_000, 100_000, 250_000, 10**9):
        ours = ModelSize.from_module(net, min_unit_params=min_params).largest_unit_params
        assert ours == _torch_fsdp_units(net, min_params), min_params
    assert ModelSize.from_module(net, min_unit_params=10**9).largest_unit_params == size.num_params
    assert ModelSize.from_module(nn.Linear(2, 2)).largest_unit_params == 6
    assert FSDP_MIN_UNIT_PARAMS == 10_000_000


# --- plan_strategy: the table ------------------------------------------------------------------

ROWS = [
    # id, gpus, busy, ram GiB, model, kwargs, strategy, devices, offload, fits, reason parts
    ("0 gpus", 0, (), 512, SMALL, {}, "single_device", (), False, True,
     ["no GPU visible: one CPU process"]),
    ("0 gpus devices=2", 0, (), 512, SMALL, {"devices": 2}, "ddp", (), False, True,
     ["2 processes per node asked for: DDP over gloo"]),
    ("1 gpu small", 1, (), 512, SMALL, {}, "single_device", (0,), False, True,
     ["a full copy needs ~190.7 MiB per GPU and fits", "77.0 GiB usable per GPU"]),
    ("2 gpus small", 2, (), 512, SMALL, {}, "ddp", (0, 1), False, True, ["fits"]),
    ("8 gpus small", 8, (), 512, SMALL, {}, "ddp", tuple(range(8)), False, True, ["fits"]),
    ("4 gpus, GPU 1 busy", 4, (1,), 512, SMALL, {}, "ddp", (0, 2, 3), False, True,
     ["skipped GPU 1 (busy: 1 foreign process(es): pid ", "20.0 GiB"]),
    ("devices=2, GPU 0 busy", 4, (0,), 512, SMALL, {"devices": 2}, "ddp", (1, 2), False, True,
     ["skipped GPU 0 (busy"]),
    ("devices=[1, 3] lists a busy GPU", 4, (1,), 512, SMALL, {"devices": [1, 3]}, "ddp",
     (1, 3), False, True, ["fits"]),
    ("7B on 2 gpus: too big for one", 2, (), 512, M7B, {"activation_bytes": A4}, "fsdp",
     (0, 1), False, True, ["a full copy needs ~134.4 GiB", "sharded over 2 GPUs ~58.4 GiB"]),
    ("7B on 8 gpus", 8, (), 512, M7B, {"activation_bytes": A4}, "fsdp", tuple(range(8)),
     False, True, ["sharded over 8 GPUs ~19.3 GiB"]),
    ("7B inference on 2 gpus", 2, (), 512, M7B, {"activation_bytes": A4, "training": False},
     "ddp", (0, 1), False, True, ["a full copy needs ~30.1 GiB"]),
    ("7B on 1 gpu: offload", 1, (), 512, M7B, {"activation_bytes": A4}, "fsdp", (0,), True,
     True, ["with CPU offload ~6.2 GiB per GPU and 104.3 GiB of 512.0 GiB host RAM"]),
    ("7B on 1 gpu, little RAM", 1, (), 64, M7B, {"activation_bytes": A4}, "single_device",
     (0,), False, False, ["a full copy needs ~108.3 GiB", "does not fit even so"]),
    ("70B: too big for all 8, offload", 8, (), 2048, M70B, {"activation_bytes": A4}, "fsdp",
     tuple(range(8)), True, True, ["sharded over 8 GPUs ~145.6 GiB", "with CPU offload"]),
    ("70B: too big for all 8", 8, (), 256, M70B, {"activation_bytes": A4}, "fsdp",
     tuple(range(8)), False, False, ["sharded over 8 GPUs ~145.6 GiB: it does not fit"]),
    ("70B: offload not allowed", 8, (), 2048, M70B,
     {"activation_bytes": A4, "cpu_offload": False}, "fsdp", tuple(range(8)), False, False,
     ["does not fit even so"]),
    ("5B fp32 adam on 1 gpu", 1, (), 64, M5B, {"activation_bytes": A4}, "single_device", (0,),
     False, False, ["a full copy needs ~78.5 GiB"]),
    ("5B bf16-true adam on 1 gpu", 1, (), 64, M5B,
     {"activation_bytes": A4, "precision": "bf16-true"}, "single_device", (0,), False, True,
     ["a full copy needs ~41.3 GiB per GPU and fits"]),
    ("5B bf16-mixed adam on 1 gpu", 1, (), 64, M5B,
     {"activation_bytes": A4, "precision": "bf16-mixed"}, "single_device", (0,), False, False,
     ["a full copy needs ~87.8 GiB"]),
    ("5B fp32 sgd on 1 gpu", 1, (), 64, M5B, {"activation_bytes": A4, "optimizer": "sgd"},
     "single_device", (0,), False, True, ["~41.3 GiB per GPU and fits"]),
    ("5B fp32 sgd+momentum on 1 gpu", 1, (), 64, M5B,
     {"activation_bytes": A4, "optimizer": "sgd_momentum"}, "single_device", (0,), False, True,
     ["~59.9 GiB per GPU and fits"]),
    ("3B fp32 adam on 2 gpus", 2, (), 512, M3B, {"activation_bytes": A4}, "ddp", (0, 1), False,
     True, ["a full copy needs ~59.9 GiB per GPU and fits"]),
    ("3B capped at 40 GiB", 2, (), 512, M3B,
     {"activation_bytes": A4, "memory_budget_bytes": 40 * GIB}, "fsdp", (0, 1), False, True,
     ["sharded over 2 GPUs ~27.5 GiB", "40.0 GiB usable per GPU", "capped at 40.0 GiB"]),
    ("40B on 1 node of 8", 8, (), 64, M40B, {"activation_bytes": A4}, "fsdp",
     tuple(range(8)), False, False, ["sharded over 8 GPUs ~84.1 GiB"]),
    ("40B on 2 nodes of 8", 8, (), 64, M40B, {"activation_bytes": A4, "num_nodes": 2}, "fsdp",
     tuple(range(8)), False, True, ["sharded over 16 GPUs ~46.8 GiB"]),
    ("memory basis total", 2, (), 512, SMALL, {"memory_basis": "total"}, "ddp", (0, 1), False,
     True, ["77.5 GiB usable per GPU (total memory - 2.5 GiB headroom)"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("gpus", "busy", "ram", "model", "kwargs", "strategy", "devices", "offload", "fits", "parts"),
    [pytest.param(*row[1:], id=row[0]) for row in ROWS],
)
def test_plan_table(
    gpus: int,
    busy: tuple[int, ...],
    ram: float,
    model: ModelSize,
    kwargs: dict[str, Any],
    strategy: str,
    devices: tuple[int, ...],
    offload: bool,
    fits: bool,
    parts: list[str],
) -> None:
    plan = plan_strategy(fake_machine(gpus, busy=busy, ram_gib=ram), model, **kwargs)
    assert (plan.strategy, plan.devices, plan.cpu_offload, plan.fits) == (
        strategy, devices, offload, fits,
    )  # fmt: skip
    for part in parts:
        assert part in plan.reason, plan.reason
    if plan.accelerator == "cuda":
        expected_processes = 1 if strategy == "single_device" else len(devices)
        assert plan.num_processes == expected_processes
        assert plan.budget_bytes is not None
        assert (plan.need_bytes <= plan.budget_bytes) is fits
    # A request that cannot be met as asked is never silent.
    shares_busy = isinstance(kwargs.get("devices"), list) and bool(busy)
    assert bool(plan.warnings) is (not fits or offload or shares_busy)
    assert StrategyPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_plan_numbers_follow_the_formula() -> None:
    plan = plan_strategy(fake_machine(2), M7B, activation_bytes=A4)
    assert plan.need_bytes == plan.memory.fsdp_bytes(2)
    assert plan.budget_bytes == int(79.5 * GIB) - int(2.5 * GIB)
    assert plan.world_size == 2 and plan.num_nodes == 1
    text = str(plan)
    assert text.startswith("maxtp: strategy: FSDP (FULL_SHARD) on GPUs [0, 1]. a full copy needs")
    assert "7.0 B params (7.0 B trainable), 32-true: weights 26.1 GiB + grads 26.1 GiB" in text
    assert "adam state 52.2 GiB + activations 4.0 GiB (measured)" in text
    assert "\n" not in text  # one line on rank zero
    estimated = plan_strategy(fake_machine(1), SMALL)
    assert "activations 38.1 MiB (est. 25% of state)" in str(estimated)


def test_plan_warnings_name_the_fix() -> None:
    offload = plan_strategy(fake_machine(1), M7B, activation_bytes=A4)
    assert "CPU offload" in offload.warnings[0] and "more GPUs" in offload.warnings[0]
    tight = plan_strategy(fake_machine(1, ram_gib=64), M7B, activation_bytes=A4)
    assert tight.warnings == (
        "maxtp: the model needs ~108.3 GiB per GPU but only 77.0 GiB is usable on 1 GPU(s); "
        "it will likely run out of memory. Fix: more free GPUs (FSDP shards over them), "
        "precision='bf16-true', an optimizer with fewer states (SGD), activation checkpointing "
        "or a smaller batch",
    )
    shared = plan_strategy(fake_machine(4, busy=(1,)), SMALL, devices=[1, 3])
    assert shared.warnings[0].startswith("maxtp: GPU 1 is busy (1 foreign process(es)")
    assert "devices=[1, 3] lists it: using it as asked" in shared.warnings[0]
    cpu = plan_strategy(fake_machine(0, ram_gib=0.1), M3B, devices=2)
    assert cpu.fits is False and "2 CPU process(es) need" in cpu.warnings[0]


def test_plan_with_unknown_gpu_memory_says_so() -> None:
    res = fake_machine(2)
    gpus = tuple(dataclasses.replace(g, memory_free_bytes=None) for g in res.gpus)
    plan = plan_strategy(dataclasses.replace(res, gpus=gpus), M7B)
    assert (plan.strategy, plan.fits, plan.budget_bytes) == ("ddp", None, None)
    assert plan.warnings == ("maxtp: " + plan.reason,)
    assert "GPU memory is unknown, so whether a full copy (~156.5 GiB per GPU) fits" in plan.reason


@pytest.mark.parametrize(
    ("gpus", "busy", "kwargs", "match"),
    [
        (
            2,
            (0, 1),
            {},
            r"devices='auto' found no free GPU among \[0, 1\]: GPU 0 \(busy: 1 "
            r"foreign process\(es\): pid \d+.*pass accelerator='cpu', or devices=\[0\]",
        ),
        (2, (), {"devices": 3}, r"devices=3 asks for 3 GPUs but only 2 are visible"),
        (
            4,
            (0, 2),
            {"devices": 3},
            r"devices=3 asks for 3 GPUs but only 2 are free \(\[1, 3\]\)"
            r": GPU 0 \(busy.*Fix: devices=2 or 'auto'",
        ),
        (2, (), {"devices": [0, 5]}, r"devices=\[0, 5\] must list distinct visible GPUs"),
        (2, (), {"devices": [1, 1]}, r"devices=\[1, 1\] must list distinct visible GPUs"),
        (2, (), {"devices": 0}, r"`devices` must be 'auto', -1 or an int >= 1, got 0"),
        (0, (), {"accelerator": "cuda"}, r"`accelerator='cuda'` but no GPU is visible"),
        (0, (), {"devices": 0}, r"`devices` must be 'auto', an int >= 1"),
        (1, (), {"accelerator": "tpu"}, r"`accelerator` must be 'auto', 'cpu' or 'cuda'"),
        (1, (), {"num_nodes": 0}, r"`num_nodes` must be an int >= 1, got 0"),
        (1, (), {"memory_budget_bytes": 0}, r"`memory_budget_bytes` must be None or > 0, got 0"),
        (1, (), {"headroom_bytes": -1}, r"`headroom_bytes` must be >= 0, got -1"),
        (1, (), {"memory_basis": "peak"}, r"`memory_basis` must be 'free' or 'total'"),
    ],
)
def test_plan_rejects_requests_it_cannot_meet(
    gpus: int, busy: tuple[int, ...], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        plan_strategy(fake_machine(gpus, busy=busy), SMALL, **kwargs)
