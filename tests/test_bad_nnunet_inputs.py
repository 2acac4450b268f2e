"""The bad inputs of ``calib-monai calibrate-probabilities`` (issue 30) in one table: nnU-Net's own files
(``tests/data/nnunet``, written by nnU-Net's exporter) altered one way per row, and the line the command ends with
(exit 2, ``calib-monai: error: ...``) or the case it refuses to score, with the words each line must hold."""

from __future__ import annotations

import pickle
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

NNUNET = Path(__file__).resolve().parents[1] / "tests" / "data" / "nnunet"


@dataclass(frozen=True)
class Row:
    name: str
    build: Callable  # tmp -> the command's arguments
    outcome: str  # "error" (a bad argument), "refused" (a case not scored)
    words: tuple[str, ...]  # each must be in the line


def _file(path: Path) -> Path:
    path.write_text("not a folder")
    return path


def _nnunet(tmp: Path, change: Callable[[Path], None] | None = None) -> list[str]:
    shutil.copytree(NNUNET, tmp / "nnunet")
    if change is not None:
        change(tmp / "nnunet" / "predictions")
    return [str(tmp / "nnunet" / "predictions"), str(tmp / "nnunet" / "labelsTr"), str(tmp / "report")]


def _properties(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        pkl = folder / "case_001.pkl"
        properties = pickle.loads(pkl.read_bytes())
        change(properties)
        pkl.write_bytes(pickle.dumps(properties))

    return edit


def _without(*names: str) -> Callable[[Path], None]:
    return lambda folder: [(folder / n).unlink() for n in names]


def _channel_copy(folder: Path) -> None:  # a NIfTI map named <case>_0000 beside <case>: which one is scored?
    label = nib.load(str(folder.parent / "labelsTr" / "case_001.nii.gz"))
    prob = np.stack([np.asarray(label.dataobj) == c for c in range(3)], -1).astype(np.float32)
    for name in ("case_001", "case_001_0000"):
        nib.save(nib.Nifti1Image(prob, label.affine), str(folder.parent / "maps" / f"{name}.nii.gz"))


def _maps(tmp: Path) -> list[str]:
    args = _nnunet(tmp)
    (tmp / "nnunet" / "maps").mkdir()
    _channel_copy(tmp / "nnunet" / "predictions")
    return [str(tmp / "nnunet" / "maps"), *args[1:]]


def _maps_twice(tmp: Path) -> list[str]:
    args = _maps(tmp)
    (Path(args[0]) / "case_001_0000.nii.gz").unlink()
    _second_file(Path(args[0]), "case_001")
    return args


def _shifted_box(properties: dict) -> None:  # another case's crop box (same geometry and shape)
    properties["bbox_used_for_cropping"] = [[0, 6], [0, 3], [0, 5]]


def _no_geometry(drop: Callable[[dict], None]) -> Callable[[Path], None]:
    """The .pkl edited by ``drop``, the segmentation beside the .npz (the other source of the geometry) removed."""

    def edit(folder: Path) -> None:
        _properties(drop)(folder)
        (folder / "case_001.nii.gz").unlink()

    return edit


def _second_file(folder: Path, name: str) -> None:
    """``<case>.nii`` beside ``<case>.nii.gz``: the same image under the other NIfTI name."""
    image = nib.load(str(folder / f"{name}.nii.gz"))
    nib.save(nib.Nifti1Image(np.asanyarray(image.dataobj), image.affine, image.header), str(folder / f"{name}.nii"))


def _no_affine(path: Path) -> None:
    image = nib.load(str(path))
    nib.save(nib.Nifti1Image(np.asanyarray(image.dataobj), None), str(path))  # qform_code = sform_code = 0


CALIBRATE = [
    Row("ambiguous <case> and <case>_0000", lambda t: _maps(t), "refused", ("ambiguous", "case_001_0000.nii.gz")),
    Row("--num_bins=0", lambda t: [*_nnunet(t), "--num_bins=0"], "error", ("--num_bins 0", "whole number >= 1")),
    Row("--num_bins=-5", lambda t: [*_nnunet(t), "--num_bins=-5"], "error", ("--num_bins -5", "whole number")),
    Row("--num_bins=2.5", lambda t: [*_nnunet(t), "--num_bins=2.5"], "error", ("--num_bins 2.5", "whole number")),
    Row(
        "--contour_alpha=1.5",
        lambda t: [*_nnunet(t), "--contour_alpha=1.5"],
        "error",
        ("--contour_alpha 1.5", "in (0, 1)", "--contour_alpha 0.1"),
    ),
    Row(
        "--contour_risk=per-case",
        lambda t: [*_nnunet(t), "--contour_risk=per-case"],
        "error",
        ("--contour_risk", "'per-case'", "Did you mean 'per_case'?"),
    ),
    Row(
        "a corrupt .pkl",
        lambda t: _nnunet(t, lambda f: (f / "case_001.pkl").write_bytes(b"\x80\x04garbage")),
        "error",
        ("case_001.pkl", "cannot read"),
    ),
    Row(
        "an .npz without .pkl or segmentation",
        lambda t: _nnunet(t, _without("case_001.pkl", "case_001.nii.gz")),
        "refused",
        ("case_001.npz", "no case_001.pkl", "mirrored"),
    ),
    Row(
        "a .pkl whose shape_before_cropping is not the map's",
        lambda t: _nnunet(t, _properties(lambda p: p.update(shape_before_cropping=(12, 6, 11)))),
        "refused",
        ("case_001.pkl", "shape_before_cropping", "(12, 6, 11)"),
    ),
    Row(
        "the .pkl of another case",
        lambda t: _nnunet(t, _properties(_shifted_box)),
        "refused",
        ("outside the crop box", "another case"),
    ),
    Row(
        "an nnU-Net v1 .pkl naming another case",
        lambda t: _nnunet(t, _properties(lambda p: p.update(list_of_data_files=["/x/case_007_0000.nii.gz"]))),
        "refused",
        ("another case", "case_007_0000.nii.gz"),
    ),
    Row(
        "a .pkl without geometry, no segmentation",
        lambda t: _nnunet(t, _no_geometry(lambda p: p.pop("sitk_stuff"))),
        "refused",
        ("case_001.npz has a case_001.pkl without the image's geometry", "neither nibabel_stuff", "sitk_stuff"),
    ),
    Row(
        "a .pkl whose sitk_stuff lacks the direction",
        lambda t: _nnunet(t, _no_geometry(lambda p: p["sitk_stuff"].pop("direction"))),
        "refused",
        ("case_001.pkl without the image's geometry", "sitk_stuff lacks ['direction']"),
    ),
    Row(
        "<case>.nii beside <case>.nii.gz (labels)",
        lambda t: _nnunet(t, lambda f: _second_file(f.parent / "labelsTr", "case_001")),
        "refused",
        ("labelsTr/case_001.nii and ", "labelsTr/case_001.nii.gz are two files", "'case_001'", "keep one"),
    ),
    Row(
        "<case>.nii beside <case>.nii.gz (NIfTI maps)",
        lambda t: _maps_twice(t),
        "refused",
        ("maps/case_001.nii and ", "maps/case_001.nii.gz are two files", "'case_001'"),
    ),
    Row(
        "a label without an affine",
        lambda t: _nnunet(t, lambda f: _no_affine(f.parent / "labelsTr" / "case_001.nii.gz")),
        "refused",
        ("label ", "case_001.nii.gz has no usable affine", "qform_code and sform_code are both 0", "set_sform"),
    ),
    Row(
        "--surface_distances=maybe",
        lambda t: [*_nnunet(t), "--surface_distances=maybe"],
        "error",
        ("--surface_distances", "expected a boolean switch (true or false)", "'maybe'"),
    ),
    Row(
        "output_dir is a file",
        lambda t: [*_nnunet(t)[:2], str(_file(t / "report"))],
        "error",
        ("output_dir", "is a file"),
    ),
]


@pytest.mark.parametrize("row", CALIBRATE, ids=[r.name for r in CALIBRATE])
def test_calibrate_probabilities(tmp_path, monkeypatch, capsys, row):
    from calib_monai import cli

    monkeypatch.setattr(sys, "argv", ["calib-monai", "calibrate-probabilities", *row.build(tmp_path)])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and lines[-1].startswith("calib-monai: error: "), lines
    assert all(w in lines[-1] for w in row.words), lines[-1]
    assert not (tmp_path / "report" / "before").exists()  # nothing scored


def test_an_npz_without_pkl_takes_the_geometry_of_its_segmentation(tmp_path):
    """nnU-Net's own files without the .pkl: the segmentation beside the .npz gives the geometry, DSC stays 1
    (a LAS-stored map: ``tests/test_external_geometry.py``)."""
    from calib_monai.recalibration.external import calibrate_probabilities

    args = _nnunet(tmp_path, _without("case_001.pkl"))
    result = calibrate_probabilities(*args, surface_distances=False)
    assert result["comparison"]["mean_dice"]["before"] == pytest.approx(1.0)


def test_a_switch_written_false_is_false(tmp_path, monkeypatch, capsys):
    """``--write_calibrated false`` as typed (python-fire passes the string "false", which is truthy): no
    calibrated/ folder, as with ``--write_calibrated=False``."""
    from calib_monai import cli

    args = [*_nnunet(tmp_path), "--write_calibrated", "false", "--surface_distances", "no", "--contours=False"]
    monkeypatch.setattr(sys, "argv", ["calib-monai", "calibrate-probabilities", *args])
    cli.main()
    assert (tmp_path / "report" / "after").is_dir() and not (tmp_path / "report" / "calibrated").exists()
    assert "hd95" not in (tmp_path / "report" / "after" / "metrics.csv").read_text().splitlines()[0]
