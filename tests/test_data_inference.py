"""Inference helpers: listing images, image-only preprocessing, segmentation + confidence written on the file grid."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.data import DataLoader, Dataset
from monai.engines import SupervisedEvaluator
from monai.inferers import SliceInferer
from monai.networks.nets import UNet

from calib_monai.data import FLARE, ConfidenceAndSegmentationd, image_datalist, segmentation_and_confidence

SHAPE = (20, 18, 5)
AFFINE = np.diag([-2.0, -2.0, 5.0, 1.0])  # LPS-like storage: RAS orientation and resampling must both be undone


def _flare22(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for i in range(3):
        label = np.zeros(SHAPE, np.uint8)
        label[4:14, 3:12, 1:4] = 1
        for folder, array in (("imagesTr", rng.integers(-300, 300, SHAPE).astype(np.int16)), ("labelsTr", label)):
            (root / folder).mkdir(parents=True, exist_ok=True)
            suffix = "_0000" if folder == "imagesTr" else ""
            nib.save(nib.Nifti1Image(array, AFFINE), str(root / folder / f"case{i}{suffix}.nii.gz"))
    return root


def test_image_datalist_finds_files_folders_and_falls_back_to_the_test_split(tmp_path):
    root = _flare22(tmp_path / "F")
    names = [Path(d["image"]).name for d in image_datalist(root)]
    assert names == ["case0_0000.nii.gz", "case1_0000.nii.gz", "case2_0000.nii.gz"]  # imagesTr/ under the root
    one = root / "imagesTr" / "case1_0000.nii.gz"
    assert image_datalist(one) == [{"image": str(one)}]
    data = FLARE(str(root), output_dir=tmp_path / "run", roi_size=(8, 8, 4), spacing=None, split=(1, 1, 1))
    assert image_datalist("", data) == [{"image": data.datalist()["test"][0]["image"]}]
    with pytest.raises(ValueError, match="dataset_dir is empty"):
        image_datalist("")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .nii/.nii.gz images"):
        image_datalist(tmp_path / "empty")


def test_confidence_is_the_max_probability_and_segmentation_its_argmax():
    probs = torch.tensor([[[0.2, 0.5]], [[0.7, 0.1]], [[0.1, 0.4]]])  # (C=3, 1, 2)
    out = ConfidenceAndSegmentationd("pred")({"pred": probs})
    assert out["segmentation"].tolist() == [[[1, 0]]] and out["segmentation"].dtype == torch.uint8
    torch.testing.assert_close(out["confidence"], torch.tensor([[[0.7, 0.5]]]))


def test_inference_writes_segmentation_and_confidence_on_the_original_grid(tmp_path):
    root = _flare22(tmp_path / "F")
    # 4 mm in-plane vs the files' 2 mm, and flipped axes: inverting needs both Orientation and Spacing undone
    data = FLARE(str(root), output_dir=tmp_path / "run", roi_size=(16, 16, 4), spacing=(4.0, 4.0, 5.0), split=(1, 1, 1))
    preprocessing = data.inference_preprocessing()
    assert preprocessing is data.inference_preprocessing()  # one instance, so Invertd matches the transform ids
    loader = DataLoader(Dataset(image_datalist(root / "imagesTr"), transform=preprocessing), batch_size=1)
    torch.manual_seed(0)
    network = UNet(spatial_dims=2, in_channels=1, out_channels=5, channels=(4, 8), strides=(2,)).eval()
    evaluator = SupervisedEvaluator(
        device=torch.device("cpu"),
        val_data_loader=loader,
        network=network,
        inferer=SliceInferer(roi_size=(16, 16), sw_batch_size=4, spatial_dim=2, progress=False),
        postprocessing=segmentation_and_confidence(preprocessing, tmp_path / "out"),
    )
    evaluator.run()
    for i in range(3):
        seg = nib.load(tmp_path / "out" / f"case{i}_0000_seg.nii.gz")
        conf = nib.load(tmp_path / "out" / f"case{i}_0000_conf.nii.gz")
        for written in (seg, conf):
            assert written.shape == SHAPE
            np.testing.assert_allclose(written.affine, AFFINE, atol=1e-5)
        assert set(np.unique(np.asarray(seg.dataobj)).tolist()) <= {0, 1, 2, 3, 4}
        confidence = np.asarray(conf.dataobj)
        assert confidence.min() >= 0.2 - 1e-5 and confidence.max() <= 1.0 + 1e-5  # max of 5 probabilities


def test_only_the_segmentation_and_confidence_cross_to_the_input_grid(tmp_path):
    """The served chain takes the argmax, the confidence and the case quality on the network's grid (3 mm here, of a
    1 mm file; voxel centres aligned at the corner) and maps back only the two outputs: each input voxel takes the
    label of the network voxel whose centre is nearest (input voxels 0..6 at 0..6 mm, network ones at 0, 3, 6 mm:
    0 0 1 1 1 2 2), and the volumes count network voxels of 27 mm^3 = 0.027 mL."""
    from monai.data import MetaTensor
    from monai.transforms import Compose, Spacingd

    from calib_monai.review import CaseQualityd

    chain = Compose([Spacingd("image", pixdim=(3.0, 3.0, 3.0), mode="bilinear", dtype=torch.float32)])
    item = chain({"image": MetaTensor(torch.rand(1, 7, 7, 4), affine=torch.eye(4, dtype=torch.float64))})
    assert item["image"].shape == (1, 3, 3, 2)
    labels = torch.tensor([[[1, 0], [0, 0], [2, 0]], [[0, 0], [1, 1], [0, 0]], [[0, 2], [0, 0], [0, 0]]])
    logits = 5.0 * torch.nn.functional.one_hot(labels, 3).permute(3, 0, 1, 2).float()
    item["image"].meta["filename_or_obj"] = str(tmp_path / "case.nii.gz")
    item["pred"] = MetaTensor(logits, meta=dict(item["image"].meta))
    quality = CaseQualityd("pred", label_names={"0": "background", "1": "a", "2": "b"})
    out = segmentation_and_confidence(chain, tmp_path / "out", quality)(item)
    nearest, nearest_z = torch.tensor([0, 0, 1, 1, 1, 2, 2]), torch.tensor([0, 0, 1, 1])
    delivered = labels[nearest][:, nearest][:, :, nearest_z]
    assert out["segmentation"].dtype == torch.uint8 and out["segmentation"].shape == (1, 7, 7, 4)
    assert torch.equal(out["segmentation"][0].long(), delivered)
    written = nib.load(tmp_path / "out" / "case_seg.nii.gz")
    np.testing.assert_array_equal(np.asarray(written.dataobj), delivered.numpy())
    np.testing.assert_allclose(written.affine, np.eye(4), atol=1e-6)
    top = 1 / (1 + 2 * np.exp(-5.0))  # softmax of (5, 0, 0): the confidence of every voxel, on either grid
    np.testing.assert_allclose(np.asarray(nib.load(tmp_path / "out" / "case_conf.nii.gz").dataobj), top, rtol=1e-6)
    scored = out["quality"]
    assert scored["voxel_volume"] == pytest.approx(0.027)  # the network grid's voxel, from its affine
    assert scored["classes"]["a"]["volume_predicted"] == pytest.approx(3 * 0.027)  # 3 network voxels
    assert scored["classes"]["b"]["volume_predicted"] == pytest.approx(2 * 0.027)
    expected = 3 * top + 15 * (1 - top) / 2  # its own 3 voxels, and half of what the other 15 leave
    assert scored["classes"]["a"]["volume"] == pytest.approx(expected * 0.027)
