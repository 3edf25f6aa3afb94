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

Storage is ``storage/experiments.py``; the REST routes are ``service/rest/experiments.py``.
"""
