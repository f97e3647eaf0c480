"""vLLM's own scheduler tests (``tests/v1/core/`` of the installed vLLM's source release),
run against the plugin's scheduler classes. See :mod:`tests.vllm_upstream.harness`."""
