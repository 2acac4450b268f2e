"""3D Slicer review files (calib_monai.export.slicer): the .seg.nrrd segments and layers, the NIfTI RAS -> NRRD LPS
geometry, the confidence round trip, and scripts/slicer_review.py importable without Slicer."""

from __future__ import annotations

import ast
import importlib.util
import py_compile
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from calib_monai.export import LOW_CONFIDENCE_SEGMENT_NAME, SlicerFiles, lps_geometry, write_slicer_files
from calib_monai.export.slicer import LOW_CONFIDENCE_COLOR, SEGMENT_PALETTE, slicer_files_from_inference

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slicer_review.py"
LABEL_NAMES = {"0": "background", "1": "liver", "2": "kidney", "3": "spleen"}  # as in a bundle's train.json
SHAPE = (6, 5, 4)

# Rotation-free, non-unit spacing and an origin. NIfTI: voxel (i, j, k) -> RAS (x, y, z) = A @ (i, j, k, 1).
AFFINE = np.array([[0.8, 0.0, 0.0, -100.0], [0.0, 1.25, 0.0, 50.0], [0.0, 0.0, 3.0, 20.0], [0.0, 0.0, 0.0, 1.0]])
# Same grid axes but i runs to the Right-to-Left and j Posterior-to-Anterior flipped (a typical radiological file).
AFFINE_FLIPPED = np.array(
    [[-0.8, 0.0, 0.0, 100.0], [0.0, -1.25, 0.0, -50.0], [0.0, 0.0, 3.0, 20.0], [0.0, 0.0, 0.0, 1.0]]
)
# The expected LPS geometry, by hand: LPS = (-x, -y, z), so the x and y parts of every vector and of the origin flip.
EXPECTED_LPS = {
    "plain": (AFFINE, [[-0.8, 0, 0], [0, -1.25, 0], [0, 0, 3.0]], [100.0, -50.0, 20.0]),
    "flipped": (AFFINE_FLIPPED, [[0.8, 0, 0], [0, 1.25, 0], [0, 0, 3.0]], [-100.0, 50.0, 20.0]),
}


@pytest.fixture
def nrrd():
    return pytest.importorskip("nrrd", reason="pynrrd reads the files back (pip install pynrrd)")


def synthetic_case():
    """Labels 0..2 (no spleen in this case) and a float32 confidence with values on both sides of 0.8."""
    seg = np.zeros(SHAPE, dtype=np.uint8)
    seg[1:4, 1:3, 0:2] = 1  # liver
    seg[4:6, 2:5, 1:4] = 2  # kidney
    rng = np.random.default_rng(0)
    conf = rng.uniform(0.3, 1.0, size=SHAPE).astype(np.float32)
    conf[0, 0, 0] = np.float32(0.8)  # exactly the threshold: not low
    conf[1, 1, 0] = np.nextafter(np.float32(0.8), np.float32(0))  # just below, inside the liver: low
    return seg, conf


def segments_of(header) -> dict[str, dict[str, str]]:
    """{segment ID: {field: value}} from the Segment<N>_<field> keys."""
    segments: dict[int, dict[str, str]] = {}
    for key, value in header.items():
        if key.startswith("Segment") and "_" in key and key[len("Segment") : key.index("_")].isdigit():
            index = int(key[len("Segment") : key.index("_")])
            segments.setdefault(index, {})[key[key.index("_") + 1 :]] = value
    assert sorted(segments) == list(range(len(segments))), "segment indices must be 0..N-1"
    return {fields["ID"]: fields for _, fields in sorted(segments.items())}


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split()]


