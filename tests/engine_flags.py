"""vLLM engine flags every test that starts a real engine passes.

``--enforce-eager``: no test measures speed, and torch.compile's warm-up is most of a CPU
engine's start (the tiny model's server is ready in about 43 s eager against 58 s with a
warm compile cache and 89 s with a cold one, on this 2-core machine). Each test that
starts engines passes it, so CI spends its time on what the tests check."""

EAGER = ["--enforce-eager"]
