"""The thin vLLM layer: scheduler subclasses, the policy-ordered waiting queue, checks.

The only part of the serving path that imports vLLM (outside it, ``sim/`` drives vLLM's
scheduler classes with fake model outputs).
"""
