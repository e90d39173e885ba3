#!/usr/bin/env bash
# Fails (and lists the files) when any tracked C++ file is not clang-format
# clean under the repository's .clang-format.
set -uo pipefail
cd "$(dirname "$0")/../.."
mapfile -t files < <(git ls-files -- '*.h' '*.cc' '*.cu' '*.cuh')
[ ${#files[@]} -eq 0 ] && exit 0
bad=()
for f in "${files[@]}"; do
  if ! clang-format --dry-run -Werror --style=file "$f" >/dev/null 2>&1; then
    bad+=("$f")
  fi
done
if [ ${#bad[@]} -ne 0 ]; then
  echo "not clang-format clean (run clang-format -i): ${bad[*]}"
  exit 1
fi
echo "clang-format: ${#files[@]} files clean"
