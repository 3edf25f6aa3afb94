"""The θ specification is the one source of truth: the proto, defaults and search space agree."""

import numpy as np
import pytest

from gemini_api.theta import ThetaError, load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster.policy.surrogate import ThetaSpace


def test_table_iii_regions_and_granularity():
    spec = load_spec()
    natural = {
        p.name: (p.to_natural(p.production[0]), p.to_natural(p.production[1])) for p in spec.params
    }
    assert natural == {
        "init_cwnd": (10, 50),
        "mult_increase": (1.0, 1.25),
        "add_increase": (1, 10),
        "mult_decrease": (0.5, 0.9),
        "loss_threshold": (0.0, 1.0),
        "rtt_threshold": (1, 100),
        "window_intervals": (1, 60),
    }
    assert spec.param("mult_decrease").wide == (10, 99)  # λ ∈ [0.1, 0.99] in Θ'
    assert spec.param("loss_threshold").wide == (0, 1000)  # l ∈ [0 %, 100 %] in 0.1 % steps


def test_proto_theta_fields_follow_the_spec():
    assert tuple(f.name for f in pb.Theta.DESCRIPTOR.fields) == load_spec().names


def test_default_is_inside_production_region():
    spec = load_spec()
    assert spec.violations(spec.default(), spec.region_bounds("production")) == []


def test_validation_names_each_offending_parameter():
    spec = load_spec()
    theta = spec.default() | {"mult_decrease": 95, "init_cwnd": 5}
    with pytest.raises(ThetaError) as e:
        spec.validate(theta, spec.region_bounds("production"))
    assert "mult_decrease: 95 outside [50, 90]" in str(e.value)
    assert "init_cwnd: 5 outside [10, 50]" in str(e.value)


def test_search_space_samples_on_the_granularity_grid_inside_bounds():
    spec = load_spec()
    bounds = spec.region_bounds("production")
    space = ThetaSpace(spec, bounds)
    thetas = space.sample(500, np.random.default_rng(1))
    assert all(spec.violations(t, bounds) == [] for t in thetas)
    assert all(isinstance(v, int) for t in thetas for v in t.values())
    round_trip = space.decode(space.encode(thetas))
    assert round_trip == thetas


def test_pinned_parameters_are_not_searched():
    spec = load_spec()
    bounds = spec.region_bounds("production") | {"window_intervals": (8, 8)}
    space = ThetaSpace(spec, bounds)
    assert "window_intervals" not in space.free
    assert {t["window_intervals"] for t in space.sample(50, np.random.default_rng(0))} == {8}
