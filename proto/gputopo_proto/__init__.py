"""Generated gRPC/protobuf code of the kubelet APIs and gputopo's status service (see proto/generate.sh)."""
