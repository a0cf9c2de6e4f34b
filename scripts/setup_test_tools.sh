#!/usr/bin/env bash
# What the test command needs beyond scripts/setup.sh (which defines install_missing; only
# what is missing is installed): the job launchers the launch tests run under
# (scripts/launch_test.sh, slurm_test.sh: Open MPI, MPICH, Slurm and munge) and the browser the
# dashboard is tested in (scripts/dashboard_test.sh), without their recommended extras. Where
# they cannot be installed, those tests say so and skip.
install_missing --no-install-recommends -- openmpi-bin mpich slurm-wlm munge chromium fonts-dejavu-core \
  || echo "setup: the launchers or the browser could not be installed: their tests will say so and skip"
