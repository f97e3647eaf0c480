"""Test models built offline, so engine-level tests need no model download."""
