"""What Next Sample's feature hook costs a served prediction: ``TrainedBundle.predict_item`` with and without the
pooled-features hook that ``ServedBundle.predict`` puts on the network (``calib_monai.label.serving``), interleaved
on the same preprocessed volumes, on the quality study's CE+Dice seed-0 run. From the repository root, after
``scripts/experiments.py quality`` on Hippocampus (README)::

    python docs/results/benchmarks/feature_hook_cost.py ../shared/data/Task04_Hippocampus
"""

import json
import statistics
import sys
import time

sys.path.insert(0, ".")  # the repository root: studies/ is not installed
from calib_monai.label.serving import _pooled_features  # noqa: E402
from studies.quality import _serving_bundle  # noqa: E402
from studies.study import StudySetup  # noqa: E402

setup = StudySetup(
    "hpc",
    dataset_dir=sys.argv[1],
    runs_dir="runs/quality/hpc",
    epochs=6,
    lr_milestone=4,
    train_fraction=0.5,
    split_seed=0,
).seeded(0)
models = setup.spec("ce_dice").models_dir
bundle = _serving_bundle(setup, "ce_dice", models)
items = [bundle.preprocess(i["image"]) for i in json.loads((models / "datalist.json").read_text())["test"][:20]]
bundle.predict_item(items[0])  # warm-up: the network is built
plain, hooked = [], []
for _ in range(5):
    for item in items:
        start = time.perf_counter()
        bundle.predict_item(item)
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        with _pooled_features(bundle.network):
            bundle.predict_item(item)
        hooked.append(time.perf_counter() - start)
ratio = statistics.median(h / p for h, p in zip(hooked, plain))
print(
    f"predict_item on {len(items)} volumes x 5 rounds: without the hook {statistics.median(plain) * 1e3:.1f} ms, "
    f"with it {statistics.median(hooked) * 1e3:.1f} ms (medians); with / without: {ratio:.3f} (median per volume)"
)
