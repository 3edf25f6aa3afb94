"""A/B experiments: arms of congestion controls (and how their parameters are set) on a
population of hosts, a deterministic split of that population, results per day and per arm with
confidence intervals, and a guardrail that stops a harmful arm.

- ``domain``: what an operator declares (``ExperimentCreate``) and what is kept (``Experiment``),
  and ``Days``, the one mapping between instants and experiment days (UTC calendar days by
  default, or compressed days of ``day_seconds`` for a rehearsal), each labelled by a date.
- ``assignment``: which arm a host runs, a pure function of the experiment's salt, the host and
  the day (hash position; crossover swaps the two groups).
- ``statistics``: per-arm estimates and differences from per-host-day ``FlowSums``, with
  intervals that treat hosts, the unit of randomisation, as independent, not flows.
- ``guardrail``: which arms to stop, from the difference to control.

The package is the experiments' domain: its modules import neither storage nor the service
layer. Storage is ``storage/experiments.py``; the service over it (results, guardrail
enforcement, the agents' arm cache) is ``service/experiments.py`` and ``service/arm_cache.py``;
the REST routes are ``service/rest/experiments.py``. ``cache`` and ``service`` here are only
re-export names for callers not yet moved (``service/core.py``, ``service/guardrail_task.py``),
to be deleted once they import from the service layer (``tests/test_layers.py`` lists them).
"""
