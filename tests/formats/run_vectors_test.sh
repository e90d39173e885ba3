#!/bin/bash
# Runs a format's Python reference self-test, writes its test vectors with a
# seed and runs a C++ test binary against them (MNEME_VECTORS).
# Usage: run_vectors_test.sh GENERATOR.py SEED TEST_BINARY
set -euo pipefail
generator=$1
seed=$2
binary=$3
vectors="${TEST_TMPDIR:-$(mktemp -d)}/vectors.safetensors"
/usr/bin/python3 -B "$generator" --self-test
/usr/bin/python3 -B "$generator" --out "$vectors" --seed "$seed"
MNEME_VECTORS="$vectors" exec "$binary"
