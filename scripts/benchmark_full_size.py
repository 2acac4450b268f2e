"""What serving a full-size CT costs: time and peak memory of ``TrainedBundle.predict`` (the chain ``inferring`` and
MONAI Label run) on a 512 x 512 x 200 CT of 0.8 x 0.8 x 2.5 mm, against a plain forward pass, each in its own process.

Variants, each a run folder of ``bundles/nacl_flare`` (``model.pt`` and what its ``calibrate`` wrote):

- ``forward``: the plain forward pass of the first run's network: the preprocessing, the inferer over every slice
  and the softmax, nothing mapped back or written;
- ``<name>``: the served chain of run ``<name>`` (``--runs name=folder``; ``calibration none`` adds the first run's
  weights without their recalibration): recalibration, softmax, segmentation, confidence and case quality on the
  network grid, the segmentation and confidence (and the contours, with a contour set) mapped back to the input
  grid, in memory.

Every variant's process is started and warmed up first; then the calls go in rounds, one call of each variant per
round, and each served call comes with a forward pass in its own process just before it, so that the load of a
shared machine and the process weigh on both alike. Prints a Markdown table: the median seconds and CPU seconds (the
process's, all threads: less moved by other jobs than the seconds) of the served call over ``--repeats`` rounds, the
process's peak resident memory, the median over the rounds of the served call's time and CPU time over its forward
pass's (and their range), the peak over the forward process's, and the load average before and after.

Example (the demo run of README, calibrated once per method; a run with ``contours.json`` also maps its contours)::

    python scripts/benchmark_full_size.py --runs '{"temperature": "/tmp/t", "local_temperature": "/tmp/lts"}' \\
        --overrides '{"data#spacing": [3.2, 3.2, 12.0]}'

Results and the commands that made them: ``docs/results/benchmarks/full_size.md``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
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


def _run(variant: str, bundle_dir: str, image: str, overrides: dict, connection) -> None:
    """Serve ``variant`` in this process: one warm-up (weights, transforms), then per ``"call"`` received one forward
    pass and one served call (the ``forward`` variant: the forward pass alone), each timed in seconds and in the
    process's CPU seconds (all threads); ``"stop"``: the peak resident memory (GB). The forward pass runs on a bundle
    of its own, whose network carries no feature hook (the case quality's)."""
    import torch

    from calib_monai.bundle import TrainedBundle

    torch.set_num_threads(2)
    settings = dict(overrides)
    if variant == "calibration none":
        settings["calibration_path"] = "none"
    plain = TrainedBundle(bundle_dir, overrides=settings)

    def forward():
        item = plain.preprocess(image)
        with torch.no_grad():
            return torch.softmax(plain.inferer(item["image"][None], plain.network), dim=1)

    calls = {"forward": forward}
    if variant != "forward":
        bundle = TrainedBundle(bundle_dir, overrides=settings)
        calls["served"] = lambda: bundle.predict(image)
    for call in calls.values():
        call()
    connection.send("ready")
    while connection.recv() == "call":
        timed = {}
        for name, call in calls.items():
            start, cpu = time.perf_counter(), time.process_time()
            call()
            timed[name] = (time.perf_counter() - start, time.process_time() - cpu)
        connection.send(timed)
    connection.send(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help='JSON {"name": "run folder holding model.pt", ...}')
    parser.add_argument("--overrides", default="{}", help="JSON config overrides (e.g. the demo's data#spacing)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of one call per variant")
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
        context = mp.get_context("spawn")
        connections, processes = {}, []
        for variant, folder in bundles.items():  # one at a time: the warm-ups do not overlap
            connections[variant], child = context.Pipe()
            process = context.Process(target=_run, args=(variant, str(folder), str(image), overrides, child))
            process.start()
            processes.append(process)
            connections[variant].recv()
        load_before = os.getloadavg()
        times: dict[str, list[dict[str, tuple[float, float]]]] = {variant: [] for variant in bundles}
        for _ in range(args.repeats):
            for variant, connection in connections.items():
                connection.send("call")
                times[variant].append(connection.recv())
        load_after = os.getloadavg()
        results = {}
        for variant, connection in connections.items():
            connection.send("stop")
            results[variant] = connection.recv()
        for process in processes:
            process.join()
    base_memory = results["forward"]
    print(f"{SHAPE[0]} x {SHAPE[1]} x {SHAPE[2]} CT at {SPACING} mm; {args.repeats} rounds after a warm-up, 2 threads")
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}\n")
    print("| variant | median s | median CPU s | peak GB | time / forward (rounds) | CPU / forward | peak / forward |")
    print("|---|---|---|---|---|---|---|")
    for variant, memory in results.items():  # each round's served call over the same process's forward pass
        rounds = [(t.get("served", t["forward"]), t["forward"]) for t in times[variant]]
        seconds, cpu = (statistics.median(served[i] for served, _ in rounds) for i in (0, 1))
        ratios, cpu_ratios = ([served[i] / forward[i] for served, forward in rounds] for i in (0, 1))
        spread = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        row = f"{seconds:.2f} | {cpu:.2f} | {memory:.2f} | {spread} | {statistics.median(cpu_ratios):.2f}x"
        print(f"| {variant} | {row} | {memory / base_memory:.2f}x |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
