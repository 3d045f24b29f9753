#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds and runs a
# consumer with find_package(pagedattn) and one with pkg-config.
# Usage: run.sh BUILD_DIR SOURCE_DIR SCRATCH_DIR
set -euo pipefail
build=$1 source=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
cmake -S "$source/tests/consumer" -B "$scratch/consumer" -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/consumer" >/dev/null
LD_LIBRARY_PATH="$scratch/prefix/lib:$scratch/prefix/lib64" "$scratch/consumer/consumer_shared"
"$scratch/consumer/consumer_static"
if command -v pkg-config >/dev/null; then
  pc_dir=$(dirname "$(find "$scratch/prefix" -name pagedattn.pc | head -n 1)")
  flags=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs --static pagedattn)
  cc "$source/tests/consumer/consumer.c" $flags -o "$scratch/consumer_pc"
  LD_LIBRARY_PATH="$scratch/prefix/lib:$scratch/prefix/lib64" "$scratch/consumer_pc"
fi
