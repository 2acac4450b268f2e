"""Finding (image, label) pairs in the folder layouts users download, and the seeded train/validation/test split."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from calib_monai.atomic import write_json_atomically

__all__ = [
    "FLARE_LAYOUTS",
    "files_by_case",
    "find_flare_cases",
    "find_msd_cases",
    "read_dataset_json",
    "read_dataset_json_labels",
    "require_file",
    "split_sizes",
    "strip_nifti",
    "split_cases",
    "load_or_create_datalist",
    "layout_error",
    "split_groups",
    "given_datalist",
    "unless_given",
]

logger = logging.getLogger("calib_monai.data")

SUBSETS = ("training", "validation", "test")
NIFTI_SUFFIXES = (".nii.gz", ".nii")
FLARE_LAYOUTS = (
    "FLARE21: <dataset_dir>/TrainingImg/<case>_0000.nii.gz with <dataset_dir>/TrainingMask/<case>.nii.gz",
    "FLARE22 / nnU-Net: <dataset_dir>/imagesTr/<case>_0000.nii.gz with <dataset_dir>/labelsTr/<case>.nii.gz "
    "(or images/ + labels/ as in FLARE22_LabeledCase50)",
    "MSD: <dataset_dir>/imagesTr/<case>.nii.gz with <dataset_dir>/labelsTr/<case>.nii.gz (dataset.json optional)",
)


def strip_nifti(name: str) -> str | None:
    for suffix in NIFTI_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def require_file(path: Path, what: str) -> str:
    """``str(path)``, or a ValueError naming the missing ``what`` file and where it was expected."""
    if not path.is_file():
        raise ValueError(f"{what} {path} is missing; add the file or remove the case folder {path.parent}")
    return str(path)


def files_by_case(paths: Iterable[Path], case_of: Callable[[Path], str], what: str = "files") -> dict[str, Path]:
    """``{case: path}`` of ``paths`` named by ``case_of``; two of them naming one case (``<case>.nii`` beside
    ``<case>.nii.gz``) raise a ValueError naming both, where a dict would keep one and drop the other unseen."""
    cases: dict[str, Path] = {}
    for path in paths:
        case = case_of(path)
        if case in cases:
            raise ValueError(
                f"{cases[case]} and {path} are two {what} of the case {case!r}: one would be used and the other left "
                "out; keep one of them (move the other out of the folder)"
            )
        cases[case] = path
    return cases


def _nifti_files(folder: Path) -> list[Path]:
    # MSD archives carry macOS "._x.nii.gz" resource forks: skip hidden files
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and strip_nifti(p.name))


def _found(dataset_dir: Path) -> str:
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in dataset_dir.iterdir())
    shown = ", ".join(entries[:12]) + (f", ... ({len(entries)} entries)" if len(entries) > 12 else "")
    return shown or "nothing (empty folder)"


def layout_error(dataset_dir: str | os.PathLike, problem: str, layouts: Sequence[str] = FLARE_LAYOUTS) -> ValueError:
    """A ValueError saying ``dataset_dir`` ``problem``, listing the expected ``layouts`` and what the folder holds."""
    dataset_dir, expected = Path(dataset_dir), "\n  - ".join(layouts)
    return ValueError(
        f"dataset_dir {str(dataset_dir)!r} {problem}.\nExpected one of:\n  - {expected}\n"
        f"Found: {_found(dataset_dir) if dataset_dir.is_dir() else 'no such folder'}"
    )


def _paths(value) -> list[str]:
    """The file(s) of a datalist entry: one path, or a list of paths (multi-modal images stacked as channels)."""
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _case_key(case: dict) -> str:
    return _paths(case["image"])[0]


def _first_missing(items: Iterable[dict]) -> str | None:
    """The first image or label file of ``items`` (datalist entries) that does not exist, if any."""
    files = (f for item in items for f in _paths(item["image"]) + _paths(item["label"]))
    return next((f for f in files if not Path(f).is_file()), None)


def _pair_by_name(image_dir: Path, label_dir: Path) -> list[dict[str, str]]:
    """Pair ``<case>_0000.nii.gz`` (nnU-Net/FLARE channel suffix) or ``<case>.nii.gz`` with ``<case>.nii[.gz]``."""
    labels = files_by_case(_nifti_files(label_dir), lambda p: strip_nifti(p.name), "labels")

    def case_of(image: Path) -> str:
        stem = strip_nifti(image.name)
        return stem[: -len("_0000")] if stem.endswith("_0000") and stem not in labels else stem

    cases = []
    for case, image in files_by_case(_nifti_files(image_dir), case_of, "images").items():
        if case not in labels:
            raise ValueError(
                f"image {image} has no label: expected {label_dir / (case + '.nii.gz')}; "
                f"add the mask or remove the image from {image_dir}"
            )
        cases.append({"image": str(image), "label": str(labels[case])})
    return cases


def _cases_from_dataset_json(dataset_dir: Path, description: dict) -> list[dict[str, str]] | None:
    training = description.get("training")
    if not isinstance(training, list) or not training:
        return None
    cases = []
    for item in training:
        image, label = (dataset_dir / item[k] for k in ("image", "label"))
        for path in (image, label):
            if not path.is_file():
                raise ValueError(
                    f"{dataset_dir / 'dataset.json'} lists {path}, which does not exist; "
                    "fix the 'training' entries or remove dataset.json to pair files by name"
                )
        cases.append({"image": str(image.resolve()), "label": str(label.resolve())})
    return cases


def read_dataset_json(dataset_dir: str | os.PathLike) -> dict | None:
    path = Path(dataset_dir) / "dataset.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); fix or remove it") from err


def read_dataset_json_labels(description: dict, source: str) -> dict[str, str]:
    """``{"0": "background", ...}`` from an MSD (value -> name) or nnU-Net v2 (name -> value) ``labels`` entry."""
    labels = description.get("labels")
    if not isinstance(labels, dict) or not labels:
        raise ValueError(f'{source} has no \'labels\' mapping; expected e.g. {{"0": "background", "1": "organ"}}')
    if all(str(k).lstrip("-").isdigit() for k in labels):
        out = {str(int(k)): str(v) for k, v in labels.items()}
    elif all(isinstance(v, int) for v in labels.values()):
        out = {str(v): str(k) for k, v in labels.items()}
    else:
        raise ValueError(
            f"{source} 'labels' must map integer values to names (MSD) or names to integers (nnU-Net v2), got {labels}"
        )
    values = sorted(int(k) for k in out)
    if values != list(range(len(values))):
        raise ValueError(f"{source} label values must be 0..K-1 without gaps, got {values}")
    return {str(v): out[str(v)] for v in values}


def find_flare_cases(dataset_dir: str | os.PathLike) -> tuple[str, list[dict[str, str]]]:
    """Return ``(layout, cases)`` for a FLARE download: layout ``"flare21"`` or ``"flare22"`` (imagesTr/images)."""
    root = Path(dataset_dir).expanduser().resolve()
    if not root.is_dir():
        raise layout_error(root, "does not exist or is not a folder")
    if (root / "TrainingImg").is_dir() and (root / "TrainingMask").is_dir():
        layout, cases = "flare21", _pair_by_name(root / "TrainingImg", root / "TrainingMask")
    else:
        pairs = [(root / i, root / m) for i, m in (("imagesTr", "labelsTr"), ("images", "labels"))]
        pairs = [(i, m) for i, m in pairs if i.is_dir() and m.is_dir()]
        if not pairs:
            raise layout_error(root, "is in no known FLARE layout")
        description = read_dataset_json(root) if pairs[0][0].name == "imagesTr" else None
        cases = (description and _cases_from_dataset_json(root, description)) or _pair_by_name(*pairs[0])
        layout = "flare22"
    if not cases:
        raise layout_error(root, "has the folders of a FLARE layout but no .nii/.nii.gz image files in them")
    return layout, cases


def find_msd_cases(dataset_dir: str | os.PathLike) -> tuple[dict, list[dict[str, str]]]:
    """Return ``(dataset.json contents, cases)`` of an MSD-style task folder (``dataset.json`` is required)."""
    root = Path(dataset_dir).expanduser().resolve()
    if not root.is_dir():
        raise ValueError(
            f"dataset_dir {str(root)!r} does not exist; expected an MSD task folder with dataset.json, "
            "imagesTr/ and labelsTr/"
        )
    description = read_dataset_json(root)
    if description is None:
        raise ValueError(
            f"dataset_dir {str(root)!r} has no dataset.json (found: {_found(root)}); expected an MSD task "
            "folder: dataset.json with 'labels' and 'training', imagesTr/, labelsTr/"
        )
    cases = _cases_from_dataset_json(root, description)
    if cases is None:
        if not ((root / "imagesTr").is_dir() and (root / "labelsTr").is_dir()):
            raise ValueError(
                f"{root / 'dataset.json'} has no 'training' list and {root} has no imagesTr/ + labelsTr/ "
                f"(found: {_found(root)})"
            )
        cases = _pair_by_name(root / "imagesTr", root / "labelsTr")
    if not cases:
        raise ValueError(f"dataset_dir {str(root)!r} has no training cases (found: {_found(root)})")
    return description, cases


def split_sizes(num_cases: int, split: Sequence[int] = (240, 40, 80)) -> tuple[int, int, int]:
    """Sizes ``(train, val, test)``: ``split`` itself when it sums to ``num_cases``, else the same ratios.

    Validation and test get ``round(n * s_k / sum(s))`` cases (at least one each), training the rest; e.g. 360 cases
    -> (240, 40, 80), 361 -> (241, 40, 80), 12 -> (8, 1, 3).
    """
    if len(split) != 3 or min(split) < 0 or split[0] <= 0:
        raise ValueError(f"split must be three non-negative counts (train > 0, val, test), got {tuple(split)}")
    split = [int(s) for s in split]
    if sum(split) == num_cases:
        return split[0], split[1], split[2]
    if num_cases < sum(1 for s in split if s > 0):
        raise ValueError(f"{num_cases} case(s) cannot be split {tuple(split)}: need at least one case per subset")
    sizes = [max(1, round(num_cases * s / sum(split))) if s > 0 else 0 for s in split[1:]]
    return num_cases - sum(sizes), sizes[0], sizes[1]


def _shuffle_and_cut(items: Sequence, split: Sequence[int], seed: int) -> dict[str, list]:
    order = np.random.default_rng(int(seed)).permutation(len(items))
    n_train, n_val, _ = split_sizes(len(items), split)
    shuffled = [items[i] for i in order]
    return dict(zip(SUBSETS, (shuffled[:n_train], shuffled[n_train : n_train + n_val], shuffled[n_train + n_val :])))


def split_cases(cases: Sequence[dict], split: Sequence[int], seed: int) -> dict[str, list[dict]]:
    """Seeded shuffle of the cases (sorted by image path first, so the listing order does not matter), then cut."""
    return _shuffle_and_cut(sorted(cases, key=_case_key), split, seed)


def split_groups(
    cases: Sequence[dict], groups: Sequence[str], split: Sequence[int], seed: int, subset_of: dict | None = None
) -> dict[str, list[dict]]:
    """Split of whole groups (``groups[i]`` of ``cases[i]``, e.g. patients) by ``subset_of`` (group -> subset), else by
    a seeded shuffle of the sorted group names cut by ``split_sizes``; each subset sorted by image path."""
    if subset_of is None:
        cut = _shuffle_and_cut(sorted(set(groups)), split, seed)
        subset_of = {group: key for key, names in cut.items() for group in names}
    out: dict[str, list[dict]] = {key: [] for key in SUBSETS}
    for case, group in sorted(zip(cases, groups), key=lambda cg: _case_key(cg[0])):
        out[subset_of[group]].append(case)
    return out


def load_or_create_datalist(
    path: Path, cases: Sequence[dict], split: Sequence[int], seed: int, info: dict, splitter: Callable
) -> dict[str, list[dict]]:
    """Read the datalist at ``path`` if present (a resumed run keeps its split), else ``splitter(cases, split, seed)``
    and write it with ``info`` (source, dataset_dir, a ``fold``, ...): a stored datalist that disagrees with ``info``
    or names missing files is an error rather than a silently different split."""
    if path.is_file():
        stored = _read_datalist(path)
        for name, value in info.items():
            if name != "source" and (name in stored or name == "dataset_dir") and stored.get(name) != value:
                raise ValueError(
                    f"{path} was written for {name} {stored.get(name)!r}, not {value!r}: use a new "
                    f"output_dir or delete {path}"
                )
        for key in SUBSETS:
            missing = _first_missing(stored.get(key, []))
            if missing:
                raise ValueError(
                    f"{path} lists {missing}{_relative(missing)} ({key}), which no longer exists: restore "
                    f"the data or delete {path} to split again"
                )
        stored_images = {_case_key(item) for key in SUBSETS for item in stored.get(key, [])}
        if stored_images != {_case_key(case) for case in cases}:
            logger.warning(
                "%s lists %d cases but %d are found now: reusing the stored split; delete the file to "
                "split the current cases",
                path,
                len(stored_images),
                len(cases),
            )
        if stored.get("seed") != int(seed) or list(stored.get("split", [])) != [int(s) for s in split]:
            logger.warning(
                "reusing the split in %s (seed %s, split %s), not seed %s, split %s",
                path,
                stored.get("seed"),
                stored.get("split"),
                seed,
                list(split),
            )
        logger.info("datalist: reusing %s", path)
        return {k: stored[k] for k in SUBSETS}
    datalist = splitter(cases, split, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**info, "seed": int(seed), "split": [int(s) for s in split], **datalist}
    write_json_atomically(path, record, indent=1)
    logger.info("datalist: wrote %s (%s)", path, {k: len(v) for k, v in datalist.items()})
    return datalist


def given_datalist(path: str | os.PathLike) -> dict[str, list[dict]] | None:
    """The lists of a datalist written beforehand with ``"given": true`` (no data set folder behind it: MONAI Label's
    train task, ``calib_monai.label.fine_tune``); None when ``path`` is absent or a split this code wrote."""
    path = Path(path)
    if not path.is_file():
        return None
    stored = _read_datalist(path)
    if not stored.get("given"):
        return None
    lists = {key: list(stored.get(key, [])) for key in SUBSETS}
    for key in ("training", "validation"):
        if not lists[key]:
            raise ValueError(f"{path} lists no {key} case: a run needs at least one of each")
    for key, items in lists.items():
        missing = _first_missing(items)
        if missing:
            raise ValueError(
                f"{path} lists {missing}{_relative(missing)} ({key}), which does not exist: fix the datalist"
            )
    logger.info("datalist: the given %s (%s)", path, {k: len(v) for k, v in lists.items()})
    return lists


def _read_datalist(path: Path) -> dict:
    """A datalist file, checked: JSON, every case with an image and a label, no image twice (in two lists a case is
    scored on what it was fitted on; twice in one, it counts twice). A one-line ValueError naming the file and entry."""
    fix = "fix the file, or delete it to split the data set again"
    try:
        stored = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path} is not a datalist (not JSON: {err}): {fix}") from None
    if not isinstance(stored, dict):
        raise ValueError(f"{path} is not a datalist (a {type(stored).__name__}, not an object of lists): {fix}")
    seen: dict[str, str] = {}
    for key in SUBSETS:
        for item in stored.get(key, []):
            absent = [k for k in ("image", "label") if not isinstance(item, dict) or k not in item]
            if absent:
                raise ValueError(f"{path} lists a {key} case without its {absent[0]!r} ({str(item)[:80]}): {fix}")
            image = _case_key(item)
            if image in seen:
                where = f"twice in {key}" if seen[image] == key else f"in {seen[image]} and in {key}"
                raise ValueError(f"{path} lists the case {image} {where}: keep it in one list once, or {fix}")
            seen[image] = key
    return stored


def _relative(name: str) -> str:  # a relative path in a datalist is read from the current folder
    return "" if Path(name).is_absolute() else f" (a relative path, read from the current folder {os.getcwd()})"


def unless_given(dataset_dir: str | os.PathLike | None, datalist_path: str | os.PathLike):
    """``dataset_dir``, or None when it is empty and ``datalist_path`` is a given datalist (``given_datalist``): the
    component then reads no data set folder, as one built with ``dataset_dir=None``."""
    if dataset_dir:
        return dataset_dir
    try:
        given = bool(json.loads(Path(datalist_path).read_text()).get("given"))
    except (OSError, ValueError, AttributeError):
        given = False  # absent, or not ours to judge here: the component's own datalist reading reports it
    if given:
        logger.info("dataset_dir is empty and %s is a given datalist: training on the cases it lists", datalist_path)
        return None
    return dataset_dir
