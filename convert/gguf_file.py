"""The GGUF file itself (llama.cpp's format), read with the gguf package: its
structure checked before the package sees it, typed metadata, lazy
dequantized tensors.

gguf.GGUFReader parses the file and gguf.quants.dequantize turns every tensor
type it knows into float32; this package has no dequantizer of its own. Before
the reader sees a file, _gguf_layout walks its structure (header, metadata,
tensor table) and checks every length and offset against the file size: the
reader trusts them (a corrupt array length can keep it looping for hours, a
short file fails deep inside numpy), and this way a bad file gets one line
saying what is wrong where. Whatever the reader or the dequantizer still
raises is turned into an ExportError naming the file.
"""

import importlib.util
import math
import os
import struct
import warnings

import numpy as np

from convert.common import ExportError, _check_no_overlap, _one_line
from convert.lazy import _view_rows


GGUF_VERSIONS = (2, 3)
_GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY, _GGUF_UINT32 = 8, 9, 4
_GGUF_INTS = {0, 1, 2, 3, 4, 5, 10, 11}
_GGUF_FLOATS = {6, 12}
_GGUF_BOOL = 7
_GGUF_MAX_DIMS = 4
_GGUF_DEFAULT_ALIGNMENT = 32


def _import_gguf():
    try:
        import gguf  # only the GGUF paths need it
        import gguf.quants  # noqa: F401
    except ImportError:
        raise ExportError("reading GGUF needs the gguf package (pip install gguf, "
                          "or make venv)") from None
    return gguf


def _gguf_package_version():
    try:
        import importlib.metadata
        return importlib.metadata.version("gguf")
    except Exception:  # a source checkout without metadata
        return "?"


class _Cursor:
    """Reads little-endian numbers and strings from a buffer, checking each
    against the end: a read past it raises ExportError naming what was read."""

    def __init__(self, path, buf, size, pos):
        self.path, self.buf, self.size, self.pos = path, buf, size, pos

    def need(self, n, what):
        if n > self.size - self.pos:
            raise ExportError(f"{self.path}: truncated in {what} (byte {self.pos}: {n} bytes "
                              f"needed, the file has {self.size})")

    def unpack(self, fmt, what):
        n = struct.calcsize("<" + fmt)
        self.need(n, what)
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return v[0] if len(v) == 1 else v

    def string(self, what):
        n = self.unpack("Q", what)
        self.need(n, what)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s


