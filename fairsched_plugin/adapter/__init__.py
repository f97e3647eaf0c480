"""The thin vLLM layer: scheduler subclasses, the policy-ordered waiting queue, checks.

The only part of the package that imports vLLM.
"""
