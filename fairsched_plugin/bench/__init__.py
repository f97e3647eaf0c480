"""A real server: starting it, the replay client, vLLM's own benchmark client, the runner that
replays each arm, and the profiling run."""
