"""One source of truth for the bundles of ``bundles/``: every method x data set is rendered from ``specs`` here.

``scripts/make_bundles.py`` writes them; ``tests/test_bundles_generated.py`` checks that the committed files equal
what this renders.
"""

from __future__ import annotations

import json
from pathlib import Path

from bundle_factory import calibration, configs, docs, inference
from bundle_factory.specs import DATASETS, METHODS, RESULTS, Dataset, Method

__all__ = ["DATASETS", "METHODS", "bundle_names", "render_bundle", "write_bundles"]


def bundle_names() -> list[str]:
    return [f"{m}_{d}" for d in DATASETS for m in METHODS]


def _json(obj) -> str:
    """4-space JSON with each short list of plain values, and each dict of up to three, on one line
    (``"keys": ["image", "label"]``), as the model zoo's configs are written."""
    return _render(obj, 0, 0) + "\n"


def _render(obj, indent: int, key_width: int, width: int = 120) -> str:
    flat = json.dumps(obj)
    if not isinstance(obj, (list, dict)) or not obj:
        return flat
    values = obj if isinstance(obj, list) else list(obj.values())
    plain = not any(isinstance(v, (list, dict)) for v in values) and (isinstance(obj, list) or len(obj) <= 3)
    if plain and indent + key_width + len(flat) <= width:
        return flat
    pad, end = " " * (indent + 4), " " * indent
    if isinstance(obj, list):
        return "[\n" + ",\n".join(pad + _render(v, indent + 4, 0) for v in obj) + "\n" + end + "]"
    items = [pad + json.dumps(k) + ": " + _render(v, indent + 4, len(json.dumps(k)) + 2) for k, v in obj.items()]
    return "{\n" + ",\n".join(items) + "\n" + end + "}"


def render_bundle(name: str) -> dict[str, str]:
    """The files of bundle ``<method>_<dataset>``: relative path -> text."""
    # method names may hold an underscore (ce_dice): match against the known names
    matches = [(m, name[len(m) + 1 :]) for m in METHODS if name.startswith(m + "_") and name[len(m) + 1 :] in DATASETS]
    if not matches:
        raise ValueError(
            f"unknown bundle {name!r}: expected <method>_<dataset> with methods {sorted(METHODS)} "
            f"and data sets {sorted(DATASETS)}"
        )
    method_name, dataset_name = matches[0]
    method: Method = METHODS[method_name]
    dataset: Dataset = DATASETS[dataset_name]
    studies = [folder for folder, (data, methods) in RESULTS.items() if data == dataset_name and method_name in methods]
    files = {
        "configs/metadata.json": _json(docs.metadata(name, method, dataset)),
        "configs/train.json": _json(configs.train_config(name, method, dataset)),
        "configs/evaluate.json": _json(configs.evaluate_config(name, method, dataset)),
        "configs/calibrate.json": _json(calibration.calibrate_config(name, method, dataset)),
        "configs/multi_gpu_train.json": _json(configs.multi_gpu_config(name, method, dataset)),
        "configs/inference.json": _json(inference.inference_config(name, method, dataset)),
        "configs/logging.conf": docs.LOGGING_CONF,
        "docs/README.md": docs.bundle_readme(name, method, dataset, studies),
        "docs/data_license.txt": dataset.terms.text(),
        "large_files.yml": docs.large_files(name),
        "LICENSE": docs.LICENSE,
    }
    if dataset.demo:
        files["configs/demo.json"] = _json(dataset.demo)
    return files


def write_bundles(root: str | Path, names: list[str] | None = None) -> list[Path]:
    """Write (or overwrite) the bundles ``names`` (default: all) under ``root``; returns the files written."""
    written = []
    for name in names or bundle_names():
        for rel, text in render_bundle(name).items():
            path = Path(root) / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.is_file() or path.read_text() != text:
                path.write_text(text)
                written.append(path)
    return written
