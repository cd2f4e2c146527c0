"""What the tests of text data share: a folder of .jsonl documents drawn from a small vocabulary, and the state of
a folder's files (to show a build left them untouched)."""

import json
import random

WORDS = "the cat sat on a mat while dogs ran over hills and rivers under skies of blue green red héllo".split()


def write_docs(folder, files=4, per_file=60, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    texts = []
    for f in range(files):
        with open(folder / f"part{f}.jsonl", "w") as h:
            for i in range(per_file):
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80)))
                texts.append((f"part{f}.jsonl:{i}", text))
                h.write(json.dumps({"text": text, "id": i}) + "\n")
    return texts


def files_state(folder):
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.iterdir())}
