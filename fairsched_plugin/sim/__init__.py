"""A scheduler-in-the-loop simulator: vLLM's real scheduler classes (stock and the
plugin's), fake model outputs, a virtual clock and a step-time model.

Exact: every scheduling decision (vLLM's and the policy's code runs unchanged). Modelled:
only how long each engine step takes (``step_models``). ``fake_engine`` is the same
fake-output pattern on the wall clock, without arrivals or a step-time model: the test
suite's and the overhead benchmarks' engine.
"""
