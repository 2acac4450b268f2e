"""The site monitor's own cost per served case against the number of cases its stream has seen: the median time of
``SiteMonitor.observe`` (lock, read and check ``site.json``, add the case, write it atomically, the martingale over
every case) over 20 new cases after a stream of 0, 100, 1,000 and 5,000 earlier ones (random ranks, 3 signals).

    python docs/results/benchmarks/site_monitor_observe.py
"""

import random
import statistics
import tempfile
import time

from calib_monai.atomic import write_json_atomically
from calib_monai.review import SiteMonitor

SIGNALS = ("case_score", "input", "features")
rng = random.Random(0)
for earlier in (0, 100, 1000, 5000):
    monitor = SiteMonitor(tempfile.mkdtemp(), "a" * 64, "b" * 64, 25, SIGNALS)
    if earlier:
        state = {**monitor._new_state(), "cases": []}
        for i in range(earlier):
            ranks = {s: rng.randint(1, 26) for s in SIGNALS}
            state["cases"].append({"hash": f"h{i}", "rank": rng.randint(1, 26), "signal_ranks": ranks})
        write_json_atomically(monitor.path, state)
    times = []
    for i in range(20):
        start = time.perf_counter()
        monitor.observe(f"new{i}", rng.randint(1, 26), {s: rng.randint(1, 26) for s in SIGNALS})
        times.append(time.perf_counter() - start)
    print(f"| {earlier} | {statistics.median(times) * 1000:.1f} |")
