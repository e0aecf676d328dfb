"""Train with ``Trainer(strategy="auto_maxtp")``: single device, DDP or FSDP, chosen for you.

``import lightning_maxtp`` registers the name. When ``fit`` starts, the strategy probes the
machine, sizes the model's training memory (weights, gradients, optimizer state, activations)
and picks: no GPU or one GPU -> single device; several GPUs -> DDP if a full copy fits on one
GPU, FSDP if it does not; busy GPUs are skipped and named. It logs one line with the plan and
its reason. This script first prints the same plan computed by hand with ``plan_strategy``,
then trains a small MLP on random data (no download) and prints the loss before and after.

Usage::

    python examples/strategy_auto.py                                  # this machine
    python examples/strategy_auto.py --accelerator cpu --devices 2    # DDP over gloo on the CPU
"""

from __future__ import annotations

import argparse
import logging
import warnings

import lightning_maxtp  # registers Trainer(strategy="auto_maxtp"); imports no lightning yet


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--width", type=int, default=256, help="hidden width of the MLP")
    parser.add_argument("--accelerator", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--devices", default="auto", help="'auto' or a count")
    parser.add_argument("--precision", default="32-true", help="Lightning precision name")
    args = parser.parse_args()
    if args.steps < 1 or args.width < 1:
        parser.error(f"need --steps >= 1 and --width >= 1, got {args.steps} and {args.width}")
    devices = args.devices if args.devices == "auto" else int(args.devices)

    import lightning.pytorch as pl
    import torch
    from torch import nn

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # keep the output short
    warnings.filterwarnings("ignore", module="lightning")

    class MLP(pl.LightningModule):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 10))

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.log("loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    pl.seed_everything(0, verbose=False)
    model = MLP(args.width)
    data = torch.utils.data.TensorDataset(torch.randn(1024, 32), torch.randint(0, 10, (1024,)))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True)

    plan = lightning_maxtp.plan_strategy(
        lightning_maxtp.inspect_resources(),
        lightning_maxtp.ModelSize.from_module(model),
        precision=args.precision,
        optimizer="adamw",
        accelerator=args.accelerator,
        devices=devices,
    )
    trainer = pl.Trainer(
        strategy="auto_maxtp", accelerator=args.accelerator, devices=devices,
        precision=args.precision, max_steps=args.steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    if trainer.is_global_zero:
        print(f"planned: {plan}")
    with torch.no_grad():
        x, y = data.tensors
        before = nn.functional.cross_entropy(model.net(x), y).item()
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        with torch.no_grad():
            after = nn.functional.cross_entropy(model.net.cpu()(x), y).item()
        strategy = type(trainer.strategy).__name__
        print(f"trained: {strategy}, {trainer.global_step} steps, loss {before:.3f} -> {after:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
