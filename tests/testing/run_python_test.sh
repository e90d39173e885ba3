#!/bin/bash
# Runs a Python test with Debian's /usr/bin/python3 (numpy,
# PyYAML). Usage: run_python_test.sh TEST.py
set -euo pipefail
exec /usr/bin/python3 -B "$@"
