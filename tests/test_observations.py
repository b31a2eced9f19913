"""What the daemon hands the batch tuner: the batches each window ran, one group
per window, so the tuner can fit batch time against size and see its scatter."""
import math

import numpy as np

from daemon.model.histogram import BucketHistogram
from daemon.control.observations import batches_run
from daemon.model.window import Window


def counts(bounds, values) -> BucketHistogram:
    bounds = (*bounds, math.inf)
    c = np.zeros(len(bounds))
    for v in values:
        c[next(i for i, b in enumerate(bounds) if v <= b)] += 1
    return BucketHistogram(bounds, c, float(sum(values)))


def window(t, sizes, compute_s) -> Window:
    w = Window("inference", t, t + 1, 0.5)
    if sizes:
        w.histograms[("inference_batch_size", "")] = counts((1, 2, 4, 8, 16, 32), sizes)
        w.histograms[("inference_batch_compute_seconds", "")] = counts((0.01, 0.05, 0.1), compute_s)
    return w


def test_each_window_with_batches_is_one_group_of_its_mean_size_count_and_mean_time():
    ws = [window(0, [8, 8, 16], [0.03, 0.03, 0.06]), window(1, [], []), window(2, [2, 4], [0.01, 0.02])]
    assert batches_run(ws) == ((11, 3, 0.04), (3, 2, 0.015))