@pytest.mark.parametrize("orientation", sorted(EXPECTED_LPS))
def test_geometry_is_the_nifti_affine_in_lps(orientation, tmp_path, nrrd):
    affine, directions, origin = EXPECTED_LPS[orientation]
    seg, conf = synthetic_case()
    files = write_slicer_files(seg, conf, affine, LABEL_NAMES, tmp_path, "case0")
    for path, list_axis in ((files.segmentation, True), (files.confidence, False)):
        _, header = nrrd.read(str(path))
        assert header["space"] == "left-posterior-superior"
        space_directions = header["space directions"]
        if list_axis:  # the layer axis comes first and has no direction ("none")
            assert header["kinds"] == ["list", "domain", "domain", "domain"]
            assert np.isnan(space_directions[0]).all()
            space_directions = space_directions[1:]
        else:
            assert header["kinds"] == ["domain", "domain", "domain"]
        np.testing.assert_allclose(space_directions, directions, atol=1e-12)
        np.testing.assert_allclose(header["space origin"], origin, atol=1e-12)
        # and a voxel lands on the same physical point: LPS from the NRRD vs RAS from the NIfTI affine
        ijk = np.array([5, 2, 3])
        lps = header["space origin"] + ijk @ space_directions
        ras = (affine @ np.append(ijk, 1))[:3]
        np.testing.assert_allclose(lps * [-1, -1, 1], ras, atol=1e-12)
    directions_fn, origin_fn = lps_geometry(affine)
    np.testing.assert_allclose(directions_fn, directions, atol=1e-12)
    np.testing.assert_allclose(origin_fn, origin, atol=1e-12)


def test_segments_layers_and_voxels(tmp_path, nrrd):
    seg, conf = synthetic_case()
    files = write_slicer_files(seg, conf, AFFINE, LABEL_NAMES, tmp_path / "out", "case0", low_confidence=0.8)
    assert files == SlicerFiles(tmp_path / "out" / "case0.seg.nrrd", tmp_path / "out" / "case0_confidence.nrrd")
    data, header = nrrd.read(str(files.segmentation))

    assert data.shape == (2, *SHAPE) and data.dtype == np.uint8
    assert header["Segmentation_MasterRepresentation"] == "Binary labelmap"
    assert header["Segmentation_ContainedRepresentationNames"] == "Binary labelmap|"
    assert header["Segmentation_ReferenceImageExtentOffset"] == "0 0 0"
    assert not any(key in header for key in ("Segmentation_Extent",)), "legacy key: Slicer would use its old reader"

    segments = segments_of(header)
    assert [s["Name"] for s in segments.values()] == ["liver", "kidney", "spleen", LOW_CONFIDENCE_SEGMENT_NAME]
    full_extent = "0 5 0 4 0 3"
    for value, name in ((1, "liver"), (2, "kidney"), (3, "spleen")):  # spleen: named, absent here, still a segment
        fields = segments[f"label_{value}"]
        assert fields["Name"] == name
        assert fields["LabelValue"] == str(value) and fields["Layer"] == "0"
        assert fields["Extent"] == full_extent
        np.testing.assert_allclose(floats(fields["Color"]), SEGMENT_PALETTE[value - 1], atol=1e-6)
        assert fields["NameAutoGenerated"] == "0" and fields["ColorAutoGenerated"] == "0"
    low = segments["low_confidence"]
    assert low["LabelValue"] == "1" and low["Layer"] == "1" and low["Extent"] == full_extent
    assert low["Tags"] == "calib_monai.confidence_threshold:0.8|"
    np.testing.assert_allclose(floats(low["Color"]), LOW_CONFIDENCE_COLOR, atol=1e-6)
    colors = [tuple(floats(s["Color"])) for s in segments.values()]
    assert len(set(colors)) == len(colors), "segment colours must differ"

    np.testing.assert_array_equal(data[0], seg)  # layer 0: the labels as they are
    expected_low = conf < np.float32(0.8)
    np.testing.assert_array_equal(data[1], expected_low.astype(np.uint8))  # layer 1: low confidence, over organs
    assert data[1][0, 0, 0] == 0 and data[1][1, 1, 0] == 1 and seg[1, 1, 0] == 1
    assert 0 < expected_low.sum() < expected_low.size


def test_confidence_round_trips_exactly(tmp_path, nrrd):
    seg, conf = synthetic_case()
    files = write_slicer_files(seg, conf, AFFINE, LABEL_NAMES, tmp_path, "case0")
    data, header = nrrd.read(str(files.confidence))
    assert header["type"] == "float" and data.dtype == np.float32
    assert data.shape == SHAPE
    np.testing.assert_array_equal(data, conf)


