"""``replicaft-ckpt`` (= ``python -m replicaft.checkpoint``): look at checkpoints from a shell.

::

    replicaft-ckpt list DIR                     step, lineage, size, age and validity, newest first
    replicaft-ckpt list --no-verify DIR         the same without reading every byte
    replicaft-ckpt verify DIR/step-000000400-…  exit 0 if intact, 1 if not (the message says why)
    replicaft-ckpt export DIR --format safetensors --out OUT [--optimizer]
                                                model.safetensors (and optimizer.safetensors) of the
                                                checkpoint DIR, or of the newest valid one in DIR
    replicaft-ckpt import FILE.safetensors... --into DIR [--step N]
                                                a checkpoint of those files, for a warm start
    replicaft-ckpt catalog DIR [--rebuild]      the catalog (catalog.py): tags, metrics, roles, tiers
    replicaft-ckpt find DIR [--experiment X] [--lineage L] [--tag K=V]... [--min-step N]
                        [--max-step N] [--best METRIC [--mode max] [--top N]]
                                                matching checkpoints, newest (or best) first
    replicaft-ckpt show DIR/step-000000400-…    one checkpoint's catalog row in full
    replicaft-ckpt tag DIR/step-000000400-… KEY=VALUE...
                                                add tags (kept across a catalog rebuild)

An encrypted checkpoint is read with the key in ``REPLICAFT_CHECKPOINT_KEY_FILE`` (or
``REPLICAFT_CHECKPOINT_KEY``); ``import`` encrypts with it when one is set. Bad arguments
(unknown command, missing directory) print one line and exit 2, so scripts can tell "the
checkpoint is bad" (1) from "you called me wrong" (2).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from replicaft.checkpoint.catalog import Catalog, CatalogEntry, CatalogError
from replicaft.checkpoint.entries import scan
from replicaft.checkpoint.export import export_safetensors, import_safetensors
from replicaft.checkpoint.keys import key_from_env
from replicaft.checkpoint.layout import is_tmp_dirname, lineage_label, parse_dirname
from replicaft.checkpoint.reader import LoadedCheckpoint, load, verify
from replicaft.checkpoint.tiers import CheckpointReader
from replicaft.errors import CheckpointCorrupt, CheckpointKeyError, OptionsError, StateError

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="replicaft-ckpt", description="List and verify replicaft persistent checkpoints.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    list_cmd = commands.add_parser("list", help="list the checkpoints in a directory, newest first")
    list_cmd.add_argument("directory", type=Path)
    list_cmd.add_argument("--no-verify", action="store_true", help="do not read and hash every file (fast)")
    verify_cmd = commands.add_parser("verify", help="check every file of one checkpoint against its manifest")
    verify_cmd.add_argument("checkpoint", type=Path, help="a checkpoint directory, e.g. DIR/step-000000400-…")
    export_cmd = commands.add_parser("export", help="write a checkpoint's model (and optimizer) as safetensors")
    export_cmd.add_argument(
        "checkpoint", type=Path, help="a checkpoint directory, or a directory of checkpoints (the newest valid)"
    )
    export_cmd.add_argument("--format", choices=["safetensors"], default="safetensors")
    export_cmd.add_argument("--out", type=Path, required=True, help="directory for <entry>.safetensors")
    export_cmd.add_argument("--optimizer", action="store_true", help="also write optimizer.safetensors")
    export_cmd.add_argument("--entry", action="append", default=[], help="another top-level state entry to write")
    import_cmd = commands.add_parser("import", help="make a checkpoint of safetensors files (a warm start)")
    import_cmd.add_argument("files", type=Path, nargs="+", help="<entry>.safetensors files (model.safetensors, ...)")
    import_cmd.add_argument("--into", type=Path, required=True, help="the checkpoint directory to write it into")
    import_cmd.add_argument("--step", type=int, default=0, help="the step it resumes at (default 0)")
    catalog_cmd = commands.add_parser("catalog", help="list the catalog of a checkpoint directory")
    catalog_cmd.add_argument("directory", type=Path)
    catalog_cmd.add_argument("--rebuild", action="store_true", help="rebuild it from the checkpoints' manifests first")
    find_cmd = commands.add_parser("find", help="find checkpoints by tags, step and metrics")
    find_cmd.add_argument("directory", type=Path)
    find_cmd.add_argument("--experiment")
    find_cmd.add_argument("--lineage", help="the run's history id (the name's last part)")
    find_cmd.add_argument("--tag", action="append", default=[], type=_key_value, help="KEY=VALUE, repeatable")
    find_cmd.add_argument("--min-step", type=int)
    find_cmd.add_argument("--max-step", type=int)
    find_cmd.add_argument("--best", metavar="METRIC", help="only checkpoints with METRIC, best first")
    find_cmd.add_argument(
        "--mode", choices=["min", "max"], default="min", help="with --best: lower or higher is better"
    )
    find_cmd.add_argument(
        "--top", type=int, default=None, help="at most this many (default: 1 with --best, all without)"
    )
    show_cmd = commands.add_parser("show", help="one checkpoint's catalog row")
    show_cmd.add_argument("checkpoint", type=Path, help="a checkpoint directory, e.g. DIR/step-000000400-…")
    tag_cmd = commands.add_parser("tag", help="add tags to a checkpoint")
    tag_cmd.add_argument("checkpoint", type=Path, help="a checkpoint directory, e.g. DIR/step-000000400-…")
    tag_cmd.add_argument("tags", nargs="+", type=_key_value, help="KEY=VALUE")
    return parser


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _size(num_bytes: int) -> str:
    if num_bytes < 1024:
        return f"{num_bytes} B"
    size = num_bytes / 1024
    for unit in ("KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _age(seconds: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def _list(directory: Path, verify_files: bool) -> int:
    reader = CheckpointReader(directory)
    infos = reader.list(verify_files=verify_files)
    if not infos:
        print(f"no published checkpoints in {directory}")
    for info in infos:
        validity = {True: "valid", False: f"INVALID: {info.reason}", None: "not verified"}[info.valid]
        print(
            f"{info.step:>10}  {lineage_label(info.lineage):>14}  {_size(info.num_bytes):>10}  "
            f"{_age(info.age_s):>7} ago  {validity}"
        )
    for path, why in reader.ignored():
        print(f"{path.name}: {why}")
    partial = sorted(e.path.name for e in scan(directory) if e.is_dir and is_tmp_dirname(e.path.name))
    if partial:
        print(f"{len(partial)} unpublished (ignored; the next writer removes those abandoned): {', '.join(partial)}")
    return EXIT_OK


def _verify(checkpoint: Path) -> int:
    ok, reason = verify(checkpoint)
    print(f"valid: {reason}" if ok else f"INVALID: {reason}")
    return EXIT_OK if ok else EXIT_INVALID


def _export(args: argparse.Namespace) -> int:
    key = key_from_env(os.environ)
    if parse_dirname(args.checkpoint.name) is not None:
        loaded: LoadedCheckpoint | None = load(args.checkpoint, key=key)
    else:
        loaded = CheckpointReader(args.checkpoint, encryption_key=key).load_latest_valid()
    if loaded is None:
        print(f"INVALID: no valid checkpoint in {args.checkpoint}")
        return EXIT_INVALID
    entries = ["model", *(["optimizer"] if args.optimizer else []), *args.entry]
    for path in export_safetensors(loaded, args.out, entries):
        print(f"wrote {path} (step {loaded.step}, from {loaded.path.name})")
    return EXIT_OK


def _import(args: argparse.Namespace) -> int:
    path = import_safetensors(args.files, args.into, step=args.step, encryption_key=key_from_env(os.environ))
    print(f"wrote {path}: a job with checkpoint_dir={args.into} resumes from it at step {args.step}")
    return EXIT_OK


def _catalog_of(directory: Path) -> Catalog:
    """The catalog of ``directory``, rebuilt first (with a warning) if missing or unreadable."""
    catalog = Catalog(directory)
    problem = catalog.ensure()
    if problem is not None:
        print(f"warning: {problem}", file=sys.stderr)
    return catalog


def _row(entry: CatalogEntry) -> str:
    metrics = " ".join(f"{k}={v:.6g}" for k, v in entry.metrics.items()) or "-"
    return (
        f"{entry.name}  {entry.step:>10}  {'-' if entry.epoch is None else entry.epoch:>5}  "
        f"{entry.experiment or '-':>12}  {','.join(entry.roles) or '-':>16}  {','.join(entry.tiers):>12}  "
        f"{_size(entry.num_bytes):>10}  {metrics}"
    )


def _catalog(args: argparse.Namespace) -> int:
    catalog = Catalog(args.directory)
    if args.rebuild:
        print(f"rebuilt {catalog.path} from {catalog.rebuild()} checkpoint manifest(s)")
    else:
        catalog = _catalog_of(args.directory)
    entries = catalog.find()
    if not entries:
        print(f"no checkpoints in the catalog of {args.directory}")
    for entry in entries:
        print(_row(entry))
    return EXIT_OK


def _find(args: argparse.Namespace) -> int:
    top = args.top if args.top is not None else (1 if args.best else None)
    entries = _catalog_of(args.directory).find(
        experiment=args.experiment,
        lineage=args.lineage,
        tags=dict(args.tag),
        min_step=args.min_step,
        max_step=args.max_step,
        best=args.best,
        mode=args.mode,
        limit=top,
    )
    if not entries:
        print(f"no checkpoint in {args.directory} matches")
        return EXIT_INVALID
    for entry in entries:
        print(_row(entry))
    return EXIT_OK


def _show(checkpoint: Path) -> int:
    entry = _catalog_of(checkpoint.parent).get(checkpoint.name)
    if entry is None:
        print(
            f"{checkpoint.name} is not in the catalog of {checkpoint.parent} (published and intact? see "
            f"`replicaft-ckpt list {checkpoint.parent}`)"
        )
        return EXIT_INVALID
    print(f"path: {checkpoint}")
    for label, value in (
        ("step", entry.step),
        ("epoch", entry.epoch),
        ("lineage", lineage_label(entry.lineage)),
        ("experiment", entry.experiment),
        ("config hash", entry.config_hash),
        ("code version", entry.code_version),
        ("roles", ", ".join(entry.roles)),
        ("tiers", ", ".join(entry.tiers)),
        ("size", f"{_size(entry.num_bytes)} ({entry.num_bytes} bytes)"),
        ("kind", entry.save_kind),
        ("format version", entry.format_version),
    ):
        print(f"{label}: {'-' if value is None or value == '' else value}")
    for key, value in entry.metrics.items():
        print(f"metric {key}: {value:.10g}")
    for key, text in entry.tags.items():
        print(f"tag {key}: {text}")
    return EXIT_OK


def _tag(args: argparse.Namespace) -> int:
    catalog = _catalog_of(args.checkpoint.parent)
    try:
        catalog.tag(args.checkpoint.name, dict(args.tags))
    except ValueError as e:  # a bad tag, or a checkpoint the catalog does not hold
        print(f"replicaft-ckpt: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"tagged {args.checkpoint.name}: {', '.join(f'{k}={v}' for k, v in args.tags)}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command in ("catalog", "find") and not args.directory.is_dir():
            parser.error(f"{args.directory} is not a directory")
        if args.command in ("show", "tag") and parse_dirname(args.checkpoint.name) is None:
            parser.error(f"{args.checkpoint} is not a checkpoint name; pass one such as DIR/step-000000400-<lineage>")
        command = {"catalog": _catalog, "find": _find, "tag": _tag}.get(args.command)
        if command is not None:
            return command(args)
        if args.command == "show":
            return _show(args.checkpoint)
        if args.command == "export":
            return _export(args)
        if args.command == "import":
            return _import(args)
    except (CheckpointCorrupt, StateError) as e:
        print(f"INVALID: {e}")
        return EXIT_INVALID
    except CatalogError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    except (CheckpointKeyError, OptionsError) as e:
        parser.error(str(e))
    if args.command == "list":
        if not args.directory.is_dir():
            parser.error(f"{args.directory} is not a directory")
        return _list(args.directory, not args.no_verify)
    if not args.checkpoint.is_dir():
        parser.error(f"{args.checkpoint} is not a directory; pass a checkpoint such as DIR/step-000000400")
    return _verify(args.checkpoint)


if __name__ == "__main__":
    sys.exit(main())
