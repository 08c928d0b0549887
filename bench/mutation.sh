#!/usr/bin/env bash
# Mutation testing of the core modules with the README's fast tests (see docs/testing.md):
#
#     pip install 'mutmut==3.8.1' && bash bench/mutation.sh [--work DIR] [--jobs N] [--again] [MODULE ...]
#
# Prints module | mutants | killed | survived | score. Not part of CI: a module takes 15-25 min on a
# busy 2-core machine.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/mutation.py" "$@"
