"""Whether a GGUF file is whole, read from its own header before any loader sees it.

A GGUF file is a header (magic ``GGUF``, version, tensor count, metadata key/value pairs,
then one entry per tensor: name, shape, type, offset), padded to the file's alignment
(``general.alignment``, 32 by default), then the tensors' data. The header says how many
bytes the data needs: the largest ``offset + size`` of a tensor, a size being the shape's
element count in blocks of the tensor type (``gguf.GGML_QUANT_SIZES``). A file that ends
inside its header, or before the end of its last tensor, is truncated (an interrupted copy
or download): :func:`check_gguf_size` says so in one line, with the size found and the size
needed, instead of the parser's own text. Every length read from the header is checked
against what is left of the file before it is used, so a hostile header costs no more than
the file's own size.
"""

from __future__ import annotations

import mmap
import os
import struct

from ppokit.errors import UsageError

__all__ = ["check_gguf_size", "gguf_needed_size"]

# scalar value types of GGUF metadata: struct format of each (8: string, 9: array)
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}
_STRING, _ARRAY = 8, 9


class _Short(Exception):
    """The file ended before what its header says comes next."""


class _Header:
    """A cursor over the bytes of a GGUF file (little-endian)."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> int:
        if n < 0 or self.pos + n > len(self.buf):
            raise _Short
        start, self.pos = self.pos, self.pos + n
        return start

    def num(self, fmt: str):
        start = self.take(struct.calcsize("<" + fmt))
        return struct.unpack_from("<" + fmt, self.buf, start)[0]

    def string(self) -> bytes:
        n = self.num("Q")
        start = self.take(n)
        return bytes(self.buf[start:start + n])

    def value(self, vtype: int, key: bytes = b""):
        if vtype in _SCALAR:
            return self.num(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ValueError(f"metadata {key.decode(errors='replace')!r} has an unknown "
                             f"value type {vtype}")
        etype, count = self.num("I"), self.num("Q")
        if etype in _SCALAR:
            self.take(count * struct.calcsize("<" + _SCALAR[etype]))
        else:
            for _ in range(count):
                self.value(etype, key)
        return None


def gguf_needed_size(buf) -> int:
    """The size in bytes the GGUF file ``buf`` (bytes or a memory map) needs, from its
    header; :class:`_Short` when the header itself is cut, ``ValueError`` when it is not
    a GGUF header."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    h = _Header(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("it does not start with GGUF")
    h.take(4)
    h.num("I")  # version
    n_tensors, n_kv = h.num("Q"), h.num("Q")
    alignment = 32
    for _ in range(n_kv):
        key = h.string()
        value = h.value(h.num("I"), key)
        if key == b"general.alignment" and isinstance(value, int) and value > 0:
            alignment = value
    end = 0
    for _ in range(n_tensors):
        name = h.string()
        dims = [h.num("Q") for _ in range(h.num("I"))]
        ttype, offset = h.num("I"), h.num("Q")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {name.decode(errors='replace')!r} has an unknown type "
                             f"{ttype}") from None
        count = 1
        for d in dims:
            count *= d
        end = max(end, offset + -(-count // block) * type_size)
    data_start = -(-h.pos // alignment) * alignment
    return data_start + end


def check_gguf_size(path: str, what: str = "--model") -> None:
    """A one-line :class:`UsageError` naming ``what`` and ``path`` when the GGUF file is
    truncated (module doc); a file whose header cannot be read is left to the loader."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise UsageError(f"{what}: the GGUF file {path!r} is empty")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                try:
                    needed = gguf_needed_size(buf)
                except _Short:
                    raise UsageError(f"{what}: the GGUF file {path!r} is truncated: its "
                                     f"{size} bytes end inside its header (an interrupted "
                                     "copy or download? fetch it again)") from None
    except UsageError:
        raise
    except (OSError, ValueError, OverflowError, RecursionError):
        return  # not a GGUF header ppokit can read: the loader says what it is
    if size < needed:
        raise UsageError(f"{what}: the GGUF file {path!r} is truncated: it has {size} bytes, "
                         f"its header describes {needed} (an interrupted copy or download? "
                         "fetch it again)")
