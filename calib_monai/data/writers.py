"""How ``inferring`` writes a case's images: NIfTI on the input's grid, named after the case, each file complete or
not at all, and the case's files side by side (:class:`SaveImagesd`)."""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from functools import partial

import numpy as np
import torch
from monai.data import MetaTensor
from monai.data.folder_layout import default_name_formatter
from monai.data.image_writer import NibabelWriter
from monai.transforms import MapTransform, SaveImaged

from calib_monai.atomic import write_concurrently, write_durably
from calib_monai.bundle.outputs import (
    CONTOUR_POSTFIXES,
    OUTPUT_POSTFIXES,
    SOURCE_META,
    OutputWriter,
    source_descrip,
)

__all__ = ["GridNibabelWriter", "SaveImagesd", "case_name_formatter"]


def case_name_formatter(metadict: dict, saver) -> dict:
    """``SaveImaged`` file names: ``<case_name>_<postfix>`` when ``CaseNamed`` set one, else MONAI's default
    (the input file's name without extension)."""
    if metadict and metadict.get("case_name"):
        # the extension is stripped again by MONAI: it protects case names with dots
        return {"subject": f"{metadict['case_name']}.nii.gz", "idx": metadict.get("patch_index")}
    return default_name_formatter(metadict, saver)


def in_file_order(data) -> np.ndarray:
    """``data`` (channel-last, a tensor or array) as an array nibabel writes with one copy at most: as it is when it
    is C- or Fortran-ordered (one channel), else Fortran-ordered, the order NIfTI stores voxels in. MONAI's writer
    makes a channel-last view of several channels C-ordered, and nibabel then copies it again, voxel by voxel; here
    that is one copy, in torch, which leaves the GIL to the case's other writers."""
    if isinstance(data, torch.Tensor):
        plain = (data.as_tensor() if isinstance(data, MetaTensor) else data).detach().cpu()
        if plain.is_contiguous():
            return plain.numpy()
        return plain.permute(*reversed(range(plain.ndim))).contiguous().numpy().T
    data = np.asarray(data)
    return data if data.flags.c_contiguous else np.asfortranarray(data)


class GridNibabelWriter(NibabelWriter):
    """``NibabelWriter`` that writes the data as it is on its grid when no resampling is asked for (``SaveImaged``
    with ``resample=False``): MONAI's writer resamples anyway (an identity), and that fails for 2D images such as
    the BUSI PNGs once the depth-1 axis is squeezed (the squeezed MetaTensor's spatial rank drops to 1).

    Each file reaches its name complete or not at all (``write_durably``: a temporary name in the same folder,
    fsync, ``os.replace``; MONAI's writer saves straight to the name, so a killed run could leave a truncated
    ``.nii.gz``), and the image's source (``SOURCE_META``, from :class:`RecordSourced`) goes into the header's
    ``descrip`` (``calib_monai w=<weights> c=<calibration> r=<range>``, short SHA-256s)."""

    def set_metadata(self, meta_dict=None, resample: bool = True, **options):
        self.descrip = source_descrip((meta_dict or {}).get(SOURCE_META))
        return super().set_metadata(meta_dict, resample, **options)

    def write(self, filename, verbose: bool = False, **obj_kwargs):
        import nibabel as nib
        from monai.data.utils import to_affine_nd
        from monai.utils import convert_data_type, get_equivalent_dtype

        if self.affine is None:
            self.affine = np.eye(4)
        affine = to_affine_nd(r=3, affine=convert_data_type(self.affine, np.ndarray)[0])
        data = in_file_order(self.data_obj)
        if self.output_dtype is not None:
            data = data.astype(get_equivalent_dtype(self.output_dtype, np.ndarray), copy=False)  # keeps the order
        kwargs = {k: obj_kwargs[k] for k in ("header", "extra", "file_map") if k in obj_kwargs}  # as MONAI's
        self.data_obj = nib.Nifti1Image(data, affine, **kwargs)
        self.data_obj.set_sform(affine, code=1)
        self.data_obj.set_qform(affine, code=1)
        if getattr(self, "descrip", ""):
            self.data_obj.header["descrip"] = self.descrip.encode()[:79]
        write_durably(filename, lambda tmp: nib.save(self.data_obj, tmp))

    @classmethod
    def resample_if_needed(cls, data_array, affine=None, target_affine=None, output_spatial_shape=None, **kwargs):
        if target_affine is None and output_spatial_shape is None:
            if isinstance(data_array, MetaTensor):
                data_array = data_array.as_tensor()
            if isinstance(affine, MetaTensor):
                affine = affine.as_tensor()
            return data_array, affine
        return super().resample_if_needed(
            data_array, affine=affine, target_affine=target_affine, output_spatial_shape=output_spatial_shape, **kwargs
        )


class SaveImagesd(MapTransform, OutputWriter):
    """The case's images, one ``SaveImaged`` per key (``savers``), written side by side: compressing them is most of
    the writing time and zlib releases the GIL, so on two cores the contours and the segmentation compress while the
    confidence does. A key the item lacks is skipped, as ``allow_missing_keys`` does."""

    def __init__(self, savers: Mapping[Hashable, SaveImaged]) -> None:
        super().__init__(list(savers), allow_missing_keys=True)
        self.savers = dict(savers)

    def __call__(self, data: Mapping[Hashable, object]) -> Mapping[Hashable, object]:
        write_concurrently([partial(self.savers[key], data) for key in self.key_iterator(data)])
        return data


def image_savers(output_dir: str | os.PathLike, contours: bool = False) -> SaveImagesd:
    """``<output_dir>/<case>_seg.nii.gz`` (uint8) and ``<case>_conf.nii.gz`` (float32), and with ``contours``
    ``<case>_inner.nii.gz`` and ``<case>_outer.nii.gz`` (uint8) where ``ContourMarginsd`` made them."""
    save = {
        "output_dir": str(output_dir),
        "separate_folder": False,
        "resample": False,
        "print_log": False,
        "output_name_formatter": case_name_formatter,
        "writer": GridNibabelWriter,
    }
    postfixes = {**OUTPUT_POSTFIXES, **(CONTOUR_POSTFIXES if contours else {})}
    dtypes = {"confidence": "float32"}
    return SaveImagesd(
        {
            key: SaveImaged(key, output_postfix=postfix, output_dtype=dtypes.get(key, "uint8"), **save)
            for key, postfix in postfixes.items()
        }
    )
