"""Where a FlashPass run's time goes (gemini_lab.flashpass.anatomy) without a guest: the
max-min fair rates, the fluid schedule, the fair bytes of a run's flows and the credit
regrowth after a flow's end."""

from __future__ import annotations

import pytest

from gemini_lab.flashpass import anatomy


def test_max_min_shares_the_bottleneck_equally_without_access_links() -> None:
    rates = anatomy.max_min([1, 2, 3, 4], {1: 0, 2: 0, 3: 1, 4: 2}, 12.0)
    assert rates == {1: 3.0, 2: 3.0, 3: 3.0, 4: 3.0}


def test_max_min_freezes_a_sender_s_flows_at_its_access_link_and_gives_the_rest_away() -> None:
    # two flows behind one 2-unit access link, one alone behind another, a 10-unit bottleneck
    rates = anatomy.max_min([1, 2, 3], {1: 0, 2: 0, 3: 1}, 10.0, access_bps=2.0)
    assert rates == {1: 1.0, 2: 1.0, 3: 2.0}
    rates = anatomy.max_min([1, 2, 3], {1: 0, 2: 0, 3: 1}, 10.0, access_bps=6.0)
    assert rates == pytest.approx({1: 3.0, 2: 3.0, 3: 4.0})
    rates = anatomy.max_min([1, 2, 3], {1: 0, 2: 0, 3: 1}, 10.0, access_bps=8.0)
    assert rates == pytest.approx({1: 10 / 3, 2: 10 / 3, 3: 10 / 3})


def test_the_fluid_schedule_shares_the_link_between_overlapping_flows() -> None:
    # 1000 B at 8000 b/s alone is 1 s; a second flow of 500 B arrives at 0.5 s: both at
    # half the link, the second done at 1.5 s (500 B at 500 B/s), the first at 1.5 s too
    flows = [
        {"flow": 1, "bytes": 1000, "start_ms": 0.0, "sender": 0},
        {"flow": 2, "bytes": 500, "start_ms": 500.0, "sender": 1},
    ]
    fct = anatomy.fluid_fcts(flows, 8000.0)
    assert fct[1] == pytest.approx(1.5)
    assert fct[2] == pytest.approx(1.0)
    assert anatomy.fluid_fcts(flows, 8000.0, access_bps=4000.0) == pytest.approx({1: 2.0, 2: 1.0})
    one_host = [f | {"sender": 0} for f in flows]  # both behind one access link
    assert anatomy.fluid_fcts(one_host, 8000.0, access_bps=4000.0) == pytest.approx(
        {1: 3.0, 2: 2.0}
    )


def test_fair_bytes_are_the_link_over_the_flows_active_at_each_instant() -> None:
    life = {1: (0.0, 2.0), 2: (1.0, 2.0)}
    fair = anatomy.fair_bytes(life, 8.0)  # 1 byte/s
    assert fair == pytest.approx({1: 1.5, 2: 0.5})


def test_regrowth_is_the_time_to_the_first_full_bin_after_an_end_and_an_arrival_cuts_it() -> None:
    life = {1: (0.0, 1.05), 2: (0.0, 3.0), 3: (2.0, 2.5)}
    bins = [10] * 10 + [5, 6, 9, 10] + [10] * 16  # bins of 0.1 s
    times, censored = anatomy.regrowth(life, bins, 10.0)
    # flow 1 ends at 1.05: bins 11, 12 are under 90 %, bin 12 (1.2-1.3 s) reaches 9 ≥ 9
    assert times == pytest.approx([0.25, 0.1])  # flow 3's end at 2.5: the next bin is full
    assert censored == 0
    life[4] = (1.15, 1.5)  # an arrival before the regrowth: censored
    assert anatomy.regrowth(life, bins, 10.0)[1] >= 1