def test_nifti_inputs_from_inference(tmp_path, nrrd):
    """The inference outputs (<case>_seg.nii.gz, <case>_conf.nii.gz) as paths: the geometry comes from the files."""
    seg, conf = synthetic_case()
    inference_dir = tmp_path / "inference"
    inference_dir.mkdir()
    nib.save(nib.Nifti1Image(seg, AFFINE_FLIPPED), inference_dir / "case7_seg.nii.gz")
    nib.save(nib.Nifti1Image(conf, AFFINE_FLIPPED), inference_dir / "case7_conf.nii.gz")
    files = slicer_files_from_inference(inference_dir, "case7", ["background", "liver", "kidney"], tmp_path / "slicer")
    data, header = nrrd.read(str(files.segmentation))
    _, directions, origin = EXPECTED_LPS["flipped"]
    np.testing.assert_allclose(header["space directions"][1:], directions, atol=1e-6)
    np.testing.assert_allclose(header["space origin"], origin, atol=1e-6)
    np.testing.assert_array_equal(data[0], seg)
    assert [s["Name"] for s in segments_of(header).values()] == ["liver", "kidney", LOW_CONFIDENCE_SEGMENT_NAME]
    np.testing.assert_array_equal(nrrd.read(str(files.confidence))[0], conf)


def test_unnamed_labels_and_2d(tmp_path, nrrd):
    """A label missing from label_names still gets a segment; a 2D (PNG-like) prediction becomes one slice deep."""
    seg = np.array([[0, 1], [5, 5]], dtype=np.uint8)
    conf = np.array([[0.9, 0.5], [0.99, 0.7]], dtype=np.float32)
    files = write_slicer_files(seg, conf, np.eye(4), {0: "background", 1: "lesion"}, tmp_path, "img")
    data, header = nrrd.read(str(files.segmentation))
    assert data.shape == (2, 2, 2, 1)
    segments = segments_of(header)
    assert segments["label_5"]["Name"] == "label 5" and segments["label_5"]["LabelValue"] == "5"
    assert segments["label_5"]["Extent"] == "0 1 0 1 0 0"
    np.testing.assert_array_equal(data[1, ..., 0], [[0, 1], [0, 1]])


def test_geometry_mismatch_is_refused(tmp_path):
    pytest.importorskip("nrrd")
    seg, conf = synthetic_case()
    seg_path = tmp_path / "case_seg.nii.gz"
    nib.save(nib.Nifti1Image(seg, AFFINE), seg_path)
    with pytest.raises(ValueError, match="not on the reference grid"):
        write_slicer_files(seg_path, conf, AFFINE_FLIPPED, LABEL_NAMES, tmp_path, "case")
    with pytest.raises(ValueError, match="different shapes"):
        write_slicer_files(seg, conf[:-1], AFFINE, LABEL_NAMES, tmp_path, "case")
    ref_path = tmp_path / "ref.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((6, 5, 5), np.float32), AFFINE), ref_path)
    with pytest.raises(ValueError, match="reference image"):
        write_slicer_files(seg, conf, ref_path, LABEL_NAMES, tmp_path, "case")


