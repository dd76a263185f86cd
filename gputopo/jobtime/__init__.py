"""How long a data-parallel training step takes on a placement: the measured job-time model
(`model`: NVLink/NVSwitch/PCIe efficiencies, NICs per node, fabric efficiency, oversubscription,
overlap with the backward pass), the workload profiles it runs (`profiles`) and tensor x data
parallel LLM jobs (`parallel`: TP traffic inside each group, gradient all-reduce across replicas). Every constant
has its source in docs/jobtime.md. The simulator and the sidecar read the same model."""
