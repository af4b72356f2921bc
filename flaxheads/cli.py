"""The `flaxheads` command: thin argument parsing over library functions."""

from __future__ import annotations

import argparse
import sys

from flaxheads.heads import HEAD_NAMES


def _convert(args) -> int:
    from flaxheads.convert import convert, default_direction

    to = args.to or default_direction(args.src)
    info, seconds = convert(args.src, args.dst, to=to, head=args.head, num_labels=args.num_labels)
    print(info)
    print(f"wrote {to} checkpoint to {args.dst} in {seconds:.2f} s")
    return 0


def _inspect(args) -> int:
    from flaxheads.convert import describe

    print(describe(args.path, head=args.head, num_labels=args.num_labels))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flaxheads", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="convert a checkpoint directory between Hugging Face PyTorch and flaxheads")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--to", choices=["pytorch", "flax"], help="default: pytorch for flaxheads sources, else flax")
    p.add_argument("--head", choices=HEAD_NAMES, help="default: the checkpoint's own head")
    p.add_argument("--num_labels", type=int)
    p.set_defaults(run=_convert)

    p = sub.add_parser("inspect", help="architecture, sizes, and which weights a head loads or creates")
    p.add_argument("path")
    p.add_argument("--head", choices=HEAD_NAMES)
    p.add_argument("--num_labels", type=int)
    p.set_defaults(run=_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, FileExistsError, NotImplementedError) as err:
        print(f"flaxheads {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