def test_review_script_compiles_and_needs_slicer_only_in_main():
    py_compile.compile(str(SCRIPT), doraise=True)
    tree = ast.parse(SCRIPT.read_text())
    top_level_imports = {
        alias.name.split(".")[0]
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    } | {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert not top_level_imports & {"slicer", "vtk", "qt", "calib_monai", "nrrd"}

    spec = importlib.util.spec_from_file_location("slicer_review", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # no Slicer here: importing must not need it
    assert callable(module.main)
    assert module.LOW_CONFIDENCE_SEGMENT_NAME == LOW_CONFIDENCE_SEGMENT_NAME
    args = module.parse_args(["--image", "img.nii.gz", "--segmentation", "c.seg.nrrd", "--confidence", "c_conf.nrrd"])
    assert (args.image, args.segmentation, args.confidence) == ("img.nii.gz", "c.seg.nrrd", "c_conf.nrrd")
    if importlib.util.find_spec("slicer") is None:  # (PyPI has an unrelated "slicer" package)
        with pytest.raises(ModuleNotFoundError, match="slicer"):
            module.main(["--image", "i", "--segmentation", "s", "--confidence", "c"])


def test_bundle_label_names():
    from calib_monai.export import bundle_label_names

    bundles = sorted((Path(__file__).resolve().parents[1] / "bundles").glob("*/configs/train.json"))
    if not bundles:
        pytest.skip("no generated bundles")
    names = bundle_label_names(bundles[0].parents[1])
    assert names[0] == "background" and all(isinstance(k, int) for k in names)


def test_cli_slicer_names_segments_from_the_bundle(tmp_path):
    nrrd = pytest.importorskip("nrrd")
    from calib_monai.cli import slicer

    affine = np.diag([2.0, 2.0, 5.0, 1.0])
    seg = np.zeros((6, 5, 4), dtype=np.uint8)
    seg[1:3, 1:3, 1:3] = 4  # pancreas in nacl_flare
    conf = np.full(seg.shape, 0.95, dtype=np.float32)
    conf[0, 0, 0] = 0.5
    nib.save(nib.Nifti1Image(seg, affine), tmp_path / "case_seg.nii.gz")
    nib.save(nib.Nifti1Image(conf, affine), tmp_path / "case_conf.nii.gz")
    bundle = Path(__file__).resolve().parents[1] / "bundles" / "nacl_flare"
    written = slicer(str(bundle), "case", inference_dir=str(tmp_path), output_dir=str(tmp_path / "out"))
    _, header = nrrd.read(written["segmentation"])
    names = {header[f"Segment{i}_Name"]: header[f"Segment{i}_LabelValue"] for i in range(5)}
    assert names["pancreas"] == "4" and names["liver"] == "1"
    values, _ = nrrd.read(written["confidence"])
    assert values[0, 0, 0] == np.float32(0.5)


def test_case_quality_travels_with_the_slicer_files(tmp_path, nrrd):
    """The inference run's <case>_quality.json: copied beside the files, its verdict in the header, each structure's
    estimated DSC and volume as tags of its segment."""
    import json

    seg, conf = synthetic_case()
    inference_dir = tmp_path / "inference"
    inference_dir.mkdir()
    nib.save(nib.Nifti1Image(seg, AFFINE_FLIPPED), inference_dir / "case7_seg.nii.gz")
    nib.save(nib.Nifti1Image(conf, AFFINE_FLIPPED), inference_dir / "case7_conf.nii.gz")
    quality = {
        "case_score": 0.4123,
        "review": {"flag": True, "reasons": ["estimated mean DSC 0.412 is below"]},
        "classes": {"liver": {"est_dice": 0.61234, "volume": 12.5}, "kidney": {"est_dice": 0.2, "volume": 3.0}},
    }
    (inference_dir / "case7_quality.json").write_text(json.dumps({"case": "case7", **quality}))
    files = slicer_files_from_inference(inference_dir, "case7", ["background", "liver", "kidney"], tmp_path / "slicer")
    _, header = nrrd.read(str(files.segmentation))
    assert header["calib_monai_case_score"] == "0.4123" and header["calib_monai_review"] == "yes"
    assert header["calib_monai_review_reasons"] == "estimated mean DSC 0.412 is below"
    segments = segments_of(header)
    assert segments["label_1"]["Tags"] == "calib_monai.est_dice:0.612|calib_monai.volume_ml:12.5|"
    assert json.loads(files.quality.read_text()) == {"case": "case7", **quality}
    # without a quality file: no quality fields, no JSON
    (inference_dir / "case7_quality.json").unlink()
    files = slicer_files_from_inference(inference_dir, "case7", ["background", "liver", "kidney"], tmp_path / "plain")
    assert files.quality is None and "calib_monai_review" not in nrrd.read(str(files.segmentation))[1]


def test_missing_inference_outputs_say_to_run_inferring_first(tmp_path):
    """``calib-monai slicer`` before ``inferring`` said only that a _seg.nii.gz was missing."""
    (tmp_path / "other_case_seg.nii.gz").write_bytes(b"")  # an inference folder that holds another case
    with pytest.raises(FileNotFoundError) as err:
        slicer_files_from_inference(tmp_path, "case_0001", {"0": "background", "1": "organ"})
    message = str(err.value)
    assert message.startswith(
        f"{tmp_path} has no case_0001_seg.nii.gz or case_0001_conf.nii.gz; it has the cases "
        "['other_case']: run the bundle's inferring step on the image first"
    )
    assert "monai.bundle run inferring" in message and "--inference_dir" in message


def test_outputs_of_two_models_in_one_case_are_refused(tmp_path):
    """A case whose segmentation and confidence record different sources (NIfTI descrip, as inferring writes it)."""
    from calib_monai.export import slicer_files_from_inference

    affine = np.diag([2.0, 2.0, 5.0, 1.0])
    for name, descrip, data in (
        ("case_seg.nii.gz", "calib_monai w=aaaaaaaaaaaa c=none r=none", np.zeros((4, 4, 2), np.uint8)),
        ("case_conf.nii.gz", "calib_monai w=bbbbbbbbbbbb c=none r=none", np.ones((4, 4, 2), np.float32)),
    ):
        image = nib.Nifti1Image(data, affine)
        image.header["descrip"] = descrip.encode()
        nib.save(image, tmp_path / name)
    with pytest.raises(ValueError, match="come from different models") as info:
        slicer_files_from_inference(tmp_path, "case", {0: "background", 1: "liver"})
    assert "w=aaaaaaaaaaaa" in str(info.value) and "w=bbbbbbbbbbbb" in str(info.value)
    assert not list(tmp_path.glob("*.nrrd"))


def _contour_case():
    """Inner and outer contours of liver, kidney and spleen (structure last, as inferring writes them): the liver's
    inner is its prediction less one voxel, its outer one row more; the kidney's outer reaches into the liver's (the
    outer contours overlap); the spleen's are empty."""
    seg, conf = synthetic_case()
    inner = np.stack([seg == c for c in (1, 2, 3)], axis=-1).astype(np.uint8)
    inner[1, 1, 0, 0] = 0
    outer = np.stack([seg == c for c in (1, 2, 3)], axis=-1).astype(np.uint8)
    outer[0, 1:3, 0:2, 0] = 1
    outer[3, 2, 1, 1] = 1  # the kidney's outer contour over a liver voxel
    contours = {
        "alpha": 0.1,
        "epsilon": 0.02,
        "risk": "per_case",
        "vouched": True,
        "reason": None,
        "classes": {
            "liver": {"lambda_in": 0.7, "lambda_out": 0.25, "inner_ml": 1.5, "outer_ml": 4.0},
            "kidney": {"lambda_in": 0.8, "lambda_out": 0.125, "inner_ml": 2.0, "outer_ml": 3.0},
            "spleen": {"lambda_in": None, "lambda_out": None, "inner_ml": 0.0, "outer_ml": 0.0},
        },
    }
    return seg, conf, inner, outer, contours


def test_contours_become_outer_and_inner_segments(tmp_path, nrrd):
    """<case>_inner/_outer.nii.gz: per structure the segments "<name> (outer 90%)" and "(inner 90%)", the inner ones
    in one layer (value: the label), each outer one in its own; the lambdas, alpha and epsilon in tags and header."""
    import json

    seg, conf, inner, outer, contours = _contour_case()
    folder = tmp_path / "inference"
    folder.mkdir()
    for name, volume in (("seg", seg), ("conf", conf), ("inner", inner), ("outer", outer)):
        nib.save(nib.Nifti1Image(volume, AFFINE_FLIPPED), folder / f"case7_{name}.nii.gz")
    quality = {"case_score": 0.8, "review": {"flag": False, "reasons": []}, "classes": {}, "contours": contours}
    (folder / "case7_quality.json").write_text(json.dumps({"case": "case7", **quality}))
    names = ["background", "liver", "kidney", "spleen"]
    files = slicer_files_from_inference(folder, "case7", names, tmp_path / "slicer")
    data, header = nrrd.read(str(files.segmentation))
    # labels, low confidence, the inner contours, then one layer per outer contour
    assert data.shape == (3 + 3, *SHAPE) and data.dtype == np.uint8
    segments = segments_of(header)
    assert [s["Name"] for s in segments.values()][4:] == [
        "liver (outer 90%)", "liver (inner 90%)", "kidney (outer 90%)", "kidney (inner 90%)",
        "spleen (outer 90%)", "spleen (inner 90%)",
    ]  # fmt: skip
    for c in range(1, 4):
        for kind, masks in (("outer", outer), ("inner", inner)):
            fields = segments[f"{kind}_{c}"]
            layer, value = int(fields["Layer"]), int(fields["LabelValue"])
            assert (layer, value) == ((2 + c, 1) if kind == "outer" else (2, c))
            assert fields["Extent"] == "0 5 0 4 0 3"
            np.testing.assert_array_equal(data[layer] == value, masks[..., c - 1] > 0)
    assert segments["outer_1"]["Tags"] == (
        "calib_monai.contour:outer|calib_monai.lambda:0.25|calib_monai.alpha:0.1|calib_monai.epsilon:0.02|"
        "calib_monai.risk:per_case|calib_monai.volume_ml:4|"
    )
    assert "calib_monai.lambda" not in segments["inner_3"]["Tags"]  # the spleen: too few subjects, no lambdas
    assert header["calib_monai_contours_alpha"] == "0.1" and header["calib_monai_contours_epsilon"] == "0.02"
    assert header["calib_monai_contours_lambdas"] == (
        "liver in=0.7 out=0.25; kidney in=0.8 out=0.125; spleen in=null out=null"
    )
    assert header["calib_monai_contours_vouched"] == "yes" and header["calib_monai_contours_reason"] == "-"
    colors = [tuple(floats(s["Color"])) for s in segments.values()]
    assert len(set(colors)) == len(colors), "segment colours must differ"

    # TrainedBundle.predict's contours (the structure first) give the same file
    memory = {"inner": np.moveaxis(inner, -1, 0), "outer": np.moveaxis(outer, -1, 0)}
    again = write_slicer_files(
        seg, conf, AFFINE_FLIPPED, names, tmp_path / "memory", "case7", quality=quality, contours=memory
    )
    np.testing.assert_array_equal(nrrd.read(str(again.segmentation))[0], data)
    # no contour files: no contour segments
    for kind in ("inner", "outer"):
        (folder / f"case7_{kind}.nii.gz").unlink()
    plain = slicer_files_from_inference(folder, "case7", names, tmp_path / "plain")
    assert nrrd.read(str(plain.segmentation))[0].shape == (2, *SHAPE)


def test_contours_off_the_grid_are_refused(tmp_path):
    seg, conf, inner, outer, _ = _contour_case()
    short = nib.Nifti1Image(inner[:, :, :3], AFFINE)
    with pytest.raises(ValueError, match=r"the inner contours has shape \(3, 6, 5, 3\), not one volume per structure"):
        write_slicer_files(seg, conf, AFFINE, LABEL_NAMES, tmp_path, "c", contours={"inner": short, "outer": outer})
    with pytest.raises(ValueError, match="the inner contours is not on the segmentation's grid"):
        moved = {"inner": nib.Nifti1Image(inner, AFFINE), "outer": outer}
        write_slicer_files(seg, conf, AFFINE_FLIPPED, LABEL_NAMES, tmp_path, "c", contours=moved)
    two = {"inner": np.moveaxis(inner, -1, 0)[:2], "outer": np.moveaxis(outer, -1, 0)}
    with pytest.raises(ValueError, match=r"the inner \(2, 6, 5, 4\) and outer \(3, 6, 5, 4\) contours do not hold"):
        write_slicer_files(seg, conf, AFFINE, LABEL_NAMES, tmp_path, "c", contours=two)
