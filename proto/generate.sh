#!/usr/bin/env bash
# Regenerates the Python stubs of proto/cronscale/v1/*.proto next to their sources, so the path
# under the include root (proto/) equals the import path (cronscale.v1). CI fails if this
# changes anything that is committed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python}
cd "$here"
rm -f cronscale/v1/*_pb2*.py cronscale/v1/*_pb2*.pyi
"$py" -m grpc_tools.protoc -I . \
  --python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. \
  cronscale/v1/*.proto
