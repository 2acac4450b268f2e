"""Adaptation at a new site through the annotation loop (issue 31.2), on a simulated site.

Run in the MONAI Label environment (it drives the real server with MONAI Label's own client)::

    .venv-label/bin/python scripts/site_adaptation.py --dataset_dir ../shared/data/Task04_Hippocampus \
        --output_dir /tmp/site_adaptation

1. A source model: ``ce_dice_hpc`` trained on Hippocampus (``--epochs``, ``--train_fraction``; the bundle's own
   ``training`` and ``calibrate``), or reused from ``<output_dir>/source`` when it is there.
2. The site: images of the source run's test split (never trained or validated on) under one fixed shift
   (``shift``: a multiplicative bias field, gamma 1.5 contrast, in-plane blur, Gaussian noise), labels unchanged;
   ``--pool`` of them go into the datastore (to annotate), ``--held_out`` others are the site's unlabelled images the
   model is scored on.
3. For each order (``typiclust``: the server's most-typical strategy, Slicer's default; ``typical``: its
   typical-least-confident strategy; ``next_sample``: its least-confident strategy; ``random``: a seeded draw,
   ``--order_seed``), a fresh copy
   of the source bundle is served by ``monailabel start_server`` (docs/site.md's command); images are taken in that
   order, their true labels submitted as Slicer does (``label_info`` names), and Train runs after 2, 4 and 8 labels
   (the defaults an annotator gets: 5 epochs, lr 1e-4, 20% held out), each from the weights the last one published.
4. Before and after each Train: mean DSC on the held-out site images, the case-score error, mean |estimated mean
   DSC - true mean DSC|, and how many the review flag marks (true, false, null: "cannot judge"), with the served
   weights, calibration and validated range (``TrainedBundle.predict``).

Writes ``results.csv`` and ``README.md`` (the table, this command) to ``--output_dir``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy.ndimage import gaussian_filter

REPO = Path(__file__).resolve().parents[1]
BUNDLE = "ce_dice_hpc"
KS = (2, 4, 8)
#: the orders served by Next Sample, by the strategy's name suffix; "random" is a seeded draw (MONAI Label's default)
STRATEGIES = {"typical": "typical_least_confident", "next_sample": "least_confident", "typiclust": "most_typical"}


def shift(image: np.ndarray, seed: int, scale: float = 1.0) -> np.ndarray:
    """The site's fixed acquisition change at ``scale`` 1: bias field x2.0..0.5 across the volume, gamma 1.5, in-plane
    blur sigma 1 voxel, Gaussian noise at 5% of the intensity range (seeded per image); ``scale`` multiplies the
    bias field's exponent, gamma - 1, the blur and the noise."""
    x = image.astype(np.float64)
    lo, hi = np.percentile(x, 0.5), np.percentile(x, 99.5)
    u = np.clip((x - lo) / max(hi - lo, 1e-6), 0, 1) ** (1 + 0.5 * scale)
    grid = np.meshgrid(*[np.linspace(-1, 1, s) for s in x.shape], indexing="ij")
    u = u * np.exp(scale * (0.45 * grid[0] - 0.25 * grid[1]))
    u = gaussian_filter(u, sigma=(scale, scale, 0.0))
    u = u + np.random.default_rng(seed).normal(0, 0.05 * scale, u.shape)
    return (u * (hi - lo) + lo).astype(np.float32)


def run(cmd: list[str], log: Path) -> None:
    with open(log, "a") as out:
        out.write("$ " + shlex.join(cmd) + "\n")
        out.flush()
        code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    if code:
        raise SystemExit(f"failed (exit {code}): {shlex.join(cmd)}; see {log}")


