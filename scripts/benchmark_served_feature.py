"""What a served feature costs: a served case's time (``TrainedBundle.predict`` and ``write``, as ``inferring``
serves and writes it) with the feature against without it, in one process, the two alternating case by case so that
both see the same load.

``--feature contours``: the run's contour set against none ("without" points ``contours_path`` at a file that does
not exist). ``--feature site_monitor``: the site monitor and the level re-anchoring (``site_dir`` a folder) against
none (``site_dir`` empty, ``predict``'s default); before each call the folder's ``site.json`` and ``site_cases.jsonl``
are set back to a stream of ``--stream`` earlier cases (random ranks, these weights and range), so every served case
is a new one and the stream has the same length each time.

``--models``: a run's ``models/`` folder (with ``contours.json`` for contours); ``--bundle``: its bundle;
``--images``: a JSON list of image files, or the run's ``datalist.json`` test split when left out. Prints a Markdown
table: the median seconds per case of each variant over ``--rounds`` passes over the images (after one warm-up case
each), their ratio, and the median ratio of a case served both ways back to back ("paired"). Run, e.g.::

    python scripts/benchmark_served_feature.py --feature contours --bundle ce_dice_hpc \\
        --models /tmp/calib_monai_margins/hpc/seed0/ce_dice_hpc/eps0.02/models --limit 20
    python scripts/benchmark_served_feature.py --feature site_monitor --stream 1000 --bundle nacl_acdc \\
        --models runs/site_study/acdc/seed0/nacl_acdc/models --overrides '{"data#resize": [96, 96]}'

Results: ``docs/results/margins/README.md`` (contours), ``docs/results/benchmarks/site_monitor.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def _stream(site: Path, cases: int) -> tuple[str, bytes]:
    """``site.json`` and ``site_cases.jsonl`` of the served weights and range (the warm-up's) after ``cases``
    earlier cases."""
    from calib_monai.review.site_martingale import SiteMartingale
    from calib_monai.review.site_monitor import SITE_FILE, advance, new_state
    from calib_monai.review.site_store import CASES_FILE, write_log

    served = json.loads((site / SITE_FILE).read_text())
    test = SiteMartingale.from_settings(served)
    state, earlier, rng = new_state(served["weights_sha256"], served["range_sha256"], test), [], random.Random(0)
    for i in range(cases):
        ranks = {s: rng.randint(1, test.m + 1) for s in test.signals}
        earlier.append({"hash": f"earlier{i}", "rank": rng.randint(1, test.m + 1), "signal_ranks": ranks})
        advance(state, earlier[-1]["rank"], ranks, test)
    state["cases_bytes"] = write_log(site, earlier)
    return json.dumps(state), (site / CASES_FILE).read_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--feature", choices=("contours", "site_monitor"), default="contours")
    parser.add_argument("--bundle", required=True, help="the bundle name (bundles/<name>) or folder")
    parser.add_argument("--models", required=True, help="a models/ folder holding model.pt (and contours.json)")
    parser.add_argument("--images", default="", help="JSON list of images (default: datalist.json's test split)")
    parser.add_argument("--overrides", default="{}", help="JSON config overrides (the run's preprocessing)")
    parser.add_argument("--stream", type=int, default=0, help="site_monitor: earlier cases in the stream")
    parser.add_argument("--limit", type=int, default=20, help="at most this many images")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch

    from calib_monai.bundle import TrainedBundle, locate_bundle

    torch.set_num_threads(2)
    models = Path(args.models).resolve()
    if args.feature == "contours" and not (models / "contours.json").is_file():
        raise SystemExit(f"{models} has no contours.json: run the bundle's calibrate there first")
    images = json.loads(args.images) if args.images else None
    if images is None:
        images = [item["image"] for item in json.loads((models / "datalist.json").read_text())["test"]]
    images = images[: args.limit]
    overrides = json.loads(args.overrides)
    tmp = Path(tempfile.mkdtemp())
    off = {"contours_path": str(models / "no_contours.json")} if args.feature == "contours" else {}
    on = {"site_dir": str(tmp / "site")} if args.feature == "site_monitor" else {}
    names = (f"with {args.feature}", f"without {args.feature}")
    bundles = {
        name: TrainedBundle(locate_bundle(args.bundle), overrides={**overrides, **extra}, weights=models / "model.pt")
        for name, extra in zip(names, (on, off))
    }
    stream = None

    def serve(bundle: TrainedBundle, image: str, out: Path) -> float:
        if stream is not None and bundle is bundles[names[0]]:  # the same stream before every case
            (tmp / "site" / "site.json").write_text(stream[0])
            (tmp / "site" / "site_cases.jsonl").write_bytes(stream[1])
        start = time.perf_counter()
        prediction = bundle.predict(image)
        bundle.write(*prediction, output_dir=out, contours=prediction.contours)
        return time.perf_counter() - start

    for name, bundle in bundles.items():  # warm-up: weights, transforms
        serve(bundle, images[0], tmp / "warm" / name.replace(" ", "_"))
    if args.feature == "site_monitor":
        stream = _stream(tmp / "site", args.stream)
    elif bundles[names[0]].predict(images[0]).contours is None:
        raise SystemExit(f"the served contours are missing; check {models}")
    times: dict[str, list[float]] = {name: [] for name in bundles}
    for r in range(args.rounds):
        for i, image in enumerate(images):
            for name in names if (i + r) % 2 == 0 else names[::-1]:
                times[name].append(serve(bundles[name], image, tmp / f"{name.replace(' ', '_')}_{r}"))
    print(f"{len(images)} images x {args.rounds} rounds, 2 threads; models: {models}")
    if args.feature == "site_monitor":
        print(f"stream: {args.stream} earlier cases before each served case")
    print("\n| variant | median s per case | mean s per case |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.3f} | {statistics.fmean(values):.3f} |")
    with_s, without_s = (statistics.median(times[name]) for name in names)
    total = sum(times[names[0]]) / sum(times[names[1]]) - 1
    # each case served both ways back to back: the pair sees the same load, so its ratio is the steadier figure
    paired = statistics.median(a / b for a, b in zip(*(times[name] for name in names))) - 1
    print(f"\n{args.feature} adds {with_s / without_s - 1:+.1%} (median), {total:+.1%} (total), {paired:+.1%} (paired)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
