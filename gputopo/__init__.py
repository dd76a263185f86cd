"""The pure core of gputopo (topology-aware GPU scheduling for Kubernetes): link bandwidths,
topology, the node objective and its exact allocator, gang placement, the simulator, the CLI.

This package is the pure core shared by the device plugin, the scheduler sidecar, the CLI and
the simulator. It does no network or hardware I/O and holds no global state. Its subpackages
each decide one thing, and import only the ones below them (pyproject.toml's import-linter
contract; docs/architecture.md has the map):

- `gputopo.sim`: the simulator, replaying a workload through gputopo and today's policies;
- `gputopo.gang`: where a gang goes, and its life from the first member to the last bind;
- `gputopo.pod`: where one pod that is not in a gang goes (and the cluster objective);
- `gputopo.network`: which nodes share a network domain, and what is known of each node;
- `gputopo.node`: which GPUs inside one node (the node objective and its exact allocator).

Beside them: the `gputopo` command (`cli`, `commands`, `output`) and what every layer may use
(`numerals`, `userfile`, `jsonlog`).
"""

__version__ = "0.1.0"
