"""Finished log-likelihood scores on disk, so an interrupted eval resumes where it stopped."""

import hashlib
import json
import sqlite3
from pathlib import Path

from compress.manifest import MANIFEST
from compress.models import cache_dir

COMMIT_EVERY = 256


def model_fingerprint(model_dir: Path) -> str:
    """Changes when the checkpoint does: its path and the size and mtime of each file in it but
    compress.json, which every eval rewrites with its results (that must not orphan the cache)."""
    files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in Path(model_dir).iterdir()
                   if f.is_file() and f.name != MANIFEST)
    return hashlib.sha1(json.dumps([str(Path(model_dir).resolve()), files]).encode()).hexdigest()[:16]


class ScoreCache:
    """(token ids, first scored position) -> (log-likelihood, is_greedy), one SQLite file per model."""

    def __init__(self, model_dir: Path, path: Path | None = None):
        path = path or cache_dir() / "eval" / f"{model_fingerprint(model_dir)}.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path)
        self.db.execute("CREATE TABLE IF NOT EXISTS scores (key TEXT PRIMARY KEY, logprob REAL, greedy INTEGER)")
        self.pending = 0

    @staticmethod
    def key(token_ids: list[int], score_from: int) -> str:
        return hashlib.sha1(json.dumps([score_from, token_ids]).encode()).hexdigest()

    def get(self, key: str) -> tuple[float, bool] | None:
        row = self.db.execute("SELECT logprob, greedy FROM scores WHERE key = ?", (key,)).fetchone()
        return None if row is None else (row[0], bool(row[1]))

    def put(self, key: str, value: tuple[float, bool]) -> None:
        self.db.execute("INSERT OR REPLACE INTO scores VALUES (?, ?, ?)", (key, value[0], int(value[1])))
        self.pending += 1
        if self.pending >= COMMIT_EVERY:
            self.commit()

    def commit(self) -> None:
        self.db.commit()
        self.pending = 0
