"""Tokenizers of ``data=text``: ``bytes``, a ``tokenizer.json`` file, or a Hugging Face tokenizer by name.

Every tokenizer here has one end-of-document token (EOD), appended to each document when shards are written
(linrope.data.shards): ``bytes`` is the 256 byte values plus EOD = 256 (a vocabulary of 257); a trained BPE
(``train_bpe``) reserves ``<|endoftext|>``; a tokenizer.json or an HF tokenizer uses the first of its special
tokens named in ``EOD_NAMES`` (one is added if it has none, which enlarges the vocabulary by one).

``token_bytes()`` gives, for every token id, how many bytes of text that token stands for — the denominator of
bits per byte (docs/methods.md, "Text data and metrics across tokenizers").  For a byte-level tokenizer (bytes, a
BPE trained here, GPT-2's) it is exact: a token's string is read through the byte-level alphabet.  Otherwise it
is the UTF-8 length of the token decoded alone, and the shard writer counts the documents whose tokens' bytes do
not add up to the document's own bytes (manifest ``bytes_mismatch_documents``).  EOD counts as one byte: it stands
for the separator a byte model reads between documents (the newline that joins files in ``data=bytes``), so with
the bytes tokenizer every target covers exactly one byte and bits per byte equal loss / ln 2.

``tokenizers`` is imported only when a tokenizer other than ``bytes`` is asked for (the ``text`` extra).
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import numpy as np

from linrope.base.errors import CorpusError

EOD_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]", "<|eot_id|>")
EOD = "<|endoftext|>"  # the end-of-document token of a BPE trained here


def _tokenizers():
    try:
        import tokenizers  # the `text` extra
    except ImportError:
        raise CorpusError(
            "data.tokenizer: a tokenizer other than `bytes` needs the `tokenizers` package (pip install 'linrope[text]')"
        ) from None
    return tokenizers


@lru_cache(maxsize=1)
def byte_alphabet() -> Dict[str, int]:
    """GPT-2's byte-level alphabet: {printable character: the byte it stands for}."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Tokenizer:
    """One tokenizer: ``name`` (what was asked), ``vocab_size``, ``eod`` (the end-of-document id), ``digest`` (a
    hash of what defines it), ``encode_batch(texts) -> [ids]``, ``decode(ids) -> str``, ``token_bytes()``."""

    name: str
    vocab_size: int
    eod: int
    digest: str
    path: Optional[str] = None  # the tokenizer.json read, absolute (None: bytes, or an HF name)

    def encode_batch(self, texts: List[str]) -> List[List[int]]:
        raise NotImplementedError

    def encode(self, text: str) -> List[int]:
        """One text's ids (no end-of-document token)."""
        return self.encode_batch([text])[0]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def token_bytes(self) -> np.ndarray:
        raise NotImplementedError

    @property
    def dtype(self):
        """The shards' token type: uint16 while every id fits, else uint32."""
        return np.uint16 if self.vocab_size <= 2**16 else np.uint32


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes 0–255 and EOD = 256."""

    name, vocab_size, eod = "bytes", 257, 256
    digest = hashlib.sha256(b"linrope bytes tokenizer, eod 256").hexdigest()[:16]

    def encode_batch(self, texts):
        return [list(t.encode("utf-8", errors="surrogatepass")) for t in texts]

    def encode_bytes(self, raw: bytes) -> np.ndarray:
        return np.frombuffer(raw, dtype=np.uint8)

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_bytes(self):
        return np.ones(self.vocab_size, dtype=np.int64)  # EOD counts one byte (the module docstring)


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (from a tokenizer.json, or an HF name)."""

    def __init__(self, tok, name: str, digest: str):
        self.tok, self.name, self.digest = tok, name, digest
        # a document that spells a special token ("<|endoftext|>" in a text about tokenizers) is text: encoded as
        # its bytes, never as the token (which would end the document there and lose its bytes from bpb's count)
        tok.encode_special_tokens = True
        vocab = tok.get_vocab(with_added_tokens=True)
        eod = next((t for t in EOD_NAMES if t in vocab), None)
        if eod is None:  # no end-of-document token: add one (the vocabulary grows by one)
            tok.add_special_tokens([EOD])
            vocab = tok.get_vocab(with_added_tokens=True)
            eod = EOD
        self.eod = int(vocab[eod])
        self.vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
        self._vocab = vocab

    def encode_batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def byte_level(self) -> bool:
        model = json.loads(self.tok.to_str())
        pre = json.dumps(model.get("pre_tokenizer")) + json.dumps(model.get("decoder"))
        return '"ByteLevel"' in pre and not (model.get("normalizer") or None)

    def token_bytes(self):
        out = np.zeros(self.vocab_size, dtype=np.int64)
        special = {a.content for a in self.tok.get_added_tokens_decoder().values() if a.special}
        alphabet = byte_alphabet() if self.byte_level() else None
        for token, i in self._vocab.items():
            if token in special:
                out[i] = 1 if i == self.eod else 0
            elif alphabet is not None and all(c in alphabet for c in token):
                out[i] = len(token)  # one character of the byte-level alphabet per byte
            else:
                out[i] = len(self.tok.decode([i]).encode("utf-8"))
        return out


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_tokenizer(spec: Optional[str]) -> Tokenizer:
    """``bytes`` (or null), a path to a tokenizer.json, or a Hugging Face tokenizer name (downloaded by
    ``tokenizers`` only because it was named)."""
    spec = str(spec or "bytes")
    if spec == "bytes":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        path = path / "tokenizer.json"
    if path.is_file():
        tk = _tokenizers()
        try:
            tok = tk.Tokenizer.from_file(str(path))
        except Exception as e:  # the library's own message, on one line
            raise CorpusError(
                f"data.tokenizer={spec}: not a tokenizer.json the tokenizers library reads ({e})"
            ) from None
        made = HFTokenizer(tok, spec, file_digest(path)[:16])
        made.path = str(path.resolve())
        return made
    looks_like_path = spec.endswith(".json") or spec.startswith((".", "/", "~")) or spec.count("/") > 1
    if looks_like_path:
        raise CorpusError(f"data.tokenizer={spec}: no such file (expected bytes, a tokenizer.json or an HF name)")
    tk = _tokenizers()
    try:
        tok = tk.Tokenizer.from_pretrained(spec)
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CorpusError(
            f"data.tokenizer={spec}: unknown tokenizer — not `bytes`, not a file, and not found on the Hugging Face "
            f"Hub ({first})"
        ) from None
    return HFTokenizer(tok, spec, hashlib.sha256(tok.to_str().encode()).hexdigest()[:16])


def train_bpe(texts: Iterable[str], vocab_size: int, out: Path, length: Optional[int] = None) -> Tokenizer:
    """A byte-level BPE trained on ``texts`` with ``vocab_size`` tokens (``<|endoftext|>`` among them), saved to
    ``out`` (tokenizer.json); the trainer's progress bar shows.  No text that is not blank: refused, nothing
    written (a tokenizer of the 256 bytes alone)."""
    tk = _tokenizers()
    if vocab_size < 257 + 1:
        raise CorpusError(f"--vocab-size {vocab_size}: a byte-level BPE needs at least 258 (256 bytes, EOD, a merge)")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    read = 0  # texts with something in them

    def counted():
        nonlocal read
        for text in texts:
            read += bool(text.strip())
            yield text

    tok.train_from_iterator(counted(), trainer=trainer, length=length)
    if not read:
        raise CorpusError(f"--out {out}: no document of the train split to train on (none, empty, or every one in "
                          "val or test: see --val-fraction, --test-fraction); nothing written")  # fmt: skip
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return load_tokenizer(str(out))
