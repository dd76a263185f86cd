"""How long a data-parallel training step takes on a placement: the measured job-time model
(`model`: NVLink/NVSwitch/PCIe efficiencies, NICs per node, fabric efficiency, oversubscription,
overlap with the backward pass) and the workload profiles it runs (`profiles`). Every constant
has its source in docs/jobtime.md. The simulator and the sidecar read the same model."""
