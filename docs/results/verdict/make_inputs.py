import json
import os

import nibabel as nib
import numpy as np
import torch

from calib_monai.data.site_shift import SITE_SHIFT_KINDS, apply_site_shift

d = json.load(open("runs/verdict/hpc/datalist.json"))
test = [c["image"] for c in d["test"]]
os.makedirs("runs/verdict/hpc_test", exist_ok=True)
for p in test:
    dst = f"runs/verdict/hpc_test/{os.path.basename(p)}"
    if not os.path.exists(dst):
        os.symlink(p, dst)
os.makedirs("runs/verdict/acdc10", exist_ok=True)
for pid in open("../shared/data/ACDC/splits/test.list").read().split()[:10]:
    src = f"../shared/data/ACDC/database/training/{pid}/{pid}_frame01.nii.gz"
    dst = f"runs/verdict/acdc10/{pid}_frame01.nii.gz"
    if not os.path.exists(dst):
        os.symlink(src, dst)
for kind in SITE_SHIFT_KINDS:
    out = f"runs/verdict/shift_{kind}"
    os.makedirs(out, exist_ok=True)
    for i, p in enumerate(test):
        img = nib.load(p)
        x = torch.as_tensor(np.asarray(img.dataobj, dtype=np.float32))[None]
        y = apply_site_shift(x, kind, "strong", seed=i)[0].numpy()
        nib.save(nib.Nifti1Image(y.astype(np.float32), img.affine), f"{out}/{os.path.basename(p)}")
print(len(test), SITE_SHIFT_KINDS)
