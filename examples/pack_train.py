"""One small training job, the unit ``maxtp pack`` runs many of (seeds of a tiny MLP).

Plain torch on purpose: it starts in ~3 s instead of Lightning's ~8 s, so the examples and the
pack benchmarks measure packing, not imports. It uses the GPU that ``maxtp pack`` gave it
(``CUDA_VISIBLE_DEVICES``), or the CPU with the thread count pack set (``OMP_NUM_THREADS``).

Usage: ``python examples/pack_train.py --seed 1 [--steps 200] [--width 512] [--batch 256]``
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SEED", "0")))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()

    import torch

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Sequential(
        torch.nn.Linear(64, args.width), torch.nn.ReLU(),
        torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
        torch.nn.Linear(args.width, 10),
    ).to(device)  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(args.batch * 8, 64, device=device)
    y = (x[:, :10].argmax(dim=1)).to(device)
    start = time.perf_counter()
    for step in range(args.steps):
        i = (step % 8) * args.batch
        loss = torch.nn.functional.cross_entropy(
            model(x[i : i + args.batch]), y[i : i + args.batch]
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()  # the clock must include the queued kernels
    print(
        f"seed {args.seed} device {device} threads {torch.get_num_threads()} "
        f"steps {args.steps} loss {loss.item():.4f} train_s {time.perf_counter() - start:.2f}"
    )


if __name__ == "__main__":
    main()