def _gguf_layout(path, gguf):
    """Walk a GGUF file's header, metadata and tensor table, checking every
    length and offset against the file size; returns {name: (type, dims,
    absolute data offset, bytes)}. Raises ExportError for a file that is not
    GGUF, a version other than 2 or 3, a truncated header, metadata or tensor
    table, an unknown value or tensor type, a tensor whose data lies (partly)
    past the end of the file, tensors whose data overlap, duplicate names."""
    import mmap
    size = os.path.getsize(path)
    n_tensors, n_kv = _gguf_header(path, size)
    # (counts are not trusted: each entry read below is checked against the file's end, so
    # a corrupt count ends in a "truncated" message after at most size / 13 entries)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        cur = _Cursor(path, mm, size, 24)
        alignment = _gguf_metadata_alignment(cur, n_kv)
        table = []
        for k in range(n_tensors):
            raw = cur.string(f"the name of tensor {k} of {n_tensors}")
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ExportError(f"{path}: tensor {k} has a name that is not UTF-8") from None
            n_dims = cur.unpack("I", f"tensor {name}")
            if not 1 <= n_dims <= _GGUF_MAX_DIMS:
                raise ExportError(f"{path}: tensor {name} has {n_dims} dimensions "
                                  f"(1..{_GGUF_MAX_DIMS})")
            dims = list(cur.unpack(f"{n_dims}Q", f"tensor {name}")) if n_dims > 1 \
                else [cur.unpack("Q", f"tensor {name}")]
            ttype, offset = cur.unpack("IQ", f"tensor {name}")
            table.append((name, dims, ttype, offset))
        data_start = -(-cur.pos // alignment) * alignment
    out = {}
    for name, dims, ttype, offset in table:
        if name in out:
            raise ExportError(f"{path}: tensor {name} appears twice")
        out[name] = _gguf_tensor_range(path, gguf, name, dims, ttype, offset, data_start,
                                       alignment, size)
    _check_no_overlap(path, {n: (r[2], r[2] + r[3]) for n, r in out.items()})
    return out


def _gguf_header(path, size):
    """(tensor count, metadata count) from the 24-byte header, after checking
    the magic and the version."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:4] != b"GGUF":
        raise ExportError(f"{path}: not a GGUF file (it starts with {head[:4]!r}, not b'GGUF')")
    if len(head) < 24:
        raise ExportError(f"{path}: truncated: {size} bytes, less than the 24-byte GGUF header")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", head, 4)
    if version not in GGUF_VERSIONS:
        hint = " (a big-endian file?)" if version and not version & 0xFFFF else ""
        raise ExportError(f"{path}: GGUF version {version} is not supported (versions "
                          f"{' and '.join(map(str, GGUF_VERSIONS))} are){hint}")
    return n_tensors, n_kv


def _gguf_metadata_alignment(cur, n_kv):
    """Walk the n_kv metadata entries at cur (names unique and UTF-8, values
    of known types); returns general.alignment (default 32)."""
    path, keys, alignment = cur.path, set(), _GGUF_DEFAULT_ALIGNMENT
    for k in range(n_kv):
        raw = cur.string(f"the name of metadata entry {k} of {n_kv}")
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ExportError(f"{path}: metadata entry {k} has a name that is not UTF-8") \
                from None
        if key in keys:
            raise ExportError(f"{path}: metadata key {key} appears twice")
        keys.add(key)
        vtype = cur.unpack("I", f"metadata {key}")
        start = cur.pos
        _skip_value(cur, vtype, f"metadata {key}")
        if key == "general.alignment":
            if vtype != _GGUF_UINT32:
                raise ExportError(f"{path}: general.alignment must be a uint32")
            alignment = struct.unpack_from("<I", cur.buf, start)[0]
            if alignment == 0 or alignment & (alignment - 1):
                raise ExportError(f"{path}: general.alignment {alignment} is not a power "
                                  "of two")
    return alignment


def _skip_value(cur, vtype, what, depth=0):
    """Move cur past one metadata value of type vtype (arrays nest at most 4 deep)."""
    path, size = cur.path, cur.size
    if vtype in _GGUF_SCALAR_SIZES:
        cur.need(_GGUF_SCALAR_SIZES[vtype], what)
        cur.pos += _GGUF_SCALAR_SIZES[vtype]
    elif vtype == _GGUF_STRING:
        cur.string(what)
    elif vtype == _GGUF_ARRAY and depth < 4:
        etype, count = cur.unpack("IQ", what)
        if etype in _GGUF_SCALAR_SIZES:
            cur.need(count * _GGUF_SCALAR_SIZES[etype], what)
            cur.pos += count * _GGUF_SCALAR_SIZES[etype]
        elif etype in (_GGUF_STRING, _GGUF_ARRAY):
            if count > (size - cur.pos) // 8:
                raise ExportError(f"{path}: truncated in {what} (an array of {count} "
                                  f"entries at byte {cur.pos}, the file has {size})")
            for _ in range(count):
                _skip_value(cur, etype, what, depth + 1)
        else:
            raise ExportError(f"{path}: {what} is an array of unknown type {etype}")
    else:
        raise ExportError(f"{path}: {what} has unknown value type {vtype}")


def _gguf_tensor_range(path, gguf, name, dims, ttype, offset, data_start, alignment, size):
    """(type, dims, absolute data offset, bytes) of one tensor table entry,
    after checking its type, its dimensions and that its data (at offset from
    data_start) is aligned and lies inside the file."""
    try:
        qtype = gguf.GGMLQuantizationType(ttype)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ExportError(f"{path}: tensor {name} has unknown type {ttype} (gguf "
                          f"{_gguf_package_version()} does not know it)") from None
    if any(d == 0 for d in dims) or math.prod(dims) >= 1 << 48:
        raise ExportError(f"{path}: tensor {name} has dimensions {dims}")
    if dims[0] % block:
        raise ExportError(f"{path}: tensor {name}: rows of {dims[0]} values are not whole "
                          f"{qtype.name} blocks of {block}")
    nbytes = math.prod(dims) // block * type_size
    if offset % alignment:
        raise ExportError(f"{path}: tensor {name}: data offset {offset} is not a multiple of "
                          f"the alignment {alignment}")
    begin = data_start + offset
    if begin + nbytes > size:
        where = "starts" if begin >= size else "ends"
        raise ExportError(f"{path}: tensor {name}: its data {where} past the end of the file "
                          f"(bytes {begin}..{begin + nbytes}, the file has {size}); truncated?")
    return qtype, dims, begin, nbytes


_DEQUANTIZABLE = {}


def _gguf_can_dequantize(gguf, qtype):
    """Whether gguf.quants.dequantize handles qtype (asked once per type, on one
    zero block)."""
    if qtype not in _DEQUANTIZABLE:
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        try:
            x = gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
            _DEQUANTIZABLE[qtype] = np.asarray(x).size == block
        except Exception:  # NotImplementedError for the types it has no code for
            _DEQUANTIZABLE[qtype] = False
    return _DEQUANTIZABLE[qtype]


class _GGUFTensor:
    """A GGUF tensor behind the lazy interface: rows a..b of its 2-D view
    dequantized by gguf.quants.dequantize, a block at a time."""

    def __init__(self, path, name, qtype, dims, data, gguf):
        self.path, self.name, self.qtype, self.gguf = path, name, qtype, gguf
        self.shape = tuple(int(d) for d in reversed(dims))
        self.raw = data.reshape(_view_rows(self.shape), -1)

    def rows(self, a, b):
        try:  # overflows in bad scales end as inf/NaN, refused below, not as numpy warnings
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                x = self.gguf.quants.dequantize(np.ascontiguousarray(self.raw[a:b]), self.qtype)
                x = np.asarray(x, dtype=np.float32).reshape(b - a, self.shape[-1])
        except Exception as e:  # whatever the package raises on data it cannot take
            raise ExportError(f"{self.path}: tensor {self.name}: gguf could not dequantize its "
                              f"{self.qtype.name} data ({type(e).__name__}: {_one_line(e)})") \
                from None
        if not np.isfinite(x).all():
            raise ExportError(f"{self.path}: tensor {self.name} contains NaN or infinite values")
        return x


class _GGUFMetadata:
    """Typed access to a GGUFReader's metadata; every wrong type or missing
    required key is an ExportError naming the file and the key."""

    REQUIRED = object()

    def __init__(self, path, reader, gguf):
        self.path, self.fields, self.gguf = path, reader.fields, gguf

    def __contains__(self, key):
        return key in self.fields

    def _types(self, key):
        return [int(t) for t in self.fields[key].types]

    def get(self, key, kind, default=REQUIRED):
        """kind: "int", "float", "str", "bool", "int[]", "float[]", "bytes[]"."""
        f = self.fields.get(key)
        if f is None:
            if default is self.REQUIRED:
                raise ExportError(f"{self.path}: missing required key {key}")
            return default
        types = self._types(key)
        try:
            if kind in ("int", "float", "bool") and len(types) == 1:
                t, v = types[0], f.parts[-1][0]
                if kind == "int" and t in _GGUF_INTS:
                    return int(v)
                if kind == "float" and t in _GGUF_INTS | _GGUF_FLOATS:
                    return float(v)
                if kind == "bool" and t in _GGUF_INTS | {_GGUF_BOOL} and int(v) in (0, 1):
                    return bool(v)
            elif kind == "str" and types == [_GGUF_STRING]:
                return bytes(f.parts[-1]).decode("utf-8")
            elif kind.endswith("[]") and types[0] == _GGUF_ARRAY:
                if not f.data or len(types) == 1:
                    return []
                sub = types[1]
                if kind == "bytes[]" and sub == _GGUF_STRING:
                    return [bytes(f.parts[i]) for i in f.data]
                if kind in ("int[]", "float[]") and sub in _GGUF_INTS | _GGUF_FLOATS and \
                        (kind == "float[]" or sub in _GGUF_INTS):
                    return np.concatenate([f.parts[i] for i in f.data]).astype(
                        np.int64 if kind == "int[]" else np.float64)
        except UnicodeDecodeError:
            raise ExportError(f"{self.path}: {key} is not UTF-8 text") from None
        except Exception as e:  # the reader's parts are not what its types say
            raise ExportError(f"{self.path}: cannot read {key} ({type(e).__name__}: "
                              f"{_one_line(e)})") from None
        names = []
        for t in types:
            try:
                names.append(self.gguf.GGUFValueType(t).name)
            except ValueError:
                names.append(str(t))
        want = {"int": "an integer", "float": "a number", "str": "a string", "bool": "a bool",
                "int[]": "an array of integers", "float[]": "an array of numbers",
                "bytes[]": "an array of strings"}[kind]
        raise ExportError(f"{self.path}: {key} is {'/'.join(names)}, expected {want}")


def _open_gguf(path):
    """(gguf module, layout, reader, metadata) of a GGUF file, after
    _gguf_layout's checks."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ExportError(f"{path}: is a directory, expected a GGUF file")
    if not os.path.exists(path):
        raise ExportError(f"{path}: no such file")
    gguf = _import_gguf()
    layout = _gguf_layout(path, gguf)
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError, KeyError, IndexError, ... on bad input
        raise ExportError(f"{path}: gguf could not read it ({type(e).__name__}: "
                          f"{_one_line(e)})") from None
    return gguf, layout, reader, _GGUFMetadata(path, reader, gguf)
