"""``calibrate-probabilities`` where a prediction meets its label: geometry (orientation, position), the folders users
point it at (nnU-Net's labelsTr, segmentations without probabilities), its --help text and its reliability plot.

Expected values come from the construction: probabilities whose argmax is the label score DSC 1 when the two are read
onto the same voxels, and a map stored LAS is the RAS map with its x axis reversed (and the affine saying so), so it
must give exactly the RAS map's numbers."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from test_external_probabilities import _affine, _peaked, _random_label, _rows, _save_label, _save_nnunet

from calib_monai.recalibration import calibrate_probabilities

REPO = Path(__file__).resolve().parents[1]


def _las(affine: np.ndarray, nx: int) -> np.ndarray:
    """The affine of the same grid with its x axis stored in reverse (RAS -> LAS)."""
    flipped = affine.copy()
    flipped[:3, 0] *= -1
    flipped[:3, 3] += affine[:3, 0] * (nx - 1)
    return flipped


def _asymmetric_label() -> np.ndarray:
    label = _random_label((7, 6, 5), 3, seed=11)
    assert not np.array_equal(label, label[::-1])  # reading the x axis the wrong way round would not score DSC 1
    return label


def _save_map(folder: Path, case: str, prob_cxyz: np.ndarray, affine: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case}.nii.gz"
    nib.save(nib.Nifti1Image(np.moveaxis(prob_cxyz, 0, -1).astype(np.float32), affine), str(path))
    return path


def test_las_probability_maps_against_ras_labels_are_reoriented(tmp_path):
    """Maps stored LAS against labels stored RAS were scored voxel index against voxel index (DSC 0.384 instead of
    0.754 in the issue's case): the same voxels must give the same numbers as RAS maps."""
    label = _asymmetric_label()
    prob = _peaked(label, 3)
    _save_label(tmp_path / "labels", "case", label)
    _save_map(tmp_path / "ras", "case", prob, _affine())
    las_path = _save_map(tmp_path / "las", "case", prob[:, ::-1], _las(_affine(), label.shape[0]))
    ras = calibrate_probabilities(str(tmp_path / "ras"), str(tmp_path / "labels"), str(tmp_path / "out_ras"))
    las = calibrate_probabilities(
        str(tmp_path / "las"), str(tmp_path / "labels"), str(tmp_path / "out_las"), write_calibrated=True
    )
    rows_ras, rows_las = (_rows(tmp_path / out / "before" / "metrics.csv")[0] for out in ("out_ras", "out_las"))
    assert float(rows_las["mean_dice"]) == 1.0 and float(rows_las["mean_hd95"]) == 0.0
    assert rows_las == rows_ras and las["temperature"] == ras["temperature"]
    # the calibrated map is written back as it came: LAS, with its own affine
    written = nib.load(str(tmp_path / "out_las" / "calibrated" / las_path.name))
    np.testing.assert_allclose(written.affine, _las(_affine(), label.shape[0]))
    np.testing.assert_array_equal(np.asarray(written.dataobj).argmax(-1)[::-1], label)


def test_an_nnunet_map_stored_las_without_its_pkl_takes_the_geometry_of_its_segmentation(tmp_path):
    """Without ``<case>.pkl`` the shapes alone matched and a LAS image was scored mirrored; the segmentation nnU-Net
    writes beside the ``.npz`` (the argmax, with the image's affine) now gives the geometry; without it: refused."""
    label = _asymmetric_label()
    las = _las(_affine(), label.shape[0])
    _save_label(tmp_path / "labels", "case", label)
    _save_nnunet(tmp_path / "preds", "case", _peaked(label, 3)[:, ::-1])  # stored LAS: x reversed
    (tmp_path / "preds" / "case.pkl").unlink()
    nib.save(nib.Nifti1Image(label[::-1].astype(np.uint8), las), str(tmp_path / "preds" / "case.nii.gz"))
    calibrate_probabilities(str(tmp_path / "preds"), str(tmp_path / "labels"), str(tmp_path / "out"))
    assert float(_rows(tmp_path / "out" / "before" / "metrics.csv")[0]["mean_dice"]) == 1.0
    (tmp_path / "preds" / "case.nii.gz").unlink()
    with pytest.raises(ValueError, match=r"case.npz has no case.pkl .* and no segmentation case.nii.gz beside it"):
        calibrate_probabilities(str(tmp_path / "preds"), str(tmp_path / "labels"), str(tmp_path / "out2"))


def test_an_nnunet_map_whose_pkl_swaps_its_axes_is_refused_not_scored_as_stored(tmp_path):
    """The array's shape matches the label's only as stored: its ``.pkl`` says x and y are swapped, so (7, 6, 5)
    voxels lie as (6, 7, 5) in RAS order. It was scored voxel against voxel as stored, without a word."""
    import pickle

    label = _asymmetric_label()
    _save_label(tmp_path / "labels", "case", label)
    _save_nnunet(tmp_path / "preds", "case", _peaked(label, 3))
    pkl = tmp_path / "preds" / "case.pkl"
    properties = pickle.loads(pkl.read_bytes())
    properties["sitk_stuff"]["direction"] = (0, -1.0, 0, -1.0, 0, 0, 0, 0, 1.0)  # x and y swapped
    pkl.write_bytes(pickle.dumps(properties))
    with pytest.raises(ValueError) as err:
        calibrate_probabilities(str(tmp_path / "preds"), str(tmp_path / "labels"), str(tmp_path / "out"))
    message = str(err.value)
    assert f"the probabilities {tmp_path / 'preds' / 'case.npz'} have shape (3, 5, 6, 7)" in message
    assert "orders the axes otherwise than the label's" in message and "check that the .pkl belongs" in message
    assert not (tmp_path / "out" / "before").exists()


@pytest.mark.parametrize("fmt", ["nifti", "nnunet"])
def test_a_label_40_mm_off_its_prediction_is_an_error_naming_both_files(tmp_path, fmt):
    label = _asymmetric_label()
    shifted = _affine()
    shifted[0, 3] += 40.0
    _save_label(tmp_path / "labels", "case", label, shifted)
    if fmt == "nifti":
        _save_map(tmp_path / "preds", "case", _peaked(label, 3), _affine())
        prediction = tmp_path / "preds" / "case.nii.gz"
    else:
        _save_nnunet(tmp_path / "preds", "case", _peaked(label, 3))  # .pkl: SimpleITK's view of _affine()
        prediction = tmp_path / "preds" / "case.npz"
    with pytest.raises(ValueError) as err:
        calibrate_probabilities(str(tmp_path / "preds"), str(tmp_path / "labels"), str(tmp_path / "out"))
    message = str(err.value)
    assert (
        f"the probabilities {prediction} do not lie on the grid of the label {tmp_path / 'labels' / 'case.nii.gz'}"
        in message
    )
    assert "40 mm apart" in message and not (tmp_path / "out" / "before").exists()


def test_nnunet_segmentations_without_probabilities_say_how_to_get_them(tmp_path):
    label = _asymmetric_label()
    _save_label(tmp_path / "labels", "case", label)
    _save_label(tmp_path / "preds", "case", label)  # nnUNetv2_predict without --save_probabilities: label maps only
    (tmp_path / "preds" / "plans.json").write_text("{}")
    with pytest.raises(FileNotFoundError) as err:
        calibrate_probabilities(str(tmp_path / "preds"), str(tmp_path / "labels"), str(tmp_path / "out"))
    message = str(err.value)
    assert message.startswith(
        f"{tmp_path / 'preds'} holds segmentations (1 <case>.nii.gz label maps) but no probabilities (<case>.npz)"
    )
    assert "run nnUNetv2_predict again with --save_probabilities" in message


def _documented_arguments() -> dict[str, str]:
    """Each argument of calibrate_probabilities' docstring with its whole description, read independently of fire."""
    doc = inspect.getdoc(calibrate_probabilities)
    args = doc.split("Args:\n", 1)[1].split("\n\n", 1)[0]
    entries = re.split(r"\n(?=    \w+: )", "\n" + args)
    out = {}
    for entry in filter(None, (e.strip() for e in entries)):
        name, text = entry.split(": ", 1)
        out[name] = " ".join(text.split())
    return out


def test_help_shows_every_argument_with_its_whole_description():
    """--help showed "... it the temperature is fitted" under output_dir, nothing for --fit_predictions/--fit_labels
    and a cut-off --empty_class."""
    result = subprocess.run(
        [sys.executable, "-m", "calib_monai.cli", "calibrate-probabilities", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    help_text = " ".join((result.stdout + result.stderr).split())  # fire writes help to stderr without a terminal
    documented = _documented_arguments()
    assert set(documented) == set(inspect.signature(calibrate_probabilities).parameters)
    for name, text in documented.items():
        assert text in help_text, name
    assert not re.search(r"\bit the temperature", help_text)


def test_reliability_plot_says_pooled_and_which_voxels(tmp_path, monkeypatch):
    """The plot showed the pooled ECE as "ECE" under "Reliability (N volumes)", while the log leads with the mean."""
    import calib_monai.metrics.report_table as saver
    from calib_monai.metrics.calibration import plot_reliability

    calls = []
    monkeypatch.setattr(saver, "save_reliability_diagram", lambda data, path, **kw: calls.append((data, kw)))
    for i in range(2):
        label = _random_label((6, 5, 4), 3, seed=20 + i)
        _save_map(tmp_path / "preds", f"case_{i}", 0.5 * _peaked(label, 3) + 0.5 / 3, _affine())
        _save_label(tmp_path / "labels", f"case_{i}", label)
    calibrate_probabilities(
        str(tmp_path / "preds"), str(tmp_path / "labels"), str(tmp_path / "out"), surface_distances=False
    )
    data, kwargs = calls[0]  # before/
    assert kwargs["ece_label"] == "pooled ECE"
    assert (
        " ".join(kwargs["title"].split()) == "Reliability, pooled over all ground-truth foreground voxels of 2 volumes"
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    drawn = plot_reliability(ax, data, kwargs["title"], kwargs["ece_label"])
    pooled = json.loads((tmp_path / "out" / "before" / "summary.json").read_text())["pooled"]["pooled_ece"]
    assert drawn == pytest.approx(pooled, abs=1e-12)  # the number drawn is the pooled one, and is called so
    assert ax.get_legend().get_title().get_text() == f"pooled ECE = {pooled:.4f}"
    plt.close(fig)
