"""What the ACDC bundles lose by labelling on the network's 96 x 96 grid (issue 29): the best 96 x 96 labelling of
each test label (one-hot, area-downsampled, argmax), upsampled back to the image's grid (nearest, as `inferring`
returned the segmentation until it mapped the probabilities back before the argmax), against the label. From the repository root, after this folder's `quality` study:

    python docs/results/acdc/quality/grid_loss.py
"""

import json

import nibabel as nib
import numpy as np
import torch
import torch.nn.functional as F

test = json.load(open("runs/quality/acdc/seed0/ce_dice_acdc/models/datalist.json"))["test"]
scores = []
for item in test[:20]:
    label = torch.as_tensor(np.asarray(nib.load(item["label"]).dataobj).round().astype(np.int64))
    height, width, _ = label.shape
    onehot = F.one_hot(label, 4).permute(2, 3, 0, 1).float()  # slices, classes, H, W
    best = F.interpolate(onehot, size=(96, 96), mode="area").argmax(1)
    back = F.interpolate(F.one_hot(best, 4).permute(0, 3, 1, 2).float(), size=(height, width), mode="nearest")
    back = back.argmax(1).permute(1, 2, 0)
    dice = []
    for c in (1, 2, 3):
        a, b = back == c, label == c
        dice.append(2 * (a & b).sum().item() / max(1, a.sum().item() + b.sum().item()))
    scores.append(dice)
mean = np.mean(scores, 0)
print(f"{len(scores)} test volumes: DSC RV {mean[0]:.3f}, Myo {mean[1]:.3f}, LV {mean[2]:.3f}, mean {mean.mean():.3f}")
