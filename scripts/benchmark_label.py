"""Latency of the MONAI Label app on one 256 x 256 x 40 volume: a segmentation request and a scoring pass, against
the same bundle's in-process prediction (``TrainedBundle.predict``, the peer: what the server adds is the request,
the upload and the file it writes back).

    python scripts/benchmark_label.py --bundle bundles/nacl_flare   # a bundle with models/model.pt (README's demo)

Starts ``monailabel start_server`` from ``.venv-label`` on 127.0.0.1 over a temporary app folder (the bundle linked)
and a datastore holding the volume; prints medians over ``--repeats`` and the ratios. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import nibabel as nib
import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _volume(path: Path, seed: int = 3, shape=(256, 256, 40)) -> None:
    from calib_monai.data.phantoms import generate_phantom

    image, _, _ = generate_phantom(seed=seed, index=0, shape=shape, spacing=(1.5, 1.5, 6.0))
    nib.save(nib.Nifti1Image(image.astype(np.float32), np.diag([1.5, 1.5, 6.0, 1.0])), str(path))


def _multipart(file: Path) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="params"\r\n\r\n{{}}\r\n--{boundary}\r\n'
        f'Content-Disposition: form-data; name="file"; filename="{file.name}"\r\n\r\n'
    ).encode()
    body += file.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def _timed(request: urllib.request.Request) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=900) as response:
        response.read()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=str(REPO / "bundles" / "nacl_flare"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=8791)
    args = parser.parse_args()
    bundle = Path(args.bundle).resolve()
    if not (bundle / "models" / "model.pt").is_file():
        raise SystemExit(f"{bundle}/models/model.pt is missing: train the bundle first (README's first command)")
    root = Path(tempfile.mkdtemp(prefix="calib_monai_bench_"))
    try:
        (root / "app" / "model").mkdir(parents=True)
        (root / "app" / "main.py").symlink_to(REPO / "calib_monai" / "label" / "main.py")
        (root / "app" / "model" / bundle.name).symlink_to(bundle)
        (root / "studies").mkdir()
        volume = root / "studies" / "volume_256x256x40.nii.gz"
        _volume(volume)

        from calib_monai.bundle import TrainedBundle

        peer = TrainedBundle(bundle)
        peer.predict(volume)  # network built, caches warm
        direct = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            peer.predict(volume)
            direct.append(time.perf_counter() - start)

        env = {
            **os.environ,
            "PATH": f"{REPO / '.venv-label' / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "MONAI_LABEL_AUTO_UPDATE_SCORING": "false",
        }
        env.pop("VIRTUAL_ENV", None)
        server = subprocess.Popen(
            [
                "monailabel",
                "start_server",
                "--app",
                str(root / "app"),
                "--studies",
                str(root / "studies"),
                "--host",
                "127.0.0.1",
                "--port",
                str(args.port),
            ],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{args.port}"
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"{url}/info/", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(
                        "the MONAI Label server did not start (bash scripts/setup_label_env.sh?)"
                    ) from None
                time.sleep(1)
        try:
            segment, score = [], []
            for repeat in range(args.repeats + 1):  # the first request builds the network: not counted
                # another volume each time: the server keeps the last prediction by image content, and scoring
                # the datastore's volume in between makes that cache miss too
                upload = root / f"upload_{repeat}.nii.gz"
                _volume(upload, seed=100 + repeat)
                body, kind = _multipart(upload)
                seconds = _timed(
                    urllib.request.Request(
                        f"{url}/infer/{bundle.name}?output=image",
                        data=body,
                        method="POST",
                        headers={"Content-Type": kind},
                    )
                )
                segment += [seconds] if repeat else []
                scoring = urllib.request.Request(
                    f"{url}/scoring/{bundle.name}_case_quality?run_sync=true",
                    data=json.dumps({"force": True}).encode(),  # score it again though scored with these weights
                    method="POST",
                    headers={"Content-Type": "application/json"},
                )
                seconds = _timed(scoring)
                score += [seconds] if repeat else []
        finally:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
        d, s, c = statistics.median(direct), statistics.median(segment), statistics.median(score)
        print(
            f"volume 256x256x40, bundle {bundle.name}, {args.repeats} repeats (medians; spread "
            f"{min(segment):.2f}-{max(segment):.2f} s for the requests)"
        )
        print(f"  TrainedBundle.predict in process (peer): {d:.2f} s")
        print(f"  POST /infer/{bundle.name} (upload, segmentation, file back): {s:.2f} s = {s / d:.2f}x the peer")
        print(f"  POST /scoring/{bundle.name}_case_quality, one image (run_sync): {c:.2f} s = {c / d:.2f}x the peer")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
