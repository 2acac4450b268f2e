"""What serving a full-size CT costs: time and peak memory of ``TrainedBundle.predict`` (the chain ``inferring`` and
MONAI Label run) on a 512 x 512 x 200 CT of 0.8 x 0.8 x 2.5 mm, against a plain forward pass, each in its own process.

Variants, each a run folder of ``bundles/nacl_flare`` (``model.pt`` and what its ``calibrate`` wrote):

- ``forward``: the plain forward pass of the first run's network: the preprocessing, the inferer over every slice
  and the softmax, nothing mapped back or written;
- ``<name>``: the served chain of run ``<name>`` (``--runs name=folder``; ``calibration none`` adds the first run's
  weights without their recalibration): recalibration, softmax, segmentation, confidence and case quality on the
  network grid, the segmentation and confidence mapped back to the input grid, in memory.

Prints a Markdown table: the median seconds over ``--repeats`` calls after one warm-up, the process's peak resident
memory, and both against the forward pass. Example (the demo run of README, calibrated once per method)::

    python scripts/benchmark_full_size.py --runs '{"temperature": "/tmp/t", "local_temperature": "/tmp/lts"}' \\
        --overrides '{"data#spacing": [3.2, 3.2, 12.0]}'

Results and the commands that made them: ``docs/results/benchmarks/full_size.md``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPE, SPACING = (512, 512, 200), (0.8, 0.8, 2.5)


def _bundle(folder: Path, run: Path, calibrated: bool) -> Path:
    """A bundle folder: nacl_flare's configs and the run's files under ``models/`` (links)."""
    (folder / "models").mkdir(parents=True)
    shutil.copytree(REPO / "bundles" / "nacl_flare" / "configs", folder / "configs")
    for item in run.iterdir():
        if item.is_file() and (calibrated or item.name in ("model.pt", "datalist.json")):
            (folder / "models" / item.name).symlink_to(item)
    return folder


def _run(variant: str, bundle_dir: str, image: str, overrides: dict, repeats: int, queue) -> None:
    import torch

    from calib_monai.bundle import TrainedBundle

    torch.set_num_threads(2)
    settings = dict(overrides)
    if variant == "calibration none":
        settings["calibration_path"] = "none"
    bundle = TrainedBundle(bundle_dir, overrides=settings)

    def forward():
        item = bundle.preprocess(image)
        with torch.no_grad():
            return torch.softmax(bundle.inferer(item["image"][None], bundle.network), dim=1)

    call = forward if variant == "forward" else (lambda: bundle.predict(image))
    call()  # warm-up: weights, transforms
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    queue.put((statistics.median(times), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help='JSON {"name": "run folder holding model.pt", ...}')
    parser.add_argument("--overrides", default="{}", help="JSON config overrides (e.g. the demo's data#spacing)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = {name: Path(path).resolve() for name, path in json.loads(args.runs).items()}
    overrides = json.loads(args.overrides)
    with tempfile.TemporaryDirectory() as tmp:
        import nibabel as nib

        from calib_monai.data.phantoms import generate_phantom

        data, _, affine = generate_phantom(7, 0, shape=SHAPE, spacing=SPACING)
        image = Path(tmp) / "ct.nii.gz"
        nib.save(nib.Nifti1Image(data, affine), str(image))
        first = next(iter(runs.values()))
        bundles = {"forward": _bundle(Path(tmp) / "forward", first, False)}
        bundles["calibration none"] = bundles["forward"]
        bundles.update({name: _bundle(Path(tmp) / f"run_{i}", run, True) for i, (name, run) in enumerate(runs.items())})
        results = {}
        context = mp.get_context("spawn")
        for variant, folder in bundles.items():
            queue = context.Queue()
            process = context.Process(
                target=_run, args=(variant, str(folder), str(image), overrides, args.repeats, queue)
            )
            process.start()
            results[variant] = queue.get()
            process.join()
    base_time, base_memory = results["forward"]
    print(f"{SHAPE[0]} x {SHAPE[1]} x {SHAPE[2]} CT at {SPACING} mm; {args.repeats} calls after a warm-up, 2 threads\n")
    print("| variant | median s | peak GB | time / forward | peak / forward |")
    print("|---|---|---|---|---|")
    for variant, (seconds, memory) in results.items():
        ratios = f"{seconds / base_time:.2f}x | {memory / base_memory:.2f}x"
        print(f"| {variant} | {seconds:.2f} | {memory:.2f} | {ratios} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
