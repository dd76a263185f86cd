"""The simulator: replay a workload on a cluster through gputopo and today's policies.

Pure apart from reading trace and cluster files (traces.py, clusters.py); time, randomness and
progress reporting are injected by the caller (cli.py).
"""
