

def test_the_time_axis_starts_at_the_first_sample_not_its_bucket():
    """A coarse level stamps its rows with the bucket's start, up to 10 s
    before the first sample: the axis (and its "so far") starts at the
    sample (the chip's screens read "24s so far" beside "up 20s")."""
    import numpy as np

    from jaxtop.dashboard.history import Window
    from jaxtop.dashboard.snapshot import _span

    rows = np.zeros((3, 1))
    coarse = Window(np.array([1000.0, 1010.0, 1020.0]), rows, rows, 10.0)
    assert _span(coarse, 600.0, 1024.3, first_t=1004.3) == (1004.3, 1024.3)
    assert _span(coarse, 600.0, 1024.3) == (1000.0, 1024.3)  # no first sample known: the bucket's
    assert _span(coarse, 10.0, 1024.3, first_t=1004.3) == (1014.3, 1024.3)  # the window still bounds it
