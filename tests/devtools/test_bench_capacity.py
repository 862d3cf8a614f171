"""`make bench`'s capacity section: how its goals are judged, the ablation's included."""

from __future__ import annotations

from inferop_devtools.bench.capacity import capacity_lines, capacity_targets


def test_a_spread_or_a_load_that_moves_the_figure_is_missed_and_the_clock_must_show_the_load() -> None:
    steady = {"network": "conv_net", "batch": 8, "busy": 2,
              "idle": {"cpu_time": [750.0, 740.0, 745.0], "clock": [740.0, 730.0, 735.0]},
              "loaded": {"cpu_time": [748.0, 735.0, 742.0], "clock": [480.0, 500.0, 470.0]}}  # fmt: skip
    assert [target.missed for target in capacity_targets(steady)] == [False, False, False]
    halved = {**steady, "loaded": {"cpu_time": [300.0, 360.0, 690.0], "clock": [300.0, 360.0, 690.0]}}
    assert [target.missed for target in capacity_targets(halved)] == [True, True, False]
    unloaded = {**steady, "loaded": steady["idle"]}  # the clock saw no load: the run had no power
    assert [target.missed for target in capacity_targets(unloaded)] == [False, False, True]
    assert "loaded  timed by the clock (ablation)   480, 500, 470  (spread 6.2%)" in "\n".join(capacity_lines(steady))
