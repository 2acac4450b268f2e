"""MONAI Label serving (calib_monai/label): a real ``monailabel start_server`` from ``.venv-label`` on 127.0.0.1
(``tests/label_server.py``: the served bundles and the helpers).

What the server returns is compared with the bundle's own ``inferring`` run on the same file (main environment,
another process), and the JSON summary with numpy on the returned files.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from calib_monai.bundle import TrainedBundle
from calib_monai.label import InputError, ServedBundle, confidence_summary
from conftest import REPO_ROOT
from label_server import (
    AFFINE,
    FULL_SIZE,
    FULL_SPACING,
    LABEL_NAMES,
    REVIEW_NAMES,
    SHAPE,
    _get_json,
    _infer,
    _multipart,
    _nifti,
    _post,
    _reference,
    _write_images,
    needs_label_env,
)

# the fixture scripts a network for model.ts; torch >= 2.10 flags every torch.jit call as deprecated
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")


@needs_label_env
def test_info_lists_the_tasks_of_every_bundle_with_weights(server):
    info = _get_json(f"{server['url']}/info/")
    models = info["models"]
    # ce_dice_hpc has no weights: not offered
    served = ("confident_flare", "loop_flare", "nacl_flare", "nacl_flare_calibrated", "nacl_flare_ts")
    assert sorted(models) == sorted(f"{b}{s}" for b in served for s in ("", "_confidence", "_review", "_margins"))
    assert models["nacl_flare"]["type"] == "segmentation"
    assert models["nacl_flare_confidence"]["type"] == "others"
    assert models["nacl_flare_review"]["type"] == "segmentation"  # listed by Slicer's segmentation selector
    for name, task in models.items():
        if name.endswith("_review"):  # confident and uncertain part of each structure, consecutive values
            assert task["labels"] == REVIEW_NAMES
            assert task["config"] == {"uncertainty_threshold": 0.8}  # a scalar: Slicer's options table takes it
        elif name.endswith("_margins"):  # outer band, prediction and inner contour of each structure, consecutive
            percent = "50%" if name == "loop_flare_margins" else "90%"  # loop_flare's contours: contour_alpha 0.5
            assert list(task["labels"].values()) == list(range(13)) and task["type"] == "segmentation"
            assert list(task["labels"])[1:4] == [
                f"liver (outer {percent})",
                "liver (predicted)",
                f"liver (inner {percent})",
            ]
        else:
            assert task["labels"] == {name: value for value, name in LABEL_NAMES.items()}
            assert task["config"] == {}
        assert task["dimension"] == 3
    assert set(info["scoring"]) == {f"{b}_case_quality" for b in (*served, "ce_dice_hpc")}
    bundles = (*served, "ce_dice_hpc")
    kinds = ("most_typical", "typical_least_confident", "least_confident")
    assert set(info["strategies"]) == {f"{b}_{kind}" for b in bundles for kind in kinds}
    assert next(iter(info["strategies"])).endswith("_most_typical")  # first: Slicer's Next Sample default
    assert set(info["trainers"]) == {*served, "ce_dice_hpc"}


@needs_label_env
def test_segmentation_equals_the_bundle_inference_run_with_its_summary(server, tmp_path):
    status, kind, body = _infer(server, "nacl_flare", server["images"]["case"])
    assert status == 200, body[:2000]
    parts = _multipart(kind, body)
    params = json.loads(parts["params"])
    seg = _nifti(parts["image"], tmp_path / "seg.nii.gz")
    assert seg.shape == SHAPE
    np.testing.assert_allclose(seg.affine, AFFINE, atol=1e-5)
    labels = np.asarray(seg.dataobj)
    assert set(np.unique(labels).tolist()) <= set(LABEL_NAMES)
    ref_seg, ref_conf = _reference(server)
    np.testing.assert_array_equal(labels, ref_seg)

    # every label named, in value order: Slicer names the segments by position (value i: the i-th name after
    # "background"), so a name left out would shift the others (issue 22; it sent only the labels present before)
    assert params["label_names"] == {name: value for value, name in LABEL_NAMES.items()}
    summary = params["confidence_summary"]
    assert set(summary) == set(LABEL_NAMES.values())
    for value, name in LABEL_NAMES.items():  # recomputed here from the reference files
        entry, inside = summary[name], ref_conf[ref_seg == value].astype(np.float64)
        assert entry["label"] == value and entry["voxels"] == inside.size
        if inside.size:
            assert entry["mean_confidence"] == pytest.approx(inside.mean(), abs=1e-6)
            assert entry["fraction_below_0.5"] == pytest.approx((inside < 0.5).mean(), abs=1e-9)
            assert entry["fraction_below_0.8"] == pytest.approx((inside < 0.8).mean(), abs=1e-9)
            assert 0 <= entry["fraction_below_0.5"] <= entry["fraction_below_0.8"] <= 1
            assert 0 < entry["mean_confidence"] <= 1
    assert sum(e["voxels"] for e in summary.values()) == int(np.prod(SHAPE))
    # the case quality is the inferring run's <case>_quality.json (no validated range stored: no flag, and why)
    reference = json.loads((server["reference"] / "case_quality.json").read_text())
    assert params["quality"]["case_score"] == pytest.approx(reference["case_score"], rel=1e-6)
    assert params["quality"]["review"] == reference["review"] and params["quality"]["review"]["flag"] is None


@needs_label_env
def test_confidence_map_is_float32_on_the_input_grid(server, tmp_path):
    status, kind, body = _infer(server, "nacl_flare_confidence", server["images"]["case"])
    assert status == 200, body[:2000]
    parts = _multipart(kind, body)
    conf = _nifti(parts["image"], tmp_path / "conf.nii.gz")
    assert conf.shape == SHAPE and conf.get_data_dtype() == np.float32
    np.testing.assert_allclose(conf.affine, AFFINE, atol=1e-5)
    values = np.asarray(conf.dataobj)
    assert values.min() >= 1 / len(LABEL_NAMES) - 1e-6 and values.max() <= 1 + 1e-6
    np.testing.assert_allclose(values, _reference(server)[1], rtol=0, atol=1e-6)
    stats = json.loads(parts["params"])["confidence"]
    assert stats == pytest.approx({"min": values.min(), "mean": values.mean(dtype=np.float64), "max": values.max()})


@needs_label_env
def test_torchscript_weights_serve_the_same(server, tmp_path):
    status, _, body = _infer(server, "nacl_flare_ts_confidence", server["images"]["case"], output="image")
    assert status == 200, body[:2000]
    np.testing.assert_allclose(
        np.asarray(_nifti(body, tmp_path / "c.nii.gz").dataobj), _reference(server)[1], rtol=0, atol=1e-5
    )


@needs_label_env
def test_a_calibrated_bundle_serves_the_calibrated_confidence(server, tmp_path):
    # T = 100 divides logits of a few units to a few hundredths: the softmax is nearly uniform over the 5 classes
    status, _, body = _infer(server, "nacl_flare_calibrated_confidence", server["images"]["case"], output="image")
    assert status == 200, body[:2000]
    confidence = np.asarray(_nifti(body, tmp_path / "c.nii.gz").dataobj)
    assert confidence.min() >= 0.2 - 1e-6 and confidence.max() < 0.3
    # a temperature above 1 can only lower the top probability:
    # max_k softmax(z / T)_k = 1 / sum_j exp(-(z_max - z_j) / T)
    assert (confidence <= _reference(server)[1] + 1e-6).all()
    status, kind, body = _infer(server, "nacl_flare_calibrated", server["images"]["case"])
    assert status == 200, body[:2000]
    parts = _multipart(kind, body)
    # the argmax of the calibrated probabilities on the network's grid, mapped back to the input grid (nearest), as
    # the bundle's own chain gives it
    expected = TrainedBundle(server["app"] / "model" / "nacl_flare_calibrated").predict(server["images"]["case"])
    served = np.asarray(_nifti(parts["image"], tmp_path / "s.nii.gz").dataobj)
    np.testing.assert_array_equal(served, expected.segmentation[0].numpy())
    # its stored validated range flags the case for review, with the reason
    review = json.loads(parts["params"])["quality"]["review"]
    # (the first reason may be the site monitor's alarm: every image this tiny model segments ranks below the range)
    reason = next(r for r in review["reasons"] if "is among the lowest" in r)
    assert review["flag"] is True and "is among the lowest" in reason and "lowest validation score is 0.990" in reason
    assert "far beyond the others, which barely vary" in reason  # the 19 validation scores are all 0.990


@needs_label_env
def test_the_site_monitor_beside_the_datastore_counts_an_image_once_and_info_shows_it(server):
    for _ in range(2):  # the same image twice: one case of the stream
        status, kind, body = _infer(server, "nacl_flare_calibrated", server["images"]["case"])
        assert status == 200, body[:2000]
    site = json.loads(_multipart(kind, body)["params"])["quality"]["site"]
    folder = server["root"] / "studies" / "calib_monai_site" / "nacl_flare_calibrated"
    assert site["monitored"] is True and site["file"] == str(folder / "site.json") and site["cases"] >= 1
    shown = _get_json(f"{server['url']}/info/")["calib_monai_site"]
    assert shown["nacl_flare_calibrated"]["cases"] == site["cases"]
    assert shown["nacl_flare_calibrated"]["alarm"] is site["alarm"]
    assert shown["nacl_flare"]["cases"] == 0  # no recalibration, so no range applies: nothing is counted


@needs_label_env
def test_a_corrupt_site_state_is_a_503_naming_the_fix_and_a_reset_serves_again(server, tmp_path):
    from calib_monai.data.phantoms import generate_phantom
    from calib_monai.review import reset_site

    folder = server["root"] / "studies" / "calib_monai_site" / "nacl_flare_calibrated"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "site.json").write_text("{oops")
    image, _, _ = generate_phantom(seed=12, index=0, shape=SHAPE, spacing=(4.0, 4.0, 10.0))
    path = tmp_path / "unseen.nii.gz"  # content no earlier request sent: the chain runs
    nib.save(nib.Nifti1Image(image, AFFINE), str(path))
    status, _, body = _infer(server, "nacl_flare_calibrated", path)
    detail = json.loads(body)["detail"]
    assert status == 503 and f"site state {folder / 'site.json'} is corrupt" in detail
    assert f"calib-monai site reset {folder}" in detail
    reset_site(folder)  # the fix it names
    status, _, body = _infer(server, "nacl_flare_calibrated", path)
    assert status == 200, body[:2000]


@needs_label_env
def test_a_full_size_ct_is_served_by_a_confident_calibrated_bundle(server, tmp_path):
    # 512 x 512 x 200 at 0.8 x 0.8 x 2.5 mm: the confidence mapped back holds exact ones, whose float32
    # interpolation rounds above 1 (the served chain clips the rounding where it makes it)
    status, kind, body = _infer(server, "confident_flare", server["images"]["full_size"])
    assert status == 200, body[:2000]
    parts = _multipart(kind, body)
    segmentation = _nifti(parts["image"], tmp_path / "s.nii.gz")
    assert segmentation.shape == FULL_SIZE
    np.testing.assert_allclose(segmentation.header.get_zooms(), FULL_SPACING, rtol=1e-6)
    quality = json.loads(parts["params"])["quality"]
    assert 0 <= quality["case_score"] <= 1


@needs_label_env
@pytest.mark.parametrize(
    "model, image, status, message",
    [
        ("no_such_model", "case", 404, "no model 'no_such_model'"),
        ("ce_dice_hpc", "case", 404, "has no weights"),
        ("nacl_flare", "corrupt", 400, "cannot read the uploaded image as NIfTI"),
        ("nacl_flare", "truncated", 400, "truncated"),
        ("nacl_flare", "flat", 422, "2 dimensions"),
        ("nacl_flare_confidence", "four", 422, "4 dimensions"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_message(server, model, image, status, message):
    code, kind, body = _infer(server, model, server["images"][image])
    assert code == status, body[:2000]
    assert "json" in kind and message in json.loads(body)["detail"]


@needs_label_env
def test_still_serving_after_bad_requests(server, tmp_path):
    _infer(server, "nacl_flare", server["images"]["corrupt"])
    status, _, body = _infer(server, "nacl_flare", server["images"]["case"], output="image")
    assert status == 200, body[:2000]
    np.testing.assert_array_equal(np.asarray(_nifti(body, tmp_path / "s.nii.gz").dataobj), _reference(server)[0])

    # served files are removed: the other map is never written, the sent one is removed by a MONAI Label background
    # task after the response (uploads of failed requests: test_failed_requests_leave_no_file_behind)
    def served_files():  # the answers lie in <tmp>/calib_monai_results, out of the client's way
        return [path for path in (server["root"] / "tmp").rglob("calib_monai_*") if path.is_file()]

    deadline = time.monotonic() + 10
    while served_files() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not served_files()


@needs_label_env
@pytest.mark.parametrize(
    "model, image, status",
    [
        ("nacl_flare", "corrupt", 400),
        ("nacl_flare_confidence", "flat", 422),
        ("no_such_model", "case", 404),
        ("ce_dice_hpc", "case", 404),
    ],
)
def test_failed_requests_leave_no_file_behind(server, model, image, status):
    """MONAI Label copies each upload into TMPDIR (the server's own here) and removes it only after a response."""
    tmp = server["root"] / "tmp"
    before = set(tmp.iterdir())
    code, _, body = _infer(server, model, server["images"][image])
    assert code == status, body[:2000]
    assert set(tmp.iterdir()) - before == set()  # earlier requests' files may go meanwhile; none may come


@needs_label_env
@pytest.mark.parametrize(
    "file, params, message", [(False, None, "no image to segment"), (True, "{not json", "'params' is not JSON")]
)
def test_requests_without_an_image_or_with_bad_params_get_a_4xx_with_a_message(server, file, params, message):
    tmp = server["root"] / "tmp"
    before = set(tmp.iterdir())
    code, kind, body = _post(f"{server['url']}/infer/nacl_flare", server["images"]["case"] if file else None, params)
    assert code == 400, body[:2000]
    assert "json" in kind and message in json.loads(body)["detail"]
    assert set(tmp.iterdir()) - before == set()


@needs_label_env
@pytest.mark.parametrize("threshold", [1.5, 0, "high"])
def test_a_bad_uncertainty_threshold_is_a_422_naming_it(server, threshold):
    params = {"uncertainty_threshold": threshold}
    code, kind, body = _post(f"{server['url']}/infer/nacl_flare_review", server["images"]["case"], params)
    assert code == 422, body[:2000]
    assert "json" in kind and "uncertainty_threshold must be a number in (0, 1]" in json.loads(body)["detail"]


@needs_label_env
def test_both_tasks_of_an_image_cost_one_inference(server, tmp_path):
    """Slicer asks for ``<bundle>`` then ``<bundle>_confidence``, uploading the image each time: one inference."""
    from calib_monai.data.phantoms import generate_phantom

    image, _, _ = generate_phantom(seed=11, index=0, shape=SHAPE, spacing=(4.0, 4.0, 10.0))
    path = tmp_path / "new.nii.gz"  # content that no earlier request sent
    nib.save(nib.Nifti1Image(image, AFFINE), str(path))
    log = server["log"]
    runs, reuses = log.read_text().count("nacl_flare: segmented "), log.read_text().count("prediction reused")
    for model in ("nacl_flare", "nacl_flare_confidence"):
        status, _, body = _infer(server, model, path, output="image")
        assert status == 200, body[:2000]
    assert log.read_text().count("nacl_flare: segmented ") == runs + 1
    assert log.read_text().count("prediction reused") == reuses + 1


# main environment only (no server): the summary, the upload checks and the prediction kept for the second task


def test_served_bundle_reuses_the_last_prediction(served_folder, tmp_path):
    """The same image content (a new upload of the same bytes) costs no network call; other content does."""
    served = ServedBundle(served_folder["app"] / "model" / "nacl_flare", device="cpu")
    calls = []
    served.bundle.network.register_forward_pre_hook(lambda module, args: calls.append(1))
    case = served_folder["images"]["case"]
    first = served.predict(str(case))
    assert calls
    count = len(calls)
    upload = tmp_path / "tmp_upload.nii.gz"
    shutil.copy(case, upload)
    assert served.predict(str(upload)) is first and len(calls) == count
    # the two files of the two tasks: the bundle's inferring outputs, under names of their own
    paths = [Path(served.save(first, key)) for key in ("segmentation", "confidence", "confidence")]
    try:
        assert paths[0].name.startswith("calib_monai_nacl_flare_") and paths[0].name.endswith("_seg.nii.gz")
        ref_seg, ref_conf = _reference(served_folder)
        np.testing.assert_array_equal(np.asarray(nib.load(str(paths[0])).dataobj), ref_seg)
        np.testing.assert_allclose(np.asarray(nib.load(str(paths[1])).dataobj), ref_conf, rtol=0, atol=1e-6)
        assert paths[1] != paths[2]  # every request gets its own file
    finally:
        for path in paths:
            path.unlink()
    other = tmp_path / "other.nii.gz"
    nib.save(nib.Nifti1Image(np.asarray(nib.load(str(case)).dataobj)[::-1].copy(), AFFINE), str(other))
    served.predict(str(other))
    assert len(calls) > count


def test_confidence_summary_by_hand():
    seg = np.array([[0, 1, 1], [1, 2, 2]])
    conf = np.array([[0.9, 0.4, 0.6], [0.85, 0.7, 0.79]], dtype=np.float32)
    summary = confidence_summary(seg, conf, {0: "bg", 1: "a", 2: "b", 3: "absent"})
    assert summary["a"] == pytest.approx(
        {
            "label": 1,
            "voxels": 3,
            "mean_confidence": (0.4 + 0.6 + 0.85) / 3,
            "fraction_below_0.5": 1 / 3,
            "fraction_below_0.8": 2 / 3,
        }
    )
    assert summary["b"]["fraction_below_0.8"] == 1.0 and summary["bg"]["fraction_below_0.5"] == 0.0
    assert summary["absent"] == {
        "label": 3,
        "voxels": 0,
        "mean_confidence": None,
        "fraction_below_0.5": None,
        "fraction_below_0.8": None,
    }


def test_upload_checks_name_the_problem(tmp_path):
    served = ServedBundle(REPO_ROOT / "bundles" / "nacl_brats")  # 4 channels: a (H, W, D, 4) NIfTI
    paths = _write_images(tmp_path)
    with pytest.raises(InputError, match=r"\(H, W, D, 4\).*3 dimensions") as err:
        served.check_upload(str(paths["case"]))
    assert err.value.status == 422
    with pytest.raises(InputError, match="as NIfTI") as err:
        served.check_upload(str(paths["corrupt"]))
    assert err.value.status == 400
    four = tmp_path / "four4.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 3, 4), np.float32), np.eye(4)), str(four))
    served.check_upload(str(four))
    with pytest.raises(InputError, match="no such image in the datastore") as err:
        served.check_upload("")  # what MONAI Label's datastore gives for an id it does not hold
    assert err.value.status == 404


def test_margins_label_map_by_hand():
    """Outer bands first (the kidney's over the liver's), then the predictions, then the inner contours."""
    from calib_monai.label.margins import margins_label_map, margins_label_names

    segmentation = np.array([[0, 1, 1, 2, 2, 0]])
    inner = np.array([[[0, 0, 1, 0, 0, 0]], [[0, 0, 0, 1, 0, 0]]])
    outer = np.array([[[1, 1, 1, 1, 0, 0]], [[0, 0, 1, 1, 1, 1]]])
    margins = margins_label_map(segmentation, inner, outer)
    assert margins.dtype == np.uint8 and margins.tolist() == [[1, 2, 3, 6, 5, 4]]
    assert margins_label_names({0: "background", 1: "liver", 2: "kidney"}, 0.1) == {
        "background": 0,
        "liver (outer 90%)": 1,
        "liver (predicted)": 2,
        "liver (inner 90%)": 3,
        "kidney (outer 90%)": 4,
        "kidney (predicted)": 5,
        "kidney (inner 90%)": 6,
    }
    with pytest.raises(ValueError, match=r"the contours \(1, 1, 6\) / \(2, 1, 6\) are not one volume per structure"):
        margins_label_map(segmentation, inner[:1], outer)
