"""``python -m linrope tokenize``: train a byte-level BPE on a corpus, or write a corpus's token shards (the same
code ``data=text`` runs on first use; linrope.data.shards).  Errors are one line (``linrope: …``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from linrope.base.errors import LinropeError, OutputPathError
from linrope.base.naming import program
from linrope.base.writable import writable_folder

from .bytes import split_of
from .shards import Shards, build_shards, default_cache_dir, utf8
from .sources import resolve_source
from .tokenizer import load_tokenizer, train_bpe

EPILOG = """examples:
  python -m linrope tokenize train --input docs/ --vocab-size 8192 --out tok.json
  python -m linrope tokenize shards --input docs/ --tokenizer tok.json
  python -m linrope tokenize shards --hf-dataset roneneldan/TinyStories --tokenizer gpt2 --max-documents 100000
then: python train.py data=text data.path=docs/ data.tokenizer=tok.json   (finds the same shards)
"""


def _source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--input",
        help="a file, folder or glob of .txt (one document per file), .jsonl (one per line) or "
        ".parquet (one per row); omitted: the Python standard library's .py files (data=bytes' corpus)",
    )
    p.add_argument("--field", default="text", help="the .jsonl field / .parquet column / HF dataset field (text)")
    p.add_argument("--suffixes", nargs="+", help="a folder's files to read (default .txt .jsonl .parquet .md)")
    p.add_argument("--hf-dataset", help="a Hugging Face dataset name (streamed; downloaded only when named)")
    p.add_argument("--hf-config", help="its configuration")
    p.add_argument("--hf-split", default="train", help="its split (train)")
    p.add_argument("--max-documents", type=int, help="read at most this many documents")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=program("python -m linrope tokenize"),
        description="Tokenizers and memory-mapped token shards for data=text.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = top.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a byte-level BPE (tokenizers) with an <|endoftext|> token",
                       description="Train a byte-level BPE on the train split of a corpus (val/test documents, drawn "
                       "as data=text draws them, are left out) and save it as a tokenizer.json.")  # fmt: skip
    _source_args(t)
    t.add_argument("--vocab-size", type=int, required=True, help="tokens, <|endoftext|> included (>= 258)")
    t.add_argument("--out", required=True, help="the tokenizer.json to write (an existing file is refused: runs "
                   "may have trained with it)")  # fmt: skip
    t.add_argument("--force", action="store_true", help="replace an existing --out")
    t.add_argument("--val-fraction", type=float, default=0.05)
    t.add_argument("--test-fraction", type=float, default=0.05)
    s = sub.add_parser("shards", help="tokenise a corpus into shards with a manifest (resumable, reused)",
                       description="Tokenise a corpus into memory-mapped shards with manifest.json; a stopped run "
                       "resumes, a finished one is reused.")  # fmt: skip
    _source_args(s)
    s.add_argument("--tokenizer", default="bytes", help="bytes | path/to/tokenizer.json | an HF tokenizer name")
    s.add_argument("--out", help="the shard folder (default: data.shards_dir/<key>, where data=text looks: "
                   "$LINROPE_DATA_DIR/shards or data/shards)")  # fmt: skip
    s.add_argument("--shards-dir", help="the cache folder holding <key> folders (instead of --out)")
    s.add_argument("--shard-documents", type=int, default=10_000, help="documents per shard (10000)")
    s.add_argument("--val-fraction", type=float, default=0.05)
    s.add_argument("--test-fraction", type=float, default=0.05)
    return top


def main(argv: Optional[List[str]] = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    vf, tf = args.val_fraction, args.test_fraction
    if not (0 <= vf < 1 and 0 <= tf < 1 and vf + tf < 1):  # as data.val_fraction and data.test_fraction
        p.error(f"--val-fraction {vf} --test-fraction {tf}: each in [0, 1) and their sum below 1 (train is the rest)")
    for key in ("out", "shards_dir"):  # --out=~/x reaches Python unexpanded (the shell expands ~ at a word's start)
        if getattr(args, key, None):
            setattr(args, key, str(Path(getattr(args, key)).expanduser()))
    try:
        source = resolve_source(args.input, field=args.field, suffixes=args.suffixes, hf_dataset=args.hf_dataset,
                                hf_config=args.hf_config, hf_split=args.hf_split)  # fmt: skip
        if args.command == "train":
            out = Path(args.out).expanduser()
            writable_folder(out.parent, "--out", out)  # before training: a path it cannot write is one line
            if out.is_dir():
                raise OutputPathError(f"--out {out}: is a folder; name the tokenizer.json to write")
            if out.exists() and not args.force:  # before training: runs record it by hash and refuse another
                raise OutputPathError(
                    f"--out {out}: exists (a tokenizer runs may have trained with); pass --force to replace it"
                )
            limit = args.max_documents

            def texts():
                for i, (ident, raw) in enumerate(source.documents()):
                    if limit is not None and i >= limit:
                        return
                    if split_of(ident, args.val_fraction, args.test_fraction) == "train":
                        yield utf8(ident, raw)  # UTF-8 (linrope.data.sources skips what is not)

            tok = train_bpe(texts(), args.vocab_size, out)
            print(f"{args.out}: byte-level BPE, {tok.vocab_size} tokens, end of document <|endoftext|> = {tok.eod}")
            return 0
        tok = load_tokenizer(args.tokenizer)
        if args.out:
            writable_folder(Path(args.out), "--out", args.out)  # before the corpus is read
        folder = build_shards(
            source,
            tok,
            out=Path(args.out) if args.out else None,
            cache_dir=Path(args.shards_dir) if args.shards_dir else default_cache_dir(),
            val_fraction=args.val_fraction,
            test_fraction=args.test_fraction,
            shard_documents=args.shard_documents,
            max_documents=args.max_documents,
            progress=not args.no_progress,
        )
        m = Shards(folder, tok).manifest
        splits = ", ".join(f"{k} {v['documents']} documents {v['tokens']} tokens" for k, v in m["splits"].items())
        print(f"{folder}: {m['documents']} documents, {m['tokens']} tokens, {m['bytes']} bytes ({splits})")
        return 0
    except LinropeError as e:
        print(f"linrope: {e}", file=sys.stderr)
        return 1
