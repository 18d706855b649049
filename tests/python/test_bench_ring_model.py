"""bench/ring_model.py: the seam placed as the library places it, and the model's steps never
below their bounds."""

import pytest

from conftest import load_bench


@pytest.fixture(scope="module")
def rm():
    return load_bench("ring_model")


def test_the_seam_as_the_library_places_it(rm):
    units = rm.flux_q8(pack=False)  # 58 units: "", 19 doubles, 38 singles
    seam = rm.ddo_seam(units, 6)
    assert 6 <= seam <= 52 and all(units[(seam + j) % 58][0] < 200 for j in range(-6, 6))
    assert rm.ddo_seam(units[:54], 6) == 0  # 54 units: a multiple of the slots, no seam
    assert rm.ddo_seam(units, 60) == 0      # every unit its own slot


def test_steps_are_never_below_their_bounds(rm):
    for pack in (False, True):
        units = rm.flux_q8(pack)
        compute = sum(c for _, c in units) + 6.0
        bus = sum(mb for mb, _ in units) / 54.0
        for slots in (2, 4, 6, 8):
            for kw in ({}, {"homes": True}, {"homes": True, "seam": rm.ddo_seam(units, slots)}):
                for barrier in (True, False):
                    assert rm.step_ms(units, slots, barrier=barrier, **kw) >= \
                        max(compute, bus) - 1e-9
    # a window that reaches further never makes the back-to-back step slower here
    units = rm.flux_q8(pack=False)
    assert rm.step_ms(units, 8, barrier=False) <= rm.step_ms(units, 4, barrier=False)
