"""Where the shared evaluation and calibration data live ($COMPRESS_DATA_DIR)."""

import os
from pathlib import Path

from compress.errors import UserError


def data_dir() -> Path:
    return Path(os.environ.get("COMPRESS_DATA_DIR", "../shared/data")).expanduser()


def data_file(relative: str) -> Path:
    path = data_dir() / relative
    if not path.is_file():
        raise UserError(
            f"data file {relative} not found under {data_dir().resolve()}; "
            "set COMPRESS_DATA_DIR to the folder holding mmlu/, wikitext2/ and c4/"
        )
    return path
