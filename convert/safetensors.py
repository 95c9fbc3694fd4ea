"""Reads safetensors files (Hugging Face's weight format) with numpy; no
safetensors package.

File: u64 little-endian N, then N bytes of JSON
  {"NAME": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
   "__metadata__": {...}}
then the raw data; offsets are relative to byte 8 + N, data row-major little-endian.
"""

import json
import math
import os
import struct

import numpy as np

from convert.common import ExportError, _check_no_overlap


SAFETENSORS_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2), "F64": ("<f8", 8)}
_MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit


def _bf16_to_f32(u16):
    """bfloat16 bit patterns (uint16) -> float32: they are the high half of a float32."""
    return (u16.astype(np.uint32) << 16).view(np.float32)


class _SafetensorsTensor:
    """One tensor in a safetensors file, read with pread on demand."""

    def __init__(self, path, name, dtype, shape, offset):
        self.path, self.name, self.dtype, self.offset = path, name, dtype, offset
        self.shape = tuple(shape)

    def rows(self, a, b):
        np_dtype, size = SAFETENSORS_DTYPES[self.dtype]
        cols = self.shape[-1] if self.shape else 1
        n = (b - a) * cols * size
        buf = np.empty(n, dtype=np.uint8)
        got = 0
        with open(self.path, "rb", buffering=0) as f:
            while got < n:
                start = self.offset + a * cols * size + got
                k = os.preadv(f.fileno(), [memoryview(buf)[got:]], start)
                if k <= 0:
                    raise ExportError(f"{self.path}: truncated inside tensor {self.name}")
                got += k
        x = buf.view(np_dtype)
        x = _bf16_to_f32(x) if self.dtype == "BF16" else x.astype(np.float32)
        x = x.reshape(b - a, cols)
        if not np.isfinite(x).all():
            raise ExportError(f"{self.path}: tensor {self.name} contains NaN or infinite values")
        return x


def read_safetensors_header(path):
    """{name: _SafetensorsTensor} for every tensor in a safetensors file, after
    checking the header against the file: JSON, dtypes, shapes, byte ranges
    inside the file and not overlapping one another. Raises ExportError naming the file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ExportError(f"{path}: is a directory, expected a safetensors file")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ExportError(f"{path}: {size} bytes, too short for a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > _MAX_HEADER_BYTES:
            raise ExportError(f"{path}: header length {n} does not fit in the file ({size} bytes); "
                              "truncated, or not a safetensors file")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ExportError(f"{path}: header is not JSON; not a safetensors file") from None
    except RecursionError:
        raise ExportError(f"{path}: header JSON is nested too deeply; not a safetensors file") from None
    if not isinstance(header, dict):
        raise ExportError(f"{path}: header is not a JSON object; not a safetensors file")
    data_start, out, ranges = 8 + n, {}, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            ok = (isinstance(dtype, str) and isinstance(shape, list)
                  and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                          for v in shape + [begin, end]) and begin <= end)
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise ExportError(f"{path}: malformed header entry for tensor {name}")
        if data_start + end > size:
            raise ExportError(f"{path}: truncated: tensor {name} ends at byte {data_start + end}, "
                              f"the file has {size}")
        if dtype in SAFETENSORS_DTYPES:
            want = math.prod(shape) * SAFETENSORS_DTYPES[dtype][1]
            if end - begin != want:
                raise ExportError(f"{path}: tensor {name}: {end - begin} data bytes, but "
                                  f"{dtype} {shape} needs {want}")
        out[name] = _SafetensorsTensor(path, name, dtype, shape, data_start + begin)
        ranges[name] = (begin, end)
    _check_no_overlap(path, ranges)
    return out
