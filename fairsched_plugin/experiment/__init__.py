"""What the simulator and the benchmark share: arms, cases and requests, workloads, traces,
sessions, stand-in tokens, run files, run statistics and reports."""
