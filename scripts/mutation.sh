#!/usr/bin/env bash
# Mutation testing of kvgeom's rule modules (docs/mutation.md): mutmut mutates the modules listed under
# [tool.mutmut] in pyproject.toml and runs, for each mutant, only the tests that cover the mutated function.
# Slow (tens of minutes on 2 cores), so it is not part of .ci/run. Results stay in mutants/ (git-ignored)
# and later runs only re-test the functions that changed.
#
#   scripts/mutation.sh                      # run every mutant not yet decided
#   scripts/mutation.sh 'kvgeom.keys.*'      # only these mutants (mutmut name globs)
#   MUTMUT=/path/to/mutmut scripts/mutation.sh
#
# Then: mutmut results (the survivors), mutmut show NAME (one mutant's diff).
set -euo pipefail
cd "$(dirname "$0")/.."
MUTMUT=${MUTMUT:-mutmut}
# derandomized examples: a mutant is killed or not the same way on every run
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
start=$(date +%s)
nice -n 10 "$MUTMUT" run --max-children "${MUTMUT_CHILDREN:-2}" "$@"
echo "mutation run: $(( $(date +%s) - start )) s"
