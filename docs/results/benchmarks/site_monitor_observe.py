"""The site monitor's own cost per served case against the number of cases its stream has seen: the median time of
``SiteMonitor.observe`` (lock, read and check ``site.json``, look the image up in ``site_cases.jsonl``, append the
case, one step of the martingale, write ``site.json`` atomically) over 20 new cases after a stream of 0, 100, 1,000
and 5,000 earlier ones (random ranks, 3 signals).

    python docs/results/benchmarks/site_monitor_observe.py
"""

import random
import statistics
import tempfile
import time

from calib_monai.atomic import write_json_atomically
from calib_monai.review import SiteMonitor
from calib_monai.review.site_monitor import advance, new_state
from calib_monai.review.site_store import write_log

SIGNALS = ("case_score", "input", "features")
rng = random.Random(0)
for earlier in (0, 100, 1000, 5000):
    monitor = SiteMonitor(tempfile.mkdtemp(), "a" * 64, "b" * 64, 25, SIGNALS)
    if earlier:
        state, cases = new_state(monitor.weights_sha256, monitor.range_sha256, monitor.test), []
        for i in range(earlier):
            ranks = {s: rng.randint(1, 26) for s in SIGNALS}
            cases.append({"hash": f"h{i}", "rank": rng.randint(1, 26), "signal_ranks": ranks})
            advance(state, cases[-1]["rank"], ranks, monitor.test)
        state["cases_bytes"] = write_log(monitor.folder, cases)
        write_json_atomically(monitor.path, state)
    times = []
    for i in range(20):
        start = time.perf_counter()
        monitor.observe(f"new{i}", rng.randint(1, 26), {s: rng.randint(1, 26) for s in SIGNALS})
        times.append(time.perf_counter() - start)
    print(f"| {earlier} | {statistics.median(times) * 1000:.1f} |")