def source_model(args, out: Path) -> Path:
    bundle = out / "source" / BUNDLE
    if (bundle / "models" / "validated_range.json").is_file():
        return bundle
    shutil.rmtree(bundle, ignore_errors=True)
    shutil.copytree(REPO / "bundles" / BUNDLE / "configs", bundle / "configs")
    common = [
        "--dataset_dir",
        str(args.dataset_dir),
        "--output_dir",
        str(bundle / "models"),
        "--bundle_root",
        str(bundle),
    ]
    train = [str(bundle / "configs" / "train.json")]
    run(
        [
            sys.executable,
            "-m",
            "monai.bundle",
            "run",
            "training",
            "--config_file",
            json.dumps(train),
            *common,
            "--epochs",
            str(args.epochs),
            "--lr_milestone",
            str(max(1, args.epochs * 2 // 3)),
            "--train_fraction",
            str(args.train_fraction),
            "--seed",
            str(args.seed),
        ],
        out / "source.log",
    )
    run(
        [
            sys.executable,
            "-m",
            "monai.bundle",
            "run",
            "calibrate",
            "--config_file",
            json.dumps(train + [str(bundle / "configs" / "calibrate.json")]),
            *common,
        ],
        out / "source.log",
    )
    return bundle


def make_site(args, source: Path, out: Path) -> tuple[list[tuple[str, Path, Path]], list[tuple[str, Path, Path]]]:
    test = json.loads((source / "models" / "datalist.json").read_text())["test"]
    need = args.pool + args.held_out
    if len(test) < need:
        raise SystemExit(f"the source split has {len(test)} test cases; --pool + --held_out need {need}")
    site = out / "site"
    shutil.rmtree(site, ignore_errors=True)
    (site / "labels").mkdir(parents=True)
    cases = []
    for i, item in enumerate(test[:need]):
        name = Path(item["image"]).name.split(".")[0]
        image = nib.load(item["image"])
        path = site / f"{name}.nii.gz"
        shifted = shift(np.asarray(image.dataobj), seed=i, scale=args.shift_scale)
        nib.save(nib.Nifti1Image(shifted, image.affine), str(path))
        label = site / "labels" / f"{name}.nii.gz"
        shutil.copy(item["label"], label)
        cases.append((name, path, label))
    return cases[: args.pool], cases[args.pool :]


def dice_and_error(bundle_dir: Path, cases, site_dir: Path) -> dict:
    """Mean DSC of the served segmentations of ``cases``, the case-score error (mean |case score - DSC|) and how many
    the review flag marked: ``{"mean_dsc", "case_score_error", "flagged", "not_flagged", "flag_null"}``; served into
    the server's site monitor (``site_dir``), as the site's other cases are, and ``site_alarm`` counts the answers
    that carry its alarm."""
    from calib_monai.bundle import TrainedBundle

    settings = {"output_dir": str(bundle_dir / "eval_tmp"), "site_dir": str(site_dir)}
    bundle = TrainedBundle(bundle_dir, ("inference.json",), settings, device="cpu")
    classes = [v for v in bundle.label_names if v > 0]
    dices, errors, flags, signed, anchored, alarms = [], [], [], [], 0, 0
    for _, image, label in cases:
        segmentation, _, quality = bundle.predict(str(image))
        alarms += bool((quality.get("site") or {}).get("alarm"))
        seg = np.asarray(segmentation[0])
        truth = np.asarray(nib.load(str(label)).dataobj)
        per = [2 * ((seg == c) & (truth == c)).sum() / max((seg == c).sum() + (truth == c).sum(), 1) for c in classes]
        dices.append(float(np.mean(per)))
        errors.append(abs(float(quality["case_score"]) - dices[-1]))
        signed.append(float(quality["case_score"]) - dices[-1])
        flags.append(quality["review"]["flag"])
        anchored = (quality.get("level") or {}).get("site_labels", 0)  # the range's held-out site labels
    return {
        "mean_dsc": float(np.mean(dices)),
        "case_score_error": float(np.mean(errors)),
        "case_score_minus_truth": float(np.mean(signed)),
        "anchored_on": anchored,
        "flagged": flags.count(True),
        "not_flagged": flags.count(False),
        "flag_null": flags.count(None),
        "site_alarm": alarms,
    }


class Server:
    """docs/site.md's start_server line with the app, studies and port substituted (as tests/label_server.py)."""

    def __init__(self, app: Path, studies: Path, port: int, log: Path):
        line = next(
            ln.strip()
            for ln in (REPO / "docs" / "site.md").read_text().splitlines()
            if ln.strip().startswith("monailabel start_server")
        )
        cmd = shlex.split(line)
        for option, value in {"--app": app, "--studies": studies, "--port": port}.items():
            cmd[cmd.index(option) + 1] = str(value)
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        env.pop("VIRTUAL_ENV", None)
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=app.parent
        )
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/info/", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start; see {log}")
            time.sleep(1)

    def wait_for_scoring(self, timeout: float = 600) -> None:
        """Until the start-up scoring (every datastore image's case score, for Next Sample) has finished."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/scoring/?all=true", timeout=30) as response:
                    tasks = json.loads(response.read())
            except OSError:
                tasks = []
            tasks = tasks if isinstance(tasks, list) else [tasks]
            if tasks and all(t.get("status") in ("DONE", "ERROR", "STOPPED") for t in tasks):
                return
            time.sleep(3)
        raise SystemExit("the start-up scoring did not finish")

    def stop(self):
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=60)


def loop(order: str, source: Path, pool, held_out, out: Path, port: int, epochs: int, seed: int = 0) -> list[dict]:
    from monailabel.client import MONAILabelClient

    from calib_monai.label.serving import SITE_FOLDER

    work = out / order
    shutil.rmtree(work, ignore_errors=True)
    app = work / "app"
    (app / "model").mkdir(parents=True)
    (app / "main.py").symlink_to(REPO / "calib_monai" / "label" / "main.py")
    bundle = app / "model" / BUNDLE
    shutil.copytree(source, bundle, ignore=shutil.ignore_patterns("runs", "eval_tmp", "tensorboard", "*.pt.tmp"))
    studies = work / "studies"
    studies.mkdir()
    for _, image, _ in pool:
        shutil.copy(image, studies / image.name)
    truth = {name: label for name, _, label in pool}
    site_dir = studies / SITE_FOLDER / BUNDLE  # the server's site monitor of this bundle
    rows = [{"order": order, "labels": 0, **dice_and_error(bundle, held_out, site_dir), "images": ""}]
    print(rows[-1], flush=True)
    server = Server(app, studies, port, work / "server.log")
    try:
        server.wait_for_scoring()
        client = MONAILabelClient(server.url, client_id="site-annotator")
        names = json.loads((bundle / "configs" / "train.json").read_text())["label_names"]
        info = [{"name": names[k], "idx": int(k)} for k in sorted(names, key=int) if int(k) > 0]
        rng, taken = random.Random(seed), []
        for k in KS:
            while len(taken) < k:
                if order in STRATEGIES:
                    image_id = client.next_sample(f"{BUNDLE}_{STRATEGIES[order]}", {})["id"]
                else:
                    image_id = rng.choice(sorted(set(truth) - set(taken)))
                if image_id in taken:
                    raise SystemExit(f"Next Sample handed out {image_id} again")
                client.save_label(image_id, str(truth[image_id]), params={"label_info": info})
                taken.append(image_id)
            client.train_start(BUNDLE, {"epochs": epochs})
            while (status := client.train_status())["status"] not in ("DONE", "ERROR", "STOPPED"):
                time.sleep(5)
            if status["status"] != "DONE":
                raise SystemExit(f"training after {k} labels: {status['status']}: {status.get('details', [])[-3:]}")
            served = dice_and_error(bundle, held_out, site_dir)
            rows.append({"order": order, "labels": k, **served, "images": " ".join(taken)})
            print(rows[-1], flush=True)
    finally:
        server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset_dir", type=Path, default=REPO.parent / "shared" / "data" / "Task04_Hippocampus")
    parser.add_argument("--output_dir", type=Path, default=Path("/tmp/site_adaptation"))
    parser.add_argument("--epochs", type=int, default=6, help="the source model's training epochs")
    parser.add_argument("--train_fraction", type=float, default=0.5)
    parser.add_argument("--fine_tune_epochs", type=int, default=5)
    parser.add_argument("--pool", type=int, default=16)
    parser.add_argument("--held_out", type=int, default=12)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--orders", default="typiclust,typical,next_sample,random")
    parser.add_argument("--shift_scale", type=float, default=1.0, help="strength of the site's shift (see shift)")
    parser.add_argument("--seed", type=int, default=0, help="the source model's training seed and the random order's")
    parser.add_argument("--order_seed", type=int, default=None, help="the random order's draw (default: --seed)")
    args = parser.parse_args()
    out = args.output_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    source = source_model(args, out)
    pool, held_out = make_site(args, source, out)
    rows = []
    for order in args.orders.split(","):
        draw = args.seed if args.order_seed is None else args.order_seed
        rows += loop(order, source, pool, held_out, out, args.port, args.fine_tune_epochs, draw)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    table = [
        "| order | labels | mean DSC (held-out site images) | case-score error | estimate minus truth | re-anchored on "
        "| flagged / not / null | site alarm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    table += [
        f"| {r['order']} | {r['labels']} | {r['mean_dsc']:.3f} | {r['case_score_error']:.3f} | "
        f"{r['case_score_minus_truth']:+.3f} | {r['anchored_on']} | "
        f"{r['flagged']} / {r['not_flagged']} / {r['flag_null']} | {r['site_alarm']} |"
        for r in rows
    ]
    command = " ".join(shlex.quote(a) for a in [".venv-label/bin/python", "scripts/site_adaptation.py", *sys.argv[1:]])
    (out / "README.md").write_text(
        f"# Adaptation at a simulated site\n\nShift scale {args.shift_scale}; {len(held_out)} held-out site images, "
        f"a pool of {len(pool)}; "
        f"{(time.time() - started) / 60:.0f} min.\n\n" + "\n".join(table) + f"\n\nCommand: `{command}`\n"
    )
    print("\n".join(table))


if __name__ == "__main__":
    main()
