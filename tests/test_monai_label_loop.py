"""The annotation loop on a real MONAI Label server (``tests/label_server.py``), driven by MONAI Label's own client
with the parameters 3D Slicer's module sends (``tests/label_client.py``, run in the label environment): the review
task, Next Sample by case quality, training from submitted labels, a failing and a stopped training, and concurrent
requests. The loop trains ``loop_flare`` only; the other bundles keep the weights the inference tests compare."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from calib_monai.label.selection import next_to_label
from conftest import REPO_ROOT
from label_server import AFFINE, LABEL_ENV, REVIEW_NAMES, _get_json, needs_label_env

pytestmark = [needs_label_env, pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")]
BUNDLE = "loop_flare"


def _client(server, command: str, **arguments):
    done = subprocess.run(
        [
            str(LABEL_ENV / "bin" / "python"),
            str(REPO_ROOT / "tests" / "label_client.py"),
            server["url"],
            command,
            json.dumps(arguments),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{command} {arguments}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _request_scoring(server, method: str) -> dict:
    """``POST /scoring/<method>`` (no client method for it); a 429 while the start-up scoring runs: try again."""
    request = urllib.request.Request(
        f"{server['url']}/scoring/{method}", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )

    def attempt():
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            if err.code != 429:
                raise
            return None

    return _wait(attempt, f"POST /scoring/{method} accepted")


def _wait(check, what: str, timeout: float = 900.0, every: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"{what}: not within {timeout:.0f} s")


def _scores(server) -> dict[str, dict]:
    """``info["calib_monai"][loop_flare]`` of every image of the datastore."""
    objects = _get_json(f"{server['url']}/datastore/?output=all")["objects"]
    return {
        image: (entry.get("image", {}).get("info", {}).get("calib_monai") or {}).get(BUNDLE, {})
        for image, entry in objects.items()
    }


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _scoring_done(server):
    status = _get_json(f"{server['url']}/scoring/?all=true")
    tasks = status if isinstance(status, list) else [status]
    return tasks and all(t.get("status") in ("DONE", "ERROR", "STOPPED") for t in tasks)


def _train_status(server) -> dict:
    return _client(server, "train_status")


def test_review_task_names_every_value_and_covers_the_segmentation(server):
    image = str(server["images"]["case"])
    out = _client(server, "compare", image=image, bundle=BUNDLE)
    names = out["review"]["info"]["label_names"]
    assert names == REVIEW_NAMES
    assert set(out["review"]["values"]) <= set(names.values())  # exactly the values label_names names
    assert out["same_support"] and out["same_structures"]  # the segments cover the segmentation, nothing more
    info = out["review"]["info"]
    assert info["uncertainty_threshold"] == 0.8
    assert set(info["uncertain_fraction"]) == {"liver", "kidney", "spleen", "pancreas"}
    review = info["quality"]["review"]  # the case quality and its flag, against loop_flare's validated range
    # null: the fixture validated on one phantom, too few for the input rule to judge (validated_range.py)
    assert review["flag"] in (True, False, None) and review["validation_volumes"] >= 1
    # a stricter threshold can only mark more voxels uncertain
    stricter = _client(server, "compare", image=image, bundle=BUNDLE, threshold=0.99)
    assert stricter["uncertain_voxels"] >= out["uncertain_voxels"]


def test_margins_task_serves_the_contours_as_nested_named_segments(server, tmp_path):
    """``loop_flare_margins`` with Slicer's parameters: per structure "(outer 50%)", "(predicted)" and "(inner 50%)"
    (alpha 0.5: the fixture's contour set), every value named in order, the predicted and inner segments exactly the
    segmentation, the map the one made from ``TrainedBundle.predict``'s contours, and the guarantee in the JSON."""
    from calib_monai.bundle import TrainedBundle
    from calib_monai.label.margins import margins_label_map

    image = str(server["images"]["case"])
    out = _client(server, "margins", image=image, bundle=BUNDLE, save_to=str(tmp_path / "margins.npy"))
    names = out["info"]["label_names"]
    expected_names = {"background": 0}
    for k, name in enumerate(["liver", "kidney", "spleen", "pancreas"], start=1):
        expected_names.update({f"{name} (outer 50%)": 3 * k - 2, f"{name} (predicted)": 3 * k - 1})
        expected_names[f"{name} (inner 50%)"] = 3 * k
    assert names == expected_names and list(names.values()) == list(range(13))  # consecutive: Slicer names by position
    assert set(out["values"]) <= set(names.values())
    assert out["same_support"] and out["same_structures"]
    contours = out["info"]["quality"]["contours"]
    assert (contours["alpha"], contours["epsilon"], contours["risk"]) == (0.5, 0.02, "per_case")
    assert "holds at least 0.98 of the true structure" in contours["guarantee"]
    assert set(contours["classes"]) == {"liver", "kidney", "spleen", "pancreas"}
    assert all(e["inner_ml"] <= e["predicted_ml"] <= e["outer_ml"] for e in contours["classes"].values())
    # the map of the bundle's own contours for this image (main environment, TrainedBundle.predict)
    prediction = TrainedBundle(server["root"] / "app" / "model" / BUNDLE).predict(image)
    inner, outer = (prediction.contours[kind].numpy() for kind in ("inner", "outer"))
    expected = margins_label_map(prediction.segmentation[0].numpy(), inner, outer)
    np.testing.assert_array_equal(np.load(tmp_path / "margins.npy"), expected)
    # what the JSON says of each outer contour is what the map holds (mL of 4 x 4 x 10 mm voxels), up to the nearest
    # mapping: the JSON measures the contours on the network's grid, the map is delivered on the input's (the inner
    # contours, a few voxels here, are too small for that comparison)
    for k, name in enumerate(["liver", "kidney", "spleen", "pancreas"], start=1):
        assert contours["classes"][name]["outer_ml"] == pytest.approx(outer[k - 1].sum() * 0.16, rel=0.15)
    # a bundle without a contour set: refused with why and the fix
    refused = _client(server, "infer", model="nacl_flare_margins", image=image)["refused"]
    assert "409" in refused and "nacl_flare' has no contours for this image" in refused, refused


def test_next_sample_hands_out_the_least_confident_image_once(server):
    _request_scoring(server, f"{BUNDLE}_case_quality")
    scores = _wait(
        lambda: (s := _scores(server)) and all(v.get("case_score") is not None for v in s.values()) and s,
        "scoring every datastore image",
    )
    assert len(scores) == 4 and len({v["weights_sha256"] for v in scores.values()}) == 1
    lowest = min(scores, key=lambda i: scores[i]["case_score"])
    first = _client(server, "next_sample", strategy=f"{BUNDLE}_least_confident", client_id="annotator-a")
    assert first["id"] == lowest and first["case_score"] == pytest.approx(scores[lowest]["case_score"])
    # another annotator does not get the image the first one has just received: the next least confident
    second = _client(server, "next_sample", strategy=f"{BUNDLE}_least_confident", client_id="annotator-b")
    rest = {i: v for i, v in scores.items() if i != lowest}
    assert second["id"] == min(rest, key=lambda i: rest[i]["case_score"])
    # the first annotator asking again gets its image back (it is still the least confident, and reserved for it)
    assert _client(server, "next_sample", strategy=f"{BUNDLE}_least_confident", client_id="annotator-a")["id"] == lowest
    # a misspelt strategy: 404 naming the served ones, not MONAI Label's 500
    refused = _client(server, "next_sample", strategy=f"{BUNDLE}_least_confdent", client_id="annotator-a")["refused"]
    assert "404" in refused and f"{BUNDLE}_least_confdent" in refused and f"{BUNDLE}_most_typical" in refused


@pytest.mark.parametrize("kind, by_score", [("most_typical", False), ("typical_least_confident", True)])
def test_typical_next_sample_follows_the_stored_scores_and_features(server, kind, by_score):
    _request_scoring(server, f"{BUNDLE}_case_quality")
    scores = _wait(
        lambda: (s := _scores(server)) and all(v.get("features") for v in s.values()) and s,
        "scoring every datastore image with its features",
    )
    assert len({len(v["features"]) for v in scores.values()}) == 1  # one pooled vector per image, same weights
    ids = sorted(i for i in scores if i not in _labelled(server))
    candidates = np.array([scores[i]["case_score"] for i in ids]), np.array([scores[i]["features"] for i in ids])
    expected = ids[next_to_label(*candidates, by_score=by_score)]
    strategy = f"{BUNDLE}_{kind}"
    first = _client(server, "next_sample", strategy=strategy, client_id=f"{kind}-a")
    assert first["id"] == expected and first["case_score"] == pytest.approx(scores[expected]["case_score"])
    # another annotator gets another image; the first one asking again gets its own back
    assert _client(server, "next_sample", strategy=strategy, client_id=f"{kind}-b")["id"] != expected
    assert _client(server, "next_sample", strategy=strategy, client_id=f"{kind}-a")["id"] == expected


def _labelled(server) -> set[str]:
    objects = _get_json(f"{server['url']}/datastore/?output=all")["objects"]
    return {image for image, entry in objects.items() if entry.get("labels", {}).get("final")}


SLICER_ORDER = ["pancreas", "spleen", "kidney", "liver", "liver (uncertain)"]


def _submit_labels(server, count: int, answers: list | None = None) -> list[str]:
    """Ground-truth labels of the datastore phantoms, saved as Slicer saves them: segment i has value i + 1, in the
    order of its label_info (here the reverse of the bundle's, with part of the liver as "liver (uncertain)");
    ``answers`` collects the server's answers."""
    from calib_monai.data.phantoms import generate_phantom

    order = SLICER_ORDER
    saved = []
    for index in range(count):
        image_id = f"study_{index}"
        shape = (40 + 4 * index, 36, 10)
        _, label, _ = generate_phantom(seed=20 + index, index=0, shape=shape, spacing=(4.0, 4.0, 10.0))
        slicer = np.zeros_like(label, dtype=np.int16)
        for position, name in enumerate(order[:4]):
            slicer[label == {"liver": 1, "kidney": 2, "spleen": 3, "pancreas": 4}[name]] = position + 1
        slicer[(label == 1) & (np.arange(shape[2]) < 3)[None, None, :]] = 5  # the uncertain part of the liver
        path = server["root"] / "tmp" / f"label_{image_id}.nii.gz"
        nib.save(nib.Nifti1Image(slicer, AFFINE), str(path))
        label_info = [{"name": name, "idx": position + 1} for position, name in enumerate(order)]
        answer = _client(server, "save_label", image_id=image_id, label=str(path), params={"label_info": label_info})
        if answers is not None:
            answers.append(answer)
        saved.append(image_id)
    return saved


def test_a_saved_label_re_anchors_the_served_case_score(server):
    from calib_monai.bundle import TrainedBundle
    from calib_monai.data.phantoms import generate_phantom

    answers = []
    _submit_labels(server, 1, answers)
    assert answers[0]["calib_monai_site_labels"][BUNDLE]["labels"] == 1
    state = json.loads((server["root"] / "studies" / "calib_monai_site" / BUNDLE / "site.json").read_text())
    assert [label["case"] for label in state["labels"]] == ["study_0"]
    # its truth: the served segmentation (the same bundle, here) against the phantom's organs, by numpy
    bundle = TrainedBundle(server["app"] / "model" / BUNDLE, overrides={"site_dir": ""})
    prediction = bundle.predict(str(server["root"] / "studies" / "study_0.nii.gz"))
    seg = prediction.segmentation[0].numpy()
    _, truth, _ = generate_phantom(seed=20, index=0, shape=(40, 36, 10), spacing=(4.0, 4.0, 10.0))
    dice = [2 * ((seg == c) & (truth == c)).sum() / ((seg == c).sum() + (truth == c).sum()) for c in range(1, 5)]
    assert state["labels"][0]["truth"] == pytest.approx(float(np.mean(dice)), abs=1e-6)
    assert state["labels"][0]["score"] == pytest.approx(prediction.quality["level"]["raw_case_score"], abs=1e-6)


def test_training_on_submitted_labels_serves_new_weights_and_calibration(server):
    models = server["app"] / "model" / BUNDLE / "models"
    image = str(server["images"]["case"])
    before = _client(server, "infer", model=f"{BUNDLE}_confidence", image=image)
    old = {name: _sha(models / name) for name in ("model.pt", "calibration.pt", "validated_range.json")}
    _submit_labels(server, 3)
    _client(server, "train_start", model=BUNDLE, params={"epochs": 1})
    done = _wait(lambda: (s := _train_status(server))["status"] in ("DONE", "ERROR", "STOPPED") and s, "training")
    assert done["status"] == "DONE", "\n".join(done.get("details", []))
    # the status says what it trained and validated on (3 labels: 2 to train, 1 held out)
    assert any(
        "done: trained on 2 submitted label(s), validated and calibrated on 1" in line for line in done["details"]
    )
    new = {name: _sha(models / name) for name in old}
    assert all(new[name] != old[name] for name in old)  # new weights, calibration and validated range published
    # measured on the held-out label (a site label) and the bundle's own two validation volumes that are here
    validated = json.loads((models / "validated_range.json").read_text())
    assert len(validated["scores"]) == 3 and validated["info"]["site_volumes"] == [0]
    assert any("1 held out and 2 source validation volume(s)" in line for line in done["details"])
    assert _sha(models / "model.previous.pt") == old["model.pt"]
    # the server serves them without a restart: another confidence map, calibrated for the new weights
    after = _client(server, "infer", model=f"{BUNDLE}_confidence", image=image)
    assert after["info"]["confidence"] != before["info"]["confidence"]
    record = json.loads((models / "calibration.json").read_text())
    assert record["weights_sha256"] == new["model.pt"]
    # the labels were mapped back to the bundle's values by segment name (Slicer's order was reversed)
    fine_tune = server["app"] / "model" / BUNDLE / "runs" / "label_training"
    remapped = np.asarray(nib.load(str(fine_tune / "labels" / "study_0.nii.gz")).dataobj)
    assert set(np.unique(remapped).tolist()) <= {0, 1, 2, 3, 4}
    from calib_monai.data.phantoms import generate_phantom

    _, truth, _ = generate_phantom(seed=20, index=0, shape=(40, 36, 10), spacing=(4.0, 4.0, 10.0))
    expected = np.where(np.isin(truth, [1, 2, 3, 4]), truth, 0)  # the four organs the submitted label has
    np.testing.assert_array_equal(remapped, expected)  # the uncertain liver counts as liver
    # the unlabelled image is scored again with the new weights after the training
    _wait(lambda: _scores(server)["study_3"].get("weights_sha256") == new["model.pt"], "scoring after training")


def test_failed_or_stopped_training_leaves_the_previous_weights_serving(server):
    models = server["app"] / "model" / BUNDLE / "models"
    served = _sha(models / "model.pt")
    image = str(server["images"]["case"])
    before = _client(server, "infer", model=f"{BUNDLE}_confidence", image=image)["info"]["confidence"]
    _client(server, "train_start", model=BUNDLE, params={"epochs": 0})  # refused by the task: epochs must be >= 1
    failed = _wait(lambda: (s := _train_status(server))["status"] in ("DONE", "ERROR", "STOPPED") and s, "training")
    assert failed["status"] == "ERROR" and any("epochs must be >= 1" in line for line in failed["details"])
    _client(server, "train_start", model=BUNDLE, params={"epochs": 30})
    _wait(lambda: _train_status(server)["status"] == "RUNNING", "the training to start", every=0.5)
    stopped = _client(server, "train_stop")
    assert stopped["status"] == "STOPPED"
    assert _sha(models / "model.pt") == served
    assert _client(server, "infer", model=f"{BUNDLE}_confidence", image=image)["info"]["confidence"] == before


def _label_info(names=SLICER_ORDER) -> list[dict]:
    return [{"name": name, "idx": position + 1} for position, name in enumerate(names)]


def _detail(refused: str) -> str:
    """The server's ``detail`` from the client's ``Status: <code>; Response: <JSON>`` message."""
    return json.loads(refused.split("Response: ", 1)[1])["detail"]


def test_bad_input_on_the_loop_gets_one_answer_and_changes_nothing(server):
    models = server["app"] / "model" / BUNDLE / "models"
    labels = server["root"] / "studies" / "labels" / "final"
    kept = {p.name: _sha(p) for p in labels.iterdir()}
    label = server["root"] / "tmp" / "label_study_1.nii.gz"  # written by the training test, a valid label
    # a segment the bundle does not know: refused when submitted, by name, and the stored label is unchanged
    wrong = _client(
        server,
        "save_label",
        image_id="study_1",
        label=str(label),
        params={"label_info": _label_info(["pancreas", "spleen", "kidney", "liver", "tumour"])},
    )
    assert "Status: 422" in wrong["refused"]
    assert "segment 'tumour'" in _detail(wrong["refused"]) and "nothing was saved" in _detail(wrong["refused"])
    # a label on another grid (voxels twice as large): refused, naming both files' grids
    moved = server["root"] / "tmp" / "label_other_grid.nii.gz"
    data = nib.load(str(label))
    nib.save(nib.Nifti1Image(np.asarray(data.dataobj), AFFINE @ np.diag([2.0, 2.0, 1.0, 1.0])), str(moved))
    other = _client(server, "save_label", image_id="study_1", label=str(moved), params={"label_info": _label_info()})
    assert "Status: 422" in other["refused"] and "not on the grid of its image" in _detail(other["refused"])
    assert {p.name: _sha(p) for p in labels.iterdir()} == kept
    # Train with a model.pt that does not load: one ERROR line last in the status, nothing published
    weights = (models / "model.pt").read_bytes()
    published = {n: _sha(models / n) for n in ("calibration.pt", "validated_range.json")}
    try:
        (models / "model.pt").write_bytes(weights[: len(weights) // 3])  # cut off
        _client(server, "train_start", model=BUNDLE, params={"epochs": 1})
        failed = _wait(lambda: (s := _train_status(server))["status"] in ("DONE", "ERROR", "STOPPED") and s, "train")
    finally:
        (models / "model.pt").write_bytes(weights)
    assert failed["status"] == "ERROR"
    last = failed["details"][-1]
    assert last.startswith("ERROR: ") and "model.pt" in last and "restore them" in last, failed["details"]
    assert not any(line.startswith("Traceback") for line in failed["details"])
    assert {n: _sha(models / n) for n in published} == published
    # Train while a training runs: refused (429), the running one goes on; then stopped, publishing nothing
    _client(server, "train_start", model=BUNDLE, params={"epochs": 30})
    _wait(lambda: _train_status(server)["status"] == "RUNNING", "the training to start", every=0.5)
    second = _client(server, "train_start", model=BUNDLE, params={"epochs": 1})
    assert "Status: 429" in second["refused"] and "Already Running" in _detail(second["refused"])
    assert _client(server, "train_stop")["status"] == "STOPPED"
    assert (models / "model.pt").read_bytes() == weights
    assert _client(server, "infer", model=BUNDLE, image=str(server["images"]["case"]))["values"]  # still serving


def test_concurrent_requests_all_succeed(server):
    image = str(server["images"]["case"])
    label = server["root"] / "tmp" / "label_study_0.nii.gz"
    jobs = [("infer", {"model": "nacl_flare", "image": image})] * 4
    jobs += [("next_sample", {"strategy": f"{BUNDLE}_least_confident", "client_id": f"c{i}"}) for i in range(3)]
    params = {"label_info": _label_info()}  # as the training test submitted it
    jobs += [("save_label", {"image_id": "study_0", "label": str(label), "params": params})] * 2
    jobs += [("infer", {"model": f"{BUNDLE}_review", "image": image})]
    results, errors = [None] * len(jobs), []

    def run(i, command, arguments):
        try:
            results[i] = _client(server, command, **arguments)
        except BaseException as err:  # noqa: BLE001 - collected and reported below
            errors.append(f"{command}: {err}")

    threads = [threading.Thread(target=run, args=(i, c, a)) for i, (c, a) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert not errors and all(r is not None and "refused" not in r for r in results), (errors, results)
    assert _get_json(f"{server['url']}/info/")["name"] == "calib-monai"  # still serving
