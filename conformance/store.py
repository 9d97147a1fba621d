"""Stored golden vectors: safetensors files plus one canonical manifest.json.

Every tensor's sha256 (of its raw little-endian bytes) is in the manifest;
``load_case`` recomputes it and refuses a file that does not match, so a
tampered or half-written golden can never be judged against.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Optional

import numpy as np

GOLDEN_DIR = pathlib.Path(__file__).resolve().parent / "goldens"
MANIFEST = "manifest.json"
FORMAT = 1


class GoldenError(RuntimeError):
    """The stored goldens are missing, tampered with or out of date."""


def case_file(case_id: str) -> str:
    return case_id.replace("/", "__") + ".safetensors"


def little_endian_bytes(a: np.ndarray) -> bytes:
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.tobytes()


def sha256(a: np.ndarray) -> str:
    return hashlib.sha256(little_endian_bytes(a)).hexdigest()


def dtype_name(a: np.ndarray) -> str:
    return a.dtype.name  # float64, float32, float16, bfloat16, bool, int64


def describe(tensors: dict) -> dict:
    return {
        n: {"dtype": dtype_name(a), "shape": list(a.shape), "sha256": sha256(a)} for n, a in sorted(tensors.items())
    }


def dump_manifest(manifest: dict) -> str:
    """Canonical JSON: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(manifest, sort_keys=True, indent=1, allow_nan=False) + "\n"


def load_manifest(directory: pathlib.Path = GOLDEN_DIR) -> dict:
    path = pathlib.Path(directory) / MANIFEST
    if not path.is_file():
        raise GoldenError(f"no golden manifest at {path}; run `python -m conformance generate`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise GoldenError(f"{path} is not valid JSON ({e})") from None
    if manifest.get("format") != FORMAT:
        raise GoldenError(f"{path}: expected manifest format {FORMAT}, got {manifest.get('format')!r}")
    return manifest


def save_case(directory: pathlib.Path, case_id: str, tensors: dict) -> None:
    from safetensors.numpy import save_file

    save_file(
        {n: np.ascontiguousarray(a) for n, a in tensors.items()}, str(pathlib.Path(directory) / case_file(case_id))
    )


def load_case(case_id: str, entry: dict, directory: pathlib.Path = GOLDEN_DIR, names: Optional[list] = None) -> dict:
    """The tensors of one case, each checked against its manifest sha256."""
    import ml_dtypes  # noqa: F401  (registers the bfloat16 dtype that the files use)
    from safetensors.numpy import load_file

    path = pathlib.Path(directory) / entry["file"]
    if not path.is_file():
        raise GoldenError(f"{case_id}: golden file {path} is missing; run `python -m conformance generate`")
    try:
        tensors = load_file(str(path))
    except Exception as e:  # a truncated or foreign file
        raise GoldenError(f"{case_id}: cannot read {path} ({e})") from None
    expected = entry["tensors"]
    if sorted(tensors) != sorted(expected):
        raise GoldenError(
            f"{case_id}: {path.name} holds tensors {sorted(tensors)}, the manifest lists "
            f"{sorted(expected)}: the file was changed after generation"
        )
    for name in names or expected:
        meta, a = expected[name], tensors[name]
        if dtype_name(a) != meta["dtype"] or list(a.shape) != meta["shape"] or sha256(a) != meta["sha256"]:
            raise GoldenError(
                f"{case_id}: tensor {name!r} in {path.name} does not match its manifest sha256 "
                "(tampered or regenerated without the manifest); refusing to judge against it"
            )
    return tensors
