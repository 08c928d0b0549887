"""``tritonwarm tune``: give every autotuned call in the specs its winner, where Triton's autotuner reads it.

On a GPU (``--target local``) Triton benchmarks each row's pruned configs with its own benchmarker and
stores the winner (``cache_results``); for any other target nothing runs: the config each row pins
(``config:``) is stored as the winner. Either way a server reading the cache never benchmarks.
"""

from __future__ import annotations

import json
import sys

from .common import UsageError, add_spec_args, prepare


def add_parsers(sub) -> None:
    t = sub.add_parser("tune", help="store autotune winners: measured on this GPU (--target local) or as pinned "
                                    "by the specs' config: field (any other target)")
    add_spec_args(t)
    t.set_defaults(func=cmd_tune)


def cmd_tune(args) -> int:
    from ..jit.adopt.winners import pin_winners, tune_winners
    from ..jit.cache import check_cache_dir, refuse_if_served_elsewhere
    from ..jit.cache.overlay import refuse_if_overlaid
    from ..jit.core.targets import local_target

    measure = args.target in (None, "local")
    if measure and local_target() is None:
        raise UsageError("tune --target local measures on this machine's GPU and there is none: pass a target "
                         "(sm90, gfx942, ...) to store the configs the specs pin instead")
    specs, targets, cache_dir = prepare(args)
    check_cache_dir(cache_dir, for_writing=True)
    refuse_if_overlaid(cache_dir)  # winners are written through Triton's cache manager
    if measure:  # measuring compiles into the folder
        refuse_if_served_elsewhere(cache_dir)
    reports = [(tune_winners if measure else pin_winners)(specs, target, cache_dir) for target in targets]
    if args.json:
        print(json.dumps({"cache_dir": str(cache_dir), "targets": [r.to_json() for r in reports]}, indent=1))
    else:
        for r in reports:
            print(f"{r.target}: {len(r.stored)} winners {'measured' if measure else 'pinned'}, "
                  f"{len(r.errors)} errors")
            for line in r.stored:
                print(f"  winner  {line}")
            for line in r.notes:
                print(f"  note: {line}")
            for line in r.errors:
                print(f"error: {line}", file=sys.stderr)
        print(f"cache: {cache_dir}")
    return 1 if any(r.errors for r in reports) else 0
