"""MONAI Label's own client, run in the label environment by the loop tests (the main one has no monailabel):
``.venv-label/bin/python tests/label_client.py <server url> <command> '<json arguments>'`` prints the answer as JSON.

The requests carry the parameters 3D Slicer's MONAI Label module sends (``result_extension`` ".nrrd",
``result_dtype`` "uint8", a ``client_id``; labels saved with the module's ``label_info``).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import SimpleITK as sitk
from monailabel.client import MONAILabelClient
from monailabel.client.client import MONAILabelClientException

SLICER = {"result_extension": ".nrrd", "result_dtype": "uint8"}


def _infer(client: MONAILabelClient, model: str, image: str, params: dict | None = None) -> tuple[dict, np.ndarray]:
    """Segment the file ``image`` as Slicer does: the JSON and the result read back with SimpleITK (z, y, x)."""
    result, info = client.infer(model, "", {**SLICER, **(params or {})}, file=image)
    try:
        return info, sitk.GetArrayFromImage(sitk.ReadImage(result))
    finally:
        os.remove(result)  # the client downloads it to a temporary file that the caller owns


def infer(client: MONAILabelClient, model: str, image: str, params: dict | None = None) -> dict:
    info, array = _infer(client, model, image, params)
    return {"info": info, "values": sorted(int(v) for v in np.unique(array))}


def compare(client: MONAILabelClient, image: str, bundle: str, threshold: float = 0.8) -> dict:
    """The review result against the segmentation of the same image: every segmented voxel is in exactly one segment
    of its structure (confident or uncertain), nothing else is."""
    review_info, r = _infer(client, f"{bundle}_review", image, {"uncertainty_threshold": threshold})
    seg_info, s = _infer(client, bundle, image)
    r, s = r.astype(np.int64), s.astype(np.int64)
    return {
        "review": {"info": review_info, "values": sorted(int(v) for v in np.unique(r))},
        "segmentation": {"info": seg_info, "values": sorted(int(v) for v in np.unique(s))},
        "same_support": bool(np.array_equal(r > 0, s > 0)),
        "same_structures": bool(np.array_equal((r + 1) // 2, s)),
        "uncertain_voxels": int(((r > 0) & (r % 2 == 0)).sum()),
    }


def margins(client: MONAILabelClient, image: str, bundle: str, save_to: str) -> dict:
    """The margins result (saved to ``save_to`` as .npy in NIfTI index order, i, j, k) against the segmentation of
    the same image: the predicted and inner segments of a structure cover exactly its segmented voxels."""
    info, m = _infer(client, f"{bundle}_margins", image)
    _, s = _infer(client, bundle, image)
    m, s = m.astype(np.int64), s.astype(np.int64)
    np.save(save_to, m.transpose(2, 1, 0))
    predicted = (m > 0) & (m % 3 != 1)  # 3k - 1 (predicted) and 3k (inner)
    return {
        "info": info,
        "values": sorted(int(v) for v in np.unique(m)),
        "same_support": bool(np.array_equal(predicted, s > 0)),
        "same_structures": bool(np.array_equal(np.where(predicted, (m + 2) // 3, 0), s)),
    }


def main() -> None:
    """Print the answer as JSON; a request the server refuses prints ``{"refused": "<the client's message>"}``
    (``Status: <code>; Response: <the server's JSON>``) instead of a traceback."""
    url, command, arguments = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    client = MONAILabelClient(url, client_id=arguments.pop("client_id", "user-xyz"))
    try:
        out = _command(client, command, arguments)
    except MONAILabelClientException as err:
        out = {"refused": err.msg}
    print(json.dumps(out, default=str))


def _command(client: MONAILabelClient, command: str, arguments: dict):
    if command == "infer":
        out = infer(client, **arguments)
    elif command == "compare":
        out = compare(client, **arguments)
    elif command == "margins":
        out = margins(client, **arguments)
    elif command == "next_sample":
        out = client.next_sample(arguments["strategy"], {})
    elif command == "save_label":
        out = client.save_label(arguments["image_id"], arguments["label"], params=arguments.get("params"))
    elif command == "train_start":
        out = client.train_start(arguments["model"], arguments.get("params", {}))
    elif command == "train_status":
        out = client.train_status(check_if_running=bool(arguments.get("check_if_running", False)))
    elif command == "train_stop":
        out = client.train_stop()
    elif command == "info":
        out = client.info()
    else:
        raise SystemExit(f"unknown command {command}")
    return out


if __name__ == "__main__":
    main()
