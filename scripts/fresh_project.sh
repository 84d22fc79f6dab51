#!/usr/bin/env bash
# A fresh copy of the project in DIR, a git repository of its own: where the GPU sessions run the pipeline, as
# in a user's clone (the device machine's copy of the tree carries no .git).
#   bash scripts/fresh_project.sh DIR
set -euo pipefail
DIR=${1:?usage: fresh_project.sh DIR}
rm -rf "$DIR" && mkdir -p "$DIR"
# the whole tree as a clone has it, less what the device tool carries and what runs leave behind
tar cf - --exclude=./.git --exclude=./.whl --exclude=./.whl_extra --exclude=./.venv --exclude=__pycache__ --exclude=./workspace \
  --exclude=./results.tsv --exclude=./.night --exclude=.pytest_cache --exclude=.ruff_cache --exclude="*.egg-info" . | tar xf - -C "$DIR"
cd "$DIR" && git init -q && git add -A && git -c user.name=setup -c user.email=setup@localhost commit -qm "fresh project"
