"""Fault injection for the CLI in a subprocess: put this folder first on PYTHONPATH and set one of

- ``GRPOKIT_FAULT_SIGNAL_AT=module:SIGNAL[,SIGNAL...]``: send the signals to this process, one after the other,
  when ``module`` is first imported (from the import system's search for it, so the handler runs inside that import
  and inside whatever imports it: a C extension's initialisation included);
- ``GRPOKIT_FAULT_SIGNAL_AT_EXIT=SIGNAL``: send it in the interpreter's teardown (the last atexit handler to run);
- ``GRPOKIT_FAULT_WRITE_ERROR=ERRNO:PATH``: simulate storage that fails under PATH, where the real thing cannot be
  had (no tmpfs mount, root ignoring permissions). ENOSPC, EDQUOT, EIO, EFBIG fail at the first ``write()`` of a
  file opened for writing (no filename in the error, as the kernel reports it); EROFS, EACCES, EPERM fail at the
  open, mkdir, rename or unlink, with the filename. Python-level file calls only (SQLite's own writes are C).

Python imports a module named sitecustomize at start-up when it is on the path; this one does nothing unless one
of the variables is set.
"""

import atexit
import builtins
import errno
import io
import os
import signal
import sys

_signal_at = os.environ.get("GRPOKIT_FAULT_SIGNAL_AT")
if _signal_at:
    _module, _, _name = _signal_at.partition(":")

    class _SignalOnImport:
        """A meta-path finder that finds nothing: it only sees the first search for the module."""

        fired = False

        def find_spec(self, fullname, path=None, target=None):
            if fullname == _module and not _SignalOnImport.fired:
                _SignalOnImport.fired = True
                for name in _name.split(","):
                    os.kill(os.getpid(), getattr(signal, name))
            return None

    sys.meta_path.insert(0, _SignalOnImport())

_signal_at_exit = os.environ.get("GRPOKIT_FAULT_SIGNAL_AT_EXIT")
if _signal_at_exit:
    # registered first, so it runs last: after every atexit handler the program registers
    atexit.register(lambda: os.kill(os.getpid(), getattr(signal, _signal_at_exit)))

_write_error = os.environ.get("GRPOKIT_FAULT_WRITE_ERROR")
if _write_error:
    _code_name, _, _root = _write_error.partition(":")
    _code = getattr(errno, _code_name)
    _root = os.path.realpath(_root)
    _AT_WRITE = _code in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG)

    def _under(path) -> bool:
        try:
            real = os.path.realpath(os.fsdecode(path))
        except TypeError:  # a file descriptor
            return False
        return real == _root or real.startswith(_root + os.sep)

    def _writes(mode) -> bool:
        return any(c in str(mode) for c in "wax+")

    class _FailingFile:
        """A file opened for writing whose writes fail as a full or broken disk's do."""

        def __init__(self, file):
            self._file = file

        def write(self, data):
            raise OSError(_code, os.strerror(_code))

        writelines = write

        def __getattr__(self, name):
            return getattr(self._file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._file.close()

        def __iter__(self):
            return iter(self._file)

    _real_open = io.open

    def _open(file, mode="r", *args, **kwargs):
        if _writes(mode) and _under(file):
            if not _AT_WRITE:
                raise OSError(_code, os.strerror(_code), os.fsdecode(file))
            return _FailingFile(_real_open(file, mode, *args, **kwargs))
        return _real_open(file, mode, *args, **kwargs)

    io.open = builtins.open = _open

    def _refusing(real, *path_args):
        def call(*args, **kwargs):
            for i in path_args:
                if i < len(args) and _under(args[i]):
                    raise OSError(_code, os.strerror(_code), os.fsdecode(args[i]))
            return real(*args, **kwargs)

        return call

    if not _AT_WRITE:  # a read-only or forbidden folder refuses every change to it
        for _name, _paths in (
            ("replace", (0, 1)),
            ("rename", (0, 1)),
            ("unlink", (0,)),
            ("remove", (0,)),
            ("mkdir", (0,)),
            ("rmdir", (0,)),
        ):
            setattr(os, _name, _refusing(getattr(os, _name), *_paths))
