#!/usr/bin/env bash
# A fresh copy of the project in DIR, a git repository of its own: where the GPU sessions run the pipeline, as
# in a user's clone (the device machine's copy of the tree carries no .git).
#   bash scripts/fresh_project.sh DIR
set -euo pipefail
DIR=${1:?usage: fresh_project.sh DIR}
rm -rf "$DIR" && mkdir -p "$DIR"
cp -r autokernel kernels models profiles benchmarks reference.py bench.py orchestrate.py profile.py extract.py \
  verify.py program.md pyproject.toml kernel.py .gitignore "$DIR"/
cd "$DIR" && git init -q && git add -A && git -c user.name=setup -c user.email=setup@localhost commit -qm "fresh project"
