"""What serving the contours costs: a served case's time (``TrainedBundle.predict`` and ``write``, as ``inferring``
serves and writes it) with the run's contour set against without it, in one process, the two alternating case by
case so that both see the same load.

``--models``: a run's ``models/`` folder whose ``calibrate`` wrote ``contours.json`` (e.g. the contour study's work
folder); ``--bundle``: its bundle; ``--images``: a JSON list of image files, or the run's ``datalist.json`` test
split when left out. "Without" points ``contours_path`` at a file that does not exist, which serves no contours.

Prints a Markdown table: the median seconds per case of each variant over ``--rounds`` passes over the images (after
one warm-up case each), and their ratio. Run, e.g.::

    python scripts/benchmark_contours.py --bundle ce_dice_hpc \\
        --models /tmp/calib_monai_margins/hpc/seed0/ce_dice_hpc/eps0.02/models --limit 20

Results: ``docs/results/benchmarks/contours.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, help="the bundle name (bundles/<name>) or folder")
    parser.add_argument("--models", required=True, help="a models/ folder holding model.pt and contours.json")
    parser.add_argument("--images", default="", help="JSON list of images (default: datalist.json's test split)")
    parser.add_argument("--overrides", default="{}", help="JSON config overrides (the run's preprocessing)")
    parser.add_argument("--limit", type=int, default=20, help="at most this many images")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch

    from calib_monai.bundle import TrainedBundle, locate_bundle

    torch.set_num_threads(2)
    models = Path(args.models).resolve()
    if not (models / "contours.json").is_file():
        raise SystemExit(f"{models} has no contours.json: run the bundle's calibrate there first")
    images = json.loads(args.images) if args.images else None
    if images is None:
        images = [item["image"] for item in json.loads((models / "datalist.json").read_text())["test"]]
    images = images[: args.limit]
    overrides = json.loads(args.overrides)
    bundles = {
        "with contours": TrainedBundle(locate_bundle(args.bundle), overrides=overrides, weights=models / "model.pt"),
        "without contours": TrainedBundle(
            locate_bundle(args.bundle),
            overrides={**overrides, "contours_path": str(models / "no_contours.json")},
            weights=models / "model.pt",
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in bundles}
    with tempfile.TemporaryDirectory() as tmp:

        def serve(bundle: TrainedBundle, image: str, out: Path) -> float:
            start = time.perf_counter()
            prediction = bundle.predict(image)
            bundle.write(*prediction, output_dir=out, contours=prediction.contours)
            return time.perf_counter() - start

        for name, bundle in bundles.items():  # warm-up: weights, transforms
            serve(bundle, images[0], Path(tmp) / "warm" / name.replace(" ", "_"))
            if (bundle.predict(images[0]).contours is None) != (name == "without contours"):
                raise SystemExit(f"{name}: the served contours are not as the variant says; check {models}")
        for r in range(args.rounds):
            for i, image in enumerate(images):
                order = list(bundles) if (i + r) % 2 == 0 else list(bundles)[::-1]
                for name in order:
                    times[name].append(serve(bundles[name], image, Path(tmp) / f"{name.replace(' ', '_')}_{r}"))
    with_s, without_s = (statistics.median(times[name]) for name in bundles)
    print(f"{len(images)} images x {args.rounds} rounds, 2 threads; models: {models}\n")
    print("| variant | median s per case | mean s per case |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.3f} | {statistics.fmean(values):.3f} |")
    total = sum(times["with contours"]) / sum(times["without contours"]) - 1
    print(f"\ncontours add {with_s / without_s - 1:+.1%} (median), {total:+.1%} (total)")


if __name__ == "__main__":
    main()
