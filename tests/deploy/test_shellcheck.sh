#!/usr/bin/env bash
# Every shell script of deploy/ and of these tests passes shellcheck.
set -euo pipefail
# shellcheck source=tests/deploy/lib.sh
source "$(dirname "$0")/lib.sh"
command -v shellcheck >/dev/null || skip "no shellcheck (HINT: deploy/install-deps.sh --test)"
cd "$root"
scripts=(deploy/*.sh deploy/slurm/zps-slurm.sh deploy/slurm/zps.sbatch deploy/slurm/zps-torch.sbatch
         tests/deploy/*.sh tests/valgrind/*.sh tests/lib/*.sh bench/*.sh bench/comm)
for f in "${scripts[@]}"; do
  [ -e "$f" ] || continue
  if out=$(shellcheck -x "$f" 2>&1); then pass "$f"; else fail "$f"; echo "$out"; fi
done
finish
