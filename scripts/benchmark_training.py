"""Benchmark a bundle's training epoch against the pure compute of its steps; prints a Markdown table.

The issue-11 targets, on a GPU: the training part of an epoch takes <= 1.3x the pure compute of its steps (the GPU is
kept fed: data loading, host synchronisation and handlers add at most 30%), and validation on the 3D volumes takes
<= 20% of the epoch.

What is timed, in one process and one run:

- **epoch**: the bundle's own ``train#trainer`` (real data loader, real handlers: validation, ALM, checkpoints,
  TensorBoard, the epoch summary) run through ``--epochs`` epochs; per epoch, the training part (``EPOCH_STARTED`` to
  the last ``ITERATION_COMPLETED``) and the validation part (the evaluator's ``STARTED`` to ``COMPLETED``). The first
  epoch is reported but left out of the ratios: it fills caches and autotunes kernels.
- **pure compute**: the same network, loss and optimizer (and ``amp`` setting) stepped on one training batch already
  on the device, ``--steps`` times after a warm-up, timed between device synchronisations; times the number of
  iterations of an epoch.

Without CUDA the GPU table is skipped with a line that says so; ``--device cpu`` runs the same measurement on the
CPU (small settings, to check the script; the targets are for GPUs).

Run (from the repository root)::

    python scripts/benchmark_training.py --bundle ce_dice_hpc --dataset_dir ../shared/data/Task04_Hippocampus
    python scripts/benchmark_training.py --bundle nacl_acdc --dataset_dir ../shared/data/ACDC --amp true
    python scripts/benchmark_training.py --device cpu --bundle nacl_flare --config demo --epochs 2  # CPU smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from ignite.engine import Events
from monai.bundle import ConfigParser

ROOT = Path(__file__).resolve().parents[1]
EPOCH_TARGET = 1.3  # training part of an epoch / pure compute of its steps
VALIDATION_TARGET = 0.20  # validation / whole epoch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_bundle(args: argparse.Namespace, output_dir: str) -> ConfigParser:
    configs = ROOT / "bundles" / args.bundle / "configs"
    files = [str(configs / "train.json")] + ([str(configs / f"{args.config}.json")] if args.config else [])
    parser = ConfigParser()
    parser.read_config(files)
    overrides = {"epochs": args.epochs, "output_dir": output_dir, "device": args.device, "amp": args.amp == "true"}
    if args.dataset_dir:
        overrides["dataset_dir"] = args.dataset_dir
    if args.num_workers is not None:
        overrides["num_workers"] = args.num_workers
    for key, value in overrides.items():
        if key == "amp" and "amp" not in parser.config:
            print("note: this bundle has no 'amp' switch; timing fp32")
            continue
        parser[key] = value
    parser.parse()
    parser.get_parsed_content("initialize")  # seeds, as `monai.bundle run` does
    return parser


def time_epochs(parser: ConfigParser, device: torch.device) -> tuple[list[float], list[float], int]:
    """Training and validation seconds of every epoch of the bundle's trainer, and its iterations per epoch."""
    trainer = parser.get_parsed_content("train#trainer")
    evaluator = parser.get_parsed_content("validate#evaluator")
    marks: dict[str, float] = {}
    train_s: list[float] = []
    val_s: list[float] = []

    def mark(name: str):
        def handler(_engine) -> None:
            _sync(device)
            marks[name] = time.perf_counter()

        return handler

    trainer.add_event_handler(Events.EPOCH_STARTED, mark("epoch"))

    def start_validation(_engine) -> None:
        # validation starts right after the epoch's last step (the ValidationHandler at EPOCH_COMPLETED): one
        # synchronisation here times the training part without adding one per step
        mark("validation")(_engine)
        train_s.append(marks["validation"] - marks["epoch"])

    def end_validation(_engine) -> None:
        _sync(device)
        val_s.append(time.perf_counter() - marks["validation"])

    evaluator.add_event_handler(Events.STARTED, start_validation)
    evaluator.add_event_handler(Events.COMPLETED, end_validation)
    trainer.run()
    return train_s, val_s, trainer.state.epoch_length


def time_pure_steps(parser: ConfigParser, device: torch.device, steps: int, amp: bool) -> float:
    """Median seconds of one training step on a batch resident on the device (no loader, no handlers)."""
    network = parser.get_parsed_content("network")
    loss_function = parser.get_parsed_content("loss")
    optimizer = parser.get_parsed_content("optimizer")
    batch = next(iter(parser.get_parsed_content("train#dataloader")))
    image, label = (torch.as_tensor(batch[key]).to(device) for key in ("image", "label"))
    amp = amp and device.type == "cuda"  # as MONAI's trainer: autocast and the scaler on CUDA only
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    network.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, enabled=amp):
            loss = loss_function(network(image), label)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    for _ in range(max(3, steps // 5)):
        step()
    times = []
    for _ in range(steps):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--bundle", default="ce_dice_hpc")
    cli.add_argument("--config", default="", help="an overlay next to train.json, e.g. demo (the FLARE phantoms)")
    cli.add_argument("--dataset_dir", default="")
    cli.add_argument("--device", default="cuda", help="cuda (default; skipped without CUDA) or cpu")
    cli.add_argument("--amp", default="false", choices=["true", "false"])
    cli.add_argument("--epochs", type=int, default=3)
    cli.add_argument("--steps", type=int, default=30, help="timed pure-compute steps")
    cli.add_argument("--num_workers", type=int, default=None, help="default: the bundle's choice for the device")
    args = cli.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("GPU part skipped: no CUDA device (torch.cuda.is_available() is False); `--device cpu` runs it here.")
        return 0
    device = torch.device(args.device)
    amp = args.amp == "true"
    with tempfile.TemporaryDirectory(prefix="benchmark_training_") as output_dir:
        parser = load_bundle(args, output_dir)
        train_s, val_s, iterations = time_epochs(parser, device)
        # the same network, loss, optimizer and (cached) data as the epochs just timed: nothing is loaded twice
        step_s = time_pure_steps(parser, device, args.steps, amp)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"\n{args.bundle} on {name}, amp {amp}, {iterations} iterations per epoch, pure step {step_s * 1e3:.1f} ms\n")
    print(
        "| epoch | training s | pure compute s | ratio (target <= 1.3) | validation s "
        "| validation share (target <= 20%) |"
    )
    print("|---|---|---|---|---|---|")
    compute = step_s * iterations
    for epoch, (t, v) in enumerate(zip(train_s, val_s), start=1):
        note = " (warm-up)" if epoch == 1 else ""
        print(f"| {epoch}{note} | {t:.2f} | {compute:.2f} | {t / compute:.2f}x | {v:.2f} | {v / (t + v):.0%} |")
    steady = list(zip(train_s, val_s))[1:] or list(zip(train_s, val_s))
    ratio = statistics.median(t / compute for t, _ in steady)
    share = statistics.median(v / (t + v) for t, v in steady)
    verdict = "meets" if ratio <= EPOCH_TARGET and share <= VALIDATION_TARGET else "misses"
    print(
        f"\nmedian after warm-up: training {ratio:.2f}x pure compute, validation {share:.0%} of the epoch: {verdict} "
        f"the GPU targets ({EPOCH_TARGET}x, {VALIDATION_TARGET:.0%})"
        + ("" if device.type == "cuda" else " (CPU run: the targets are for GPUs)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
