"""A trained bundle's ``models/`` folder as one versioned unit: ``manifest.json`` names each artifact (``model.pt``,
``calibration.pt``, ``calibration.json``, ``validated_range.json``, ``contours.json``) with its SHA-256, the weights'
SHA-256, the settings that made it and the versions that wrote it.

Publication (:func:`publish_artifacts`): every file is staged complete and fsynced, then renamed; ``manifest.json``
is replaced last, the commit point. Reading (:func:`read_artifact_set`): every file is hashed and compared with the
manifest; a live reader sees the old set or the new one, and a mixed folder, a stray or missing file, or a manifest
of another format is refused in one line naming the files and the fix. A folder without a manifest is read only when
its files' own records name each other (``calib_monai.bundle.records``).

``raw``: the network's own probabilities were asked for (``--calibration_path none``): no recalibration, and the
validated range, measured on recalibrated probabilities, is not applied.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from calib_monai.atomic import fsync, naming_write_failures, temporary_beside, write_text_durably

from .records import record_disagreements, short_sha

__all__ = [
    "CALIBRATE_AGAIN",
    "CALIBRATION_SET",
    "MANIFEST_FILE",
    "MANIFEST_FORMAT",
    "ArtifactSet",
    "ArtifactSetError",
    "WeightsChangedError",
    "copy_artifact_set",
    "file_sha256",
    "is_raw_request",
    "publish_artifacts",
    "read_artifact_set",
    "versions",
]

logger = logging.getLogger("calib_monai")
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1  # the layout publish_artifacts writes; the only one read
WEIGHTS_FILE = "model.pt"
CALIBRATION_SET = ("calibration.pt", "calibration.json", "validated_range.json", "contours.json")  # calibrate's
NOT_APPLICABLE = "no recalibration: range not applicable"
CALIBRATE_AGAIN = 'run calibrate again (python -m monai.bundle run calibrate --config_file "[<bundle>/configs/'
CALIBRATE_AGAIN += 'train.json, <bundle>/configs/calibrate.json]")'
FIX = CALIBRATE_AGAIN + ", or pass --calibration_path none for uncalibrated probabilities"
READ_RETRIES, READ_WAIT_S = 5, 0.2  # a publication in progress is given about a second to finish


class ArtifactSetError(ValueError):
    """The files of a ``models/`` folder do not belong together."""


class WeightsChangedError(RuntimeError):
    """The weights file changed between the loading of the weights and the publication of their set."""


_HASHED: dict[tuple, str] = {}  # (path, inode, size, mtime) -> SHA-256: a run checks model.pt in several places


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of the file's bytes, cached by (inode, size, mtime): the package's writers replace files whole."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _HASHED:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        if len(_HASHED) >= 256:
            _HASHED.clear()
        _HASHED[key] = digest.hexdigest()
    return _HASHED[key]


def versions() -> dict[str, str]:
    import monai
    import torch

    import calib_monai

    return {"calib_monai": calib_monai.__version__, "monai": monai.__version__, "torch": torch.__version__}


def is_raw_request(calibration: Any) -> bool:
    """Whether a ``calibration_path`` value asks for no recalibration: None or ``"none"``."""
    return calibration is None or (isinstance(calibration, str) and calibration.strip().lower() in ("", "none"))


def _read_manifest(folder: Path, raw: bool = False) -> dict | None:
    """The manifest of ``folder`` (None: none), its layout checked; ``raw``: the fix does not suggest it again."""
    path, fix = folder / MANIFEST_FILE, CALIBRATE_AGAIN if raw else FIX
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
        fmt = manifest.get("format")
        if fmt == MANIFEST_FORMAT:  # the entries every manifest has: a KeyError names the one missing
            [manifest["weights"][k] for k in ("file", "sha256")] + [e["sha256"] for e in manifest["artifacts"].values()]
            manifest["artifacts"]["model.pt"]  # noqa: B018
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        what = f"no entry {err}" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
        raise ArtifactSetError(f"{path} is not a manifest of calib_monai ({what}); {fix}") from None
    if fmt != MANIFEST_FORMAT:
        raise ArtifactSetError(
            f"{path} is a manifest of format {fmt!r}, which this calib_monai {versions()['calib_monai']} does not "
            f"read (it reads format {MANIFEST_FORMAT}): use the calib_monai that wrote it, or {fix}"
        )
    return manifest


def publish_artifacts(
    models_dir: str | os.PathLike,
    weights: str | os.PathLike,
    writers: Mapping[str, Callable[[str], Any]],
    settings: Mapping[str, Any] | None = None,
    depends: Mapping[str, str] | None = None,
    records: Mapping[str, Mapping[str, Any]] | None = None,
    weights_sha256: str | None = None,
) -> Path:
    """Publish the files ``writers`` makes (``{"calibration.pt": write(tmp_path), ...}``; an entry of the weights'
    name publishes new weights too) as the set of ``weights`` (see the module); returns the manifest's path.

    Files of the previous set not rewritten leave it and are removed. ``settings`` (what made them) and ``depends``
    (``{"validated_range.json": "calibration.pt"}``: the file it was measured with) go into each entry; ``records``:
    an entry's ``settings`` and ``versions`` as another manifest recorded them (a copied set). ``weights_sha256``:
    the bytes the files were made for; when ``weights`` holds others by then, nothing is published
    (:class:`WeightsChangedError`)."""
    folder, weights = Path(models_dir), Path(weights)
    folder.mkdir(parents=True, exist_ok=True)
    staged: dict[str, Path] = {}
    try:
        for name, write in writers.items():
            staged[name] = temporary_beside(folder / name)
            mode = staged[name].stat().st_mode & 0o7777
            with naming_write_failures(folder / name, staged[name]):  # disk full, read-only: one line naming it
                write(str(staged[name]))
            os.chmod(staged[name], mode)  # a writer may have replaced it with a file of its own
            fsync(staged[name])
        shas = {name: file_sha256(tmp) for name, tmp in staged.items()}
        if weights_sha256 is not None and weights.name not in shas:
            _check_unchanged(weights, weights_sha256)
        weights_sha = shas.get(weights.name) or weights_sha256 or file_sha256(weights)
        for name in sorted(staged, key=lambda n: n == weights.name):  # the weights renamed last
            os.replace(staged[name], folder / name)
    finally:
        for tmp in staged.values():
            if tmp.exists():
                tmp.unlink()
    fsync(folder, folder=True)
    try:
        previous = _read_manifest(folder) or {}
    except ArtifactSetError:
        previous = {}
    now = versions()
    old_weights = previous.get("artifacts", {}).get(weights.name, {})
    entries: dict[str, dict] = {}
    if old_weights.get("sha256") == weights_sha and weights.name not in shas:
        entries[weights.name] = old_weights
    else:
        shas.setdefault(weights.name, weights_sha)
    for name, sha in shas.items():
        made = {"settings": dict(settings or {}) if name != weights.name else None, "versions": now}
        made.update({k: v for k, v in (records or {}).get(name, {}).items() if k in ("settings", "versions")})
        entries[name] = {"sha256": sha, "weights_sha256": weights_sha, **made}
        if depends and depends.get(name) in shas:
            entries[name]["measured_with_sha256"] = {depends[name]: shas[depends[name]]}
    manifest = {
        "format": 1,
        "published": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "weights": {"file": weights.name, "sha256": weights_sha},
        "artifacts": entries,
    }
    text = json.dumps(manifest, indent=2) + "\n"
    path = write_text_durably(folder / MANIFEST_FILE, text)
    fsync(folder, folder=True)
    for name in CALIBRATION_SET:  # a file of the previous set that left it: no reader may pair it with the new one
        if name not in entries and name in previous.get("artifacts", {}) and (folder / name).exists():
            (folder / name).unlink()
    return path


def _check_unchanged(weights: Path, loaded: str) -> None:
    now = file_sha256(weights) if weights.is_file() else None
    if now != loaded:
        held = f"sha256 {short_sha(now)}" if now else "nothing (it was removed)"
        raise WeightsChangedError(
            f"{weights} changed while calibrate ran: it loaded the weights sha256 {short_sha(loaded)}, the file now "
            f"holds {held}; the recalibration and range fitted for the loaded weights are not published; wait for "
            "the training to finish, then run calibrate again"
        )


def copy_artifact_set(source_dir: str | os.PathLike, target_dir: str | os.PathLike) -> Path:
    """Publish the verified set of ``source_dir`` into ``target_dir`` as one unit (MONAI Label's fine-tune)."""
    source = read_artifact_set(source_dir)
    entries = (source.manifest or {}).get("artifacts", {})
    names = [WEIGHTS_FILE, *(n for n in CALIBRATION_SET if (Path(source_dir) / n).is_file())]
    writers = {n: (lambda tmp, n=n: shutil.copyfile(Path(source_dir) / n, tmp)) for n in names}
    depends = {"validated_range.json": "calibration.pt", "contours.json": "calibration.pt"}
    return publish_artifacts(target_dir, Path(target_dir) / WEIGHTS_FILE, writers, None, depends, entries)


@dataclass
class ArtifactSet:
    """The verified files of a ``models/`` folder: what to apply, and the source every output records."""

    folder: Path
    weights: Path | None
    weights_sha256: str | None = None
    calibration: Path | None = None  # the recalibration to apply (None: none)
    validated_range: Path | None = None  # the range to flag cases against (None: none applies)
    manifest: dict | None = None
    raw: bool = False  # no recalibration, asked for
    shas: dict[str, str] = field(default_factory=dict)
    range_file: Path | None = None  # a validated range on disk, applied or not

    def source(self) -> dict[str, Any]:
        """What made an output: the weights, the recalibration and the range (full SHA-256s)."""
        return {
            "weights": self.weights.name if self.weights else None,
            "weights_sha256": self.weights_sha256,
            "calibration_sha256": self.shas.get("calibration.pt") if self.calibration else None,
            "validated_range_sha256": self.shas.get("validated_range.json") if self.validated_range else None,
            "recalibration": "none (asked for)" if self.raw else ("stored" if self.calibration else "none"),
            "validated_range": "applied"
            if self.validated_range
            else (NOT_APPLICABLE if self.range_file and not self.calibration else "none"),
            "manifest": bool(self.manifest),
        }


def read_artifact_set(
    models_dir: str | os.PathLike, weights: str | os.PathLike | None = None, raw: bool = False
) -> ArtifactSet:
    """The set of ``models_dir`` checked against its ``manifest.json`` (see the module); ``weights``: model.pt."""
    folder = Path(models_dir)
    weights = Path(weights) if weights is not None else folder / WEIGHTS_FILE
    for attempt in range(READ_RETRIES):
        try:
            artifacts = _read_set(folder, weights, raw)
            break
        except ArtifactSetError:
            if attempt == READ_RETRIES - 1:
                raise
            time.sleep(READ_WAIT_S)  # a publication may be renaming its files right now
    artifacts.range_file = folder / "validated_range.json" if (folder / "validated_range.json").is_file() else None
    return artifacts


def _read_set(folder: Path, weights: Path, raw: bool) -> ArtifactSet:
    manifest = _read_manifest(folder, raw)
    weights_sha = file_sha256(weights) if weights.is_file() else None
    present = {name: folder / name for name in CALIBRATION_SET if (folder / name).is_file()}
    if manifest is None:
        return _legacy(folder, weights, weights_sha, present, raw)
    if raw:  # nothing of the set is applied
        return ArtifactSet(folder, weights, weights_sha, manifest=manifest, raw=True)
    where = folder / MANIFEST_FILE
    if weights.name != manifest["weights"]["file"]:  # other weights of the folder (epoch_<e>.pt): not this set's
        logger.warning(f"{weights} is not the weights {where} publishes a set for: no recalibration, no range applied")
        return ArtifactSet(folder, weights, weights_sha, manifest=manifest)
    listed = {n: e for n, e in manifest["artifacts"].items() if n in CALIBRATION_SET}
    stray = sorted(set(present) - set(listed))
    if stray:
        raise ArtifactSetError(
            f"{folder} holds {stray}, which {where} does not list (left by an interrupted calibrate, or copied in "
            f"from another run): delete them, or {FIX}"
        )
    if not listed:
        return ArtifactSet(folder, weights, weights_sha, manifest=manifest)
    published_for = manifest["weights"]["sha256"]
    if weights_sha is not None and weights_sha != published_for:
        raise ArtifactSetError(
            f"{weights} (sha256 {short_sha(weights_sha)}) is not the weights {where} was published for "
            f"({short_sha(published_for)}): {sorted(listed)} belong to other weights (trained again since?); {FIX}"
        )
    # a range or the readable calibration.json removed leaves a set that still belongs together (no flags then,
    # and inference says why); the calibration itself removed would serve raw probabilities against the range
    if "calibration.pt" in listed and "calibration.pt" not in present:
        raise ArtifactSetError(
            f"{folder / 'calibration.pt'} is missing, but {where} lists it (the validated range was measured on "
            f"recalibrated probabilities, and inference must not serve the raw ones against it); {FIX}"
        )
    listed = {n: e for n, e in listed.items() if n in present}
    shas = {n: file_sha256(present[n]) for n in listed}
    wrong = sorted(n for n in listed if shas[n] != listed[n]["sha256"])
    if wrong:
        detail = ", ".join(f"{n} sha256 {short_sha(shas[n])} != {short_sha(listed[n]['sha256'])}" for n in wrong)
        raise ArtifactSetError(
            f"{[str(folder / n) for n in wrong]} do not belong to the set {where} lists ({detail}): from another "
            f"calibrate run, or one killed while publishing; {FIX}"
        )
    applied = present.get("calibration.pt"), present.get("validated_range.json")
    return ArtifactSet(folder, weights, weights_sha, *applied, manifest=manifest, shas=shas)


def _legacy(folder: Path, weights: Path, weights_sha: str | None, present: dict, raw: bool) -> ArtifactSet:
    """A folder without a manifest: said in the log; its recalibration and range are applied only when their own
    records name the weights and each other (:func:`calib_monai.bundle.records.record_disagreements`)."""
    shas = {n: file_sha256(p) for n, p in present.items()}
    if raw or not present:
        logger.info(f"no {MANIFEST_FILE} in {folder}: {weights.name} is read on its own (nothing else to check)")
        return ArtifactSet(folder, weights, weights_sha, raw=raw, shas=shas)
    disagree = record_disagreements(weights, weights_sha, present, shas)
    if disagree:
        raise ArtifactSetError(
            f"no {MANIFEST_FILE} in {folder}, and its files' own records do not name each other ({'; '.join(disagree)})"
            f": they are not one set; {FIX}"
        )
    logger.warning(
        f"no {MANIFEST_FILE} in {folder}: read because the records of {sorted(present)} name {weights.name} "
        f"(sha256 {short_sha(weights_sha)}) and each other; run calibrate again to publish them with a manifest"
    )
    applied = present.get("calibration.pt"), present.get("validated_range.json")
    return ArtifactSet(folder, weights, weights_sha, *applied, shas=shas)
