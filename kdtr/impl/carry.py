"""Messages between kdtr.impl.isolation and its worker process (kdtr.impl.worker), their large arrays
through shared memory: the one packing both sides use.

A message is pickled onto the pipe as multiprocessing's Connection.send would, except that a numpy
array of SHARED_MIN_BYTES or more is written to a file of its own in the worker's carry folder, on
/dev/shm (tmpfs: memory) where there is a roomy one, else in the temporary folder, and only its
path, dtype and shape go through the pipe; the receiver reads it into an array of its own and
unlinks it. Pickling 2.4 GB through a pipe took 11.3 s on an H100 host (about 0.2 GB/s); this is
two copies in memory. Where the folder has no room for an array it is pickled through the pipe as
before (`Carrier.inlined` counts it). The folder is the caller's (`CarryFolder`): it empties it
after every exchange and removes it when the worker ends, however it ends (a crash, a kill at the
timeout, Ctrl-C), and at its own exit, so nothing is left in /dev/shm (but where the caller itself
is SIGKILLed); the worker only writes files into it.
"""

from __future__ import annotations

import errno
import io
import itertools
import os
import pickle
import shutil
import tempfile
import weakref
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np

SHARED_MIN_BYTES = 1 << 20      # smaller arrays are pickled through the pipe
SHM = "/dev/shm"
SHM_MIN_BYTES = 1 << 30         # a smaller /dev/shm (a container's 64 MB) is passed over for the temporary folder


class CarryError(Exception):
    """A shared array could not be read back (its file is gone or short): not an OSError, so that
    it is not taken for the pipe closing."""


class CarryFolder:
    """The caller's side: a fresh folder for one worker's arrays (on /dev/shm where there is one of
    SHM_MIN_BYTES or more, else the temporary folder: its page cache), emptied after each exchange
    (`clear`) and removed at the worker's end (`remove`)."""

    def __init__(self) -> None:
        try:
            roomy = os.access(SHM, os.W_OK) and shutil.disk_usage(SHM).total >= SHM_MIN_BYTES
        except OSError:
            roomy = False
        where = SHM if roomy else None
        self.path = tempfile.mkdtemp(prefix="kdtr-carry-", dir=where)
        # removed at the latest when this is collected or the caller exits (not when it is SIGKILLed)
        self._removal = weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)

    def clear(self) -> None:
        """Unlink every array file in it (the exchange is over: each has been read, or never will be)."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return
        for name in names:
            try:
                os.unlink(os.path.join(self.path, name))
            except FileNotFoundError:
                pass

    def remove(self) -> None:
        self._removal()


class Carrier:
    """Sends and receives messages over Connections, an array of SHARED_MIN_BYTES or more through a
    file in `folder` (the path of a CarryFolder). `inlined`: the bytes of such arrays the last send
    pickled through the pipe instead (its folder was full)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.inlined = 0
        self._names = itertools.count()

    def pack(self, message: Any) -> memoryview:
        self.inlined = 0
        buffer = io.BytesIO()
        _Pickler(buffer, self).dump(message)
        return buffer.getbuffer()

    def send(self, conn: Connection, message: Any) -> None:
        conn.send_bytes(self.pack(message))

    @staticmethod
    def recv(conn: Connection) -> Any:
        """The next message (EOFError or OSError: the pipe closed); its shared arrays are read in
        and unlinked as it is unpickled."""
        data = conn.recv_bytes()
        return pickle.loads(data)

    def _share(self, array: np.ndarray) -> tuple | None:
        """`array` written to a new file in the folder: the reduction that reads it back; None
        where the folder has no room for it (it goes through the pipe)."""
        transposed = array.flags.f_contiguous and not array.flags.c_contiguous
        flat = np.ascontiguousarray(array.T if transposed else array).reshape(-1).view(np.uint8)
        path = os.path.join(self.folder, f"{os.getpid()}-{next(self._names)}")
        try:
            room = os.statvfs(self.folder)
            if room.f_bavail * room.f_frsize < flat.nbytes:
                raise OSError(errno.ENOSPC, "no room for it", self.folder)
            with open(path, "xb", buffering=0) as file:
                view = memoryview(flat)
                while view:
                    view = view[file.write(view):]
        except OSError:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            self.inlined += array.nbytes
            return None
        return _load, (path, array.dtype, array.shape, transposed)


class _Pickler(ForkingPickler):
    def __init__(self, file: io.BytesIO, carrier: Carrier):
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.carrier = carrier

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is np.ndarray and obj.nbytes >= SHARED_MIN_BYTES and not obj.dtype.hasobject:
            return self.carrier._share(obj) or NotImplemented
        return NotImplemented


def _load(path: str, dtype: np.dtype, shape: tuple[int, ...], transposed: bool) -> np.ndarray:
    """A shared array read into one of this process's own, its file unlinked."""
    out = np.empty(shape[::-1] if transposed else shape, dtype)
    view = memoryview(out.reshape(-1).view(np.uint8))
    try:
        with open(path, "rb", buffering=0) as file:
            while view:
                got = file.readinto(view)
                if not got:
                    raise CarryError(f"{path}: the shared array ends {len(view)} bytes early")
                view = view[got:]
        os.unlink(path)
    except OSError as err:
        raise CarryError(f"a shared array could not be read back: {err}") from None
    return out.T if transposed else out
