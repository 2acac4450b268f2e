"""What scoring the case on the input grid costs on the serving path: time and peak memory of the postprocessing of
one CT-sized case, against the network-grid chain, each variant in its own process.

The case: a 512 x 512 x 100 image of 0.8 x 0.8 x 2.5 mm (a FLARE-sized CT), preprocessed as the FLARE bundles do
(RAS, ``Spacingd`` to 1.6 x 1.6 x 6 mm: a 256 x 256 x 42 network grid), and smooth random logits of 5 classes on that
grid. Variants, after the softmax:

- ``input grid`` (the bundles from issue 29.1 to issue 50): ``Invertd`` of the 5 probability channels to the input
  grid, then the case quality, the argmax and the confidence there;
- ``network grid`` (the bundles now, ``calib_monai.data.segmentation_and_confidence``): the case quality, the argmax
  and the confidence on the network grid, then ``Invertd`` of the segmentation (nearest) and the confidence back to
  the input grid.

Prints a Markdown table: median seconds over ``--repeats`` calls and the process's peak resident memory above what
the inputs took, and the ratios of the first to the second. Run: ``python scripts/benchmark_serving.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import time


def _inputs(shape, spacing, classes):
    import torch
    from monai.data import MetaTensor
    from monai.transforms import Compose, Orientationd, Spacingd

    affine = torch.diag(torch.tensor([*spacing, 1.0], dtype=torch.float64))
    image = MetaTensor(torch.rand(1, *shape), affine=affine)
    chain = Compose(
        [
            Orientationd("image", axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S"))),
            Spacingd("image", pixdim=(1.6, 1.6, 6.0), mode="bilinear", dtype=torch.float32),
        ]
    )
    item = chain({"image": image})
    grid = item["image"].shape[1:]
    generator = torch.Generator().manual_seed(0)
    coarse = torch.randn(1, classes, *[max(2, s // 16) for s in grid], generator=generator) * 4
    logits = torch.nn.functional.interpolate(coarse, size=tuple(grid), mode="trilinear")[0]
    return chain, item["image"], MetaTensor(logits, meta=dict(item["image"].meta))


def _run(variant: str, args, queue) -> None:
    import torch
    from monai.transforms import Invertd

    from calib_monai.metrics.case_quality import case_quality
    from calib_monai.review.validated_range import voxel_volume_ml

    torch.set_num_threads(args.threads)
    chain, image, logits = _inputs(tuple(args.shape), tuple(args.spacing), args.classes)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        prob = torch.softmax(logits, dim=0)
        prob.meta = dict(logits.meta)
        if variant == "input grid":
            prob = Invertd("pred", transform=chain, orig_keys="image", nearest_interp=False)(
                {"pred": prob, "image": image}
            )["pred"]
            quality = case_quality(prob, voxel_volume=voxel_volume_ml(prob))
            confidence, segmentation = prob.max(dim=0, keepdim=True)
        else:
            quality = case_quality(prob, voxel_volume=voxel_volume_ml(image))
            confidence, segmentation = prob.max(dim=0, keepdim=True)
            out = Invertd(["seg", "conf"], transform=chain, orig_keys="image", nearest_interp=(True, False))(
                {"seg": segmentation.float(), "conf": confidence, "image": image}
            )
            confidence, segmentation = out["conf"], out["seg"]
        times.append(time.perf_counter() - start)
        assert quality["case_score"] == quality["case_score"] and segmentation.shape[1:] == tuple(args.shape)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    queue.put((statistics.median(times), (peak - before) / 1024))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs=3, default=[512, 512, 100])
    parser.add_argument("--spacing", type=float, nargs=3, default=[0.8, 0.8, 2.5])
    parser.add_argument("--classes", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    context = mp.get_context("spawn")  # a fresh process per variant: its own peak memory
    results = {}
    for variant in ("input grid", "network grid"):
        queue = context.Queue()
        process = context.Process(target=_run, args=(variant, args, queue))
        process.start()
        results[variant] = queue.get()
        process.join()
    shape = "x".join(map(str, args.shape))
    print(f"One case of {shape} voxels, {args.classes} classes, {args.threads} threads, median of {args.repeats}:\n")
    print("| postprocessing | seconds | peak memory above the inputs (MiB) |\n|---|---|---|")
    for variant, (seconds, mib) in results.items():
        print(f"| {variant} | {seconds:.2f} | {mib:.0f} |")
    (new_s, new_m), (old_s, old_m) = results["input grid"], results["network grid"]
    print(f"\ninput grid / network grid: {new_s / old_s:.2f}x the time, {new_m / max(old_m, 1):.2f}x the memory")


if __name__ == "__main__":
    main()
