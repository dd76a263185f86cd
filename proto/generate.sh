#!/bin/sh
# Regenerates the Python code beside every .proto under proto/gputopo_proto/.
# Generated imports read `from gputopo_proto... import ...`, the package pyproject installs.
# tests/test_proto_drift.py regenerates into a temporary folder and fails when the committed
# files differ, so run this after every .proto change and commit both.
set -eu
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python}"
"$PYTHON" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \
  gputopo_proto/deviceplugin/v1beta1/api.proto \
  gputopo_proto/podresources/v1/api.proto \
  gputopo_proto/status/v1/status.proto \
  gputopo_proto/pluginregistration/v1/api.proto \
  gputopo_proto/dra/v1/api.proto
